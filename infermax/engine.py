"""The simulator: Algorithm 1's outer loop (InferMax §3.1, lines 1-7).

plan (scheduler.next_batch) -> execute (cost model, inside ServingState.apply)
-> commit (ServingState.apply). Idle time is explicit: when nothing can run, the
clock jumps to the next arrival and the next batch records ``not_before_s``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import fastloop
from .costmodel import CostModel
from .inputs import resolve_inputs
from .metrics import metrics as compute_metrics
from .schedule import ScheduleWriter
from .state import DONE, WAITING, ServingState
from .state_view import StateView
from .trace import Trace, TraceRecorder
from .types import Batch, Limits, Schedule, Workload

_NO_IDS = np.zeros(0, dtype=np.int64)


class SchedulerStuckError(RuntimeError):
    """The scheduler returned no batch although requests are unfinished and none will arrive."""


@dataclass(frozen=True, eq=False)
class SimResult:
    """A simulated run: the Schedule it produced, its Trace and metrics.

    When the schedule was streamed to a file (``simulate(..., schedule_path=...)``),
    ``schedule`` is None and ``schedule_path`` names the file
    (``Schedule.from_json(result.schedule_path)`` reads it back).
    """

    schedule: Schedule | None
    trace: Trace
    metrics: dict[str, Any] = field(default_factory=dict)
    schedule_path: Path | None = None

    @property
    def batches_df(self):
        return self.trace.batch_frame()

    @property
    def requests_df(self):
        return self.trace.request_frame()


class _BatchList:
    """The in-memory counterpart of :class:`ScheduleWriter`: keeps every Batch (a repeated one once)."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self._ones = np.ones(0, dtype=np.int64)

    def add(self, batch: Batch, repeat: int = 1) -> None:
        if repeat == 1:
            self.batches.append(batch)
        else:
            self.batches.extend([batch] * repeat)

    def add_decode(self, ids: np.ndarray, repeat: int) -> None:
        """``repeat`` decode batches of the requests ``ids``: their tokens, ``n`` ones, are read-only
        and sliced from one array."""
        n = ids.size
        if self._ones.size < n:
            self._ones = np.ones(max(n, 2 * self._ones.size, 256), dtype=np.int64)
            self._ones.setflags(write=False)
        self.add(Batch.trusted(ids, self._ones[:n], _NO_IDS, 0.0), repeat)


def _stuck_message(state: ServingState, scheduler_name: str) -> str:
    act = state.active
    waiting = act[state.status[act] == WAITING]
    who = ""
    if waiting.size:
        i = int(waiting.min())
        who = (f"; first waiting request {int(state.workload.ids[i])} needs {int(state.inp[i])} "
               f"prefill tokens (C = {state.limits.C}, P = {state.limits.P}) and KV for "
               f"{int(state.inp[i])} tokens (free {state.limits.M - state.kv_used} of M = {state.limits.M})")
    return (f"scheduler {scheduler_name!r} scheduled nothing at t = {state.clock_s:.6g} s with "
            f"{state.num_requests - state.num_done} requests unfinished and none arriving{who}")


