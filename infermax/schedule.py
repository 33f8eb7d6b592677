"""Batches and schedules: the currency every producer and the judge exchange.

A Schedule is an ordered list of Batches; a Batch says, per request id, how many
tokens it processes and which requests are evicted before it runs. The JSON
form is lossless (``Schedule.to_json`` / ``from_json``).

Reading JSON trusts nothing: ``Batch.from_dict`` takes only JSON integers as ids
and token counts (8.5, "8" and true are refused, not rounded), a finite
``not_before_s``, no unknown fields; :func:`load_json` names the file, and the
line of a syntax error, for anything it cannot read. Rule violations (a chunk
too long, M exceeded, ...) are not checked here: that is the judge's job
(``replay``), which names the rule.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .costmodel.jsonfile import load_json

SCHEDULE_FORMAT = "infermax.schedule/1"
#: token counts (a chunk c, a prompt or output length) are below this: sums of them stay exact in int64
MAX_TOKENS = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
_BATCH_FIELDS = ("ids", "tokens", "evict", "not_before_s")
_SCHEDULE_FIELDS = ("format", "meta", "batches")


# --- reading JSON -------------------------------------------------------------------

def show_json(value: Any) -> str:
    """``value`` as it would read in a JSON file (``null``, ``true``, ``"8"``), cut to 60 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_kind(value: Any) -> str:
    """The JSON type of ``value``, for messages: object, array, string, number, true/false or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, (list, tuple)) else "an object" if isinstance(value, Mapping) else \
        type(value).__name__


def _int_list(values: Any, where: str, low: int, high: int) -> np.ndarray:
    """A JSON array of integers in [low, high] as int64; anything else is named."""
    if not isinstance(values, list):
        raise ValueError(f"{where} must be an array of integers, got {show_json(values)}")
    if not values:
        return np.zeros(0, dtype=np.int64)
    if set(map(type, values)) != {int}:         # bool, float, str, None, nested arrays: refused
        k = next(k for k, v in enumerate(values) if type(v) is not int)
        raise ValueError(f"{where}[{k}] must be an integer, got {show_json(values[k])}")
    try:
        arr = np.array(values, dtype=np.int64)
    except OverflowError:
        arr = None
    if arr is None or int(arr.min()) < low or int(arr.max()) > high:
        k = next(k for k, v in enumerate(values) if not low <= v <= high)
        raise ValueError(f"{where}[{k}] = {values[k]} is out of range [{low}, {high}]")
    return arr


def _check_start(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a finite number of seconds >= 0, got {show_json(value)}")
    return float(value)


def _as_int_array(owner: str, name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values if values is not None else ()).reshape(-1)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    kind = arr.dtype.kind
    if kind == "f":
        if not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)) and np.all(np.abs(arr) < 2.0**63)):
            raise ValueError(f"{owner}.{name} must hold integers, got {values!r}")
    elif kind not in "iu" or (kind == "u" and int(arr.max()) > _INT64[1]):
        raise ValueError(f"{owner}.{name} must hold integers (int64), got {values!r}")
    return arr.astype(np.int64, copy=False)


@dataclass(frozen=True, slots=True, eq=False, init=False)
class Batch:
    """One forward pass: request ``ids[k]`` processes ``tokens[k]`` tokens.

    ``evict`` lists requests whose KV cache is dropped *before* the batch runs
    (recompute eviction). ``not_before_s`` is the earliest start time, in seconds since the
    workload's first arrival (:mod:`infermax.clock`; a scheduler that idles until an arrival says so here); a batch
    never starts
    before the arrival of its requests nor before the previous batch ended.
    """

    ids: np.ndarray
    tokens: np.ndarray
    evict: np.ndarray
    not_before_s: float

    def __init__(self, ids: Any, tokens: Any, evict: Any = None, not_before_s: float = 0.0) -> None:
        """Integer sequences become int64 arrays (checked) before any field is set."""
        ids = _as_int_array("Batch", "ids", ids)
        tokens = _as_int_array("Batch", "tokens", tokens)
        evict = np.zeros(0, dtype=np.int64) if evict is None else _as_int_array("Batch", "evict", evict)
        if ids.shape != tokens.shape:
            raise ValueError(f"Batch.ids and Batch.tokens differ in length: {ids.size} != {tokens.size}")
        if tokens.size and int(np.abs(tokens).max()) > MAX_TOKENS:
            raise ValueError(f"Batch.tokens must be token counts below 2^31, got {int(np.abs(tokens).max())}")
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "evict", evict)
        object.__setattr__(self, "not_before_s", _check_start(not_before_s, "Batch.not_before_s"))

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
    def from_dict(cls, data: Mapping[str, Any], where: str = "batch") -> "Batch":
        """Read a batch as JSON gives it: ``ids`` and ``tokens`` arrays of integers (required),
        ``evict`` (an array of ids) and ``not_before_s`` (finite seconds >= 0) optional.

        Types are strict (8.5, "8", true and null are refused, never rounded or cast);
        errors name the field as ``where.field[k]`` and the bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where} must be an object with ids and tokens, got {show_json(data)}")
        unknown = [k for k in data if k not in _BATCH_FIELDS]
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"a batch has {', '.join(_BATCH_FIELDS)}")
        for key in ("ids", "tokens"):
            if key not in data:
                raise ValueError(f"{where}.{key} is missing (a batch needs ids and tokens)")
        ids = _int_list(data["ids"], f"{where}.ids", *_INT64)
        tokens = _int_list(data["tokens"], f"{where}.tokens", -MAX_TOKENS, MAX_TOKENS)
        evict = _int_list(data.get("evict", []), f"{where}.evict", *_INT64)
        if ids.size != tokens.size:
            raise ValueError(f"{where}: ids and tokens differ in length: {ids.size} != {tokens.size}")
        return cls.trusted(ids, tokens, evict, _check_start(data.get("not_before_s", 0.0), f"{where}.not_before_s"))


