"""The simulator's hot path takes shortcuts (fused rule checks, Python-int sums, a decode batch written
without its Batch, an active set filtered only after completions); each gives what the plain way gives."""
import numpy as np
import pytest
from factories import make_workload

from infermax import Batch, Limits, Schedule, ScheduleError, Workload, replay
from infermax.costmodel import LinearCoefficients, LinearCostModel
from infermax.engine import ReplicaRunner, _BatchList
from infermax.schedule import ScheduleWriter
from infermax.schedulers import get_scheduler
from infermax.state import DONE, RUNNING, WAITING, ServingState
from infermax.trace import TraceRecorder


@pytest.mark.parametrize("ids,tokens,rule,who", [
    ([0, 1, 0], [2, 2, 2], "duplicate", 0),            # a repeat that is not next to its first
    ([1, 2, 0, 2], [2, 2, 2, 1], "duplicate", 2),
    ([0, 1], [2, 0], "tokens", 1),
])
def test_fused_request_checks_name_the_rule_and_request(ids, tokens, rule, who):
    with pytest.raises(ScheduleError) as err:
        replay(Schedule((Batch(ids=ids, tokens=tokens),)), make_workload([(2, 2)] * 3), Limits(M=100, C=16))
    assert err.value.rule == rule and err.value.request_id == who


def test_a_finished_request_is_named_by_the_byte_counted_status_check():
    """A finished request in a later batch is named, as before the statuses were counted from their bytes."""
    w = make_workload([(2, 2), (2, 3)])
    s = Schedule((Batch(ids=[0, 1], tokens=[2, 2]), Batch(ids=[0, 1], tokens=[1, 1]), Batch(ids=[0, 1], tokens=[1, 1])))
    with pytest.raises(ScheduleError, match=r"batch 2, request 0: \[finished\] request is finished"):
        replay(s, w, Limits(M=100, C=16))


@pytest.mark.parametrize("coefficients", [LinearCoefficients(),
                                          LinearCoefficients(prefill_token_s=1e-6, request_s=2e-5)])
def test_one_prefill_among_decodes_costs_what_the_array_formula_gives(coefficients):
    """Integer inputs with one prefill take Python-int sums; float inputs take the array path: the same time."""
    cost = LinearCostModel(coefficients)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        kv = rng.integers(0, 20_000, n)
        dec = np.ones(n, dtype=bool)
        dec[rng.integers(0, n)] = rng.random() < 0.1   # one prefill (or none)
        tok = np.where(dec, 1, rng.integers(1, 2048, n))
        assert cost.batch_time(tok, kv, dec) == cost.batch_time(tok.astype(float), kv.astype(float), dec)


def test_a_decode_batch_is_written_as_its_batch(tmp_path):
    ids = np.array([5, 12, 7], dtype=np.int64)
    with ScheduleWriter(tmp_path / "a.json", {"x": 1}) as a, ScheduleWriter(tmp_path / "b.json", {"x": 1}) as b:
        for repeat in (1, 3, 0, 2):
            a.add_decode(ids, repeat)
            b.add(Batch(ids=ids, tokens=np.ones(3, dtype=np.int64)), repeat)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert len(Schedule.from_json(tmp_path / "a.json")) == 6


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi"])
def test_the_active_set_is_the_arrived_unfinished_requests_after_every_batch(scheduler):
    """``ServingState.active`` skips its DONE filter when nothing finished since it was built."""
    w = Workload.from_spec("fixed:I=40,O=30,B=60,rate=40")
    lim = Limits(M=600, C=256)
    sched = get_scheduler(scheduler)
    state = ServingState(w, lim, LinearCostModel())
    sched.reset(state)
    runner = ReplicaRunner(state, sched, _BatchList(), TraceRecorder(), w.ids)
    checks = 0
    while not state.is_finished:
        if not runner.step():
            runner.wait_until(state.next_arrival_s)
        st = state.status[state.arrival_order]
        expect = state.arrival_order[(st == WAITING) | (st == RUNNING)]
        assert np.array_equal(state.active, expect)
        assert not np.count_nonzero(state.status[state.active] == DONE)
        checks += 1
    assert checks > 50


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi", "sarathi-real", "rank-i", "rank-org"])
def test_the_running_and_waiting_sets_are_the_active_set_split_by_status(scheduler):
    """``GetNextBatch`` takes the waiting requests as the tail of the active set when they are there, and
    returns the decodes of a decode-priority scheduler unsplit when all run decodes: what the masks give."""
    w = Workload.from_spec("mix:LILO+SISO+SILO,B=60,rate=60,seed=3")
    lim = Limits(M=3000, C=1100)
    sched = get_scheduler(scheduler)
    state = ServingState(w, sched.limits_for(lim), LinearCostModel())
    sched.reset(state)
    runner = ReplicaRunner(state, sched, _BatchList(), TraceRecorder(), w.ids)
    seen = set()
    while not state.is_finished:
        running, waiting, _ = sched._sets(state)
        order = np.concatenate((running, waiting))
        order = order[np.argsort(sched._pos[order])]
        st = state.status[order]
        assert np.array_equal(running, order[st == RUNNING]) and np.array_equal(waiting, order[st == WAITING])
        assert np.array_equal(np.sort(order), np.sort(state.active))
        if sched.policy.priority == "decode":
            dec = state.m[running] >= state.inp[running]
            groups = sched.group_requests(state)
            assert np.array_equal(groups[0][0], running[dec]) and np.array_equal(groups[1][0], running[~dec])
        seen.add((bool(waiting.size), bool(running.size)))
        if not runner.step():
            runner.wait_until(state.next_arrival_s)
    assert seen >= {(True, True), (False, True)}


