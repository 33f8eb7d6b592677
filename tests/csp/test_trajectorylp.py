"""The trajectory LP (csp/search/trajectorylp.py): its root and per-state bounds never exceed what is left."""
from __future__ import annotations

import functools
import math

import pytest
from factories import small_instances
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload
from infermax.csp import Policy
from infermax.csp.search import configlp
from infermax.csp.search.astar import exact_search, is_applicable, pilot_search
from infermax.csp.search.batchcount import is_applicable as batchcount_applies
from infermax.csp.search.batchtable import RemainingBatches
from infermax.csp.search.classstate import ClassStateSpace, classes_of
from infermax.csp.search.trajectorybound import TrajectoryBound
from infermax.csp.search.trajectorylp import TrajectoryLP, is_available

pytestmark = pytest.mark.skipif(not is_available(), reason="OR-Tools (GLOP) is not installed")
NO_CHUNK = Policy(chunked_prefill=False)


def _space(workload, limits, cost, policy):
    """The class-state space with the batches-left table (if it can be built), as the search has it."""
    eff = policy.effective_limits(limits)
    table = None
    if batchcount_applies(eff):
        table = RemainingBatches([(I, O, len(idx)) for I, O, idx in classes_of(workload)], eff.M, eff.R_max,
                                 time_budget_s=10)
        table = table if table.is_complete else None
    return ClassStateSpace(workload, eff, cost, policy, table.num_batches if table else 0, table)


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=4, max_len=4, online=False),
       st.sampled_from([Policy(), NO_CHUNK, Policy(allow_eviction=False), Policy(hybrid=False)]), st.booleans())
@example(inst=(Workload.from_lengths([1, 1, 1], [2, 2, 2]), Limits(M=4, C=3, P=3, R_max=2)), policy=Policy(),
         refine=True)
def test_the_bound_never_exceeds_the_exact_time_left_from_any_reachable_state(cost, inst, policy, refine):
    """Every state reachable after k batches: bound(s, k) with the Lagrangian tables <= the least time
    left from s (computed exhaustively — the class-state graph is acyclic). With ``refine``, C and P are
    raised to M so that the configuration LPs (csp/search/configlp.py) apply and add their tables.

    The explicit example once made GLOP report the trajectory LP infeasible for Y = 3, 4, 5: its first
    columns (paths that never pause) cannot keep R_max = 2 in three batches — the optimum evicts one
    request and refills it — and the LP had no slack on the C, P and R_max rows. The LP was wrong, not
    the expectation: those rows now have a priced slack, like the KV row."""
    workload, limits = inst
    if refine:
        limits = Limits(M=limits.M, C=max(limits.C, limits.M), P=None if limits.P is None else max(limits.P, limits.M),
                        R_max=limits.R_max)
    if not is_applicable(workload, limits, cost, policy)[0]:
        return
    sp = _space(workload, limits, cost, policy)

    @functools.lru_cache(maxsize=None)
    def left(s: tuple) -> float:
        if s == sp.goal:
            return 0.0
        return min((dt + left(ns) for ns, dt, _ in sp.successors(s)), default=math.inf)

    best = left(sp.start)
    if best == math.inf:
        return
    sp.trajectories = TrajectoryBound(sp, sp.min_batches, 1.5 * best, time_budget_s=30, refine=refine)
    assert sp.trajectories.root_bound <= best * (1 + 1e-9)
    assert bool(sp.trajectories.refined) == (refine and configlp.applies(sp))
    layer, k = {sp.start}, 0
    while layer and k < 40:
        for s in layer:
            assert sp.bound(s, k) <= left(s) * (1 + 1e-9) + 1e-12, (s, k)
        layer = {ns for s in layer for ns, _, _ in sp.successors(s)} - {sp.goal}
        k += 1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=5, max_len=5, online=False), st.sampled_from([Policy(), NO_CHUNK]))
def test_a_star_with_the_lagrangian_tables_finds_the_same_optimum(cost, inst, policy):
    """With the optimum as incumbent (a tight cutoff), an inadmissible bound would lose the optimal path."""
    workload, limits = inst
    if not is_applicable(workload, limits, cost, policy)[0]:
        return
    eff = policy.effective_limits(limits)
    opt = exact_search(workload, eff, cost, policy, upper_s=10.0, time_budget_s=30)
    if opt.value_s is None:
        return
    with_lp = exact_search(workload, eff, cost, policy, upper_s=opt.value_s * (1 + 1e-3), time_budget_s=30,
                           lp_budget_s=10)
    assert with_lp.is_complete and with_lp.value_s == pytest.approx(opt.value_s, rel=1e-12)


def test_the_lp_prices_residency_the_class_state_bound_does_not(cost):
    """I=O=16, B=7, M=128: for the least batch count (23), the LP bound is above the class-state bound and
    below the optimum (0.2235911 s, 23 batches, 5 evictions)."""
    w, lim = Workload.from_spec("fixed:I=16,O=16,B=7"), Limits(M=128, C=4096)
    sp = _space(w, lim, cost, Policy())
    lp = TrajectoryLP(sp, 23)
    bound, _, _, converged = lp.solve(deadline=math.inf)
    h = sp.bound(sp.start, 0)
    assert converged and h + 2e-3 < bound < 0.2235911
    assert lp.value_s == pytest.approx(bound, rel=1e-6)      # the Lagrangian at the start is the LP value


@pytest.mark.slow   # a reach measurement (seconds of A*), also in benchmarks/milp_bench.py --sections astar
def test_the_tables_cut_a_stars_expansions_by_two_fifths_on_seven_requests(cost):
    """Measured: 5,938 states expanded without the tables, 3,087 with them."""
    w, lim = Workload.from_spec("fixed:I=16,O=16,B=7"), Limits(M=128, C=4096)
    table = RemainingBatches([(16, 16, 7)], lim.M, None, time_budget_s=30)
    upper = pilot_search(w, lim, cost, Policy(), width=4)[1]
    runs = [exact_search(w, lim, cost, Policy(), upper_s=upper, rel_gap=1e-4, min_batches=table.num_batches,
                         rest=table, lp_budget_s=budget) for budget in (0.0, 30.0)]
    assert all(r.is_complete for r in runs) and runs[0].value_s == pytest.approx(runs[1].value_s, rel=1e-12)
    assert runs[1].num_expanded < 0.6 * runs[0].num_expanded