def simulate(workload: "Workload | str", scheduler: Any = "vllm", limits: "Limits | str | None" = None,
             cost: "CostModel | str | None" = None,
             progress: Callable[[int, int], None] | None = None, fast_forward: bool = True,
             schedule_path: "str | Path | None" = None, read_only_state: bool = False,
             compiled: bool | None = None) -> SimResult:
    """Run ``scheduler`` on ``workload`` under ``limits``, timing batches with ``cost``.

    ``progress(done, total)`` is called every 256 batches (the CLI draws a bar).
    ``fast_forward`` applies runs of decode batches at once when the scheduler
    promises them (``Scheduler.decode_run``), through the completions of their
    requests; the result is the same schedule and trace, bit for bit, only faster.
    ``schedule_path``: stream the schedule to this JSON file as it is built (the
    same bytes ``Schedule.to_json`` writes) instead of keeping a Batch per batch in
    memory — for traces of millions of requests; the result's ``schedule`` is then
    None (its meta is taken before the run, not after). The trace and metrics are
    the same either way.
    ``read_only_state``: the scheduler sees the state through a :class:`~infermax.state_view.StateView`
    (read-only arrays, no transitions), so a scheduler that writes to it fails naming what it touched;
    the same schedule otherwise, slower (the test suite runs every registered scheduler so).
    ``compiled``: run compiled code (numba) where it covers the run — the whole loop for vLLM, Sarathi, their
    variants and ``-real`` presets (:mod:`infermax.fastloop`), the state's ``apply`` steps and Medha's planner for
    the others — the same schedule and trace, bit for bit, several times faster. None (the default): each path for
    runs above its size threshold (``fastloop.MIN_OUTPUT_TOKENS`` output tokens for the loop); True: whenever it
    covers the run; False: never (the reference path, as ``INFERMAX_PURE=1`` in the environment;
    :mod:`infermax.compiled`). The loop needs ``fast_forward`` and not ``read_only_state``.
    """
    from infermax.schedulers import get_scheduler

    workload, limits, cost = resolve_inputs(workload, limits, cost)
    sched = get_scheduler(scheduler)
    limits = sched.limits_for(limits)        # a preset's KV block size (the meta records it)
    state = ServingState(workload, limits, cost, compiled=compiled)
    sched.reset(StateView(state) if read_only_state else state)
    ids = workload.ids
    recorder = TraceRecorder()
    out = _BatchList() if schedule_path is None else ScheduleWriter(schedule_path, _meta(sched, workload, limits, cost))
    try:
        spec = fastloop.spec_for(state, sched, compiled) if fast_forward and not read_only_state else None
        if spec is not None:
            _run_compiled(state, sched, spec, out, recorder, ids, progress)
        else:
            _run(state, sched, out, recorder, ids, progress, fast_forward, read_only_state)
    finally:
        if isinstance(out, ScheduleWriter):
            out.close()
    trace = recorder.finish(state)
    if isinstance(out, ScheduleWriter):
        return SimResult(schedule=None, trace=trace, metrics=compute_metrics(trace), schedule_path=out.path)
    schedule = Schedule(tuple(out.batches), _meta(sched, workload, limits, cost))
    return SimResult(schedule=schedule, trace=trace, metrics=compute_metrics(trace))


def _meta(sched: Any, workload: Workload, limits: Limits, cost: CostModel) -> dict[str, Any]:
    return {"scheduler": sched.describe(), "workload": workload.name, "limits": limits.to_dict(),
            "cost": cost.describe()}


