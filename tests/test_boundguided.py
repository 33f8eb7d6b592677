"""The bound-guided schedulers (schedulers/boundguided.py, issue 23 item 4): their key is the
bound's own work, their schedules pass the judge, and bound-ttft does what it is for.

The generic tests (test_invariants, test_schedulers_finish, test_bounds, test_oracle) already run
every registered scheduler, these included; here: tighter instances (evictions on every run), the
KV-block semantics, the options, and the one claim the policy makes.
"""
import numpy as np
import pytest
from factories import small_instances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schedulers_finish import finishes_or_refuses, tight_instances

from infermax import Limits, Workload, lower_bound, replay, simulate
from infermax.bounds.costs import coefficients_of
from infermax.bounds.order import request_works
from infermax.costmodel import get_cost_model
from infermax.schedulers import get_scheduler
from infermax.state import ServingState

GUIDED = ["bound-ttft", "bound-e2e", "bound-e2e-ef"]
#: the existing policies that lead the mean-TTFT column on small instances
LEADERS = ["vllm", "vllm-hy", "sarathi", "sarathi-pc", "rank-i", "rank-org", "medha", "pecsched"]


def test_key_is_the_bounds_work():
    """At the start every request's remaining work equals ``order.request_works`` without multipliers
    (first token and completion), on the line the scheduler prices a full batch with."""
    w = Workload.from_lengths([5, 300, 17, 1, 64], [1, 40, 300, 7, 2])
    lim = Limits(M=4000, C=128)
    cost = get_cost_model(None)
    state = ServingState(w, lim, cost)
    sched = get_scheduler("bound-ttft")
    sched.reset(state)
    works = sched._works
    co = coefficients_of(cost)
    b = works.lin - co.prefill_token_s
    ref = request_works(co, w, lim, b, np.zeros(4))
    idx = np.arange(len(w))
    np.testing.assert_allclose(works.first_left(state, idx), ref.first_s, rtol=1e-12)
    np.testing.assert_allclose(works.total_left(state, idx), ref.total_s, rtol=1e-12)


