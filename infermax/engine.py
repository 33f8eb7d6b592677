"""The simulator: Algorithm 1's outer loop (infermax.txt §3.1, lines 1-7).

plan (scheduler.next_batch) -> execute (cost model, inside ServingState.apply)
-> commit (ServingState.apply). Idle time is explicit: when nothing can run, the
clock jumps to the next arrival and the next batch records ``not_before_s``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .costmodel import CostModel, get_cost_model
from .metrics import metrics as compute_metrics
from .state import ServingState
from .trace import Trace, TraceRecorder
from .types import Batch, Limits, Schedule, Workload


_NO_IDS = np.zeros(0, dtype=np.int64)


class SchedulerStuckError(RuntimeError):
    """The scheduler returned no batch although requests are unfinished and none will arrive."""


@dataclass(frozen=True, eq=False)
class SimResult:
    """A simulated run: the Schedule it produced, its Trace and metrics."""

    schedule: Schedule
    trace: Trace
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def batches_df(self):
        return self.trace.batch_frame()

    @property
    def requests_df(self):
        return self.trace.request_frame()


def resolve_inputs(workload: "Workload | str", limits: "Limits | str | None",
                   cost: "CostModel | str | None") -> tuple[Workload, Limits, CostModel]:
    """Accept objects or spec strings for the three inputs every entry point takes."""
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    if not isinstance(workload, Workload):
        raise ValueError(f"workload must be a Workload or a spec string, got {workload!r}")
    if limits is None or isinstance(limits, str):
        limits = Limits.from_spec(limits)
    if not isinstance(limits, Limits):
        raise ValueError(f"limits must be a Limits or a spec string, got {limits!r}")
    return workload, limits, get_cost_model(cost)


def _stuck_message(state: ServingState, scheduler_name: str) -> str:
    waiting = np.flatnonzero(state.status == 1)
    who = ""
    if waiting.size:
        i = int(waiting[0])
        who = (f"; first waiting request {int(state.workload.ids[i])} needs {int(state.inp[i])} "
               f"prefill tokens (C = {state.limits.C}, P = {state.limits.P}) and KV for "
               f"{int(state.inp[i])} tokens (free {state.limits.M - state.kv_used} of M = {state.limits.M})")
    return (f"scheduler {scheduler_name!r} scheduled nothing at t = {state.clock_s:.6g} s with "
            f"{state.num_requests - state.num_done} requests unfinished and none arriving{who}")


def simulate(workload: "Workload | str", scheduler: Any = "vllm", limits: "Limits | str | None" = None,
             cost: "CostModel | str | None" = None,
             progress: Callable[[int, int], None] | None = None, fast_forward: bool = True) -> SimResult:
    """Run ``scheduler`` on ``workload`` under ``limits``, timing batches with ``cost``.

    ``progress(done, total)`` is called every 256 batches (the CLI draws a bar).
    ``fast_forward`` applies runs of identical decode batches at once when the
    scheduler promises them (``Scheduler.repeat_horizon``); the result is the
    same schedule and trace, bit for bit, only faster.
    """
    from infermax.schedulers import get_scheduler

    workload, limits, cost = resolve_inputs(workload, limits, cost)
    sched = get_scheduler(scheduler)
    limits = sched.limits_for(limits)        # a preset's KV block size (the meta records it)
    state = ServingState(workload, limits, cost)
    sched.reset(state)
    ids = workload.ids
    recorder = TraceRecorder()
    batches: list[Batch] = []
    not_before = 0.0
    while not state.is_finished:
        plan = sched.next_batch(state)
        if plan.idx.size == 0:
            if plan.evict.size:
                raise SchedulerStuckError(f"scheduler {sched.name!r} evicted requests but scheduled none "
                                          f"(batch {state.num_batches})")
            nxt = state.next_arrival_s
            if nxt is None:
                raise SchedulerStuckError(_stuck_message(state, sched.name))
            state.advance_clock(nxt)
            not_before = nxt
            continue
        start, duration, record = state.apply(plan.idx, plan.tokens, plan.evict, not_before)
        batch = Batch.trusted(ids[plan.idx], plan.tokens, ids[plan.evict], not_before)
        batches.append(batch)
        recorder.add(start, duration, record)
        not_before = 0.0
        if fast_forward and record[3] == record[0] and (steps := sched.repeat_horizon(state, plan)) > 0:
            starts, durations, records = state.apply_decode_run(plan.idx, steps)
            again = Batch.trusted(batch.ids, batch.tokens, _NO_IDS, 0.0)
            batches.extend([again] * starts.size)
            recorder.add_many(starts, durations, records)
        if progress is not None and state.num_batches % 256 == 0:
            progress(state.num_done, state.num_requests)
    trace = recorder.finish(state)
    meta = {"scheduler": sched.describe(), "workload": workload.name, "limits": limits.to_dict(),
            "cost": cost.describe()}
    return SimResult(schedule=Schedule(tuple(batches), meta), trace=trace, metrics=compute_metrics(trace))
