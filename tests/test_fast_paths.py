"""Closed forms on the simulator's hot path (issue 41), each against the formula it replaces.

KV blocks by shifts and masks (a power-of-two block size), the most decode steps whose new blocks fit
(closed form against the binary search), the blocks a batch of decodes and one (re)fill adds, and the
blocks after a decode run: the same numbers as the sums over ``ceil(m / block_size)`` they stand for.
Hybrid runs (a (re)fill chunk advancing alongside decodes, fast-forwarded): the same state as ``apply``
batch by batch, and the same schedule as one scheduler decision per batch.
"""
import copy

import numpy as np
import pytest
from factories import make_workload
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, ScheduleError, Workload, simulate
from infermax.costmodel import LinearCostModel
from infermax.schedulers import get_scheduler
from infermax.state import DONE, ServingState

_BLOCKS = st.sampled_from([1, 2, 3, 8, 16, 32, 48])
_KV = st.lists(st.integers(1, 5000), min_size=1, max_size=60)


def _ceil_blocks(tokens, b):
    return -(-np.asarray(tokens, dtype=np.int64) // b)


@settings(max_examples=200, deadline=None)
@given(b=_BLOCKS, tokens=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=40))
def test_kv_blocks_is_the_ceiling_for_every_integer(b, tokens):
    lim = Limits(M=10**6, C=4096, block_size=b)
    arr = np.array(tokens, dtype=np.int64)
    assert np.array_equal(lim.kv_blocks(arr), _ceil_blocks(arr, b))
    assert [lim.kv_blocks(t) for t in tokens] == [-(-t // b) for t in tokens]
    assert lim.kv_blocks(2.5) == -(-2.5 // b)      # (a float: the division, as ever)


def _scheduler(b: int):
    s = get_scheduler("vllm")       # (its policy leaves the block size to the Limits)
    s.reset(ServingState(make_workload([(10, 10)] * 4), Limits(M=100_000, C=4096, block_size=b), LinearCostModel()))
    return s


@settings(max_examples=300, deadline=None)
@given(b=_BLOCKS, m=_KV, free=st.integers(-5, 3000))
def test_the_most_decode_steps_in_closed_form_are_the_binary_searchs(b, m, free):
    s = _scheduler(b)
    m = np.array(m, dtype=np.int64)
    assert s._decode_steps(m, free) == s._decode_steps_search(m, free)


def _state(b: int, n: int) -> ServingState:
    return ServingState(make_workload([(5, 5)] * n), Limits(M=10**6, C=4096, block_size=b), LinearCostModel())


@settings(max_examples=300, deadline=None)
@given(b=st.sampled_from([2, 8, 16, 32]), m=_KV, refill=st.booleans(), data=st.data())
def test_the_blocks_a_batch_adds_are_the_sum_of_ceilings(b, m, refill, data):
    state = _state(b, len(m))
    m0 = np.array(m, dtype=np.int64)
    tokens = np.ones(m0.size, dtype=np.int64)
    one = -1
    if refill:
        one = data.draw(st.integers(0, m0.size - 1))
        m0[one] = data.draw(st.integers(0, 3000))
        tokens[one] = data.draw(st.integers(1, 600))
    want = int((_ceil_blocks(m0 + tokens, b) - _ceil_blocks(m0, b)).sum())
    assert state._new_blocks(m0, not refill, one, int(tokens[one]) if refill else 0) == want


@settings(max_examples=300, deadline=None)
@given(b=st.sampled_from([2, 8, 16, 32]), m=_KV, steps=st.integers(1, 400), used=st.integers(0, 50))
def test_the_blocks_after_a_decode_run_are_the_sum_of_ceilings(b, m, steps, used):
    state = _state(b, len(m))
    m0 = np.array(m, dtype=np.int64)
    state.blocks_used = int(_ceil_blocks(m0, b).sum()) + used
    want = state.blocks_used + int((_ceil_blocks(m0 + steps, b) - _ceil_blocks(m0, b)).sum())
    last, bad = state._blocks_after_decodes(m0, steps)
    assert last == want
    assert (bad is None) == (want <= state.limits.num_blocks)


# --- hybrid runs: a (re)fill chunk advancing alongside decodes (issue 41) -------------------------------------------

_HYBRID = ["sarathi", "sarathi-real", "sarathi-pc", "sarathi-ef", "sarathi:P=64", "sarathi-real:R_max=8"]


class _OwnBatchTime(LinearCostModel):
    """The linear model with a batch_time of its own: the state cannot time a batch from its sums, so a hybrid run
    is applied batch by batch through ``apply``."""

    def batch_time(self, tokens, kv_before, is_decode):
        return LinearCostModel.batch_time(self, tokens, kv_before, is_decode)


def _hybrid_instance(seed: int, n: int, online: bool, block: int):
    rng = np.random.default_rng(seed)
    ins, outs = rng.integers(100, 1500, n), rng.integers(2, 300, n)
    arrivals = np.cumsum(rng.exponential(0.05, n)) if online else None
    M = int(max(ins + outs)) + int(rng.integers(0, 6000))
    return Workload.from_lengths(ins, outs, arrivals, name="hy"), Limits(M=M - M % 16, C=int(rng.choice([512, 2048])),
                                                                          block_size=block)


def _watch_hybrid(monkeypatch) -> list[tuple[int, bool]]:
    """Record (batches, whether a request completed) of every hybrid run applied in closed form."""
    applied: list[tuple[int, bool]] = []
    run = ServingState.apply_hybrid_run

    def watched(self, idx, chunk, num_steps):
        done = self.num_done
        seg = run(self, idx, chunk, num_steps)
        if seg is not None:
            applied.append((seg.num_batches, self.num_done > done))
        return seg

    monkeypatch.setattr(ServingState, "apply_hybrid_run", watched)
    return applied


@pytest.mark.parametrize("name", _HYBRID)
def test_hybrid_runs_change_no_schedule(name, monkeypatch):
    """The same schedule and trace as one scheduler decision per batch, online and offline, in tokens and in
    blocks; and hybrid runs of several batches were taken, some (P < C) completing a request in their last."""
    applied = _watch_hybrid(monkeypatch)
    for seed, online in ((1, False), (2, True), (3, True)):
        w, lim = _hybrid_instance(seed, 60, online, 1)
        fast, slow = simulate(w, name, lim), simulate(w, name, lim, fast_forward=False)
        assert fast.schedule == slow.schedule
        assert fast.trace == slow.trace, fast.trace.diff(slow.trace)
    assert max(k for k, _ in applied) >= 2
    if name not in ("sarathi-pc", "sarathi-ef"):
        assert any(done for _, done in applied)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 40), online=st.booleans(), block=st.sampled_from([1, 16]),
       name=st.sampled_from(["sarathi", "sarathi-pc", "sarathi-ef", "sarathi:P=96", "sarathi-real"]),
       own_time=st.booleans())
def test_a_hybrid_run_gives_the_schedule_of_stepping_batch_by_batch(seed, n, online, block, name, own_time):
    """Property: for random workloads (long prompts, tight KV, arrivals or not), KV in tokens or blocks, and a cost
    model timed from sums or from arrays (then the run goes batch by batch through ``apply``), fast-forwarding
    hybrid runs gives the schedule and trace of one decision per batch."""
    w, lim = _hybrid_instance(seed, n, online, 1 if name == "sarathi-real" else block)
    cost = _OwnBatchTime() if own_time else None
    fast = simulate(w, name, lim, cost)
    slow = simulate(w, name, lim, cost, fast_forward=False)
    assert fast.schedule == slow.schedule
    assert fast.trace == slow.trace


def _same_state(a: ServingState, b: ServingState) -> None:
    for key, value in vars(a).items():
        if key == "_slot":       # (scratch of apply's duplicate check)
            continue
        other = getattr(b, key)
        if isinstance(value, np.ndarray):
            assert value.dtype == other.dtype and value.tobytes() == other.tobytes(), key
        elif isinstance(value, (int, float, str, type(None), list, dict, tuple)):
            assert value == other or (value != value and other != other), key


@pytest.mark.parametrize("block,own_time", [(1, False), (16, False), (1, True)])
def test_apply_hybrid_run_is_apply_batch_by_batch(block, own_time):
    """At every hybrid run a scheduler promises, the state after ``apply_hybrid_run`` and its segment are those
    of ``apply`` called batch by batch with the same requests and tokens (the array formula of each batch)."""
    runs = 0
    for seed, online in ((7, False), (8, True)):
        runs += _hybrid_runs_against_apply(seed, online, block, own_time)
    assert own_time or runs >= 3


def _hybrid_runs_against_apply(seed: int, online: bool, block: int, own_time: bool) -> int:
    w, lim = _hybrid_instance(seed, 50, online, block)
    cost = _OwnBatchTime() if own_time else LinearCostModel()
    sched = get_scheduler("sarathi")
    state = ServingState(w, lim, cost)
    sched.reset(state)
    runs = 0
    while not state.is_finished:
        plan = sched.next_batch(state)
        if not plan.idx.size:
            state.advance_clock(state.next_arrival_s)
            continue
        state.apply(plan.idx, plan.tokens, plan.evict)
        idx, chunk, k = sched.hybrid_run(state, plan)
        if k < 1:
            continue
        ref = copy.deepcopy(state)
        seg = state.apply_hybrid_run(idx, chunk, k)
        if own_time:        # (nothing applied: the engine goes batch by batch)
            assert seg is None
            _same_state(state, ref)
            continue
        tokens = np.ones(idx.size, dtype=np.int64)
        tokens[-1] = chunk
        got = []
        for _ in range(k):
            nxt = ref.next_arrival_s
            if nxt is not None and ref.clock_s >= nxt:
                break
            got.append(ref.apply(idx, tokens, np.zeros(0, dtype=np.int64)))
        assert seg.num_batches == len(got)
        assert seg.tokens.tolist() == tokens.tolist()
        assert seg.starts_s == [g[0] for g in got] and seg.durations_s == [g[1] for g in got]
        for kv, (_, _, record) in zip(seg.kv_tokens, got):
            n = idx.size
            assert tuple(record) == (n, n - 1 + chunk, chunk, n - 1, kv, seg.num_running, 0)
        _same_state(state, ref)
        runs += seg.num_batches > 1
    return runs


def test_a_hybrid_run_that_breaks_its_promise_is_refused():
    w = make_workload([(400, 50), (30, 4), (30, 40)])
    state = ServingState(w, Limits(M=5000, C=512, P=128), LinearCostModel())
    state.apply(np.array([1, 2]), np.array([30, 30]), np.zeros(0, dtype=np.int64))
    state.apply(np.array([1, 2, 0]), np.array([1, 1, 100]), np.zeros(0, dtype=np.int64))
    with pytest.raises(ScheduleError, match="hybrid-run.*would reach its input"):
        state.apply_hybrid_run(np.array([1, 2, 0]), 100, 3)
    with pytest.raises(ScheduleError, match="hybrid-run.*complete before the last"):
        state.apply_hybrid_run(np.array([1, 2, 0]), 10, 5)
    with pytest.raises(ScheduleError, match="hybrid-run.*one running request in"):
        state.apply_hybrid_run(np.array([0, 1, 2]), 10, 2)
    seg = state.apply_hybrid_run(np.array([1, 2, 0]), 100, 2)      # request 1 completes in the last batch
    assert seg.num_batches == 2 and state.status[1] == DONE and state.m[0] == 300
    assert state.apply_hybrid_run(np.array([2, 2, 0]), 10, 1) is None     # (a duplicate: apply names the rule)
    with pytest.raises(ScheduleError, match="duplicate"):
        state.apply(np.array([2, 2, 0]), np.array([1, 1, 10]), np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("rule, limits, batch", [("M", Limits(M=30, C=64), 12), ("C", Limits(M=1000, C=2), 3),
                                                  ("M-blocks", Limits(M=32, C=64, block_size=4), 10),
                                                  # C broken from the first batch, M only later: C is named
                                                  ("C", Limits(M=40, C=2), 3)])
def test_a_decode_run_refuses_what_apply_refuses_at_the_same_batch(rule, limits, batch):
    """``apply_decode_run`` names the rule and the batch that its decodes, applied one batch at a time, break
    first (the run's refusal, state_rules' ``_refuse_decode_segment``), and applies nothing of the run."""
    state = ServingState(Workload.from_lengths([1, 1, 1], [20, 20, 20]), limits, LinearCostModel())
    none = np.zeros(0, dtype=np.int64)
    for i in range(3):       # each prefill alone (C = 2 holds one), each generating its first token
        state.apply(np.array([i]), np.array([1]), none)
    idx = np.arange(3)
    one = copy.deepcopy(state)
    with pytest.raises(ScheduleError) as by_apply:
        for _ in range(30):
            one.apply(idx, np.ones(3, dtype=np.int64), none)
    before = copy.deepcopy(state)
    with pytest.raises(ScheduleError) as by_run:
        state.apply_decode_run(idx, 30)
    assert (by_run.value.rule, by_run.value.batch) == (by_apply.value.rule, by_apply.value.batch) == (rule, batch)
    _same_state(state, before)


# --- workloads from lengths, checked at once ------------------------------------------------------------------------

def _one_by_one(ins, outs, arrivals):
    from infermax.types import Request, _plain
    return tuple(Request(id=i, input_len=_plain(a), output_len=_plain(b), arrival_s=_plain(t, float))
                 for i, (a, b, t) in enumerate(zip(ins, outs, arrivals)))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 30), kind=st.sampled_from(["list", "int64", "int32"]),
       times=st.sampled_from(["none", "float", "int", "np"]))
