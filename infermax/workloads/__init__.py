"""Workload generators and trace loaders, all seeded and deterministic.

``fixed`` (the paper's homogeneous grids, InferMax §4.1), ``mix`` (App. A.3
mixes) and ``load_trace`` (the Splitwise/Vidur and Azure CSV traces), with the
checks every generator shares (``check_real``, ``check_count``). The spec strings
that name them (``fixed:I=64,O=32,B=1024``) are read by :mod:`infermax.workloads.spec`.
The package's modules: :mod:`.spec` (the spec grammar behind ``Workload.from_spec``; importing
``infermax`` installs it), :mod:`.long` (PecSched's and Medha's long-context workloads, SLOs) and
:mod:`.typed` (typed multi-class workloads).

Named bounds: prompt and output lengths below 2^31 (``MAX_TOKENS``), at most 10^8
requests in a synthetic workload (``MAX_REQUESTS``; a trace has as many as its rows).
"""
from __future__ import annotations

import csv
import io
import math
from importlib import resources
from pathlib import Path

import numpy as np

from ..types import MAX_TOKENS, Request, Workload

#: synthetic workloads (fixed, mix, medha) hold at most this many requests
MAX_REQUESTS = 10**8
MAX_SEED = 2**63 - 1

MIX_SETS = {"S": (8, 16), "L": (512, 1024)}
MIX_GROUPS = ("SISO", "SILO", "LISO", "LILO")
BUILTIN_TRACES = ("splitwise_conv", "splitwise_code")


def arrivals(num: int, rate_per_s: float | None, cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """Arrival times (s) of ``num`` requests: Poisson (cv=1) or gamma inter-arrivals; 0 if no rate."""
    if rate_per_s is None:
        return np.zeros(num)
    check_real("rate", rate_per_s, unit=" requests/s")
    check_real("cv", cv)
    check_count("seed", seed, 0, MAX_SEED)
    rng = np.random.default_rng(seed)
    mean = 1.0 / rate_per_s
    if cv == 1.0:
        gaps = rng.exponential(mean, size=num)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, mean / shape, size=num)
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    if not np.all(np.isfinite(times)):
        raise ValueError(f"rate {rate_per_s!r} with cv {cv!r} makes arrival times overflow; use a larger rate")
    return times


