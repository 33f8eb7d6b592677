"""The compiled loop (infermax.fastloop, issue 41) against the pure path it twins: the same schedule, the same
trace, the same state, bit for bit, for every scheduler it covers, and the pure path wherever it does not."""
import json
import os

import numpy as np
import pytest
from factories import make_workload
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload, fastloop, simulate
from infermax.costmodel import LinearCostModel
from infermax.engine import SchedulerStuckError
from infermax.policy import Policy
from infermax.schedulers import get_scheduler
from infermax.schedulers.framework import GetNextBatch
from infermax.state import ServingState

pytest.importorskip("numba")

#: every registered scheduler the loop covers, with options that move its budgets
COVERED = ["vllm", "vllm-hy", "vllm-real", "sarathi", "sarathi-pc", "sarathi-nocp", "sarathi-nohy", "sarathi-real",
           "vllm:R_max=3", "sarathi:R_max=2", "vllm:watermark=0.2", "sarathi:watermark=0.05,P=7",
           "vllm-real:R_max=4", "sarathi-real:P=16"]
#: policies no registered name has, which the loop covers too (GetNextBatch's hooks in other combinations)
POLICIES = {"decode-nohy-chunked": Policy(priority="decode", hybrid=False, chunked_prefill=True, P=24),
            "decode-C": Policy(priority="decode", C=40, P=16, watermark=0.1, R_max=5),
            "prefill-hy-C": Policy(priority="prefill", hybrid=True, chunked_prefill=False, C=300, watermark=0.3),
            "input-key-equal": Policy(priority="decode", rank_key="input")}
#: and some it does not: the simulator runs them on the pure path even when asked for the compiled one
NOT_COVERED = ["vllm-ef", "vllm-la", "sarathi-ef", "sarathi-la", "orca", "fastertransformer", "lightllm", "medha",
               "vllm-v1"]


def _instance(seed: int, n: int, online: bool, max_in: int = 120, max_out: int = 40):
    rng = np.random.default_rng(seed)
    lengths = [(int(rng.integers(1, max_in)), int(rng.integers(1, max_out))) for _ in range(n)]
    arrivals = np.sort(rng.exponential(0.05, n)).cumsum().tolist() if online else None
    if online and rng.random() < 0.3:      # ties and bursts
        arrivals = [round(a, 1) for a in arrivals]
    return make_workload(lengths, arrivals)


def _limits(rng_seed: int, w, block: int) -> Limits:
    rng = np.random.default_rng(rng_seed)
    peak = int((w.input_lens + w.output_lens).max())
    longest = int(w.input_lens.max())
    M = max(peak * block, int(peak * rng.uniform(1.0, 6.0))) + block
    C = max(longest, int(rng.integers(longest, 4 * longest + 2)))
    return Limits(M=M, C=C, block_size=block)


def assert_same_run(a, b) -> None:
    """Two SimResults are the same run: schedule, trace columns, per-request records and metrics."""
    assert a.schedule.to_json() == b.schedule.to_json()
    fa, fb = a.trace.batches, b.trace.batches
    assert fa.keys() == fb.keys()
    for key in fa:
        assert fa[key].dtype == fb[key].dtype, key
        assert np.array_equal(fa[key], fb[key]), key
    for key, col in a.trace.requests.items():
        other = b.trace.requests[key]
        if col.dtype.kind == "f":
            assert np.array_equal(col, other, equal_nan=True), key
        else:
            assert np.array_equal(col, other), key
    assert json.dumps(a.metrics, sort_keys=True, default=str) == json.dumps(b.metrics, sort_keys=True, default=str)


def _sched(name):
    return GetNextBatch(POLICIES[name], name=name) if name in POLICIES else name


def _both(w, name, lim, cost=None):
    cost = cost or LinearCostModel()
    a = simulate(w, _sched(name), lim, cost, compiled=True)
    b = simulate(w, _sched(name), lim, cost, compiled=False)
    return a, b


