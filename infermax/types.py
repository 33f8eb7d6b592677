"""The currency of infermax: requests, workloads, limits, batches and schedules.

Every producer of a schedule (heuristic schedulers, the MILP, the executor) and its
one judge (`replay`) exchange these types. They are frozen and validate themselves:
a bad value raises ``ValueError`` naming the field and the value. Named upper
bounds keep every sum exact in int64 and float: lengths and chunks below 2^31
(``MAX_TOKENS``), limits M, C, P, R_max at most 2^53 (``MAX_LIMIT``).

Request semantics (docs/design.md): request *i* has prompt ``input_len`` (I), output
``output_len`` (O), arrival ``arrival_s`` (T). A batch gives it ``c`` tokens to
process; evictions listed on a batch happen before that batch runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .schedule import MAX_TOKENS, json_kind, load_json, show_json

#: limits (M, C, P, R_max) stay below 2^53: exact as floats (the MILP's numbers) and as int64 sums
MAX_LIMIT = 2**53
MAX_ID = 2**63 - 1


#: reads workload spec strings for ``Workload.from_spec``: the grammar (:mod:`.workloads.spec`) builds Workloads,
#: so it registers itself here on import instead of being imported by the type it builds
_spec_reader: "Callable[[str], Workload] | None" = None


def register_spec_reader(read: "Callable[[str], Workload]") -> None:
    """Install ``read(spec) -> Workload`` as the reader behind ``Workload.from_spec`` (replacing any)."""
    global _spec_reader
    _spec_reader = read


def _bound_text(bound: int) -> str:
    """``2^31 - 1``-style text for the named bounds, the number otherwise."""
    for exp in (31, 53, 63):
        if bound in (2**exp, 2**exp - 1):
            return f"2^{exp}" + (" - 1" if bound == 2**exp - 1 else "") + f" = {bound}"
    return f"{bound:,}".replace(",", "_")


def _check_int(owner: str, name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{owner}.{name} must be an integer, got {show_json(value)}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{owner}.{name} must be <= {_bound_text(maximum)}, got {value!r}")


_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_count(raw: str, field_name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """Parse an integer such as ``4096``, ``100_000``, ``100K``, ``1M`` or ``1e5``.

    Refused, naming ``field_name`` and ``raw``: fractions (``8.5``), booleans, NaN,
    infinities, and values outside [``minimum``, ``maximum``] when given.
    """
    text = str(raw).strip().replace("_", "")
    scale = 1
    if text and text[-1].lower() in _SUFFIX:
        scale, text = _SUFFIX[text[-1].lower()], text[:-1]
    try:
        value = int(text) * scale            # exact, however large
    except ValueError:
        try:
            real = float(text) * scale
        except ValueError:
            raise ValueError(f"{field_name} must be an integer, got {raw!r}") from None
        if not math.isfinite(real) or real != int(real):
            raise ValueError(f"{field_name} must be an integer, got {raw!r}") from None
        value = int(real)
    shown = str(raw).strip()
    if minimum is not None and value < minimum:
        rule = "a positive integer" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{field_name} must be {rule}, got {shown}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{field_name} must be <= {_bound_text(maximum)}, got {shown}")
    return value


def _check_float(owner: str, name: str, value: Any, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{owner}.{name} must be a number, got {show_json(value)}")
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
        _check_int("Request", "id", self.id, 0, MAX_ID)
        _check_int("Request", "input_len", self.input_len, 1, MAX_TOKENS)
        _check_int("Request", "output_len", self.output_len, 1, MAX_TOKENS)
        _check_float("Request", "arrival_s", self.arrival_s)
        if self.tag is not None and not isinstance(self.tag, str):
            raise ValueError(f"Request.tag must be a string or null, got {show_json(self.tag)}")
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


_REQUEST_FIELDS = ("id", "input_len", "output_len", "arrival_s", "ttft_slo_s", "tpot_slo_s", "tag")


def _request_from_dict(row: Any, where: str) -> Request:
    if not isinstance(row, Mapping):
        raise ValueError(f"workload {where} must be an object, got {show_json(row)}")
    unknown = [k for k in row if k not in _REQUEST_FIELDS]
    if unknown:
        raise ValueError(f"workload {where} has unknown field(s) {', '.join(map(repr, unknown))}; "
                         f"a request has {', '.join(_REQUEST_FIELDS)}")
    missing = [k for k in _REQUEST_FIELDS[:3] if k not in row]
    if missing:
        raise ValueError(f"workload {where}.{missing[0]} is missing (a request needs id, input_len, output_len)")
    try:
        return Request(**row)
    except ValueError as exc:
        raise ValueError(f"workload {where}: {exc}") from None


def _plain(value: Any, kind: type = int) -> Any:
    """NumPy scalars as Python numbers, ints as floats where ``kind`` is float; anything else
    unchanged (Request judges it: a length of 8.0 or "8" is refused, never cast)."""
    if isinstance(value, np.integer):
        return kind(value)
    if isinstance(value, np.floating) or (kind is float and type(value) is int):
        return float(value)
    return value


_INT_TYPES = frozenset({int, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8})
_REAL_TYPES = _INT_TYPES | {float, np.float64, np.float32}


def _checked_requests(ins: list, outs: list, arrivals: list) -> tuple[Request, ...] | None:
    """``from_lengths``' requests, checked at once rather than one by one, when every length is an integer (not
    a bool) in [1, MAX_TOKENS] and every arrival a finite number >= 0 — what ``Request`` checks — with the
    values ``_plain`` gives (Python ints and floats); None otherwise (the requests are then built one by one,
    and the first bad value named)."""
    if not ins or not set(map(type, ins)) | set(map(type, outs)) <= _INT_TYPES \
            or not set(map(type, arrivals)) <= _REAL_TYPES:
        return None
    if min(ins) < 1 or min(outs) < 1 or max(ins) > MAX_TOKENS or max(outs) > MAX_TOKENS:
        return None
    times = np.asarray(arrivals, dtype=np.float64)
    if not np.isfinite(times).all() or times.min() < 0.0:
        return None
    new, put = object.__new__, object.__setattr__
    out = []
    for i, a, b, t in zip(range(len(ins)), map(int, ins), map(int, outs), times.tolist()):
        r = new(Request)
        put(r, "id", i)
        put(r, "input_len", a)
        put(r, "output_len", b)
        put(r, "arrival_s", t)
        put(r, "ttft_slo_s", None)
        put(r, "tpot_slo_s", None)
        put(r, "tag", None)
        out.append(r)
    return tuple(out)


@dataclass(frozen=True, kw_only=True, init=False)
class Workload:
    """An ordered set of requests with unique ids.

    Position ``i`` in ``requests`` is the request's *index*; schedules refer to
    requests by ``id``. The NumPy views (``input_lens``, ...) are built once, in
    ``__init__`` (which also turns any sequence of requests into a tuple before
    the field is set: no field is rewritten after construction).
    """

    requests: tuple[Request, ...]
    name: str
    _arrays: dict[str, np.ndarray] = field(init=False, repr=False, compare=False)

    def __init__(self, *, requests: Iterable[Request], name: str = "workload") -> None:
        for key, value in (("requests", tuple(requests)), ("name", name), ("_arrays", {})):
            object.__setattr__(self, key, value)     # what a frozen dataclass's generated __init__ does
        self._build_views()

    def _build_views(self) -> None:
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
        dense = arrays["ids"]
        object.__setattr__(self, "_is_dense", bool(dense[0] == 0 and np.all(np.diff(dense) == 1)))

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
        """Ids are 0 .. n-1 in order (index == id); decided once, as replay asks for every batch."""
        return self._is_dense

    def check_fits(self, limits: "Limits") -> None:
        """Raise if some request can never run under ``limits`` (its peak KV exceeds M; with
        ``block_size`` > 1, its peak in whole blocks exceeds the M // block_size usable blocks)."""
        peak = self.input_lens + self.output_lens - 1
        bs = limits.block_size
        bad = np.flatnonzero(peak > limits.M if bs == 1 else -(-peak // bs) > limits.num_blocks)
        if bad.size:
            r = self.requests[int(bad[0])]
            if bs == 1:
                raise ValueError(
                    f"request {r.id} cannot fit in M: input_len + output_len - 1 = "
                    f"{r.peak_kv_tokens} > M = {limits.M} (Limits.M)")
            raise ValueError(
                f"request {r.id} cannot fit in M: input_len + output_len - 1 = {r.peak_kv_tokens} tokens "
                f"take {limits.kv_blocks(r.peak_kv_tokens)} blocks of block_size = {bs} > M // block_size = "
                f"{limits.num_blocks} blocks (M = {limits.M}, Limits.block_size)")

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
        fast = _checked_requests(ins, outs, arr)
        if fast is not None:
            return cls(requests=fast, name=name)
        return cls(requests=tuple(Request(id=i, input_len=_plain(a), output_len=_plain(b), arrival_s=_plain(t, float))
                                  for i, (a, b, t) in enumerate(zip(ins, outs, arr))), name=name)

    @classmethod
    def from_spec(cls, spec: str) -> "Workload":
        """Build a workload from a spec string, e.g. ``"fixed:I=64,O=32,B=1024"``.

        See :mod:`infermax.workloads.spec` for the grammar (importing ``infermax`` installs it).
        """
        if _spec_reader is None:
            raise RuntimeError("no workload spec reader is installed; import infermax.workloads.spec")
        return _spec_reader(spec)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "requests": [r.to_dict() for r in self.requests]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Workload":
        """Read ``{"name": ..., "requests": [{"id", "input_len", "output_len", "arrival_s"?, ...}, ...]}``.

        Types are strict (a length of 8.5, "8" or true is refused); errors name
        ``requests[k].field`` and the bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a workload must be an object with name and requests, got {json_kind(data)}")
        unknown = [k for k in data if k not in ("name", "requests")]
        if unknown:
            raise ValueError(f"workload has unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"a workload has name and requests")
        name = data.get("name", "workload")
        if not isinstance(name, str):
            raise ValueError(f"workload name must be a string, got {show_json(name)}")
        if "requests" not in data:
            raise ValueError("workload requests is missing")
        rows = data["requests"]
        if not isinstance(rows, list):
            raise ValueError(f"workload requests must be an array of objects, got {json_kind(rows)}")
        return cls(requests=tuple(_request_from_dict(r, f"requests[{k}]") for k, r in enumerate(rows)), name=name)

    @classmethod
    def from_json(cls, text_or_path: "str | Any") -> "Workload":
        """Read a workload JSON (``simulate --out`` writes one) from text or a file; errors name the file."""
        data, path = load_json(text_or_path, "workload")
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            if path is None:
                raise
            raise ValueError(f"workload file {path!r}: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class Limits:
    """Per-batch and memory limits (InferMax §2.2, §3.1).

    M: KV-cache capacity in tokens. C: tokens processed per batch. P: prefill
    tokens per batch (defaults to C). R_max: running requests (holding KV) at
    once (None = unlimited). block_size: KV is allocated in blocks of this many
    tokens, as vLLM and Vidur do (16 there); a request holding m tokens takes
    ceil(m / block_size) blocks and the cache has M // block_size of them (an M
    that is not a multiple of the block size is allowed: its remainder is
    unusable). The default 1 is the paper's token-granular KV.

    P's default is resolved in ``__init__``, before any field is set: every field
    is assigned once, to its final value, and never rewritten after.
    """

    M: int
    C: int
    P: int
    R_max: int | None
    block_size: int

    def __init__(self, *, M: int = 100_000, C: int = 4096, P: int | None = None, R_max: int | None = None,
                 block_size: int = 1) -> None:
        _check_int("Limits", "M", M, 1, MAX_LIMIT)
        _check_int("Limits", "C", C, 1, MAX_LIMIT)
        P = C if P is None else P
        _check_int("Limits", "P", P, 1, MAX_LIMIT)
        if P > C:
            raise ValueError(f"Limits.P must be <= C = {C}, got {P}")
        if R_max is not None:
            _check_int("Limits", "R_max", R_max, 1, MAX_LIMIT)
        _check_int("Limits", "block_size", block_size, 1, MAX_TOKENS)
        if block_size > M:
            raise ValueError(f"Limits.block_size must be <= M = {M} (the cache holds no whole block), "
                             f"got {block_size}")
        for name, value in (("M", M), ("C", C), ("P", P), ("R_max", R_max), ("block_size", block_size)):
            object.__setattr__(self, name, value)     # what a frozen dataclass's generated __init__ does

    @property
    def max_running(self) -> int:
        """R_max as a number (a very large one when unlimited)."""
        return self.R_max if self.R_max is not None else 1 << 62

    @property
    def num_blocks(self) -> int:
        """Usable KV blocks, M // block_size (M itself when block_size is 1)."""
        return self.M // self.block_size

    def kv_blocks(self, tokens: Any) -> Any:
        """Blocks that ``tokens`` KV tokens occupy, ceil(tokens / block_size) (int or array). For integers and a
        power-of-two block size, as floor((tokens + b - 1) / b) by a shift: the same numbers, one NumPy call fewer."""
        b = self.block_size
        if not b & (b - 1) and (type(tokens) is int or getattr(tokens, "dtype", None) == np.int64):
            return (tokens + (b - 1)) >> (b.bit_length() - 1)
        return -(-tokens // b)

    def replace(self, **changes: Any) -> "Limits":
        data = self.to_dict()
        if "C" in changes and "P" not in changes and data["P"] == data["C"]:
            data["P"] = None
        data.update(changes)
        return Limits(**data)

    def to_dict(self) -> dict[str, Any]:
        """M, C, P, R_max, and block_size only when it is not 1 (so that the files and sweep cell
        ids of token-granular runs stay what they were)."""
        out = {"M": self.M, "C": self.C, "P": self.P, "R_max": self.R_max}
        if self.block_size != 1:
            out["block_size"] = self.block_size
        return out

    @classmethod
    def from_spec(cls, spec: str | None) -> "Limits":
        """Parse ``"M=100000,C=4096,P=512,R_max=128,block=16"`` (any subset; others default)."""
        if spec is not None and not isinstance(spec, str):
            raise ValueError(f"limits spec must be a string like 'M=100000,C=4096', got {spec!r}")
        if spec is None or not spec.strip():
            return cls()
        values: dict[str, Any] = {}
        aliases = {"m": "M", "c": "C", "p": "P", "r_max": "R_max", "rmax": "R_max", "r": "R_max",
                   "block": "block_size", "block_size": "block_size"}
        for part in spec.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"Limits spec item {part!r} must look like KEY=VALUE (in {spec!r})")
            key, raw = (s.strip() for s in part.split("=", 1))
            name = aliases.get(key.lower())
            if name is None:
                raise ValueError(f"Limits spec has unknown key {key!r}; use M, C, P, R_max, block")
            if name in values:
                raise ValueError(f"Limits spec gives {name} twice (in {spec!r})")
            if raw.lower() in ("none", "inf", "unlimited") and name in ("P", "R_max"):
                values[name] = None
                continue
            values[name] = parse_count(raw, f"Limits.{name}", 1, MAX_TOKENS if name == "block_size" else MAX_LIMIT)
        return cls(**values)


# Batch and Schedule live in schedule.py; re-exported here (they are part of the core types)
from .schedule import SCHEDULE_FORMAT, Batch, Schedule  # noqa: E402,F401