def test_requests_checked_at_once_are_the_requests_built_one_by_one(data, n, kind, times):
    ins = data.draw(st.lists(st.integers(1, 2**31 - 1), min_size=n, max_size=n))
    outs = data.draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    if kind != "list":
        ins, outs = np.array(ins, dtype=kind), np.array(outs, dtype=kind)
    arrivals = {"none": None, "float": data.draw(st.lists(st.floats(0, 1e6), min_size=n, max_size=n)),
                "int": data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)),
                "np": np.sort(np.random.default_rng(n).uniform(0, 100, n))}[times]
    w = Workload.from_lengths(ins, outs, arrivals)
    want = _one_by_one(list(ins), list(outs), [0.0] * n if arrivals is None else list(arrivals))
    assert w.requests == want
    assert [tuple(map(type, (r.id, r.input_len, r.output_len, r.arrival_s))) for r in w.requests] == \
        [tuple(map(type, (r.id, r.input_len, r.output_len, r.arrival_s))) for r in want]


@pytest.mark.parametrize("ins,outs,arrivals,message", [
    ([1, True], [1, 1], None, "Request.input_len must be an integer, got true"),
    ([1, 0], [1, 1], None, "Request.input_len must be >= 1, got 0"),
    ([1, 2.0], [1, 1], None, "Request.input_len must be an integer, got 2.0"),
    ([1, 1], [1, 2**31], None, "Request.output_len must be <= 2^31 - 1"),
    ([1, 1], [1, 1], [0.0, float("nan")], "Request.arrival_s must be finite and >= 0.0, got nan"),
    ([1, 1], [1, 1], [0.0, -1.0], "Request.arrival_s must be finite and >= 0.0, got -1.0"),
    ([1, 1], [1, 1], [0.0, False], "Request.arrival_s must be a number, got false"),
])
def test_a_bad_length_or_arrival_is_named_as_ever(ins, outs, arrivals, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("^", r"\^")):
        Workload.from_lengths(ins, outs, arrivals)