@pytest.mark.parametrize("name", COVERED + list(POLICIES))
def test_the_loop_covers_these_schedulers(name):
    s = get_scheduler(_sched(name))
    w = make_workload([(10, 5)] * 3)
    lim = s.limits_for(Limits(M=1000, C=64))
    s.reset(ServingState(w, lim, LinearCostModel()))
    assert s.loop_spec(ServingState(w, lim, LinearCostModel())) is not None


@pytest.mark.parametrize("name", NOT_COVERED)
def test_the_others_stay_on_the_pure_path(name, monkeypatch):
    calls = []
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: calls.append(a))
    w = _instance(3, 12, True)
    simulate(w, name, Limits(M=4000, C=256), compiled=True)
    assert not calls


@pytest.mark.parametrize("name", COVERED + list(POLICIES))
@pytest.mark.parametrize("online", [False, True])
def test_the_compiled_loop_is_the_pure_path(name, online):
    for seed in range(3):
        w = _instance(seed * 7 + online, 30, online)
        for block in (1, 16):
            assert_same_run(*_both(w, name, _limits(seed, w, block)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 50), online=st.booleans(), block=st.sampled_from([1, 2, 3, 16]),
       name=st.sampled_from(COVERED + list(POLICIES)), tight=st.booleans())
def test_the_compiled_loop_is_the_pure_path_on_any_instance(seed, n, online, block, name, tight):
    if "-real" in name:
        block = 16      # (the presets' own block size, or 1: simulate applies it)
    w = _instance(seed, n, online)
    lim = _limits(seed + 1, w, block)
    if tight:       # KV as small as the longest request allows: evictions on almost every batch
        peak = int((w.input_lens + w.output_lens).max())
        lim = Limits(M=(-(-peak // block)) * block + block, C=lim.C, block_size=block)
    assert_same_run(*_both(w, name, lim))


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 120), online=st.booleans(),
       block=st.sampled_from([1, 2, 3, 4, 16, 32]), name=st.sampled_from(COVERED + list(POLICIES)),
       tight=st.booleans())
def test_the_compiled_loop_is_the_pure_path_on_many_instances(seed, n, online, block, name, tight):
    test_the_compiled_loop_is_the_pure_path_on_any_instance.hypothesis.inner_test(seed, n, online, block, name, tight)


def test_every_cost_model_coefficient_reaches_the_loop():
    w = _instance(11, 25, True)
    lim = Limits(M=2500, C=300)
    models = [LinearCostModel.from_json(json.dumps({"kind": "linear", "coefficients": coef})) for coef in (
        {"nonattn_lines": [[0.001, 2e-6], [0.004, 1e-7]], "decode_bias_s": 1e-4, "decode_kv_s": 3e-8,
         "prefill_bias_s": 2e-4, "prefill_attn_s": 1e-9, "prefill_token_s": 5e-7, "request_s": 1e-5},
        {"nonattn_lines": [[1e-3, 0.0], [1e-3, 0.0]], "decode_bias_s": 0.0, "decode_kv_s": 0.0, "prefill_bias_s": 0.0,
         "prefill_attn_s": 0.0, "prefill_token_s": 0.0, "request_s": 0.0})]
    for cost in models:
        for name in ("vllm", "sarathi-real"):
            assert_same_run(*_both(w, name, lim, cost))


def test_a_cost_model_of_its_own_keeps_the_pure_path(monkeypatch):
    class Own(LinearCostModel):
        def batch_time(self, tokens, kv_before, is_decode):
            return 0.001 * float(tokens.sum())

    calls = []
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: calls.append(a))
    simulate(_instance(1, 10, True), "vllm", Limits(M=4000, C=256), Own(), compiled=True)
    assert not calls


def test_a_streamed_schedule_is_the_same_file(tmp_path):
    w = _instance(5, 40, True)
    lim = Limits(M=1500, C=200, block_size=16)
    for name in ("vllm-real", "sarathi"):
        a = simulate(w, name, lim, compiled=True, schedule_path=tmp_path / "a.json")
        b = simulate(w, name, lim, compiled=False, schedule_path=tmp_path / "b.json")
        assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
        assert np.array_equal(a.trace.batches["start_s"], b.trace.batches["start_s"])


