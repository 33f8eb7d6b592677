"""Medha's fast path (issue 41, the long-context cell) against its reference, bit for bit.

With a cost model that prices a batch from its sums (``LinearCostModel.work_timer``), Medha drafts its batches
as sums alone (:class:`~infermax.schedulers.longctx.SumsDraft`), computes the slack in Python floats and orders
the candidates with ``sorted``; ``INFERMAX_PURE=1`` selects the reference: :class:`BatchDraft` on arrays, the
slack and ``np.lexsort`` on arrays, every probe through ``batch_time``. Both must give the same schedule and
trace, on online mixes of long and short prompts with and without SLOs, KV blocks and tight R_max.
"""
import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, Request, Workload, simulate
from infermax.costmodel import LinearCostModel, get_cost_model
from infermax.costmodel.linear import LinearCoefficients

_MODELS = ("default", "a100/llama3-8b", "odd")


def _model(name: str) -> LinearCostModel:
    if name == "default":
        return LinearCostModel()
    if name == "odd":   # two lines, a token term: every branch of the timer and of chunk_bound
        return LinearCostModel(LinearCoefficients(
            nonattn_lines=((2e-3, 6.1e-5), (1.1e-2, 3.3e-5)), decode_bias_s=1.7e-4, decode_kv_s=2.9e-8,
            prefill_bias_s=3.1e-4, prefill_attn_s=5.3e-9, prefill_token_s=2.7e-7, request_s=1.1e-5))
    return get_cost_model(name)


def _mix(seed: int, n: int, slos: bool, ties: bool) -> Workload:
    """``n`` requests, a fifth of them long, arriving online (``ties``: in bursts, several at one instant);
    with ``slos``, some carry a TTFT and some a TPOT SLO."""
    rng = np.random.default_rng(seed)
    ins = np.where(rng.random(n) < 0.2, rng.integers(8_000, 60_000, n), rng.integers(20, 3_000, n))
    outs = rng.integers(1, 150, n)
    gaps = rng.exponential(0.3, n)
    if ties:
        gaps[rng.random(n) < 0.5] = 0.0
    arrivals = np.cumsum(gaps)
    reqs = []
    for i in range(n):
        ttft = float(rng.choice([0.5, 3.0, 20.0])) if slos and rng.random() < 0.5 else None
        tpot = float(rng.choice([0.02, 0.08])) if slos and rng.random() < 0.3 else None
        reqs.append(Request(id=i, input_len=int(ins[i]), output_len=int(outs[i]), arrival_s=float(arrivals[i]),
                            ttft_slo_s=ttft, tpot_slo_s=tpot, tag="long" if ins[i] >= 8_000 else None))
    return Workload(requests=tuple(reqs), name="mix")


def _same_as_reference(w: Workload, sched: str, lim: Limits, cost: LinearCostModel, read_only: bool = False) -> None:
    """The sums path, the compiled one (``INFERMAX_COMPILED=1``, where numba is installed) and the reference
    (``INFERMAX_PURE=1``) give one schedule and trace."""
    runs = {}
    for env in ("", "INFERMAX_COMPILED", "INFERMAX_PURE"):
        if env == "INFERMAX_COMPILED" and importlib.util.find_spec("numba") is None:
            continue
        with pytest.MonkeyPatch.context() as mp:
            if env:
                mp.setenv(env, "1")
            runs[env] = simulate(w, sched, lim, cost, read_only_state=read_only)
    pure = runs.pop("INFERMAX_PURE")
    for env, got in runs.items():
        assert got.schedule == pure.schedule, env
        assert got.trace == pure.trace, env


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 40), name=st.sampled_from(["medha", "medha-fcfs"]),
       model=st.sampled_from(_MODELS), target=st.sampled_from([0.01, 0.05, 0.2]),
       block=st.sampled_from([1, 16, 48]), r_max=st.sampled_from([2, 8, 128]), slos=st.booleans(),
       ties=st.booleans(), share=st.sampled_from([0.0, 0.5, 1.0]), read_only=st.booleans())