@pytest.mark.parametrize("name", ["vllm-real", "sarathi-real", "vllm:watermark=0.01"])
def test_the_blocks_in_use_are_the_running_requests_blocks_at_every_decision(name, monkeypatch):
    """What the presets read instead of summing reservations (``state.blocks_used`` as Σ ceil(m / b) over the
    running requests, ``state.kv_used`` as Σ m) holds at every decision, through evictions, completions and
    decode and hybrid runs."""
    from infermax.schedulers.framework import GetNextBatch
    from infermax.state import RUNNING
    seen = []
    decide = GetNextBatch.next_batch

    def checked(self, state):
        running = state.status == RUNNING
        m = state.m[running]
        assert state.kv_used == int(m.sum())
        if state.limits.block_size > 1:
            assert state.blocks_used == int(_ceil_blocks(m, state.limits.block_size).sum())
        seen.append(int(running.sum()))
        return decide(self, state)

    monkeypatch.setattr(GetNextBatch, "next_batch", checked)
    for seed, online in ((4, False), (5, True)):
        w, lim = _hybrid_instance(seed, 80, online, 1 if "real" in name else 16)
        result = simulate(w, name, lim.replace(C=2048))      # (vLLM admits a prompt whole)
        assert result.metrics["num_evictions"] > 0 or online
    assert max(seen) > 5


