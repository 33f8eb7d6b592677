"""The executor runs exactly a Schedule's batches; what it generates cannot be faked by a cost model.

Every schedule (each registered scheduler under a KV capacity small enough to
force evictions, and hand-made ones that evict in the middle of a refill) must
make the model generate, for every request, the tokens a single-request greedy
decode of its prompt generates, and leave no KV block allocated.
"""
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import infermax  # noqa: E402
from infermax import Batch, Limits, Schedule, ScheduleError, Workload  # noqa: E402
from infermax.execute import execute, prompt_tokens  # noqa: E402
from infermax.schedulers import available  # noqa: E402

# 8 requests, peak KV 47 tokens; M = 64 makes the evicting schedulers evict, C = 64 fits any refill
EVICTING = Workload.from_lengths([24, 40, 16, 33, 28, 12, 37, 20], [10, 8, 12, 6, 9, 11, 7, 12], name="evicting")
EVICTING_LIMITS = Limits(M=64, C=64)


def _batch(ids, tokens, evict=()):
    return Batch(ids=np.array(ids), tokens=np.array(tokens), evict=np.array(evict, dtype=np.int64))


def refill_schedule():
    """Request 0 (I=20, O=6) is evicted in decode phase, refilled 10 of 23 tokens, evicted again, refilled.

    Request 1 (I=12, O=4) runs beside it. After the first eviction request 0's
    input is its prompt plus the 3 tokens generated (the last one without KV yet).
    """
    workload = Workload.from_lengths([20, 12], [6, 4], name="refill")
    batches = [_batch([0], [20]), _batch([0], [1]), _batch([0], [1]),
               _batch([1, 0], [12, 10], evict=[0]),      # evict in decode phase; refill starts
               _batch([1], [1], evict=[0]),              # evict in the middle of the refill (m = 10 of 23)
               _batch([0, 1], [15, 1]), _batch([0, 1], [8, 1]),  # refill 15 + 8 = 23 tokens, then generate
               _batch([0], [1]), _batch([0], [1])]
    return Schedule(tuple(batches)), workload, Limits(M=40, C=32)


def test_small_m_makes_the_evicting_schedulers_evict():
    for name in ("vllm", "sarathi", "rank-o"):
        assert infermax.simulate(EVICTING, name, EVICTING_LIMITS).metrics["num_evictions"] > 0, name


# one scheduler per way of building batches runs by default; every other registered one with -m slow
REPRESENTATIVE = {"vllm", "vllm-ef", "vllm-la", "sarathi", "sarathi-nocp", "medha", "pecsched"}


@pytest.mark.parametrize("scheduler", [n if n in REPRESENTATIVE else pytest.param(n, marks=pytest.mark.slow)
                                       for n in available()])
def test_every_scheduler_generates_the_reference_tokens(scheduler, model, reference):
    sim = infermax.simulate(EVICTING, scheduler, EVICTING_LIMITS)
    result = execute(sim.schedule, EVICTING, model, limits=EVICTING_LIMITS, warmup=False)
    assert dict(result.tokens) == reference(EVICTING)
    assert result.blocks_in_use == 0
    assert result.backend == "sdpa" and result.num_batches == len(sim.schedule) and np.all(result.batch_times_s > 0)


@pytest.mark.parametrize("backend", ["sdpa", "torch"])
def test_eviction_in_the_middle_of_a_refill_changes_no_token(backend, model, reference):
    schedule, workload, limits = refill_schedule()
    trace = infermax.replay(schedule, workload, limits)
    assert trace.requests["num_evictions"].tolist() == [2, 0]
    result = execute(schedule, workload, model, limits=limits, backend=backend, warmup=False)
    assert dict(result.tokens) == reference(workload)
    assert result.blocks_in_use == 0


@pytest.mark.solver
def test_milp_schedule_with_evictions_generates_the_reference_tokens(model, reference):
    """A schedule from the MILP (CP-SAT, warm-started; optimal or the best found in 5 s) that evicts."""
    csp = pytest.importorskip("infermax.csp")
    if not hasattr(csp, "solve_optimal"):
        pytest.skip("infermax.csp.solve_optimal is not available")
    workload, limits = Workload.from_spec("fixed:I=4,O=4,B=4"), Limits(M=8, C=4096)
    try:
        solved = csp.solve_optimal(workload, limits=limits, time_limit_s=5)
    except (ImportError, RuntimeError) as exc:       # no solver backend installed
        pytest.skip(f"no MILP backend: {exc}")
    assert infermax.replay(solved.schedule, workload, limits).requests["num_evictions"].sum() > 0
    result = execute(solved.schedule, workload, model, limits=limits, warmup=False)
    assert dict(result.tokens) == reference(workload)
    assert result.blocks_in_use == 0