@pytest.mark.parametrize("name", GUIDED)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=tight_instances(), block=st.sampled_from([1, 1, 2, 4]))
def test_finish_under_tight_limits(name, inst, block):
    """Every request finishes with exactly O tokens and replay accepts the schedule, KV in tokens or
    in blocks, with evictions on most instances."""
    workload, limits = inst
    if block > 1:
        limits = limits.replace(M=-(-limits.M // block) * block + block, block_size=block)
    assert finishes_or_refuses(name, workload, limits) is not None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=small_instances(online=True))
def test_eviction_free_variant_never_evicts(inst):
    workload, limits = inst
    assert simulate(workload, "bound-e2e-ef", limits).metrics["num_evictions"] == 0


def test_ttft_policy_evicts_for_first_tokens_and_beats_the_leaders():
    """KV for a third of the prompts' peaks: bound-ttft prefills every prompt first, evicting requests
    past their first token, and comes within 10 % of the certified mean-TTFT bound; the leading
    existing policies wait for decodes to free KV (several times its mean TTFT)."""
    w = Workload.from_spec("fixed:I=32,O=48,B=48")
    lim = Limits(M=600, C=128)
    result = simulate(w, "bound-ttft", lim)
    assert replay(result.schedule, w, lim) == result.trace
    assert result.metrics["num_evictions"] > 0
    ttft = result.metrics["ttft_mean_s"]
    bound = lower_bound(w, lim, objective="ttft", methods=("requests", "order")).value
    assert bound <= ttft <= 1.1 * bound
    best = min(simulate(w, n, lim).metrics["ttft_mean_s"] for n in LEADERS)
    assert ttft < 0.5 * best


def test_non_linear_cost_models_price_work_in_tokens():
    """A cost model the bounds do not cover (roofline) still gets valid schedules."""
    w = Workload.from_lengths([40, 8, 120, 3], [6, 30, 2, 9], [0.0, 0.0, 0.01, 0.02])
    lim = Limits(M=200, C=64)
    cost = get_cost_model("roofline:h100/llama3-8b")
    for name in GUIDED:
        result = simulate(w, name, lim, cost)
        assert replay(result.schedule, w, lim, cost) == result.trace


@pytest.mark.parametrize("spec, message", [
    ("bound-ttft:prefill_budget=0", "prefill_budget"),
    ("bound-e2e:R_max=0", "R_max"),
    ("bound-ttft:objective=e2e", "unknown option"),
])
def test_bad_options_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        get_scheduler(spec)


def test_options_reach_the_policy():
    assert get_scheduler("bound-ttft:prefill_budget=256,co_batch=true").describe() == {
        "name": "bound-ttft", "objective": "ttft", "co_batch": True, "prefill_budget": 256,
        "eviction_free": False, "R_max": None, "decode_slowdown": 4.0}
    assert get_scheduler("bound-ttft:decode_slowdown=none").describe()["decode_slowdown"] is None
    from infermax.schedulers.boundguided import BoundGuided
    with pytest.raises(ValueError, match="decode_slowdown"):
        BoundGuided(objective="ttft", decode_slowdown=0.5)
    with pytest.raises(ValueError, match="objective"):
        BoundGuided(objective="tpot")
    with pytest.raises(ValueError, match="eviction_free"):
        BoundGuided(objective="ttft", eviction_free=True)


def test_decode_batches_stay_short_while_no_prompt_waits():
    """bound-ttft: a batch without a first-token fill takes no more decodes than keep its estimated time
    within decode_slowdown times one decode's; uncapped, it takes every running decode."""
    from infermax import Limits, Workload, simulate
    w = Workload.from_spec("fixed:I=16,O=4,B=1500")
    lim = Limits(M=100_000, C=4096)
    capped = simulate(w, "bound-ttft", lim).schedule.batches
    free = simulate(w, "bound-ttft:decode_slowdown=none", lim).schedule.batches
    decode_only = [len(b) for b in capped if int(b.tokens.max()) == 1]
    assert decode_only and max(decode_only) < 1500 and max(len(b) for b in free) == 1500


def test_e2e_key_is_the_remaining_work():
    """bound-e2e(-ef) run the least *remaining* work first (SRPT): a 2,000-token prompt three quarters
    filled goes on before a 1,200-token prompt that arrived meanwhile (less total work, more left),
    which the total work fixed at arrival would have put first."""
    lim = Limits(M=10_000, C=500)
    alone = simulate(Workload.from_lengths([2000], [2]), "bound-e2e-ef", lim).trace.batches["start_s"]
    w = Workload.from_lengths([2000, 1200], [2, 2], [0.0, float(alone[2]) + 1e-6])   # during A's third chunk
    for name in ("bound-e2e-ef", "bound-e2e"):
        r = simulate(w, name, lim)
        fourth = r.schedule.batches[3]
        assert fourth.ids.tolist() == [0] and fourth.tokens.tolist() == [500], (name, fourth)
        assert r.trace.requests["completion_s"][0] < r.trace.requests["first_token_s"][1]


def test_e2e_prefill_budget_caps_the_prompt_tokens_of_every_batch():
    """bound-e2e(-ef):prefill_budget=N: no batch carries more than N prompt tokens (the limits' P stays the
    key's chunk size); the budget changes the schedule and the judge accepts it."""
    w = Workload.from_spec("trace:splitwise_code,n=60")
    lim = Limits(M=20_000, C=2048)
    for name in ("bound-e2e-ef", "bound-e2e"):
        base = simulate(w, name, lim)
        r = simulate(w, f"{name}:prefill_budget=200", lim)
        assert replay(r.schedule, w, lim) == r.trace
        assert r.trace.batches["num_prefill_tokens"].max() <= 200 < base.trace.batches["num_prefill_tokens"].max()
    assert get_scheduler("bound-e2e-ef:prefill_budget=512").describe()["prefill_budget"] == 512
    with pytest.raises(ValueError, match="prefill_budget"):
        get_scheduler("bound-e2e-ef:prefill_budget=0")