def test_a_batch_of_the_last_ids_or_their_tail_is_written_as_ever(tmp_path):
    """The writer reuses the last batch's ids text for the same ids or their tail; any other ids are formatted."""
    def decode(*ids):
        return Batch(ids=list(ids), tokens=[1] * len(ids)), True
    batches = [decode(3, 10, 7, 12), decode(3, 10, 7, 12),
               (Batch(ids=[3, 10, 7, 12], tokens=[2, 1, 1, 1], evict=[9], not_before_s=1.5), False),
               decode(7, 12), decode(12), decode(12, 5), decode(5), (Batch(ids=[], tokens=[]), False),
               decode(40, 5), decode(5), decode(5, 5), decode(-5)]
    with ScheduleWriter(tmp_path / "s.json", {}) as w:
        for b, is_decode in batches:
            if is_decode:
                w.add_decode(b.ids, 2)
            else:
                w.add(b, 2)
    expect = Schedule(tuple(b for b, _ in batches for _ in range(2)), {})
    assert (tmp_path / "s.json").read_text() == expect.to_json()


def test_a_batch_of_the_last_ids_less_a_head_plus_a_tail_is_written_as_ever(tmp_path):
    """Random batches made from the last one (its head dropped, ids appended, or anything else, repeats
    included) with random tokens (leading ones among them): the writer, reusing the text of the ids kept
    from the last two batches, writes what ``Schedule.to_json`` writes."""
    rng = np.random.default_rng(11)
    ids, batches = [3, 10, 7], []
    for _ in range(400):
        r = rng.random()
        if r < 0.3:
            ids = ids[int(rng.integers(0, len(ids) + 1)):]
        elif r < 0.4 and len(batches) > 1:     # the batch before the last, its head dropped
            ids = batches[-2][0].ids.tolist()[int(rng.integers(0, 3)):]
        if r < 0.7 or not ids:
            ids = ids + rng.integers(-3, 60, int(rng.integers(0 if ids else 1, 4))).tolist()
        elif r < 0.8:
            ids = rng.permutation(ids).tolist()
        elif r < 0.9:
            ids = [int(rng.integers(0, 5))] * int(rng.integers(1, 4))
        decode = rng.random() < 0.6
        tokens = [1] * len(ids) if decode else rng.integers(1, 600, len(ids)).tolist()
        if not decode and rng.random() < 0.5:     # leading decodes (a hybrid batch), or ones anywhere
            ones = int(rng.integers(0, len(ids) + 1))
            tokens = [1] * ones + tokens[ones:] if rng.random() < 0.7 else [t if t % 3 else 1 for t in tokens]
        batches.append((Batch(ids=ids, tokens=tokens), decode))
    with ScheduleWriter(tmp_path / "s.json", {}) as w:
        for b, decode in batches:
            if decode:
                w.add_decode(b.ids, 1)
            else:
                w.add(b)
    assert (tmp_path / "s.json").read_text() == Schedule(tuple(b for b, _ in batches), {}).to_json()


_STATE_ARRAYS = ("m", "inp", "gen", "status", "first_scheduled_s", "first_token_s", "completion_s", "num_evictions",
                 "refill_tokens", "num_suspensions", "_last_batch")
_STATE_VALUES = ("kv_used", "blocks_used", "num_running", "num_done", "num_batches", "clock_s", "version",
                 "prefill_tokens_left", "decode_tokens_left")


def _same_outcome(states, apply, errors: set) -> None:
    """``apply`` on both ``states``: the same result or the same error (its rule added to ``errors``),
    and the same state afterwards, array by array and value by value."""
    outcomes = []
    for state in states:
        try:
            outcomes.append(apply(state))
        except ScheduleError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    if isinstance(outcomes[0], str):
        errors.add(outcomes[0].split("[")[1].split("]")[0])
    a, b = states
    for name in _STATE_ARRAYS:
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert [getattr(a, k) for k in _STATE_VALUES] == [getattr(b, k) for k in _STATE_VALUES]


