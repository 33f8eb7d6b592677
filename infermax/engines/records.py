"""What an engine run recorded, as infermax data: a Schedule, step times and request timings.

A real engine is observed one scheduling step at a time (vLLM: each ``SchedulerOutput``). A
:class:`StepRecord` keeps what infermax needs of one step: the tokens it gives each request (in the
engine's order), the requests it preempted before it ran, and when it started and ended on the
engine's clock (seconds from the run's first arrival). :func:`schedule_from_records` turns the
records into a :class:`~infermax.Schedule`: one Batch per step that processed tokens, its
``evict`` the preemptions of that step (and of any token-less step before it). A preempted request
loses its KV and is later refilled with its prompt plus the tokens it generated, which is
infermax's recompute eviction (docs/design.md), so the recorded schedule is judged by ``replay`` as any
other.

:func:`lockstep_workload` gives each request the index of the first step that could see it as its
arrival time: simulated under a cost model of one second per batch, a scheduler then sees at
batch ``j`` exactly the requests the engine had at its step ``j`` (the engine's real clock, which
no simulator can reproduce, is taken out of the comparison).

Nothing here imports an engine.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..costmodel.linear import LinearCoefficients, LinearCostModel
from ..rundir import RUN_FILES, out_dir, write_run
from ..schedule import Batch, Schedule
from ..types import Limits, Request, Workload

MEASUREMENTS_FORMAT = "infermax.engine-measurements/1"


@dataclass(frozen=True)
class StepRecord:
    """One engine step: ``scheduled`` maps an engine request id to the tokens it processes (in the
    engine's order), ``preempted`` lists the engine ids preempted before the step ran; ``start_s`` and
    ``end_s`` are the step's times on the engine clock, ``cpu_s`` the CPU time the process spent in it
    (all its threads; on a shared machine the wall time also holds the time others had the CPU); NaN
    when not measured."""

    scheduled: Mapping[str, int]
    preempted: tuple[str, ...] = ()
    start_s: float = math.nan
    end_s: float = math.nan
    cpu_s: float = math.nan

    @property
    def num_tokens(self) -> int:
        return int(sum(self.scheduled.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"scheduled": dict(self.scheduled), "preempted": list(self.preempted),
                "start_s": self.start_s, "end_s": self.end_s, "cpu_s": self.cpu_s}


@dataclass(frozen=True)
class RequestTiming:
    """Per request, on the engine clock: when it was handed to the engine, when its first token and its
    last token came out (NaN if never), and the index of the first step that could schedule it."""

    id: int
    arrival_s: float
    submitted_s: float
    first_token_s: float = math.nan
    finish_s: float = math.nan
    first_step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "arrival_s": self.arrival_s, "submitted_s": self.submitted_s,
                "first_token_s": self.first_token_s, "finish_s": self.finish_s, "first_step": self.first_step}


def _infermax_id(engine_id: str, id_of: Mapping[str, int], step: int) -> int:
    try:
        return id_of[engine_id]
    except KeyError:
        raise ValueError(f"step {step}: engine request id {engine_id!r} was never submitted "
                         f"(known ids: {', '.join(sorted(id_of)[:5])}...)") from None


def batch_steps(records: Sequence[StepRecord]) -> list[int]:
    """Indices of the records that processed tokens (one Batch each, in order)."""
    return [k for k, r in enumerate(records) if r.num_tokens > 0]


def schedule_from_records(records: Sequence[StepRecord], id_of: Mapping[str, int],
                          meta: Mapping[str, Any] | None = None) -> Schedule:
    """The Schedule the engine ran: a Batch per step with tokens; ``id_of`` maps engine request ids to
    infermax ids. A step that processed no tokens adds no batch; its preemptions move to the next
    batch (they happened before it). A preemption after the last batch is refused (the run had not
    finished)."""
    batches: list[Batch] = []
    pending: list[int] = []
    for k, rec in enumerate(records):
        for rid in rec.preempted:
            pending.append(_infermax_id(rid, id_of, k))
        if rec.num_tokens <= 0:
            continue
        if any(int(c) < 0 for c in rec.scheduled.values()):
            raise ValueError(f"step {k}: a negative token count in {dict(rec.scheduled)}")
        ids = [_infermax_id(rid, id_of, k) for rid, c in rec.scheduled.items() if c > 0]
        tokens = [int(c) for c in rec.scheduled.values() if c > 0]
        batches.append(Batch(ids, tokens, pending))
        pending = []
    if pending:
        raise ValueError(f"requests {pending} were preempted after the last step that processed tokens "
                         f"(the run did not finish)")
    return Schedule(batches, dict(meta or {}))


def step_times(records: Sequence[StepRecord], clock: str = "wall") -> tuple[np.ndarray, np.ndarray]:
    """(start_s, duration_s) of each batch of :func:`schedule_from_records` (the steps with tokens); with
    ``clock="cpu"`` the durations are the steps' CPU times."""
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    steps = [records[k] for k in batch_steps(records)]
    start = np.array([r.start_s for r in steps], dtype=np.float64)
    if clock == "cpu":
        return start, np.array([r.cpu_s for r in steps], dtype=np.float64)
    end = np.array([r.end_s for r in steps], dtype=np.float64)
    return start, end - start


def first_batch_of(timings: Iterable[RequestTiming], records: Sequence[StepRecord]) -> dict[int, int]:
    """Per request id, the index of the first *batch* (step with tokens) at or after its ``first_step``."""
    steps = np.array(batch_steps(records), dtype=np.int64)
    return {t.id: int(np.searchsorted(steps, t.first_step, "left")) for t in timings}


def lockstep_workload(workload: Workload, timings: Iterable[RequestTiming],
                      records: Sequence[StepRecord]) -> Workload:
    """``workload`` with each request arriving at the index of the first batch that could schedule it
    (0 for an offline run): under :func:`unit_cost` batch ``j`` starts at ``j`` seconds, so a simulated
    scheduler sees the requests the engine saw (see the module docstring)."""
    first = first_batch_of(timings, records)
    reqs = [Request(id=r.id, input_len=r.input_len, output_len=r.output_len, arrival_s=float(first[r.id]),
                    ttft_slo_s=r.ttft_slo_s, tpot_slo_s=r.tpot_slo_s, tag=r.tag) for r in workload]
    return Workload(requests=reqs, name=f"{workload.name}@steps")


def unit_cost() -> LinearCostModel:
    """Every batch takes exactly one second (a cost model that counts batches)."""
    coef = LinearCoefficients(nonattn_lines=((1.0, 0.0),), decode_bias_s=0.0, decode_kv_s=0.0,
                              prefill_bias_s=0.0, prefill_attn_s=0.0)
    return LinearCostModel(coef, name="unit-batch", description="1 s per batch (counts batches)")


def num_preemptions(records: Sequence[StepRecord]) -> int:
    return sum(len(r.preempted) for r in records)


@dataclass
class Measurements:
    """What a run measured beside its schedule: the engine configuration, every step record (empty
    steps included), per-request timings and the run's wall time."""

    engine: dict[str, Any]
    records: list[StepRecord] = field(default_factory=list)
    requests: list[RequestTiming] = field(default_factory=list)
    wall_s: float = math.nan
    startup_s: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        start, dur = step_times(self.records)
        return {"format": MEASUREMENTS_FORMAT, "engine": self.engine, "wall_s": self.wall_s,
                "startup_s": self.startup_s, "num_preemptions": num_preemptions(self.records),
                "batch_start_s": start.tolist(), "batch_duration_s": dur.tolist(),
                "batch_cpu_s": step_times(self.records, "cpu")[1].tolist(),
                "steps": [r.to_dict() for r in self.records], "requests": [t.to_dict() for t in self.requests]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurements":
        if not isinstance(data, Mapping) or data.get("format") != MEASUREMENTS_FORMAT:
            raise ValueError(f"measurements must be an object with format {MEASUREMENTS_FORMAT!r}")
        recs = [StepRecord({str(k): int(v) for k, v in s["scheduled"].items()}, tuple(s["preempted"]),
                           _num(s["start_s"]), _num(s["end_s"]), _num(s.get("cpu_s"))) for s in data["steps"]]
        reqs = [RequestTiming(int(t["id"]), _num(t["arrival_s"]), _num(t["submitted_s"]), _num(t["first_token_s"]),
                              _num(t["finish_s"]), int(t["first_step"])) for t in data["requests"]]
        return cls(dict(data["engine"]), recs, reqs, _num(data.get("wall_s")), _num(data.get("startup_s")))


def _num(value: Any) -> float:
    """A JSON number, or NaN for the null a NaN was written as."""
    return math.nan if value is None else float(value)


# --- run directories ------------------------------------------------------------------------------------
MEASUREMENTS_FILE = "measurements.json"


def _clean(value: Any) -> Any:
    """NaN and infinities as JSON null (the file stays valid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_engine_run(out: "str | Path", schedule: Schedule, workload: Workload, limits: Any,
                     measurements: Measurements, cost: Any) -> Path:
    """A run directory (:mod:`infermax.rundir`: schedule.json, workload.json, limits.json, cost.json, read
    back by ``replay`` and ``bound --schedule``) plus measurements.json."""
    path = out_dir(out)
    write_run(path, schedule, workload, limits, cost)
    (path / MEASUREMENTS_FILE).write_text(json.dumps(_clean(measurements.to_dict()), allow_nan=False))
    return path


def load_engine_run(directory: "str | Path") -> tuple[Schedule, Workload, Any, Measurements]:
    """(schedule, workload, limits, measurements) of a directory :func:`write_engine_run` wrote."""
    path = Path(directory)
    schedule = Schedule.from_json(path / "schedule.json")
    workload = Workload.from_json(path / RUN_FILES["workload"])
    limits = Limits(**json.loads((path / RUN_FILES["limits"]).read_text()))
    try:
        data = json.loads((path / MEASUREMENTS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{str(path / MEASUREMENTS_FILE)!r}: {exc}") from None
    return schedule, workload, limits, Measurements.from_dict(data)