class ReplicaRunner:
    """One replica's loop body — plan (scheduler) -> execute and commit (state.apply) -> record.

    The simulator drives one runner; the cluster engine (infermax.cluster) drives one per
    replica through the same :meth:`step`, so the two share every line of batch construction.

    A fast-forwarded decode run that the next arrival (or the cluster's ``horizon_s``) cut short
    is remembered; if nothing touched the state since, the next :meth:`step` continues it
    instead of asking the scheduler again — the scheduler promised those batches
    (``Scheduler.decode_run``), so they are the batches it would plan, bit for bit.
    """

    def __init__(self, state: ServingState, sched: Any, out: "_BatchList | ScheduleWriter",
                 recorder: TraceRecorder, ids: np.ndarray, fast_forward: bool = True, read_only: bool = False) -> None:
        self.state, self.sched, self.out, self.recorder, self.ids = state, sched, out, recorder, ids
        self.seen = StateView(state) if read_only else state      # what the scheduler is handed
        self.fast_forward = fast_forward
        self.not_before = 0.0
        self._cut: tuple[np.ndarray, int, tuple] | None = None   # (requests, batches left, state stamp)

    def step(self, extra: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None) -> bool:
        """Run the next batch (True), or say that nothing can run now (False).

        ``extra``: work of the cluster layer riding in this batch (``ServingState.apply``); such a
        batch is never fast-forwarded."""
        state, sched, ids = self.state, self.sched, self.ids
        if self._cut is not None:
            (run, steps, stamp), self._cut = self._cut, None
            if extra is None and self.not_before == 0.0 and stamp == self._stamp():
                self._resume(run, steps)
                return True
        plan = sched.next_batch(self.seen)
        if plan.idx.size == 0:
            if plan.evict.size:
                raise SchedulerStuckError(f"scheduler {sched.name!r} evicted requests but scheduled none "
                                          f"(batch {state.num_batches})")
            return False
        not_before = self.not_before
        start, duration, record = state.apply(plan.idx, plan.tokens, plan.evict, not_before, extra)
        batch = Batch.trusted(ids[plan.idx], plan.tokens, ids[plan.evict] if plan.evict.size else _NO_IDS, not_before)
        self.out.add(batch)
        self.recorder.add(start, duration, record)
        self.not_before = 0.0
        if self.fast_forward and extra is None:
            run, steps = sched.decode_run(self.seen, plan)
            if steps > 0:
                self._decodes(run, steps)
            elif not state.hands_off:
                hybrid = getattr(sched, "hybrid_run", None)
                run, chunk, steps = hybrid(self.seen, plan) if hybrid is not None else (run, 0, 0)
                if steps > 0:
                    self._hybrid(run, chunk, steps)
        return True

    def _hybrid(self, run: np.ndarray, chunk: int, steps: int) -> None:
        """Apply and record up to ``steps`` promised hybrid batches (the decodes ``run[:-1]`` and ``chunk`` tokens
        of the (re)fill ``run[-1]``), stopping before the first that would start at or after the next arrival
        (the scheduler looks again then). In closed form when the state can (``apply_hybrid_run``), else one
        by one through ``apply``, which names a broken rule."""
        state, ids = self.state, self.ids
        seg = state.apply_hybrid_run(run, chunk, steps)
        if seg is not None:
            if seg.num_batches:
                self.out.add(Batch.trusted(ids[run], seg.tokens, _NO_IDS, 0.0), seg.num_batches)
                self.recorder.add_hybrid_segment(seg)
            return
        tokens = np.ones(run.size, dtype=np.int64)
        tokens[-1] = chunk
        for _ in range(steps):
            nxt = state.next_arrival_s
            if nxt is not None and state.clock_s >= nxt:
                return
            start, duration, record = state.apply(run, tokens, _NO_IDS)
            self.out.add(Batch.trusted(ids[run], tokens, _NO_IDS, 0.0))
            self.recorder.add(start, duration, record)

    def _decodes(self, run: np.ndarray, steps: int) -> bool:
        """Apply and record up to ``steps`` promised decode batches of ``run``. When the horizon cut them
        short, the rest is remembered for :meth:`step`; when a request arrived, the promise is void.
        Whether the promise still holds after these batches."""
        state, ids, done = self.state, self.ids, 0
        pending = state.num_pending
        for seg in state.apply_decode_run(run, steps):
            self.out.add_decode(ids[seg.idx], seg.num_batches)
            self.recorder.add_decode_segment(seg)
            done += seg.num_batches
        if state.num_pending != pending:
            return False                 # an arrival was admitted: the scheduler must look again
        if done < steps:
            left = run[state.status[run] != DONE]
            if left.size:
                self._cut = (left, steps - done, self._stamp())
        return True

    def _resume(self, run: np.ndarray, steps: int) -> None:
        """Continue a cut decode run. Its next batch runs whatever comes next, as a planned batch would
        (``apply`` does not look ahead); the ones after it stop at the next arrival, as ever."""
        state = self.state
        nxt = state.next_arrival_s
        if nxt is not None and nxt <= state.clock_s:
            horizon, state.horizon_s = state.horizon_s, None     # (own arrivals are all later than the clock)
            try:
                holds = self._decodes(run, 1)
            finally:
                state.horizon_s = horizon
            run, steps = run[state.status[run] != DONE], steps - 1
            if not (holds and steps and run.size):
                return
        self._decodes(run, steps)

    def _stamp(self) -> tuple:
        """What a cut run's promise rests on: no batch, status change, dispatch, clock move or KV hold since."""
        st = self.state
        return st.num_batches, st.version, st.num_pending, st.clock_s, st.external_kv

    def wait_until(self, time_s: float) -> None:
        """Idle until ``time_s``; the next batch records it as ``not_before_s``."""
        self.state.advance_clock(time_s)
        self.not_before = time_s


def _run_compiled(state: ServingState, sched: Any, spec: "fastloop.LoopSpec", out: "_BatchList | ScheduleWriter",
                  recorder: TraceRecorder, ids: np.ndarray, progress: Callable[[int, int], None] | None) -> None:
    """The loop of :func:`_run`, compiled (:func:`infermax.fastloop.run`), with the same errors."""
    code = fastloop.run(state, spec, out, recorder, ids, progress)
    if code == fastloop.STUCK:
        raise SchedulerStuckError(_stuck_message(state, sched.name))
    if code == fastloop.EVICTED_NONE:
        raise SchedulerStuckError(f"scheduler {sched.name!r} evicted requests but scheduled none "
                                  f"(batch {state.num_batches})")


def _run(state: ServingState, sched: Any, out: "_BatchList | ScheduleWriter", recorder: TraceRecorder,
         ids: np.ndarray, progress: Callable[[int, int], None] | None, fast_forward: bool,
         read_only: bool = False) -> None:
    """The loop: run batches until every request is done, idling until the next arrival when none can run."""
    runner = ReplicaRunner(state, sched, out, recorder, ids, fast_forward, read_only)
    while not state.is_finished:
        if not runner.step():
            nxt = state.next_arrival_s
            if nxt is None:
                raise SchedulerStuckError(_stuck_message(state, sched.name))
            runner.wait_until(nxt)
            continue
        if progress is not None and state.num_batches % 256 == 0:
            progress(state.num_done, state.num_requests)
