"""The heavy reproductions (run with ``pytest -m slow``): the full §4.5 grid and a scale point.

They need proofs that take seconds to a minute here; the proof is the assertion, the wall time only
the budget given to it (time itself is measured in benchmarks/milp_bench.py, never asserted).
"""
from __future__ import annotations

import pytest
from conftest import heuristic_schedules, section45

from infermax.csp import Policy
from infermax.inputs import resolve_inputs
from infermax.optimal import solve_optimal

pytestmark = [pytest.mark.slow, pytest.mark.solver]


@pytest.mark.parametrize("I", [2 ** k for k in range(11)])
def test_section45_grid_is_proven_optimal(cost, I):
    workload, limits, _ = resolve_inputs(*section45(I), cost)
    opt = solve_optimal(workload, limits, cost, time_limit_s=60)
    assert opt.status == "optimal" and opt.gap <= 1e-4
    ef = solve_optimal(workload, limits, cost, time_limit_s=60, policy=Policy(allow_eviction=False))
    assert ef.status == "optimal" and ef.metrics["num_evictions"] == 0
    assert ef.objective >= opt.bound * (1 - 1e-9)          # the class optimum can't beat the global bound
    best = min(h.metrics["latency_s"] for _, h in heuristic_schedules(workload, limits, cost))
    assert opt.objective <= best * (1 + 1e-12)


def test_homogeneous_B5_is_proven_optimal(cost):
    r = solve_optimal("fixed:I=16,O=16,B=5", "M=128,C=4096", cost, time_limit_s=60)
    assert r.status == "optimal" and r.gap <= 1e-4
