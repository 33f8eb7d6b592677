"""The strengthening never cuts off a valid schedule: dual-feasible functions, batch-count bound, horizon."""
from __future__ import annotations

from fractions import Fraction

from conftest import heuristic_schedules
from factories import small_instances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.csp.milp.strengthening import batch_count_lower_bound, dff_levels, dff_value
from infermax.csp.warmstart import horizon_for_latency


@settings(max_examples=200)
@given(M=st.integers(2, 300), k=st.integers(1, 12), data=st.data())
def test_dual_feasible_functions_keep_packings_feasible(M, k, data):
    items = data.draw(st.lists(st.integers(1, M), min_size=1, max_size=12))
    total = 0
    packed = []
    for w in items:
        if total + w <= M:
            packed.append(w)
            total += w
    assert sum((dff_value(k, w, M) for w in packed), Fraction(0)) <= 1
    levels = dff_levels(k, M, M)
    for w in packed:
        assert sum((d for th, d in levels if th <= w), Fraction(0)) == dff_value(k, w, M)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=6, max_len=12, online=False))
def test_batch_count_bound_and_horizon_hold_for_heuristics(cost, inst):
    workload, limits = inst
    lb = batch_count_lower_bound(workload, limits)
    for _, r in heuristic_schedules(workload, limits, cost):
        assert lb <= len(r.schedule)
        # a schedule of latency L has at most horizon_for_latency(L) batches
        assert len(r.schedule) <= horizon_for_latency(r.metrics["latency_s"], workload, cost)
