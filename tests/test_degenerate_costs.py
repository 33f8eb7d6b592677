"""Degenerate cost models are bounded, never a crash (issue 36 §2).

An all-zero model (every batch takes 0 s: every objective's optimum is 0, throughput's is infinite) and
models whose batches have no fixed cost (β = 0: no horizon is proven, so the MILP's own bound is not
certified) get valid bounds and solver answers from every entry point; one bound method's refusal is
reported in ``Bound.skipped`` beside the others' values, never instead of them.
"""
from __future__ import annotations

import math

import pytest

import infermax
from infermax import Limits, Workload
from infermax.costmodel import LinearCoefficients, LinearCostModel

W = Workload.from_lengths([4, 6, 3], [2, 3, 1])
LIMITS = Limits(M=64, C=16)
ZERO = dict(nonattn_lines=((0.0, 0.0),), decode_bias_s=0.0, decode_kv_s=0.0, prefill_bias_s=0.0, prefill_attn_s=0.0)
MODELS = {
    "all-zero": ZERO,
    "no-per-batch-time": dict(nonattn_lines=((0.0, 1e-4),), decode_bias_s=0.0, decode_kv_s=1e-7, prefill_bias_s=0.0,
                              prefill_attn_s=1e-8),
    "free-prefill": {**ZERO, "decode_bias_s": 1e-3, "decode_kv_s": 1e-6},
}
OBJECTIVES = ("completion", "ttft", "tpot", "latency", "throughput")
TIME_LIMIT_S = 2.0      # never a pass/fail criterion: a solve cut short is still bounded


def _cost(name: str) -> LinearCostModel:
    return LinearCostModel(LinearCoefficients(**MODELS[name]), name=name)


def _below(bound: float, value: float, objective: str) -> bool:
    return bound >= value if objective == "throughput" else bound <= value


@pytest.mark.solver
@pytest.mark.parametrize("model", ["all-zero", "no-per-batch-time",
                                   pytest.param("free-prefill", marks=pytest.mark.slow)])
def test_solve_optimal_bounds_every_objective(model):
    """Was ZeroDivisionError in relative_gap (all-zero) and "gives batches no fixed cost; pass horizon="."""
    cost = _cost(model)
    for objective in OBJECTIVES:
        r = infermax.solve_optimal(W, LIMITS, cost, objective=objective, time_limit_s=TIME_LIMIT_S, threads=1)
        assert r.schedule is not None and r.objective is not None, objective
        if r.bound is None:             # a solve cut short by a busy machine may end without one
            assert r.status == "feasible" and r.gap is None, objective
            continue
        assert _below(r.bound, r.objective, objective), (objective, r.bound, r.objective)
        assert r.gap is not None and r.gap >= 0, objective
        if model == "all-zero":         # every schedule costs nothing: the bound proves it
            assert r.status == "optimal" and r.objective == r.bound == (math.inf if objective == "throughput" else 0)


@pytest.mark.solver
@pytest.mark.parametrize("model", ["all-zero", "no-per-batch-time"])
def test_lower_bound_default_call_bounds_every_objective(model):
    cost = _cost(model)
    for objective in OBJECTIVES:
        b = infermax.lower_bound(W, LIMITS, cost, objective=objective, milp_time_limit_s=TIME_LIMIT_S)   # milp: 3 <= 6
        replayed = infermax.check_scheduler("sarathi", W, LIMITS, cost, objective=objective, optimum=False)
        assert replayed.exit_code == 0, replayed.error
        for method, value in b.values.items():
            assert _below(value, replayed.value_s, objective), (objective, method, value, replayed.value_s)


def test_the_issue_s_e2e_bound_without_per_batch_time():
    """Was the milp method's ValueError; requests, order, chains and sharing apply on the same call."""
    b = infermax.lower_bound(W, LIMITS, _cost("no-per-batch-time"), objective="e2e", milp_time_limit_s=TIME_LIMIT_S)
    assert {"requests", "order", "chains", "sharing"} <= set(b.values) | set(b.skipped)
    assert {"requests", "order", "chains"} <= set(b.values)
    assert "milp" in b.values or "milp" in b.skipped


def test_a_method_that_refuses_is_reported_beside_the_others(monkeypatch):
    import infermax.optimal

    def refuse(*args, **kwargs):
        raise ValueError("this instance is refused")

    monkeypatch.setattr(infermax.optimal, "solve_optimal", refuse)
    b = infermax.lower_bound(W, LIMITS, objective="e2e")
    assert b.skipped["milp"] == "solve_optimal refuses it: this instance is refused"
    assert {"requests", "order"} <= set(b.values) and "milp" not in b.values
    big = Workload.from_lengths([4] * 8, [2] * 8)
    skipped = infermax.lower_bound(big, LIMITS, objective="ttft").skipped
    assert skipped == {"milp": "8 requests > milp_max_requests = 6"}