def test_small_chunks_give_the_same_run(monkeypatch):
    w = _instance(8, 40, True)
    lim = Limits(M=1200, C=150)
    ref = simulate(w, "sarathi", lim, compiled=False)
    run = fastloop.run
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: run(*a, **k, chunk_batches=7))
    seen = []
    got = simulate(w, "sarathi", lim, compiled=True, progress=lambda d, t: seen.append((d, t)))
    assert_same_run(got, ref)
    assert len(seen) > 3 and seen[-1] == (40, 40) and seen == sorted(seen)


def _kept_states(monkeypatch) -> list:
    """Every ServingState built from now on, in order."""
    states = []
    init = ServingState.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        states.append(self)
    monkeypatch.setattr(ServingState, "__init__", keep)
    return states


def test_the_state_is_left_as_the_pure_path_leaves_it(monkeypatch):
    states = _kept_states(monkeypatch)
    w = _instance(2, 30, True)
    _both(w, "vllm-real", Limits(M=900, C=200, block_size=16))
    a, b = states
    # (not _last_batch: the pure path's decode runs leave it behind, being read only for a (re)fill)
    for key in ("m", "inp", "gen", "status", "num_evictions", "refill_tokens", "num_suspensions"):
        assert np.array_equal(getattr(a, key), getattr(b, key)), key
    for key in ("clock_s", "kv_used", "blocks_used", "num_running", "num_done", "num_batches", "_next_arrival",
                "prefill_tokens_left", "decode_tokens_left"):
        assert getattr(a, key) == getattr(b, key), key
    assert np.array_equal(a.active, b.active)


def test_small_runs_stay_on_the_pure_path_by_default(monkeypatch):
    calls = []
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: calls.append(a))
    monkeypatch.delenv("INFERMAX_COMPILED", raising=False)
    simulate(_instance(1, 10, True), "vllm", Limits(M=4000, C=256))
    assert not calls
    monkeypatch.setenv("INFERMAX_PURE", "1")
    simulate(_instance(1, 10, True), "vllm", Limits(M=4000, C=256), compiled=True)
    assert not calls


def test_a_run_that_cannot_go_on_is_reported_with_its_results_so_far(monkeypatch):
    # (GetNextBatch never gets stuck: a spec with no running slot stands in for a scheduler that would)
    spec_for = fastloop.spec_for
    monkeypatch.setattr(fastloop, "spec_for", lambda *a: spec_for(*a)._replace(R=0))
    with pytest.raises(SchedulerStuckError, match="scheduled nothing at t = .* 5 requests unfinished"):
        simulate(_instance(4, 5, False), "vllm", Limits(M=5000, C=500), compiled=True)


