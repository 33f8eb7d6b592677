"""mnemosyne-{fcfs,edf,lrs}: Medha as its authors released it in Vidur 0.0.26 (schedulers/mnemosyne.py).
The batch-for-batch check against Vidur itself is benchmarks/medha_side_by_side.py (it needs vidur);
these pin the behaviours the module docstring names, and the registry's invariant tests hold the
variants to finishing every feasible instance (in KV blocks of 16: tests/test_schedulers_finish.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload, replay, simulate
from infermax.costmodel import get_cost_model
from infermax.schedulers import get_scheduler
from infermax.schedulers.mnemosyne import PrefillTimes, best_chunk
from infermax.state import ServingState

LIMITS = Limits(M=160_000, C=1_000_000, R_max=128)


def _long_then_short():
    # a 16K prompt at t = 0, a 64-token one while it prefills
    return Workload.from_lengths([16_384, 64], [4, 4], [0.0, 0.2])


@pytest.mark.parametrize("name", ["mnemosyne-lrs", "mnemosyne-edf", "mnemosyne-fcfs"])
def test_a_short_prompt_waits_for_the_started_long_prefill(name):
    w = _long_then_short()
    res = simulate(w, name, LIMITS)
    assert replay(res.schedule, w, get_scheduler(name).limits_for(LIMITS)) == res.trace
    first = res.trace.requests["first_token_s"]
    assert first[1] >= first[0]  # the started prefill's queue goes first: the short one joins its last chunk at best
    ours = simulate(w, "medha", LIMITS.replace(P=2048)).trace.requests["first_token_s"]
    assert ours[1] < ours[0]                   # Medha §4 (one ILRS order over every prefill) lets it pass


def test_every_chunk_keeps_the_batch_near_the_target():
    w = Workload.from_lengths([20_000], [2])
    res = simulate(w, "mnemosyne-lrs:target_batch_s=0.05", LIMITS)
    t = res.trace.batches["duration_s"][:-2]            # (the last chunk is whatever was left)
    assert np.all(t <= 0.05 * 1.1 + 1e-12) and np.median(t) >= 0.05 * 0.9


def test_the_deadline_is_the_prefill_time_at_least_min_deadline_and_the_multiplier_is_ignored():
    w = Workload.from_lengths([64, 30_000], [2, 2])
    cost = get_cost_model(None)
    for multiplier, expect in ((None, lambda p: max(p, 0.5)), (3.0, lambda p: max(3.0 * p, 0.5))):
        sched = get_scheduler("mnemosyne-edf", deadline_multiplier=multiplier)
        lim = sched.limits_for(LIMITS)
        state = ServingState(w, lim, cost)
        sched.reset(state)
        sched.next_batch(state)
        times = PrefillTimes(cost, 0.05)
        for i, prompt in enumerate((64, 30_000)):
            assert sched._deadline[i] == pytest.approx(expect(times.remaining(prompt, 0)))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 20_000), st.floats(1e-5, 1e-3), st.floats(0.0, 0.04))
def test_the_bisection_lands_within_ten_percent_or_is_the_closest_tried(remaining, per_token, base):
    def time_of(c):
        return base + per_token * c
    target = 0.05
    chunk, t = best_chunk(time_of, remaining, target)
    assert 1 <= chunk <= min(remaining, 1024)
    assert t == time_of(chunk)


def test_decodes_are_evicted_when_the_blocks_run_out():
    w = Workload.from_spec("fixed:I=500,O=600,B=12")
    lim = Limits(M=16 * 300, C=1_000_000, R_max=128)     # 300 blocks of 16 for 12 peaks of 69 blocks
    res = simulate(w, "mnemosyne-fcfs", lim)
    assert res.metrics["num_evictions"] > 0
    assert np.isfinite(res.trace.requests["completion_s"]).all()


def test_options_are_checked():
    with pytest.raises(ValueError, match="order must be fcfs, edf or lrs"):
        from infermax.schedulers.mnemosyne import Mnemosyne
        Mnemosyne(order="sjf")
    with pytest.raises(ValueError, match="target_batch_s must be > 0"):
        get_scheduler("mnemosyne-lrs:target_batch_s=0")
    with pytest.raises(ValueError, match=r"request 0 may need 7 KV blocks at once, more than M = 112 leaves"):
        simulate(Workload.from_lengths([100], [2]), "mnemosyne-lrs:watermark=0.5", Limits(M=112, C=4096))
