"""Weak duality in floating point (``infermax.bounds.certify``): the LP-based bounds report the dual
value at the solver's multipliers, which no feasible point beats, instead of trusting the solver."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import linprog

from infermax import Limits, Workload
from infermax.bounds import lower_bound
from infermax.bounds.certify import certified_dual


def test_lower_bounds_and_unbounded_columns():
    rng = np.random.default_rng(11)
    A = rng.normal(size=(20, 6))
    lower = np.array([1.0, 0.0, -2.0, 0.0, 0.5, 0.0])
    upper = np.array([4.0, 50.0, 3.0, 2.0, 60.0, 1.0])
    x0 = np.clip(rng.uniform(0, 2, 6), lower, upper)
    b = A @ x0 + rng.uniform(0, 1, 20)
    c = np.abs(rng.normal(size=6))                   # unbounded columns cost, so the LP has a minimum
    res = linprog(c, A_ub=A, b_ub=b, bounds=list(zip(lower, upper)), method="highs")
    assert res.status == 0
    dual, err = certified_dual(c, A, b, lower, upper, -res.ineqlin.marginals)
    assert dual - err <= res.fun <= dual + 1e-7
    for _ in range(300):                             # any y >= 0: never above the optimum
        dual, err = certified_dual(c, A, b, lower, upper, rng.exponential(0.3, 20))
        assert dual - err <= res.fun + 1e-12
    # a negative reduced cost on a column with no upper bound: no finite certificate
    unbounded = np.where(np.arange(6) == 1, np.inf, upper)
    assert certified_dual(-c, A, b, lower, unbounded, np.zeros(20))[0] == -math.inf


def test_the_makespan_lp_reports_its_certified_dual():
    w = Workload.from_spec("fixed:I=16,O=1024,B=1024")
    b = lower_bound(w, Limits(M=100_000, C=4096), methods=("lp",))
    primal = b.certificate["primal_s"]
    assert b.value <= primal and b.value == pytest.approx(primal, rel=1e-6)