@pytest.mark.parametrize("block_size", [1, 4])
def test_a_batch_of_one_request_is_judged_and_committed_as_any_batch(block_size):
    """``apply`` takes batches of one request in Python ints; with an (empty) ``extra`` it takes the array
    path: the same results, the same errors and the same state after random valid and invalid batches."""
    rng = np.random.default_rng(7)
    w = make_workload([(int(rng.integers(1, 10)), int(rng.integers(1, 7))) for _ in range(12)],
                      arrivals=sorted(rng.uniform(0, 0.05, 12).tolist()))
    lim = Limits(M=16, C=9, P=7, R_max=4, block_size=block_size)
    one, arrays = ServingState(w, lim, LinearCostModel()), ServingState(w, lim, LinearCostModel())
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
    errors = set()
    for _ in range(600):
        i = int(rng.integers(0, 12))
        left = int(one.inp[i] - one.m[i])
        c = int(rng.choice([0, 1, 1, 2, max(left, 1), left + 1, int(rng.integers(1, 12))]))
        running = np.flatnonzero(one.status == RUNNING)
        evict = running[:1] if running.size and rng.random() < 0.1 else np.zeros(0, dtype=np.int64)
        idx, tokens = np.array([i]), np.array([c])
        _same_outcome((one, arrays), lambda state: state.apply(idx, tokens, evict.copy(), 0.0,
                                                               None if state is one else empty), errors)
        if one.is_finished:
            break
    assert {"finished", "tokens", "decode-chunk", "prefill-chunk", "P"} <= errors and errors & {"M", "M-blocks"}


class _MaskedChunkCheck(ServingState):
    """Checks the chunks of every batch with the masks (no shortcut from the sums)."""

    def _check_chunks(self, j, idx, tokens, m0, inp0, m1, is_decode, num_tokens, num_decode, one):
        super()._check_chunks(j, idx, tokens, m0, inp0, m1, is_decode, num_tokens, -1, -1)


def test_the_chunks_of_a_batch_of_decodes_and_one_refill_are_judged_as_by_the_masks():
    """``apply`` checks the chunks of a batch whose requests all decode, or all but one, from the token sums:
    the same results, the same errors and the same state as the masks after random valid and invalid batches."""
    rng = np.random.default_rng(5)
    w = make_workload([(int(rng.integers(1, 30)), int(rng.integers(2, 40))) for _ in range(12)])
    lim = Limits(M=300, C=60)
    fast, masked = ServingState(w, lim, LinearCostModel()), _MaskedChunkCheck(w, lim, LinearCostModel())
    errors, kinds = set(), set()       # error rules; numbers of (re)fills per batch
    for _ in range(1000):
        active = fast.active
        if active.size < 2:
            break
        idx = rng.permutation(active)[:int(rng.integers(2, active.size + 1))]
        left = fast.inp[idx] - fast.m[idx]
        tokens = np.where(left > 0, rng.integers(1, np.maximum(left, 1) + 1), 1)
        kinds.add(int(np.count_nonzero(left > 0)))
        if rng.random() < 0.2:          # a decode of 2 tokens, or a chunk past the input
            bad = int(rng.choice(np.flatnonzero(left > 0))) if rng.random() < 0.5 and left.max() > 0 else 0
            tokens[bad] = left[bad] + 1 if left[bad] > 0 else 2
        _same_outcome((fast, masked), lambda state: state.apply(idx, tokens, np.zeros(0, dtype=np.int64)), errors)
    assert fast.num_done >= 10 and {"decode-chunk", "prefill-chunk"} <= errors and {0, 1, 2} <= kinds


class _StepByStep(LinearCostModel):
    def batch_time(self, tokens, kv_before, is_decode):      # the same times, not the closed form's code
        return LinearCostModel.batch_time(self, tokens, kv_before, is_decode)


@pytest.mark.parametrize("cost", [LinearCostModel(), LinearCostModel(LinearCoefficients(request_s=2e-5)),
                                  _StepByStep()])
def test_decode_run_starts_are_the_decode_run_times_added_up_to_the_stop(cost):
    from bisect import bisect_left
    from itertools import accumulate
    rng = np.random.default_rng(3)
    for _ in range(200):
        kv = rng.integers(0, 5000, int(rng.integers(1, 60)))
        steps = int(rng.integers(1, 80))
        start = float(rng.uniform(0, 100))
        times = cost.decode_run_times(kv, steps).tolist()
        starts = list(accumulate(times, initial=start))
        stop = None if rng.random() < 0.2 else float(start + rng.uniform(-0.01, sum(times) * 1.2))
        k = steps if stop is None else bisect_left(starts, stop, 0, steps)
        assert cost.decode_run_starts(kv, steps, start, stop) == (times[:k], starts[:k + 1])