# --- a draft batch priced from its sums (LinearCostModel.work_timer; Medha's chunk search) ---------------------
def _linear_models() -> list:
    from infermax.costmodel import get_cost_model
    from infermax.costmodel.linear import LinearCoefficients
    odd = LinearCostModel(LinearCoefficients(nonattn_lines=((1e-3, 3e-5), (4e-3, 1e-5), (7e-3, 7e-6)),
                                             decode_bias_s=3e-4, decode_kv_s=9.1e-8, prefill_bias_s=1.3e-3,
                                             prefill_attn_s=5.3e-9, prefill_token_s=2.7e-7, request_s=1.1e-5))
    return [LinearCostModel(), get_cost_model("a100/llama3-8b"), odd]


@settings(max_examples=300, deadline=None)
@given(model=st.integers(0, 2), data=st.data(), n=st.integers(0, 40))
def test_a_batch_timed_from_its_sums_is_batch_time(model, data, n):
    """Bit for bit: the sums (Python ints) through ``work_timer`` give the float ``batch_time`` gives from the
    arrays, for batches of decodes, one or several chunks, or both (and the empty batch)."""
    cost = _linear_models()[model]
    dec = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    kv = np.array(data.draw(st.lists(st.integers(0, 200_000), min_size=n, max_size=n)), dtype=np.int64)
    tok = np.array([1 if d else data.draw(st.integers(0, 20_000)) for d in dec], dtype=np.int64)
    pf = ~dec
    sums = (n, int(tok.sum()), int(dec.sum()), int((kv + tok)[dec].sum()),
            sum(int(c) * (2 * int(m) + int(c) + 1) for c, m in zip(tok[pf], kv[pf])), int(tok[pf].sum()))
    assert cost.work_timer()(*sums) == cost.batch_time(tok, kv, dec)


