"""DESIGN invariants 1 and 4, property-based: for every registered scheduler, on random
workloads and limits (tiny M forces evictions), the simulated schedule replays to the
identical trace, respects every limit, and finishes every request with exactly O tokens."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from infermax import Limits, Schedule, replay, simulate
from infermax.metrics import metrics

from factories import ALL_SCHEDULERS, make_workload, small_instances


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


@pytest.mark.parametrize("name", ["vllm", "sarathi", "sarathi-nohy-ef", "rank-i", "vllm-hy-ef", "sarathi-la", "vllm-la"])
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
