"""replay: the independent judge of any Schedule.

It rebuilds the state from the Schedule alone — whoever produced it (a
scheduler, the MILP, a hand-written JSON) — through ``ServingState.apply``,
which rejects any rule violation with a ``ScheduleError`` naming the batch, the
request and the rule, and recomputes every batch time with the cost model.

Calling the module calls :func:`replay`: ``infermax.replay(schedule, workload)``.
"""
from __future__ import annotations

import sys

from ._callable import CallableModule
from .costmodel import CostModel
from .inputs import resolve_inputs
from .state import ScheduleError, ServingState
from .trace import Trace, TraceRecorder
from .types import Limits, Schedule, Workload


def replay(schedule: Schedule, workload: "Workload | str", limits: "Limits | str | None" = None,
           cost: "CostModel | str | None" = None) -> Trace:
    """Validate ``schedule`` on ``workload`` and return its Trace (raises ScheduleError)."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a Schedule, got {type(schedule).__name__}")
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    state = ServingState(workload, limits, cost)
    recorder = TraceRecorder()
    for j, batch in enumerate(schedule.batches):
        try:
            idx = workload.indices_of(batch.ids)
            evict = workload.indices_of(batch.evict)
        except ValueError as exc:
            raise ScheduleError(j, "unknown-request", str(exc)) from None
        start, duration, record = state.apply(idx, batch.tokens, evict, batch.not_before_s)
        recorder.add(start, duration, record)
    if not state.is_finished:
        unfinished = [i for i in range(state.num_requests) if state.gen[i] < state.output_lens[i]]
        i = unfinished[0]
        raise ScheduleError(len(schedule), "incomplete",
                            f"{len(unfinished)} request(s) unfinished; request generated {int(state.gen[i])} "
                            f"of O = {int(state.output_lens[i])} tokens", int(workload.ids[i]))
    return recorder.finish(state)


sys.modules[__name__].__class__ = CallableModule   # calling the module calls replay (infermax._callable)