def check_real(name: str, value: object, low: float = 0.0, allow_low: bool = False, unit: str = "") -> None:
    """``value`` must be a finite real > ``low`` (>= with ``allow_low``); bool and str are refused."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
          and math.isfinite(value) and (value >= low if allow_low else value > low))
    if not ok:
        raise ValueError(f"{name} must be {'>=' if allow_low else '>'} {low:g}{unit} and finite, got {value!r}")


def check_count(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        bound = f">= {low}" if value < low else f"<= {high:_}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def fixed(I: int, O: int, B: int, rate_per_s: float | None = None, cv: float = 1.0,
          seed: int = 0) -> Workload:
    """B identical requests with prompt I and output O (InferMax §4.1)."""
    for name, v, high in (("I", I, MAX_TOKENS), ("O", O, MAX_TOKENS), ("B", B, MAX_REQUESTS)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"fixed workload: {name} must be a positive integer, got {v!r}")
        if v > high:
            raise ValueError(f"fixed workload: {name} must be <= {high:_}, got {v!r}")
    t = arrivals(B, rate_per_s, cv, seed)
    return Workload.from_lengths([I] * B, [O] * B, t, name=f"fixed:I={I},O={O},B={B}")


def mix(groups: list[str], B: int, seed: int = 0, rate_per_s: float | None = None,
        cv: float = 1.0) -> Workload:
    """App. A.3 mix of request groups (SISO/SILO/LISO/LILO), shuffled."""
    if not groups:
        raise ValueError("mix workload: name at least one group, e.g. mix:LILO+SISO")
    for g in groups:
        if g not in MIX_GROUPS:
            raise ValueError(f"mix workload: unknown group {g!r}; use {', '.join(MIX_GROUPS)}")
    check_count("mix workload: B", B, 1, MAX_REQUESTS)
    if B < len(groups):
        raise ValueError(f"mix workload: B must be >= the number of groups ({len(groups)}), got {B}")
    check_count("mix workload: seed", seed, 0, MAX_SEED - 1)
    rng = np.random.default_rng(seed)
    ins: list[int] = []
    outs: list[int] = []
    tags: list[str] = []
    for k, g in enumerate(groups):
        n = B // len(groups) + (1 if k < B % len(groups) else 0)
        ins += rng.choice(MIX_SETS[g[0]], size=n).tolist()
        outs += rng.choice(MIX_SETS[g[2]], size=n).tolist()
        tags += [g] * n
    order = rng.permutation(B)
    t = arrivals(B, rate_per_s, cv, seed + 1)
    reqs = tuple(Request(id=i, input_len=int(ins[o]), output_len=int(outs[o]), arrival_s=float(t[i]),
                         tag=tags[o]) for i, o in enumerate(order))
    return Workload(requests=reqs, name=f"mix:{'+'.join(groups)},B={B},seed={seed}")


# --- traces ------------------------------------------------------------------
_TRACE_FORMATS = {
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
}


def _trace_text(source: str) -> tuple[str, str]:
    """The CSV text of a built-in trace or a file (a UTF-8 byte-order mark is dropped) and its label."""
    if source in BUILTIN_TRACES:
        ref = resources.files("infermax").joinpath("data", "traces", f"{source}.csv")
        return ref.read_text(), source
    path = Path(source)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"trace file {source!r} does not exist (built-in traces: {', '.join(BUILTIN_TRACES)})") \
            from None
    except OSError as exc:
        what = "is a directory, not a CSV file" if path.is_dir() else f"cannot be read ({exc.strerror or exc})"
        raise ValueError(f"trace file {source!r} {what}") from None
    try:
        return raw.decode("utf-8-sig"), path.name
    except UnicodeDecodeError:
        raise ValueError(f"trace file {source!r} is not a text file (not UTF-8; a binary file?), so not a CSV trace") \
            from None


def _parse_time(raw: str, fmt: str) -> float:
    """Seconds: a finite number (Splitwise/Vidur) or a date-time (Azure)."""
    if fmt == "vidur":
        value = float(raw)
    else:
        import pandas as pd  # Azure timestamps are datetimes

        try:
            stamp = pd.Timestamp(raw)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"not a date-time ({exc})") from None
        if pd.isna(stamp):
            raise ValueError("not a date-time (NaT)")
        value = stamp.value / 1e9
    if not math.isfinite(value):
        raise ValueError(f"time {raw!r} is not finite")
    return value


def _parse_length(raw: str) -> int:
    """A token count: ``374`` (or ``374.0``); 100.7, inf, NaN and text are refused."""
    try:
        return int(raw)
    except ValueError:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{raw!r} is not a whole number of tokens") from None
        return int(value)


# complexity: one check per trace option, column and value, each refused naming the row and field
def load_trace(source: str, n: int | None = None, skip: int = 0, time_scale: float = 1.0,
               offline: bool = False, max_len: int | None = None) -> Workload:
    """Load a Splitwise/Vidur or Azure trace CSV; rows are validated one by one.

    Each error names the trace, the line, the column and the value: lengths are
    whole numbers in [1, 2^31 - 1], times finite.
    """
    if n is not None:
        check_count("trace n", n, 1, MAX_SEED)
    check_count("trace skip", skip, 0, MAX_SEED)
    check_real("trace time_scale", time_scale)
    if max_len is not None:
        check_count("trace max_len", max_len, 1, MAX_TOKENS)
    text, label = _trace_text(source)
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as exc:
        raise ValueError(f"trace {label!r} line 1: malformed CSV header ({exc})") from None
    fmt = next((k for k, cols in _TRACE_FORMATS.items() if all(c in header for c in cols)), None)
    if fmt is None:
        raise ValueError(f"trace {label!r}: header {header} matches neither "
                         f"{list(_TRACE_FORMATS['vidur'])} nor {list(_TRACE_FORMATS['azure'])}")
    names = _TRACE_FORMATS[fmt]
    cols = [header.index(c) for c in names]
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    lineno = 1
    try:
        for rowno, row in enumerate(reader, start=2):
            lineno = reader.line_num
            if rowno - 2 < skip or not row or not any(cell.strip() for cell in row):
                continue
            if n is not None and len(ins) >= n:
                break
            if len(row) <= max(cols):
                raise ValueError(f"trace {label!r} line {lineno}: malformed row {row!r} "
                                 f"(has {len(row)} columns, needs {', '.join(names)})")
            t, i, o = (row[c].strip() for c in cols)
            values = []
            for name, raw, parse in ((names[0], t, lambda r: _parse_time(r, fmt)), (names[1], i, _parse_length),
                                     (names[2], o, _parse_length)):
                try:
                    values.append(parse(raw))
                except ValueError as exc:
                    raise ValueError(f"trace {label!r} line {lineno}: malformed row {row!r}: "
                                     f"{name} = {raw!r} ({exc})") from None
            tv, iv, ov = values
            for name, v, raw in ((names[1], iv, i), (names[2], ov, o)):
                if not 1 <= v <= MAX_TOKENS:
                    bound = ">= 1" if v < 1 else f"< 2^31 (<= {MAX_TOKENS})"
                    raise ValueError(f"trace {label!r} line {lineno}: {name} must be {bound}, got {raw}")
            if max_len is not None:
                iv, ov = min(iv, max_len), min(ov, max_len)
            times.append(tv)
            ins.append(iv)
            outs.append(ov)
    except csv.Error as exc:
        raise ValueError(f"trace {label!r} line {lineno + 1}: malformed CSV ({exc})") from None
    if not ins:
        raise ValueError(f"trace {label!r}: no request rows read (skip={skip}, n={n})")
    t = np.asarray(times, dtype=np.float64)
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, ins, outs = t[order], [ins[k] for k in order], [outs[k] for k in order]
    t = np.zeros_like(t) if offline else (t - t[0]) / time_scale
    if not np.all(np.isfinite(t)):
        raise ValueError(f"trace {label!r}: arrival times overflow with time_scale = {time_scale!r}")
    return Workload.from_lengths(ins, outs, t, name=f"trace:{label},n={len(ins)}")