def test_only_the_linear_formula_is_timed_from_sums():
    class Own(LinearCostModel):
        def batch_time(self, tokens, kv_before, is_decode):
            return 1.0

    assert Own().work_timer() is None and LinearCostModel().work_timer() is not None


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 30), name=st.sampled_from(["medha", "medha-fcfs"]),
       model=st.integers(0, 2), target=st.sampled_from([0.02, 0.05, 0.2]))
def test_medha_priced_from_sums_is_medha_priced_from_arrays(seed, n, name, model, target):
    """Property: Medha's chunk search and slack from the draft's sums give the schedule and trace of the
    array path (``INFERMAX_PURE=1``), on random mixes of long and short prompts arriving online."""
    rng = np.random.default_rng(seed)
    ins = np.where(rng.random(n) < 0.2, rng.integers(8_000, 40_000, n), rng.integers(50, 3_000, n))
    outs = rng.integers(2, 200, n)
    w = Workload.from_lengths(ins, outs, np.cumsum(rng.exponential(0.3, n)), name="mix")
    lim = Limits(M=int(max(ins + outs)) * 3, C=10**7, P=int(rng.choice([2048, 4096])), R_max=64)
    cost = _linear_models()[model]
    sched = f"{name}:target_batch_s={target}"
    calls = [0]
    shipped = cost.batch_time

    def counted(*args):
        calls[0] += 1
        return shipped(*args)

    cost.batch_time = counted      # (on the instance: the class's method is the one work_timer checks)
    fast = simulate(w, sched, lim, cost)
    fast_calls, calls[0] = calls[0], 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERMAX_PURE", "1")
        pure = simulate(w, sched, lim, cost)
    assert fast_calls < calls[0]   # the sums priced the draft's probes and the slack
    assert fast.schedule == pure.schedule
    assert fast.trace == pure.trace


@settings(max_examples=300, deadline=None)
@given(model=st.integers(0, 2), data=st.data(), n=st.integers(1, 12), target=st.floats(0.005, 0.5),
       limit=st.integers(1, 20_000), min_chunk=st.integers(1, 64))
def test_the_chunk_search_from_the_solved_bound_is_the_bisection(model, data, n, target, limit, min_chunk):
    """The largest chunk within the target, searched from sums and the solved bound, is the plain bisection's
    over the draft's arrays (no timer), for random drafts of decodes and chunks and a probed request."""
    from infermax.schedulers.longctx import BatchDraft, SumsDraft
    cost = _linear_models()[model]
    ins = data.draw(st.lists(st.integers(2, 60_000), min_size=n + 1, max_size=n + 1))
    state = ServingState(make_workload([(i, 8) for i in ins]), Limits(M=10**7, C=10**7), cost)
    state.m[:] = [data.draw(st.integers(0, i - 1)) for i in ins]
    drafts = [SumsDraft(state, 10**6, None, cost.work_timer()), BatchDraft(state, 10**6)]
    decodes = np.array([k for k in range(n) if data.draw(st.booleans())], dtype=np.int64)
    chunks = [(k, data.draw(st.integers(1, 4096))) for k in range(n) if k not in decodes.tolist()]
    for d in drafts:
        d.add_decodes(decodes)
        for k, c in chunks:
            d.add_prefill(k, c)
    got = [d.largest_chunk(n, limit, target, min_chunk) for d in drafts]
    assert got[0] == got[1]
