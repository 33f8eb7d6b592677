"""DESIGN invariants 1 and 4, property-based: for every registered scheduler, on random
workloads and limits (tiny M forces evictions), the simulated schedule replays to the
identical trace, respects every limit, and finishes every request with exactly O tokens."""
import numpy as np
import pytest
from factories import ALL_SCHEDULERS, make_workload, small_instances
from hypothesis import HealthCheck, given, settings

from infermax import Limits, Schedule, Workload, replay, simulate
from infermax.metrics import metrics
from infermax.schedulers import available, get_scheduler
from infermax.schedulers.framework import GetNextBatch
from infermax.state import ServingState


@pytest.mark.parametrize("name", ALL_SCHEDULERS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=small_instances())
def test_replay_reproduces_simulation(name, inst):
    workload, limits = inst
    result = simulate(workload, name, limits)
    trace = replay(Schedule.from_json(result.schedule.to_json()), workload, limits)
    assert trace == result.trace, trace.diff(result.trace)
    again = metrics(trace)
    assert again.keys() == result.metrics.keys()
    assert all(again[k] == v or (v != v and again[k] != again[k]) for k, v in result.metrics.items())
    b = trace.batches
    assert b["num_tokens"].max() <= limits.C
    assert b["num_prefill_tokens"].max() <= limits.P
    assert b["kv_tokens"].max() <= limits.M
    assert b["num_running"].max() <= limits.max_running
    assert not np.isnan(trace.requests["completion_s"]).any()
    # every request processed exactly I + O - 1 tokens plus what evictions threw away
    processed = np.zeros(len(workload), dtype=np.int64)
    for batch in result.schedule:
        np.add.at(processed, workload.indices_of(batch.ids), batch.tokens)
    expected = workload.input_lens + workload.output_lens - 1 + trace.requests["refill_tokens"]
    assert np.array_equal(processed, expected)


@pytest.mark.parametrize("name", ["vllm", "sarathi", "sarathi-nohy-ef", "rank-i", "vllm-hy-ef", "sarathi-la", "vllm-la",
                                  "medha", "medha-fcfs"])
@settings(max_examples=10, deadline=None)
@given(inst=small_instances(max_requests=16, max_len=60))
def test_fast_forward_changes_nothing(name, inst):
    workload, limits = inst
    fast = simulate(workload, name, limits)
    slow = simulate(workload, name, limits, fast_forward=False)
    assert fast.schedule == slow.schedule
    assert fast.trace == slow.trace


@pytest.mark.parametrize("name", ["vllm-ef", "sarathi-ef", "sarathi-pc-ef", "rank-o-ef"])
@settings(max_examples=10, deadline=None)
@given(inst=small_instances(online=False))
def test_eviction_free_variants_never_evict(name, inst):
    workload, limits = inst
    assert simulate(workload, name, limits).metrics["num_evictions"] == 0


CHUNKED = [n for n in ALL_SCHEDULERS if n.startswith(("sarathi", "rank")) and "nocp" not in n and "nohy" not in n]


@pytest.mark.parametrize("name", CHUNKED)
@settings(max_examples=10, deadline=None)
@given(inst=small_instances(small_P=True))
def test_chunked_prefill_with_tiny_P(name, inst):
    workload, limits = inst
    result = simulate(workload, name, limits)
    assert replay(result.schedule, workload, limits) == result.trace
    assert result.trace.batches["num_prefill_tokens"].max() <= limits.P


def test_non_chunked_scheduler_rejects_a_prompt_larger_than_P():
    w = make_workload([(10, 2), (40, 2)])
    with pytest.raises(ValueError, match=r"request 1 .*40 prompt tokens.*P = 32"):
        simulate(w, "vllm", Limits(M=1000, C=64, P=32))
    assert simulate(w, "sarathi", Limits(M=1000, C=64, P=32)).metrics["num_requests"] == 2


def _through_completion_instances():
    """Online (light and heavy load, a running cap) and offline (tight M: evictions, pinned decodes)."""
    rng = np.random.default_rng(19)
    out = []
    for gap_s, n, M, R_max in ((0.02, 40, 900, None), (0.002, 40, 600, 6), (None, 24, 400, None)):
        ins, outs = rng.integers(8, 100, n), rng.integers(2, 60, n)
        arrivals = None if gap_s is None else np.cumsum(rng.exponential(gap_s, n))
        out.append((Workload.from_lengths(ins, outs, arrivals, name="ff"), Limits(M=M, C=256, R_max=R_max)))
    return out


_FF_DEFAULT = {"vllm", "sarathi", "vllm-ef", "vllm-hy", "medha", "pecsched", "rank-i", "bound-ttft"}


@pytest.mark.parametrize("name", [n if n in _FF_DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in available()])   # the rest in the slow run (CPU budget)
def test_fast_forward_through_completions_changes_nothing(name, monkeypatch):
    """The decode fast-forward runs through request completions (and starts after prefill batches):
    the same schedule and trace as one scheduler decision per batch, for every registered scheduler;
    and for the GetNextBatch family some run does complete a request."""
    completing = []
    run = ServingState.apply_decode_run

    def watched(self, idx, num_steps):
        done = self.num_done
        segments = run(self, idx, num_steps)
        completing.append(self.num_done > done)
        return segments

    monkeypatch.setattr(ServingState, "apply_decode_run", watched)
    for workload, limits in _through_completion_instances():
        fast = simulate(workload, name, limits)
        slow = simulate(workload, name, limits, fast_forward=False)
        assert fast.schedule == slow.schedule
        assert fast.trace == slow.trace, fast.trace.diff(slow.trace)
    if isinstance(get_scheduler(name), GetNextBatch):
        assert any(completing)
