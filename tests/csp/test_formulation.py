"""The model admits every valid schedule, at exactly its replayed cost (no solver needed).

A heuristic schedule is turned into a full assignment of every variable; the
model must accept it and price it like ``replay`` does. This checks constraints
(1)–(5), the policy rows, the cuts (which must not cut off valid schedules), the
class flows and every objective against the judge.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import heuristic_schedules
from factories import small_instances
from hypothesis import HealthCheck, given, settings

from infermax import Limits, Workload, metrics, replay
from infermax.csp import Policy, Strengthening
from infermax.csp.milp.aggregate import assign_aggregate, build_aggregate
from infermax.csp.milp.build import build
from infermax.csp.milp.formulation import check_instance
from infermax.csp.milp.objectives import METRIC_OF, MONOTONE, nonattention_segments
from infermax.csp.milp.trajectory import canonical_labels, merge_chunks, respects_policy, strip_wasted_work
from infermax.csp.warmstart import assign
from infermax.optimal import policy_of


def _check(workload, limits, cost, schedule, objective, policy=Policy(), symmetry="lex"):
    if objective in MONOTONE:
        schedule = strip_wasted_work(schedule, workload, limits, cost)
    schedule = canonical_labels(schedule, workload, limits, cost, symmetry)
    tr = replay(schedule, workload, limits, cost)
    J = len(schedule) + 2
    fm = build(workload, limits, cost, objective, policy, J, Strengthening(symmetry=symmetry))
    x = assign(fm, schedule)
    assert fm.model.evaluate(x) == []
    want = metrics(tr)[METRIC_OF[objective]] if objective != "throughput" else metrics(tr)["latency_s"]
    assert fm.model.objective_value(x) == pytest.approx(want, rel=1e-9)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=4, max_len=6, online=False))
def test_heuristic_schedules_fit_the_latency_model(cost, inst):
    workload, limits = inst
    for _, r in heuristic_schedules(workload, limits, cost):
        _check(workload, limits, cost, r.schedule, "latency")


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=3, max_len=5, online=True))
def test_heuristic_schedules_fit_every_objective(cost, inst):
    workload, limits = inst
    runs = heuristic_schedules(workload, limits, cost, names=("vllm", "sarathi"))
    for objective in ("latency", "completion", "ttft", "tpot"):
        if objective == "tpot" and workload.output_lens.max() < 2:
            continue
        for _, r in runs:
            _check(workload, limits, cost, r.schedule, objective, symmetry="completion")


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=4, max_len=6, online=False))
def test_policy_rows_accept_their_own_class(cost, inst):
    workload, limits = inst
    for name, r in heuristic_schedules(workload, limits, cost):
        policy = policy_of(name)
        if policy.P is not None and policy.P < limits.P:
            continue
        sched = strip_wasted_work(r.schedule, workload, limits, cost)
        assert respects_policy(sched, workload, limits, cost, policy)
        _check(workload, limits, cost, sched, "latency", policy=policy)


def test_a_schedule_outside_the_policy_is_rejected(cost):
    w = Workload.from_lengths([3, 3], [3, 3])
    lim = Limits(M=6, C=64)
    evicting = [res for _, res in heuristic_schedules(w, lim, cost) if res.metrics["num_evictions"] > 0]
    assert evicting, "the instance should make some heuristic evict"
    sched = strip_wasted_work(evicting[0].schedule, w, lim, cost)
    assert not respects_policy(sched, w, lim, cost, Policy(allow_eviction=False))
    fm = build(w, lim, cost, "latency", Policy(allow_eviction=False), len(sched), Strengthening())
    bad = fm.model.evaluate(assign(fm, canonical_labels(sched, w, lim, cost, "lex")))
    assert any(b.startswith("bound e[") for b in bad)


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=4, max_len=6, online=False))
def test_aggregated_model_prices_merged_schedules_exactly(cost, inst):
    workload, limits = inst
    for _, r in heuristic_schedules(workload, limits, cost):
        merged = merge_chunks(strip_wasted_work(r.schedule, workload, limits, cost), workload, limits, cost)
        if merged is None:
            continue
        fm = build_aggregate(workload, limits, cost, Policy(), len(merged) + 1)
        x = assign_aggregate(fm, merged)
        assert fm.model.evaluate(x) == []
        assert fm.model.objective_value(x) == pytest.approx(metrics(replay(merged, workload, limits, cost))
                                                            ["latency_s"], rel=1e-9)


def test_infeasible_request_is_named_before_any_solver(cost):
    w = Workload.from_lengths([4, 9, 2], [4, 4, 1])
    with pytest.raises(ValueError, match=r"request 1 cannot fit in M.*12 > M = 10"):
        check_instance(w, Limits(M=10), Policy())
    with pytest.raises(ValueError, match=r"request 1 cannot be prefilled without chunking.*input_len = 9"):
        check_instance(w, Limits(M=100, C=8), Policy(chunked_prefill=False))


def test_nonattention_segments_equal_the_max_of_lines():
    rng = np.random.default_rng(1)
    for _ in range(20):
        lines = [(float(rng.uniform(0, 1e-2)), float(rng.uniform(0, 1e-4))) for _ in range(rng.integers(1, 4))]
        f0, segs = nonattention_segments(lines, 500)
        n = np.arange(501)
        want = np.max([a + b * n for a, b in lines], axis=0)
        got = [f0]
        for length, slope in segs:
            for _ in range(length):
                got.append(got[-1] + slope)
        assert np.allclose(got, want, rtol=1e-9, atol=1e-15)
        assert all(s1 <= s2 + 1e-15 for (_, s1), (_, s2) in zip(segs, segs[1:]))
