"""The currency of infermax: requests, workloads, limits, batches and schedules.

Every producer of a schedule (heuristic schedulers, the MILP, the executor) and its
one judge (`replay`) exchange these types. They are frozen and validate themselves:
a bad value raises ``ValueError`` naming the field and the value.

Request semantics (DESIGN.md): request *i* has prompt ``input_len`` (I), output
``output_len`` (O), arrival ``arrival_s`` (T). A batch gives it ``c`` tokens to
process; evictions listed on a batch happen before that batch runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

def _check_int(owner: str, name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{owner}.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value!r}")


_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_count(raw: str, field_name: str) -> int:
    """Parse an integer such as ``4096``, ``100_000``, ``100K``, ``1M`` or ``1e5``."""
    text = str(raw).strip().replace("_", "")
    scale = 1
    if text and text[-1].lower() in _SUFFIX:
        scale, text = _SUFFIX[text[-1].lower()], text[:-1]
    try:
        value = float(text) * scale
    except ValueError:
        raise ValueError(f"{field_name} must be an integer, got {raw!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{field_name} must be an integer, got {raw!r}")
    return int(value)


def _check_float(owner: str, name: str, value: Any, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{owner}.{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{owner}.{name} must be finite and >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """One inference request: ``input_len`` prompt tokens, ``output_len`` tokens to generate."""

    id: int
    input_len: int
    output_len: int
    arrival_s: float = 0.0
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    tag: str | None = None

    def __post_init__(self) -> None:
        _check_int("Request", "id", self.id, 0)
        _check_int("Request", "input_len", self.input_len, 1)
        _check_int("Request", "output_len", self.output_len, 1)
        _check_float("Request", "arrival_s", self.arrival_s)
        for name in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            if value is not None:
                _check_float("Request", name, value)
                if value <= 0:
                    raise ValueError(f"Request.{name} must be > 0, got {value!r}")

    @property
    def peak_kv_tokens(self) -> int:
        """KV tokens held just before the last token is generated: I + O - 1."""
        return self.input_len + self.output_len - 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": int(self.id), "input_len": int(self.input_len),
                               "output_len": int(self.output_len), "arrival_s": float(self.arrival_s)}
        for name in ("ttft_slo_s", "tpot_slo_s", "tag"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True, kw_only=True)
class Workload:
    """An ordered set of requests with unique ids.

    Position ``i`` in ``requests`` is the request's *index*; schedules refer to
    requests by ``id``. The NumPy views (``input_lens``, ...) are built once.
    """

    requests: tuple[Request, ...]
    name: str = "workload"
    _arrays: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple):
            object.__setattr__(self, "requests", tuple(self.requests))
        if not self.requests:
            raise ValueError("Workload.requests must not be empty")
        for r in self.requests:
            if not isinstance(r, Request):
                raise ValueError(f"Workload.requests must hold Request objects, got {r!r}")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"Workload.requests has a duplicate id: {dup}")
        arrays = self._arrays
        arrays["ids"] = np.array(ids, dtype=np.int64)
        arrays["input_lens"] = np.array([r.input_len for r in self.requests], dtype=np.int64)
        arrays["output_lens"] = np.array([r.output_len for r in self.requests], dtype=np.int64)
        arrays["arrivals_s"] = np.array([r.arrival_s for r in self.requests], dtype=np.float64)
        for a in arrays.values():
            a.setflags(write=False)
        object.__setattr__(self, "_index", {rid: i for i, rid in enumerate(ids)})

    # --- views -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)

    @property
    def ids(self) -> np.ndarray:
        return self._arrays["ids"]

    @property
    def input_lens(self) -> np.ndarray:
        return self._arrays["input_lens"]

    @property
    def output_lens(self) -> np.ndarray:
        return self._arrays["output_lens"]

    @property
    def arrivals_s(self) -> np.ndarray:
        return self._arrays["arrivals_s"]

    @property
    def is_offline(self) -> bool:
        """True when every request is available at time 0."""
        return bool(np.all(self.arrivals_s == 0.0))

    def index_of(self, request_id: int) -> int:
        try:
            return self._index[int(request_id)]
        except KeyError:
            raise ValueError(f"request id {request_id!r} is not in workload {self.name!r}") from None

    def indices_of(self, request_ids: np.ndarray) -> np.ndarray:
        """Vectorised ``index_of`` (raises on an unknown id)."""
        ids = np.asarray(request_ids, dtype=np.int64)
        if ids.size == 0:
            return ids
        if self._dense_ids:
            if ids.min() < 0 or ids.max() >= len(self):
                bad = ids[(ids < 0) | (ids >= len(self))][0]
                raise ValueError(f"request id {int(bad)} is not in workload {self.name!r}")
            return ids
        return np.array([self.index_of(i) for i in ids], dtype=np.int64)

    @property
    def _dense_ids(self) -> bool:
        ids = self.ids
        return bool(ids[0] == 0 and np.all(np.diff(ids) == 1))

    def check_fits(self, limits: "Limits") -> None:
        """Raise if some request can never run under ``limits`` (its peak KV exceeds M)."""
        peak = self.input_lens + self.output_lens - 1
        bad = np.flatnonzero(peak > limits.M)
        if bad.size:
            r = self.requests[int(bad[0])]
            raise ValueError(
                f"request {r.id} cannot fit in M: input_len + output_len - 1 = "
                f"{r.peak_kv_tokens} > M = {limits.M} (Limits.M)")

    # --- construction ------------------------------------------------------
    @classmethod
    def from_lengths(cls, input_lens: Iterable[int], output_lens: Iterable[int],
                     arrivals_s: Iterable[float] | None = None, name: str = "workload") -> "Workload":
        ins, outs = list(input_lens), list(output_lens)
        if len(ins) != len(outs):
            raise ValueError(f"input_lens and output_lens differ in length: {len(ins)} != {len(outs)}")
        arr = [0.0] * len(ins) if arrivals_s is None else list(arrivals_s)
        if len(arr) != len(ins):
            raise ValueError(f"arrivals_s has {len(arr)} values for {len(ins)} requests")
        return cls(requests=tuple(Request(id=i, input_len=int(a), output_len=int(b), arrival_s=float(t))
                                  for i, (a, b, t) in enumerate(zip(ins, outs, arr))), name=name)

    @classmethod
    def from_spec(cls, spec: str) -> "Workload":
        """Build a workload from a spec string, e.g. ``"fixed:I=64,O=32,B=1024"``.

        See :mod:`infermax.workloads` for the grammar.
        """
        from .workloads import workload_from_spec

        return workload_from_spec(spec)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "requests": [r.to_dict() for r in self.requests]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Workload":
        return cls(requests=tuple(Request(**r) for r in data["requests"]), name=data.get("name", "workload"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Per-batch and memory limits (infermax.txt §2.2, §3.1).

    M: KV-cache capacity in tokens. C: tokens processed per batch. P: prefill
    tokens per batch (defaults to C). R_max: running requests (holding KV) at
    once (None = unlimited).
    """

    M: int = 100_000
    C: int = 4096
    P: int | None = None
    R_max: int | None = None

    def __post_init__(self) -> None:
        _check_int("Limits", "M", self.M, 1)
        _check_int("Limits", "C", self.C, 1)
        if self.P is None:
            object.__setattr__(self, "P", self.C)
        _check_int("Limits", "P", self.P, 1)
        if self.P > self.C:
            raise ValueError(f"Limits.P must be <= C = {self.C}, got {self.P}")
        if self.R_max is not None:
            _check_int("Limits", "R_max", self.R_max, 1)

    @property
    def max_running(self) -> int:
        """R_max as a number (a very large one when unlimited)."""
        return self.R_max if self.R_max is not None else 1 << 62

    def replace(self, **changes: Any) -> "Limits":
        data = self.to_dict()
        if "C" in changes and "P" not in changes and data["P"] == data["C"]:
            data["P"] = None
        data.update(changes)
        return Limits(**data)

    def to_dict(self) -> dict[str, Any]:
        return {"M": self.M, "C": self.C, "P": self.P, "R_max": self.R_max}

    @classmethod
    def from_spec(cls, spec: str | None) -> "Limits":
        """Parse ``"M=100000,C=4096,P=512,R_max=128"`` (any subset; others default)."""
        if spec is None or not spec.strip():
            return cls()
        values: dict[str, Any] = {}
        aliases = {"m": "M", "c": "C", "p": "P", "r_max": "R_max", "rmax": "R_max", "r": "R_max"}
        for part in spec.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"Limits spec item {part!r} must look like KEY=VALUE (in {spec!r})")
            key, raw = (s.strip() for s in part.split("=", 1))
            name = aliases.get(key.lower())
            if name is None:
                raise ValueError(f"Limits spec has unknown key {key!r}; use M, C, P, R_max")
            if raw.lower() in ("none", "inf", "unlimited") and name in ("P", "R_max"):
                values[name] = None
                continue
            values[name] = parse_count(raw, f"Limits.{name}")
        return cls(**values)


# Batch and Schedule live in schedule.py; re-exported here (they are part of the core types)
from .schedule import SCHEDULE_FORMAT, Batch, Schedule  # noqa: E402,F401
