"""How a recorded engine schedule compares with infermax: the judge's verdict and a preset's batches.

:func:`judge` replays a recorded schedule under the limits the engine was given (``replay``, no rule
widened) and says ``valid`` or the rule it broke. :func:`compare_preset` simulates a preset on the
*lockstep* workload (:func:`.records.lockstep_workload`: each request arrives at the first step the
engine could schedule it, every batch takes one second) and compares the two schedules batch by
batch: a batch is identical when it gives the same requests the same tokens and evicts the same
requests first (order within a batch aside). Nothing here imports an engine.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from ..engine import simulate
from ..replay import replay
from ..schedule import Batch, Schedule
from ..state import ScheduleError
from ..types import Limits, Workload
from .records import RequestTiming, StepRecord, lockstep_workload, unit_cost


def judge(schedule: Schedule, workload: Workload, limits: Limits) -> str:
    """``valid``, or ``invalid: [rule] message`` (the first rule the schedule breaks)."""
    try:
        replay(schedule, workload, limits)
    except ScheduleError as exc:
        return f"invalid: {exc}"
    return "valid"


def _key(batch: Batch) -> tuple[dict[int, int], frozenset[int]]:
    return dict(zip(batch.ids.tolist(), batch.tokens.tolist())), frozenset(batch.evict.tolist())


def describe_batch(batch: Batch | None) -> str:
    if batch is None:
        return "(none)"
    tok, ev = _key(batch)
    text = " ".join(f"{i}:{c}" for i, c in tok.items())
    return text + (f" evict {sorted(ev)}" if ev else "")


class Comparison(NamedTuple):
    """Batches of the engine and of the preset, how many are identical, and the first that is not."""

    engine_batches: int
    preset_batches: int
    identical: int
    first_divergence: int | None
    engine_batch: str
    preset_batch: str

    @property
    def identical_pct(self) -> float:
        return 100.0 * self.identical / max(self.engine_batches, self.preset_batches, 1)

    def divergence_text(self) -> str:
        if self.first_divergence is None:
            return "-"
        return (f"batch {self.first_divergence}: vLLM {self.engine_batch} | preset {self.preset_batch}")


def compare_schedules(engine: Schedule, preset: Schedule) -> Comparison:
    """Batch-by-batch comparison (position j against position j)."""
    n = min(len(engine), len(preset))
    same = [_key(engine[j]) == _key(preset[j]) for j in range(n)]
    first = next((j for j, s in enumerate(same) if not s), None)
    if first is None and len(engine) != len(preset):
        first = n
    pick = (lambda s, j: s[j] if j is not None and j < len(s) else None)
    return Comparison(len(engine), len(preset), sum(same), first, describe_batch(pick(engine, first)),
                      describe_batch(pick(preset, first)))


def compare_preset(schedule: Schedule, workload: Workload, limits: Limits, timings: Sequence[RequestTiming],
                   records: Sequence[StepRecord], preset: Any = "vllm-v1") -> tuple[Comparison, Schedule]:
    """The preset simulated in lockstep with the recorded run, compared batch by batch."""
    lock = lockstep_workload(workload, timings, records)
    sim = simulate(lock, preset, limits, cost=unit_cost())
    return compare_schedules(schedule, sim.schedule), sim.schedule