def test_medha_from_sums_is_medha_on_arrays(seed, n, name, model, target, block, r_max, slos, ties, share,
                                            read_only):
    """Property: the fast paths' schedule and trace are the reference's, on random mixes (the state read-only
    or not: the compiled planner reads either)."""
    w = _mix(seed, n, slos, ties)
    peak = int(max(w.input_lens + w.output_lens))
    lim = Limits(M=(peak * 3 // block + 2) * block, C=10**7, P=int(np.random.default_rng(seed).choice([512, 4096])),
                 R_max=r_max, block_size=block)
    _same_as_reference(w, f"{name}:target_batch_s={target},max_share={share},R_max={r_max}", lim, _model(model),
                       read_only)


@pytest.mark.parametrize("target", [0.05, 0.2])
def test_medha_from_sums_on_a_long_context_mix(target):
    """The benchmark's kind of mix (seven ~100K prompts among short ones, KV in blocks of 16): the same
    schedule and trace on both paths."""
    from infermax.workloads.long import medha_mix
    w = medha_mix(60, long_frac=0.1, lo=60_000, hi=120_000, rate_per_s=2.0, seed=3)
    lim = Limits(M=400_000, C=10**7, P=4096, R_max=128, block_size=16)
    _same_as_reference(w, f"medha:target_batch_s={target}", lim, get_cost_model("a100/llama3-8b"))


def test_the_decode_run_sees_a_waiting_request_as_a_candidate():
    """``decode_run`` promises nothing while a request waits (it answers from the count, before the phases)."""
    from infermax.schedulers import get_scheduler
    from infermax.state import ServingState
    w = Workload.from_lengths([100, 100], [5, 5], [0.0, 0.0])
    state = ServingState(w, Limits(M=10_000, C=10**6), LinearCostModel())
    sched = get_scheduler("medha")
    sched.reset(state)
    plan = sched.next_batch(state)
    assert plan.idx.tolist() == [0, 1]
    state.apply(np.array([0]), np.array([100]), np.zeros(0, dtype=np.int64))   # 0 decodes, 1 waits
    assert state.num_waiting == 1
    run, steps = sched.decode_run(state, plan)
    assert steps == 0 and run.size == 0
    state.apply(np.array([1]), np.array([100]), np.zeros(0, dtype=np.int64))   # both decode now
    run, steps = sched.decode_run(state, plan)
    assert run.tolist() == [0, 1] and steps == 4


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 14))
def test_the_ilrs_order_is_lexsorts(data, n):
    """The candidates' order from Python floats (``sorted``) is ``np.lexsort``'s over (slack, arrival): least
    slack first, ties by arrival, then by position; NaN and infinite slacks (lexsort's order) included."""
    from infermax.schedulers.medha import Medha
    from infermax.state import ServingState
    arrivals = sorted(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)))
    state = ServingState(Workload.from_lengths([10] * n, [2] * n, arrivals), Limits(M=10_000, C=10**6),
                         LinearCostModel())
    state.advance_clock(2.0)
    values = data.draw(st.lists(st.sampled_from([-1.0, 0.0, -0.0, 0.25, float("nan"), float("inf"),
                                                 float("-inf")]), min_size=n, max_size=n))
    cand = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))), dtype=np.int64)
    sched = Medha()
    sched.reset(state)
    assert sched._timer is not None
    sched._slack_of_sums = lambda state, idx: [values[x] for x in idx]
    fast_order, fast_slack = sched._by_slack(state, cand)
    sched._timer = None       # the reference: slack on arrays, np.lexsort
    sched.slack = lambda state, idx: np.array([values[x] for x in idx])
    order, slack = sched._by_slack(state, cand)
    assert fast_order == order
    assert np.array_equal(fast_slack, slack, equal_nan=True)


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 14))
def test_the_compiled_ilrs_order_is_lexsorts(data, n):
    """The compiled planner's order (an insertion sort) is ``np.lexsort``'s over (slack, arrival), NaN and
    infinite slacks, tied slacks and tied arrivals included."""
    from infermax.schedulers.medha_kernel import ilrs_order
    arrivals = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n)))
    cand = np.array(data.draw(st.permutations(range(n))), dtype=np.int64)
    slack = np.array(data.draw(st.lists(st.sampled_from([-1.0, 0.0, -0.0, 0.25, float("nan"), float("inf"),
                                                         float("-inf")]), min_size=n, max_size=n)))
    order = np.lexsort((arrivals[cand], slack))
    want_cand, want_slack = cand[order], slack[order]
    ilrs_order(cand, slack, arrivals, n)
    assert cand.tolist() == want_cand.tolist()
    assert np.array_equal(slack, want_slack, equal_nan=True)