def test_a_batch_timed_from_its_sums_takes_the_time_batch_time_gives():
    """``apply`` times a batch of decodes and at most one (re)fill from its sums (Σ m is the KV in use when
    every running request is in it); a cost model whose ``batch_time`` is its own takes the arrays: the same
    times, errors and state after random batches (all the running requests or some, after evictions too)."""
    rng = np.random.default_rng(13)
    w = make_workload([(int(rng.integers(1, 30)), int(rng.integers(2, 40))) for _ in range(14)])
    lim = Limits(M=400, C=80)
    sums, arrays = ServingState(w, lim, LinearCostModel()), ServingState(w, lim, _StepByStep())
    assert sums._timer is not None and arrays._timer is None
    errors, kinds = set(), set()
    for _ in range(1500):
        active = sums.active
        if not active.size:
            break
        st = sums.status[active]
        running, waiting = active[st == RUNNING], active[st == WAITING]
        evict = np.zeros(0, dtype=np.int64)
        if running.size > 1 and rng.random() < 0.15:
            evict, running = running[-1:], running[:-1]
        if rng.random() < 0.6:     # every running request, and maybe one waiting
            idx = np.concatenate((running, rng.permutation(waiting)[:int(rng.integers(0, 2))]))
        else:
            idx = rng.permutation(np.setdiff1d(active, evict))[:int(rng.integers(1, active.size + 1))]
        if not idx.size:
            continue
        left = sums.inp[idx] - sums.m[idx]
        left[sums.status[idx] == WAITING] = sums.inp[idx][sums.status[idx] == WAITING]
        tokens = np.where(left > 0, rng.integers(1, np.maximum(left, 1) + 1), 1)
        if rng.random() < 0.05 and (left <= 0).any():        # a decode of 2 tokens
            tokens[int(rng.choice(np.flatnonzero(left <= 0)))] = 2
        whole = np.isin(running, idx).all()
        kinds.add((bool(whole), int(np.count_nonzero(left > 0))))
        m0, dec, ran = sums.m[idx].astype(float), sums.m[idx] >= sums.inp[idx], []

        def apply(state):
            out = state.apply(idx, tokens, evict.copy())
            if state is sums:
                ran.append(out)
            return out
        _same_outcome((sums, arrays), apply, errors)
        if ran:     # the sums against the array formula (float inputs: no sum taken from the state)
            _, duration, record = ran[0]
            assert record.num_tokens == int(tokens.sum())
            assert duration == arrays.cost.batch_time(tokens.astype(float), m0, dec)
    assert sums.num_done >= 10 and {(True, 0), (True, 1), (False, 0), (False, 1)} <= kinds
    assert "decode-chunk" in errors


def test_a_decode_run_timed_from_its_sums_is_the_one_the_array_formula_gives():
    """``apply_decode_run`` keeps the run's Σ m in Python ints (kv_used when the run holds every running
    request) and reads its completions off the sorted batches left; a cost model whose ``batch_time`` is its
    own times the run from the arrays: the same segments, errors and state after random runs of all the
    running requests or some of them."""
    rng = np.random.default_rng(17)
    w = make_workload([(int(rng.integers(1, 20)), int(rng.integers(2, 30))) for _ in range(16)],
                      arrivals=sorted(rng.uniform(0, 0.2, 16).tolist()))
    lim = Limits(M=500, C=64)
    sums, arrays = ServingState(w, lim, LinearCostModel()), ServingState(w, lim, _StepByStep())
    assert sums._run_timer is not None and arrays._run_timer is None
    none = np.zeros(0, dtype=np.int64)
    errors, kinds = set(), set()
    for _ in range(600):
        if sums.is_finished:
            break
        active = sums.active
        if not active.size:
            nxt = sums.next_arrival_s
            for state in (sums, arrays):
                state.advance_clock(nxt)
            continue
        st = sums.status[active]
        running, waiting = active[st == RUNNING], active[st == WAITING]
        if waiting.size and (rng.random() < 0.4 or not running.size):    # a prompt, whole, beside the decodes
            idx = np.concatenate((running, waiting[:1]))
            tokens = np.ones(idx.size, dtype=np.int64)
            tokens[-1] = sums.inp[waiting[0]]
            _same_outcome((sums, arrays), lambda state: state.apply(idx, tokens, none), errors)
            continue
        run = running if rng.random() < 0.6 else rng.permutation(running)[:int(rng.integers(1, running.size + 1))]
        steps = int(rng.integers(1, 40))
        kinds.add(bool(run.size == sums.num_running))
        _same_outcome((sums, arrays), lambda state: [
            (g.idx.tolist(), g.num_batches, g.starts_s, g.durations_s, list(g.kv_tokens), g.num_running)
            for g in state.apply_decode_run(run, steps)], errors)
    assert sums.is_finished and kinds == {True, False}