@dataclass(frozen=True, slots=True, eq=False, init=False)
class Schedule:
    """An ordered list of batches, plus free-form provenance in ``meta``.

    The JSON form (``to_json``/``from_json``) is lossless and is what other
    tools and the executor read.
    """

    batches: tuple[Batch, ...]
    meta: Mapping[str, Any]

    def __init__(self, batches: Iterable[Batch], meta: Mapping[str, Any] | None = None) -> None:
        """Any iterable of batches becomes a tuple before the field is set (no field is rewritten later)."""
        object.__setattr__(self, "batches", tuple(batches))
        object.__setattr__(self, "meta", {} if meta is None else meta)

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
            try:
                Path(path).write_text(text)
            except OSError as exc:
                raise ValueError(f"cannot write schedule file {str(path)!r}: {exc.strerror or exc}") from None
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Schedule":
        """Read ``{"format": "infermax.schedule/1", "meta": {...}, "batches": [...]}`` (meta optional)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"not a schedule JSON: a schedule is an object with format and batches, "
                             f"got {show_json(data)}")
        unknown = [k for k in data if k not in _SCHEDULE_FIELDS]
        if unknown:
            raise ValueError(f"schedule has unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"a schedule has {', '.join(_SCHEDULE_FIELDS)}")
        fmt = data.get("format")
        if fmt != SCHEDULE_FORMAT:
            raise ValueError(f"Schedule.format must be {SCHEDULE_FORMAT!r}, got {show_json(fmt)}")
        batches = data.get("batches")
        if not isinstance(batches, list):
            raise ValueError(f"Schedule.batches must be an array, got {json_kind(batches)}")
        meta = data.get("meta", {})
        if not isinstance(meta, Mapping):
            raise ValueError(f"Schedule.meta must be an object, got {show_json(meta)}")
        return cls(batches=tuple(Batch.from_dict(b, f"batches[{j}]") for j, b in enumerate(batches)),
                   meta=dict(meta))

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "Schedule":
        """Read JSON text (a str starting with ``{``) or a schedule file (a Path, or any other str).

        Errors from a file name it: ``schedule file 'x.json': batches[3].tokens[0] must be ...``.
        """
        data, path = load_json(text_or_path, "schedule")
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            if path is None:
                raise
            raise ValueError(f"schedule file {path!r}: {exc}") from None


# --- writing a schedule one batch at a time ---------------------------------------------

_INT64_DTYPE = np.dtype(np.int64)


class _IntText(dict):
    """``str`` of integers, remembered (a running request's id is written in batch after batch)."""

    def __missing__(self, value: int) -> str:
        text = self[value] = str(value)
        return text


def _ints(values: np.ndarray, texts: _IntText | None = None) -> str:
    return ",".join(map(str if texts is None else texts.__getitem__, values.tolist()))


def batch_json(batch: Batch, texts: _IntText | None = None, ids_text: str | None = None) -> str:
    """``batch`` as :meth:`Schedule.to_json` writes it (the same bytes), without building a dict.
    ``texts``: a cache of the integers' text (:class:`ScheduleWriter` keeps one); ``ids_text``: the
    text of ``batch.ids`` when the caller has it."""
    tokens = batch.tokens.tolist()
    ones = tokens.count(1)
    if ones == len(tokens):    # a decode batch: every token count is 1
        tokens_text = "1," * (ones - 1) + "1" if tokens else ""
    else:
        if not ones or tokens[:ones].count(1) < ones:    # the ones written at once only when they lead
            ones = 0                                     # (the decodes of a hybrid batch, before its prefills)
        tokens_text = "1," * ones + ",".join(map(str if texts is None else texts.__getitem__, tokens[ones:]))
    if ids_text is None:
        ids_text = _ints(batch.ids, texts)
    text = f'{{"ids":[{ids_text}],"tokens":[{tokens_text}]'
    if batch.evict.size:
        text += f',"evict":[{_ints(batch.evict, texts)}]'
    if batch.not_before_s:
        text += f',"not_before_s":{float(batch.not_before_s)!r}'
    return text + "}"


def _kept_from(last: bytes, raw: bytes) -> int | None:
    """How many of the int64 values in ``last`` (bytes) to drop so that the rest starts ``raw``, keeping at
    least one (None when no such tail exists)."""
    if not raw or not last:
        return None
    head, pos = raw[:8], -1
    while True:
        pos = last.find(head, pos + 1)
        if pos < 0:
            return None
        if pos % 8 == 0:      # (a whole value, not bytes across two)
            return pos // 8 if raw.startswith(last[pos:]) else None


class ScheduleWriter:
    """Writes a schedule JSON file batch by batch, byte for byte what ``Schedule(batches,
    meta).to_json(path)`` writes, holding no batch after it is written.

    For runs too long to keep every Batch in memory (``simulate(..., schedule_path=...)``);
    read the file back with :meth:`Schedule.from_json`. ``add(batch, repeat)`` appends
    ``batch`` ``repeat`` times (a fast-forwarded decode run is formatted once).
    Use as a context manager, or call :meth:`close`.
    """

    MAX_TEXTS = 1 << 16     # integers whose text is remembered (then forgotten all at once)

    def __init__(self, path: str | Path, meta: Mapping[str, Any]) -> None:
        self.path = Path(path)
        try:
            self._file = open(self.path, "w", buffering=1 << 20)
        except OSError as exc:
            raise ValueError(f"cannot write schedule file {str(path)!r}: {exc.strerror or exc}") from None
        head = json.dumps({"format": SCHEDULE_FORMAT, "meta": dict(meta)}, separators=(",", ":"))
        self._file.write(head[:-1] + ',"batches":[')
        self.num_batches = 0
        self._texts = _IntText()
        self._recent = [(b"", ""), (b"", "")]    # the last two batches' ids (their bytes) and their text, last first

    def add(self, batch: Batch, repeat: int = 1) -> None:
        if repeat >= 1:
            texts = self._text_cache()
            self._write(batch_json(batch, texts, self._ids_text(batch.ids, texts)), repeat)

    def add_decode(self, ids: np.ndarray, repeat: int) -> None:
        """``add`` of ``repeat`` decode batches of ``ids`` (a token each, no eviction, no ``not_before_s``),
        without building the Batch: the same bytes."""
        if repeat >= 1:
            ids_text = self._ids_text(ids, self._text_cache())
            self._write(f'{{"ids":[{ids_text}],"tokens":[{"1," * (ids.size - 1)}1]}}', repeat)

    def _text_cache(self) -> _IntText:
        if len(self._texts) > self.MAX_TEXTS:
            self._texts.clear()
        return self._texts

    def _ids_text(self, ids: np.ndarray, texts: _IntText) -> str:
        """The text of ``ids``. When they are the ids of one of the last two batches less the first few (a
        decode run after its oldest requests complete), plus any at the end (a request joining the running
        ones, after a batch of its own prefill), the text of the ids kept is reused and only the ones
        added are formatted."""
        if ids.dtype is not _INT64_DTYPE:      # (the remembered ids are int64 bytes; the dtype object is NumPy's one)
            return _ints(ids, texts)
        raw = ids.tobytes()
        recent = self._recent
        if raw != recent[0][0]:
            text = None
            if ids.size > 8:      # (a few ids cost less to format than to look for)
                for last, last_text in recent:
                    drop = _kept_from(last, raw)
                    if drop is not None:
                        text = last_text.split(",", drop)[drop] if drop else last_text
                        kept = len(last) // 8 - drop
                        if kept < ids.size:     # (new requests: their ids' text is not remembered)
                            text += "," + _ints(ids[kept:])
                        break
            if text is None:
                text = _ints(ids, texts)
            recent[1] = recent[0]
            recent[0] = (raw, text)
        return recent[0][1]

    def _write(self, text: str, repeat: int) -> None:
        more = "," + text
        self._file.write(text + more * (repeat - 1) if self.num_batches == 0 else more * repeat)   # (one write)
        self.num_batches += repeat

    def close(self) -> None:
        if not self._file.closed:
            self._file.write("]}")
            self._file.close()

    def __enter__(self) -> "ScheduleWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
