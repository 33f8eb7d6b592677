"""The configuration LP (csp/search/configlp.py): its knapsack, its bound against the trajectory LP's and the
optimum."""
from __future__ import annotations

import itertools
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload
from infermax.csp import Policy
from infermax.csp.search import configlp
from infermax.csp.search.astar import exact_search
from infermax.csp.search.batchtable import RemainingBatches
from infermax.csp.search.classstate import ClassStateSpace
from infermax.csp.search.trajectorylp import TrajectoryLP
from infermax.csp.search.trajectorylp import is_available as glop_available

pytestmark = pytest.mark.skipif(not (configlp.is_available() and glop_available()),
                                reason="HiGHS and OR-Tools (GLOP) are needed")


def _space(spec: str, limits: Limits, cost) -> ClassStateSpace:
    policy = Policy()
    return ClassStateSpace(Workload.from_spec(spec), policy.effective_limits(limits), cost, policy, 0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(6, 14), st.integers(1, 4))
def test_the_knapsack_finds_the_best_multiset_with_a_required_item(cost, seed, M, R_max):
    """Against enumeration of every multiset of item types that fits M KV and R_max items and holds one
    required type (I = 2, O = 3: item sizes 1 to 4)."""
    lp = configlp.ConfigLP(_space("fixed:I=2,O=3,B=4", Limits(M=M, C=64, R_max=R_max), cost), 2)
    rng = np.random.default_rng(seed)
    value = np.where(lp.type_ok, rng.normal(0.0, 3.0, (2, len(lp.size))), -math.inf)
    value[rng.random(value.shape) < 0.2] = -math.inf
    required = np.where(rng.random(value.shape) < 0.4, value, -math.inf)     # the required types' values
    best, configs = lp._knapsack(value, required)
    for j in range(2):
        top = -math.inf
        for k in range(1, lp.count_cap + 1):
            for items in itertools.combinations_with_replacement(lp.types, k):
                if lp.size[list(items)].sum() <= M and any(math.isfinite(required[j, t]) for t in items):
                    top = max(top, sum(value[j, t] for t in items))
        assert best[j] == pytest.approx(top, abs=1e-9) if math.isfinite(top) else best[j] == -math.inf
        if math.isfinite(top):        # the multiset returned is one that attains it
            items = list(configs[j])
            assert lp.size[items].sum() <= M and len(items) <= lp.count_cap
            assert any(math.isfinite(required[j, t]) for t in items)
            assert sum(value[j, t] for t in items) == pytest.approx(top, abs=1e-9)


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
def test_whole_batches_raise_the_bound_between_the_trajectory_lp_and_the_optimum(cost):
    """I=O=16, B=7, M=128, Y=23: trajectory LP 0.2209797 s, configuration LP 0.2214876 s (converged; its
    Lagrangian equals its LP value), optimum 0.2235911 s."""
    sp = _space("fixed:I=16,O=16,B=7", Limits(M=128, C=4096), cost)
    traj = TrajectoryLP(sp, 23)
    low = traj.solve(math.inf)[0]
    lp = configlp.ConfigLP(sp, 23)
    bound, _, _, converged = lp.solve(math.inf, start=traj.best_prices)
    assert converged and low + 4e-4 < bound < 0.2235911
    assert lp.value_s == pytest.approx(bound, rel=1e-6)


def test_started_at_the_trajectory_lps_prices_the_bound_never_starts_below_it(cost):
    """B = 10, Y = 30: stopped after its first round, the configuration LP's Lagrangian is already the
    trajectory LP's value (0.2900 s; converged it is 0.3028 s, after about a minute)."""
    sp = _space("fixed:I=16,O=16,B=10", Limits(M=128, C=4096), cost)
    traj = TrajectoryLP(sp, 30)
    low = traj.solve(math.inf)[0]
    bound, _, _, converged = configlp.ConfigLP(sp, 30).solve(0.0, start=traj.best_prices)
    assert not converged and bound >= low * (1 - 1e-9)


def test_it_needs_tokens_bounded_by_m():
    """Configurations do not track tokens: with C or P below M they could exceed them."""
    assert not configlp.applies(SimpleNamespace(M=128, C=64, P=4096))
    assert not configlp.applies(SimpleNamespace(M=128, C=4096, P=64))
    assert configlp.applies(SimpleNamespace(M=128, C=4096, P=128))


def test_building_it_prints_nothing():
    """HiGHS prints a banner while it is constructed; a search that refines its bound must not."""
    code = ("from infermax import Limits, Workload\n"
            "from infermax.costmodel import get_cost_model\n"
            "from infermax.csp import Policy\n"
            "from infermax.csp.search import configlp\n"
            "from infermax.csp.search.classstate import ClassStateSpace\n"
            "p = Policy()\n"
            "sp = ClassStateSpace(Workload.from_spec('fixed:I=2,O=3,B=4'), p.effective_limits(Limits(M=8, C=64)),\n"
            "                     get_cost_model(None), p, 0)\n"
            "print(configlp.ConfigLP(sp, 4).solve(float('inf'))[0] > 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "True\n", out.stdout


@pytest.mark.slow   # a reach measurement (seconds of A*), also in benchmarks/milp_bench.py --sections astar
def test_a_star_with_refined_tables_keeps_the_optimum_and_expands_fewer_states(cost):
    """B = 7: the configuration LP for Y = 23 converges, raises the root bound to 0.22103 s (0.22149 s before
    issue 19's causal attention cost) and cuts the states A* expands (3,087 with the trajectory LP's tables
    alone, 2,222 measured with both, before the refit)."""
    w, lim = Workload.from_spec("fixed:I=16,O=16,B=7"), Limits(M=128, C=4096)
    rest = RemainingBatches([(16, 16, 7)], lim.M, lim.R_max, time_budget_s=60)     # as solve_optimal has it
    kwargs = dict(upper_s=0.2236 * 1.001, time_budget_s=120, rel_gap=1e-4, lp_budget_s=30, rest=rest,
                  min_batches=rest.num_batches)
    plain = exact_search(w, lim, cost, Policy(), **kwargs)
    refined = exact_search(w, lim, cost, Policy(), refine_lp=True, **kwargs)
    assert plain.is_complete and refined.is_complete and refined.value_s == pytest.approx(plain.value_s, rel=1e-12)
    got = refined.trajectory_lp["refined"][23]
    assert got["converged"] and got["bound_s"] == pytest.approx(0.2210304, abs=1e-6)
    assert got["bound_s"] <= plain.value_s
    assert plain.trajectory_lp["refined"] == {}
    assert rest.is_complete and refined.num_expanded < 0.8 * plain.num_expanded