_STATE_FIELDS = ("m", "inp", "gen", "status", "first_scheduled_s", "first_token_s", "completion_s", "num_suspensions",
                 "_last_batch", "kv_used", "blocks_used", "num_running", "num_done", "num_batches", "clock_s",
                 "prefill_tokens_left", "decode_tokens_left", "version")


def _state(w: Workload, lim: Limits, cost: LinearCostModel, env: str):
    from infermax.state import ServingState
    with pytest.MonkeyPatch.context() as mp:
        if env:
            mp.setenv(env, "1")
        return ServingState(w, lim, cost)


@pytest.mark.parametrize("compiled", [False, True])
@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(2, 10), block=st.sampled_from([1, 3, 16]), model=st.sampled_from(_MODELS),
       M=st.sampled_from([10**7, 6_000]))
def test_a_batch_is_applied_as_on_arrays(compiled, data, n, block, model, M):
    """``ServingState.apply`` settles a batch of decodes and a few (re)fills in Python ints (``_FEW_FILLS``), or
    compiled (``INFERMAX_COMPILED=1``: :mod:`infermax.state_kernel`, where numba is installed): the same state,
    record and time as the array operations (``INFERMAX_PURE=1``, ``_FEW_FILLS = 0``), batch after batch, and the
    same error for a batch that breaks a rule (a decode of 2 tokens, a chunk past its input, a finished request,
    the KV); with evictions before some batches (refills, of requests that have generated tokens already)."""
    from infermax import ScheduleError
    from infermax import state_transitions as T
    from infermax.state import DONE, RUNNING
    if compiled and importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed")
    ins = data.draw(st.lists(st.integers(1, 3_000), min_size=n, max_size=n))
    outs = data.draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    w = Workload.from_lengths(ins, outs)
    lim = Limits(M=M // block * block, C=10**7, block_size=block)
    fast = _state(w, lim, _model(model), "INFERMAX_COMPILED" if compiled else "")
    ref = _state(w, lim, _model(model), "INFERMAX_PURE")
    assert (fast._kernel is not None) == (compiled and block != 3) and ref._kernel is None
    for _ in range(data.draw(st.integers(1, 12))):
        live = [i for i in range(n) if fast.status[i] != DONE]
        if not live:
            break
        finished = [i for i in range(n) if fast.status[i] == DONE][:data.draw(st.integers(0, 1))]
        idx = data.draw(st.lists(st.sampled_from(live + finished), min_size=1, max_size=len(live), unique=True))
        tokens = []
        for i in idx:
            left = int(fast.inp[i] - fast.m[i])
            c = 1 if left <= 0 else data.draw(st.one_of(st.just(left), st.integers(1, left)))
            tokens.append(c + data.draw(st.sampled_from([0] * 12 + [1])))     # (now and then one too many)
        running = [i for i in live if fast.status[i] == RUNNING and i not in idx]
        evict = data.draw(st.lists(st.sampled_from(running), unique=True)) if running else []
        args = (np.array(idx, dtype=np.int64), np.array(tokens, dtype=np.int64), np.array(evict, dtype=np.int64))
        got = []
        for state, few in ((fast, T._FEW_FILLS), (ref, 0)):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(T, "_FEW_FILLS", few)
                try:
                    got.append(state.apply(*args))
                except ScheduleError as e:
                    got.append(str(e))
        assert got[0] == got[1]
        for f in _STATE_FIELDS:
            assert np.array_equal(getattr(fast, f), getattr(ref, f), equal_nan=True), f
        if isinstance(got[0], str):
            break
