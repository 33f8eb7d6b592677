"""Batches and schedules: the currency every producer and the judge exchange.

A Schedule is an ordered list of Batches; a Batch says, per request id, how many
tokens it processes and which requests are evicted before it runs. The JSON
form is lossless (``Schedule.to_json`` / ``from_json``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

SCHEDULE_FORMAT = "infermax.schedule/1"


def _as_int_array(owner: str, name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values if values is not None else (), dtype=np.float64 if isinstance(values, float) else None)
    arr = arr.reshape(-1)
    if arr.size and (arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr)))):
        raise ValueError(f"{owner}.{name} must hold integers, got {values!r}")
    return arr.astype(np.int64, copy=False)


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """One forward pass: request ``ids[k]`` processes ``tokens[k]`` tokens.

    ``evict`` lists requests whose KV cache is dropped *before* the batch runs
    (recompute eviction). ``not_before_s`` is the earliest start time (a
    scheduler that idles until an arrival says so here); a batch never starts
    before the arrival of its requests nor before the previous batch ended.
    """

    ids: np.ndarray
    tokens: np.ndarray
    evict: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    not_before_s: float = 0.0

    def __post_init__(self) -> None:
        ids = _as_int_array("Batch", "ids", self.ids)
        tokens = _as_int_array("Batch", "tokens", self.tokens)
        evict = _as_int_array("Batch", "evict", self.evict)
        if ids.shape != tokens.shape:
            raise ValueError(f"Batch.ids and Batch.tokens differ in length: {ids.size} != {tokens.size}")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "evict", evict)

    def __len__(self) -> int:
        return int(self.ids.size)

    @classmethod
    def trusted(cls, ids: np.ndarray, tokens: np.ndarray, evict: np.ndarray, not_before_s: float) -> "Batch":
        """Build from int64 arrays already known to be well formed (the simulator's hot path)."""
        b = object.__new__(cls)
        object.__setattr__(b, "ids", ids)
        object.__setattr__(b, "tokens", tokens)
        object.__setattr__(b, "evict", evict)
        object.__setattr__(b, "not_before_s", not_before_s)
        return b

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.sum())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return (np.array_equal(self.ids, other.ids) and np.array_equal(self.tokens, other.tokens)
                and np.array_equal(self.evict, other.evict) and self.not_before_s == other.not_before_s)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ids": self.ids.tolist(), "tokens": self.tokens.tolist()}
        if self.evict.size:
            out["evict"] = self.evict.tolist()
        if self.not_before_s:
            out["not_before_s"] = float(self.not_before_s)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Batch":
        return cls(ids=np.asarray(data.get("ids", ()), dtype=np.int64),
                   tokens=np.asarray(data.get("tokens", ()), dtype=np.int64),
                   evict=np.asarray(data.get("evict", ()), dtype=np.int64),
                   not_before_s=float(data.get("not_before_s", 0.0)))


@dataclass(frozen=True, slots=True, eq=False)
class Schedule:
    """An ordered list of batches, plus free-form provenance in ``meta``.

    The JSON form (``to_json``/``from_json``) is lossless and is what other
    tools and the executor read.
    """

    batches: tuple[Batch, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.batches, tuple):
            object.__setattr__(self, "batches", tuple(self.batches))

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)

    def __getitem__(self, j: int) -> Batch:
        return self.batches[j]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return (len(self) == len(other) and all(a == b for a, b in zip(self.batches, other.batches))
                and dict(self.meta) == dict(other.meta))

    def to_dict(self) -> dict[str, Any]:
        return {"format": SCHEDULE_FORMAT, "meta": dict(self.meta),
                "batches": [b.to_dict() for b in self.batches]}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Schedule":
        fmt = data.get("format")
        if fmt != SCHEDULE_FORMAT:
            raise ValueError(f"Schedule.format must be {SCHEDULE_FORMAT!r}, got {fmt!r}")
        batches = data.get("batches")
        if not isinstance(batches, list):
            raise ValueError(f"Schedule.batches must be a list, got {type(batches).__name__}")
        return cls(batches=tuple(Batch.from_dict(b) for b in batches), meta=dict(data.get("meta", {})))

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "Schedule":
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text))