def test_invalid_schedule_is_rejected_before_any_model_runs():
    schedule, workload, limits = refill_schedule()
    bad = Schedule((_batch([0], [21]),) + schedule.batches[1:])        # more prefill tokens than the prompt
    with pytest.raises(ScheduleError, match="prefill-chunk"):
        execute(bad, workload, model=object(), limits=limits)            # object(): any model use would fail
    with pytest.raises(ScheduleError, match="M"):
        execute(schedule, workload, model=object(), limits=Limits(M=30, C=32))


def test_prompts_are_deterministic_per_seed_and_request():
    a, b = prompt_tokens(EVICTING, 4096, seed=0), prompt_tokens(EVICTING, 4096, seed=0)
    assert a == b and a != prompt_tokens(EVICTING, 4096, seed=1)
    assert [len(a[r.id]) for r in EVICTING] == EVICTING.input_lens.tolist() and a[0] != a[1]


def test_repeats_and_comparison_with_the_predicted_trace(model):
    sim = infermax.simulate(EVICTING, "sarathi", EVICTING_LIMITS)
    result = execute(sim.schedule, EVICTING, model, limits=EVICTING_LIMITS, repeats=2, stat="min")
    assert result.run_times_s.shape == (2, len(sim.schedule))
    assert np.array_equal(result.batch_times_s, result.run_times_s.min(axis=0))
    assert result.cpu_times_s.shape == result.batch_times_s.shape and np.all(result.cpu_times_s >= 0)
    measured = result.measured_trace()
    assert np.array_equal(measured.batches["duration_s"], result.batch_times_s)
    assert measured.requests["num_evictions"].tolist() == sim.trace.requests["num_evictions"].tolist()
    cmp = result.compare(sim.trace)
    assert cmp["num_batches"] == len(sim.schedule)
    assert cmp["measured_latency_s"] == pytest.approx(result.busy_s)       # offline: batches back to back
    assert cmp["e2e_latency_error"] == pytest.approx(abs(cmp["predicted_latency_s"] / cmp["measured_latency_s"] - 1))
    assert 0 <= cmp["batch_time_median_ape"] <= cmp["batch_time_p90_ape"]


def test_online_workload_idles_until_arrivals_in_the_measured_timeline(model):
    workload = Workload.from_lengths([16, 16], [3, 3], arrivals_s=[0.0, 5.0], name="online")
    sim = infermax.simulate(workload, "vllm", Limits(M=64, C=64))
    result = execute(sim.schedule, workload, model, limits=Limits(M=64, C=64), warmup=False)
    trace = result.measured_trace()
    second = int(np.argmax(trace.batches["start_s"] >= 5.0))
    assert second > 0 and trace.batches["start_s"][second] == 5.0


def test_bad_arguments_raise_value_error(model):
    schedule, workload, limits = refill_schedule()
    for kwargs in ({"stat": "mode"}, {"repeats": 0}, {"backend": "cuda-graphs"}, {"device": "tpu"}):
        with pytest.raises(ValueError):
            execute(schedule, workload, model, limits=limits, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    schedule, workload, limits = refill_schedule()
    with pytest.raises(ValueError, match="cuda"):
        execute(schedule, workload, device="cuda", limits=limits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_triton_path_generates_the_reference_tokens(reference):
    from infermax.execute import build_model, reference_tokens

    schedule, workload, limits = refill_schedule()
    net = build_model(device="cuda")
    result = execute(schedule, workload, net, device="cuda", limits=limits)
    assert result.backend == "triton"
    assert dict(result.tokens) == reference_tokens(net, prompt_tokens(workload, net.cfg.vocab_size), workload)


def test_importing_infermax_and_the_cli_does_not_import_torch():
    code = ("import sys, infermax, infermax.execute, infermax.execute.cli, infermax.cli; "
            "infermax.cli.build_parser(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_infermax_execute_is_callable_as_the_design_says():
    import infermax
    import infermax.execute

    sim = infermax.simulate("fixed:I=16,O=4,B=4", "vllm", "M=512,C=256")
    result = infermax.execute(sim.schedule, "fixed:I=16,O=4,B=4", limits="M=512,C=256")
    assert type(result).__name__ == "ExecutionResult"
