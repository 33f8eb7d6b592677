"""Issue 19 §3: per-batch work follows the active requests, not the trace; streamed schedules.

Three checks, none of them timed:
- the active-set path (``ServingState.active``, the schedulers' scans of it) gives the same
  schedules and traces as a deliberately simple reference that scans the whole workload
  by status every batch (the implementation before the active set);
- while the simulation runs, no scheduler decision and no state transition touches an array
  the size of the workload (a watched array raises on any full-size NumPy operation), and
  the scheduler is handed exactly the arrived, unfinished requests;
- ``simulate(..., schedule_path=...)`` writes the bytes ``Schedule.to_json`` writes, and the
  trace and metrics do not change.
"""
from __future__ import annotations

import numpy as np
import pytest
from factories import ALL_SCHEDULERS
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, Schedule, Workload, simulate
from infermax.schedule import ScheduleWriter
from infermax.schedulers.framework import GetNextBatch
from infermax.state import DONE, FUTURE, RUNNING, WAITING, ServingState

# --- the reference: scan every request by status, every batch -------------------------------


def _active_by_scan(self: ServingState) -> np.ndarray:
    order = self.arrival_order
    st = self.status[order]
    return order[(st == WAITING) | (st == RUNNING)]


def _sets_by_scan(self: GetNextBatch, state: ServingState):
    """GetNextBatch._sets as it was: a status mask over the whole priority order."""
    st = state.status[self._order]
    run, wait = st == RUNNING, st == WAITING
    active = self._order[run | wait] if self.policy.priority == "rank" else None
    self._version = state.version
    self._running, self._waiting, self._active = self._order[run], self._order[wait], active
    return self._running, self._waiting, self._active


@st.composite
def online_instances(draw):
    """Requests arriving out of index order, with ties; tight M forces evictions."""
    n = draw(st.integers(2, 14))
    ins = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    arrivals = draw(st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.02, 0.05, 0.3]), min_size=n, max_size=n))
    peak = max(i + o - 1 for i, o in zip(ins, outs))
    M = draw(st.integers(peak, peak + 80))
    C = draw(st.integers(max(ins) + max(outs), 130))
    R_max = draw(st.one_of(st.none(), st.integers(1, n)))
    return Workload.from_lengths(ins, outs, arrivals, name="shuffled"), Limits(M=M, C=C, R_max=R_max)


def _run(workload, name, limits):
    try:
        return simulate(workload, name, limits)
    except Exception as exc:  # noqa: BLE001 - a refusal must be the same refusal
        return f"{type(exc).__name__}: {exc}"