@pytest.mark.skipif(os.environ.get("INFERMAX_PURE") == "1", reason="the pure path is forced")
def test_a_long_trace_runs_compiled_by_default(monkeypatch):
    calls = []
    run = fastloop.run
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    w = make_workload([(8, fastloop.MIN_OUTPUT_TOKENS // 50)] * 50)
    got = simulate(w, "vllm", Limits(M=10**6, C=4096))
    assert calls
    assert_same_run(got, simulate(w, "vllm", Limits(M=10**6, C=4096), compiled=False))


@pytest.mark.parametrize("name", COVERED)
def test_the_compiled_loop_is_the_pure_path_on_a_real_trace(name):
    # the Splitwise conversation trace's first 150 requests at 4x their rate, in a KV cache that runs short
    w = Workload.from_spec("trace:splitwise_conv,n=150,time_scale=0.25")
    assert_same_run(*_both(w, name, Limits(M=16_000, C=16_384)))


def test_cached_code_of_other_layout_constants_is_compiled_again(monkeypatch):
    from infermax import fastloop_kernel as k
    fastloop._kernel()
    assert k.layout_key() == k.LAYOUT_KEY       # (the code in use was compiled with the constants imported now)
    assert {"loop", "plan", "fill", "apply", "time_of", "layout_key"} <= set(k.dispatchers())
    flushed = []
    monkeypatch.setattr(k, "flush_cache", lambda: flushed.append(1))
    monkeypatch.setattr(k, "LAYOUT_KEY", k.LAYOUT_KEY + 1)     # as after an edit of fastloop_layout alone
    fastloop._kernel()
    assert flushed


def test_limits_whose_sums_could_overflow_keep_the_pure_path(monkeypatch):
    calls = []
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: calls.append(a))
    simulate(_instance(1, 10, True), "vllm", Limits(M=2**40, C=2**22), compiled=True)
    assert not calls


def test_compiled_false_runs_no_compiled_path_at_all(monkeypatch):
    # simulate's choice reaches the state's compiled steps and Medha's planner too (infermax.compiled)
    monkeypatch.setenv("INFERMAX_COMPILED", "1")
    states = _kept_states(monkeypatch)
    calls = []
    monkeypatch.setattr(fastloop, "run", lambda *a, **k: calls.append(a))
    w = _instance(6, 20, True)
    for name in ("vllm", "medha", "orca"):
        simulate(w, name, Limits(M=3000, C=256), compiled=False)
    assert not calls and all(s._kernel is None for s in states)
    from infermax.schedulers import get_scheduler as get
    medha = get("medha")
    simulate(w, medha, Limits(M=3000, C=256), compiled=False)
    assert getattr(medha, "_compiled", None) is None


def test_each_compiled_timer_is_the_linear_models_sums_timer():
    # (each compiled module keeps its own copy of the timer: numba's cache is keyed per file, so a callee in another
    # file would leave its callers' cached code stale when it changed)
    from infermax import state_kernel
    from infermax.fastloop_kernel import time_of
    from infermax.schedulers import medha_kernel
    rng = np.random.default_rng(0)
    for cost in (LinearCostModel(), LinearCostModel.from_json(json.dumps({"kind": "linear", "coefficients": {
            "nonattn_lines": [[0.001, 2e-6], [0.004, 1e-7]], "decode_bias_s": 1e-4, "decode_kv_s": 3e-8,
            "prefill_bias_s": 2e-4, "prefill_attn_s": 1e-9, "prefill_token_s": 5e-7, "request_s": 1e-5}}))):
        lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = cost.work_coefficients()
        la, lb = np.array([a for a, _ in lines]), np.array([b for _, b in lines])
        co = np.array([d_bias, d_kv, p_bias, p_attn, p_tok, req])
        fc = np.zeros(9)
        fc[[medha_kernel.F_D_BIAS, medha_kernel.F_D_KV, medha_kernel.F_P_BIAS, medha_kernel.F_P_ATTN,
            medha_kernel.F_P_TOK, medha_kernel.F_REQ]] = co
        sc_co = np.zeros(6)
        sc_co[[state_kernel.C_D_BIAS, state_kernel.C_D_KV, state_kernel.C_P_BIAS, state_kernel.C_P_ATTN,
               state_kernel.C_P_TOK, state_kernel.C_REQ]] = co
        for _ in range(300):
            n = int(rng.integers(1, 600))
            ndec = int(rng.integers(0, n + 1))
            pf = int(rng.integers(0, 5000)) if ndec < n else 0
            tokens, dkv = ndec + pf, int(rng.integers(0, 10**7)) if ndec else 0
            work2 = int(rng.integers(0, 10**12)) if pf else 0
            want = cost._time_of_work(n, tokens, ndec, dkv, work2, pf)
            assert time_of(la, lb, co, n, tokens, ndec, dkv, work2, pf) == want
            assert state_kernel._time(la, lb, sc_co, n, tokens, ndec, dkv, work2, pf) == want
            assert medha_kernel._time(la, lb, fc, n, tokens, ndec, dkv, work2, pf) == want