def _same(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert a.schedule == b.schedule
    assert a.trace == b.trace, a.trace.diff(b.trace)


def _check_against_scan(workload, limits, names) -> None:
    fast = {name: _run(workload, name, limits) for name in names}
    mp = pytest.MonkeyPatch()
    mp.setattr(ServingState, "active", property(_active_by_scan))
    mp.setattr(GetNextBatch, "_sets", _sets_by_scan)
    try:
        for name in names:
            _same(fast[name], _run(workload, name, limits))
    finally:
        mp.undo()


QUICK = ["vllm", "sarathi", "vllm-la", "rank-i", "medha", "pecsched"]


def test_active_set_equals_a_full_scan():
    """Arrivals out of index order and tied, evictions, a running cap: one fixed instance."""
    rng = np.random.default_rng(7)
    n = 40
    arrivals = rng.choice([0.0, 0.01, 0.05, 0.1, 0.4], size=n)
    workload = Workload.from_lengths(rng.integers(1, 40, n), rng.integers(1, 40, n), arrivals, name="shuffled")
    limits = Limits(M=140, C=96, R_max=9)
    evicted = simulate(workload, "vllm", limits).metrics["num_evictions"]
    assert evicted > 0 and not np.all(np.diff(workload.arrivals_s) >= 0)
    _check_against_scan(workload, limits, QUICK)


@pytest.mark.slow
@settings(max_examples=8)
@given(inst=online_instances())
def test_active_set_equals_a_full_scan_for_every_scheduler(inst):
    _check_against_scan(*inst, ALL_SCHEDULERS)


# --- no full-size scan while simulating -----------------------------------------------------

class _Watched(np.ndarray):
    """An array that refuses any NumPy operation on it while ``limit`` is set and it is that large."""

    limit: int | None = None

    @classmethod
    def _check(cls, args) -> None:
        if cls.limit is not None:
            for a in args:
                if isinstance(a, np.ndarray) and a.size >= cls.limit:
                    raise AssertionError(f"a per-batch step used a full-size array ({a.size} values)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        self._check(inputs + tuple(kwargs.get("out", ())))
        args = [np.asarray(a) if isinstance(a, _Watched) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(a) if isinstance(a, _Watched) else a for a in kwargs["out"])
        return getattr(ufunc, method)(*args, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        flat = [a for x in args for a in (x if isinstance(x, (list, tuple)) else (x,))]
        self._check(flat)
        return super().__array_function__(func, (np.ndarray,), args, kwargs)


WATCHED = ("status", "m", "inp", "gen", "input_lens", "output_lens", "arrivals_s", "peak_kv",
           "first_scheduled_s", "first_token_s", "completion_s", "num_evictions", "refill_tokens",
           "num_suspensions")


@pytest.mark.parametrize("name", ["vllm", "sarathi", "medha"] + [
    pytest.param(n, marks=pytest.mark.slow) for n in ("sarathi-nohy", "vllm-la", "sarathi-ef", "rank-i",
                                                      "pecsched", "sarathi-la", "vllm-hy")])
def test_per_batch_work_never_touches_finished_or_future_requests(name, monkeypatch):
    B = 150
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(0.1, size=B))
    workload = Workload.from_lengths(rng.integers(8, 64, B), rng.integers(2, 12, B), arrivals, name="sparse")
    limits = Limits(M=2000, C=256)
    sizes: list[int] = []
    init, apply, run = ServingState.__init__, ServingState.apply, ServingState.apply_decode_run

    def watched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for field in WATCHED:
            setattr(self, field, getattr(self, field).view(_Watched))

    def watching(fn):
        def wrapper(*args, **kwargs):
            _Watched.limit = B
            try:
                return fn(*args, **kwargs)
            finally:
                _Watched.limit = None
        return wrapper

    from infermax.schedulers import get_scheduler
    sched = get_scheduler(name)
    next_batch, decode_run = sched.next_batch, sched.decode_run

    def counted_next_batch(state):
        act = np.asarray(state.active)
        st = np.asarray(state.status)
        expect = np.flatnonzero((st == WAITING) | (st == RUNNING))
        assert np.array_equal(np.sort(act), expect)        # exactly the arrived, unfinished requests
        assert not np.isin(np.asarray(st)[act], (FUTURE, DONE)).any()
        sizes.append(act.size)
        return watching(next_batch)(state)

    sched.next_batch, sched.decode_run = counted_next_batch, watching(decode_run)
    monkeypatch.setattr(ServingState, "__init__", watched_init)
    monkeypatch.setattr(ServingState, "apply", watching(apply))
    monkeypatch.setattr(ServingState, "apply_decode_run", watching(run))
    result = simulate(workload, sched, limits)
    assert result.metrics["num_requests"] == B
    assert len(sizes) >= B and max(sizes) < B // 10   # the scheduler saw a few requests, never the trace


# --- streamed schedules -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["vllm", "sarathi", "sarathi-la", "medha"] + [
    pytest.param(n, marks=pytest.mark.slow) for n in ("vllm-ef", "rank-o", "pecsched-fifo")])
def test_streamed_schedule_is_the_in_memory_one(name, tmp_path):
    rng = np.random.default_rng(4)
    arrivals = np.cumsum(rng.exponential(0.01, size=60))
    workload = Workload.from_lengths(rng.integers(8, 200, 60), rng.integers(4, 60, 60), arrivals, name="online")
    limits = Limits(M=600, C=512)
    mem = simulate(workload, name, limits)
    path = tmp_path / "schedule.json"
    streamed = simulate(workload, name, limits, schedule_path=path)
    assert streamed.schedule is None and streamed.schedule_path == path
    assert path.read_text() == mem.schedule.to_json()
    assert Schedule.from_json(path) == mem.schedule
    assert streamed.trace == mem.trace
    assert streamed.metrics.keys() == mem.metrics.keys()
    assert all(streamed.metrics[k] == v or v != v for k, v in mem.metrics.items())
    assert mem.metrics["num_evictions"] > 0 or name in ("vllm-ef", "sarathi-la", "medha", "pecsched-fifo")


def test_schedule_writer_repeats_and_edge_cases(tmp_path):
    from infermax import Batch

    batches = [Batch(ids=[3, 1], tokens=[5, 1], evict=[7], not_before_s=1e-05),
               Batch(ids=[2], tokens=[1]), Batch(ids=[2], tokens=[1]), Batch(ids=[2], tokens=[1]),
               Batch(ids=[0, 4], tokens=[1, 1], not_before_s=2.5)]
    meta = {"scheduler": {"name": "x"}, "note": "ü"}
    path = tmp_path / "s.json"
    with ScheduleWriter(path, meta) as w:
        w.add(batches[0])
        w.add(batches[1], repeat=3)
        w.add(batches[4], repeat=0)        # nothing
        w.add(batches[4])
    assert w.num_batches == 5
    assert path.read_text() == Schedule(tuple(batches), meta).to_json()
    with ScheduleWriter(tmp_path / "empty.json", {}) as w:
        pass
    assert (tmp_path / "empty.json").read_text() == Schedule((), {}).to_json()
    with pytest.raises(ValueError, match="cannot write schedule file"):
        ScheduleWriter(tmp_path / "missing" / "s.json", {})
