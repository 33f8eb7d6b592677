"""Workload generators and trace loaders, all seeded and deterministic.

One spec string serves the CLI and the API (``Workload.from_spec``):

- ``fixed:I=64,O=32,B=1024`` — the paper's homogeneous grids (infermax.txt §4.1);
- ``mix:LILO+SISO,B=512,seed=1`` — App. A.3 mixes: S = {8, 16}, L = {512, 1024};
  B requests split evenly over the named groups, each length drawn uniformly from
  its set, then shuffled;
- ``trace:splitwise_conv,n=2000`` or ``trace:path.csv,n=2000`` — real traces: the
  Splitwise/Vidur CSV (``arrived_at,num_prefill_tokens,num_decode_tokens``) or the
  Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``); options
  ``skip`` (rows to skip), ``time_scale`` (divide inter-arrival times),
  ``offline=1`` (all arrive at 0), ``max_len`` (clip I and O).

Arrival options for ``fixed`` and ``mix``: ``rate`` (requests/s) gives Poisson
arrivals; with ``cv`` != 1 the inter-arrival times are gamma distributed with that
coefficient of variation. Without ``rate`` the workload is offline (all at t=0).

Every value is checked and a bad one named (``workload spec '...': B must be <=
100_000_000, got 1e12``): counts are integers (``8.5`` and ``true`` are not),
reals are finite, a key may appear once. Named bounds: prompt and output lengths
below 2^31 (``MAX_TOKENS``), at most 10^8 requests in a synthetic workload
(``MAX_REQUESTS``; a trace has as many as its rows).
"""
from __future__ import annotations

import csv
import io
import math
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .types import MAX_TOKENS, Request, Workload, parse_count

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
    """B identical requests with prompt I and output O (infermax.txt §4.1)."""
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


# --- spec strings ------------------------------------------------------------
def _options(parts: list[str], spec: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; an item without ``=`` or a key given twice is refused."""
    opts: dict[str, str] = {}
    for part in parts:
        if "=" not in part:
            raise ValueError(f"workload spec {spec!r}: item {part!r} must look like KEY=VALUE")
        k, v = (x.strip() for x in part.split("=", 1))
        if k in opts:
            raise ValueError(f"workload spec {spec!r}: option {k} is given twice")
        opts[k] = v
    return opts


def _pop(opts: dict[str, str], key: str, cast: Any, default: Any, spec: str) -> Any:
    """Remove ``key`` and parse it with ``cast``; a bad value is named with the spec."""
    if key not in opts:
        return default
    raw = opts.pop(key)
    try:
        return cast(raw)
    except ValueError as exc:
        raise ValueError(f"workload spec {spec!r}: {exc}") from None


def _count(name: str, minimum: int = 1, maximum: int = MAX_TOKENS):
    """A count option (``4096``, ``100K``, ``1e5``) in [minimum, maximum]."""
    return lambda raw: parse_count(raw, name, minimum, maximum)


def _real(name: str, low: float = 0.0, allow_low: bool = False, high: float | None = None):
    """A real option: finite, > low (>= with ``allow_low``), <= high when given; "true" refused."""
    def cast(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
        check_real(name, value, low, allow_low)
        if high is not None and value > high:
            raise ValueError(f"{name} must be <= {high:g}, got {raw!r}")
        return value
    return cast


def _flag(name: str):
    def cast(raw: str) -> bool:
        if raw.lower() not in ("0", "1", "true", "false"):
            raise ValueError(f"{name} must be 0, 1, true or false, got {raw!r}")
        return raw.lower() in ("1", "true")
    return cast


def workload_from_spec(spec: str) -> Workload:
    """Parse a workload spec string (see the module docstring); a ``.json`` path loads a saved workload."""
    if isinstance(spec, str) and spec.strip().lower().endswith(".json") and ":" not in spec.split("/")[0]:
        return Workload.from_json(Path(spec.strip()))
    if not isinstance(spec, str) or ":" not in spec:
        hint = f"; for a CSV trace write 'trace:{spec}'" if isinstance(spec, str) and spec.endswith(".csv") else ""
        raise ValueError(f"workload spec must look like KIND:OPTIONS (fixed:, mix:, trace:, pecsched:, medha:) "
                         f"or name a workload .json file, got {spec!r}{hint}")
    kind, rest = spec.split(":", 1)
    parts = [p for p in rest.split(",") if p.strip()]
    kind = kind.strip().lower()
    slo_keys = ("ttft_slo", "ttft_slo_per_1k", "tpot_slo")
    slo = _options([p for p in parts if p.split("=", 1)[0].strip() in slo_keys], spec)
    parts = [p for p in parts if p.split("=", 1)[0].strip() not in slo_keys]
    wl = _parse_kind(kind, parts, spec)
    from .workloads_long import with_slos

    return with_slos(wl, ttft_s=_pop(slo, "ttft_slo", _real("ttft_slo"), None, spec),
                     ttft_per_1k_s=_pop(slo, "ttft_slo_per_1k", _real("ttft_slo_per_1k", allow_low=True), 0.0, spec),
                     tpot_s=_pop(slo, "tpot_slo", _real("tpot_slo"), None, spec))


_SEED = _count("seed", 0, MAX_SEED - 1)


def _parse_kind(kind: str, parts: list[str], spec: str) -> Workload:
    """Read every option of one spec kind, refuse leftovers, then build (no work before all are checked)."""
    readers = {"fixed": _synthetic_spec, "mix": _synthetic_spec, "trace": _trace_spec,
               "pecsched": _pecsched_spec, "medha": _medha_spec}
    if kind not in readers:
        raise ValueError(f"workload spec {spec!r}: unknown kind {kind!r}; use fixed, mix, trace, pecsched or medha")
    make, opts = readers[kind](kind, parts, spec)
    if opts:
        raise ValueError(f"workload spec {spec!r}: unknown option(s) {', '.join(sorted(opts))}")
    return make()


def _synthetic_spec(kind: str, parts: list[str], spec: str) -> tuple[Any, dict[str, str]]:
    head = parts[0] if kind == "mix" and parts and "=" not in parts[0] else None
    opts = _options(parts[1:] if head else parts, spec)
    seed = _pop(opts, "seed", _SEED, 0, spec)
    rate = _pop(opts, "rate", _real("rate"), None, spec)
    cv = _pop(opts, "cv", _real("cv"), 1.0, spec)
    B = _pop(opts, "B", _count("B", 1, MAX_REQUESTS), None, spec)
    if B is None:
        raise ValueError(f"workload spec {spec!r}: B (number of requests) is required")
    if kind == "fixed":
        I = _pop(opts, "I", _count("I"), None, spec)
        O = _pop(opts, "O", _count("O"), None, spec)
        if I is None or O is None:
            raise ValueError(f"workload spec {spec!r}: fixed needs I and O")
        return partial(fixed, I, O, B, rate_per_s=rate, cv=cv, seed=seed), opts
    if head is None:
        raise ValueError(f"workload spec {spec!r}: name the groups first, e.g. mix:LILO+SISO,B=512")
    groups = [g.strip().upper() for g in head.split("+")]
    return partial(mix, groups, B, seed=seed, rate_per_s=rate, cv=cv), opts


def _trace_spec(kind: str, parts: list[str], spec: str) -> tuple[Any, dict[str, str]]:
    if not parts or "=" in parts[0]:
        raise ValueError(f"workload spec {spec!r}: name a trace file or one of {', '.join(BUILTIN_TRACES)} "
                         f"first, e.g. trace:splitwise_conv,n=100")
    source, opts = parts[0].strip(), _options(parts[1:], spec)
    return partial(load_trace, source, n=_pop(opts, "n", _count("n", 1, MAX_SEED), None, spec),
                   skip=_pop(opts, "skip", _count("skip", 0, MAX_SEED), 0, spec),
                   time_scale=_pop(opts, "time_scale", _real("time_scale"), 1.0, spec),
                   offline=_pop(opts, "offline", _flag("offline"), False, spec),
                   max_len=_pop(opts, "max_len", _count("max_len"), None, spec)), opts


def _pecsched_spec(kind: str, parts: list[str], spec: str) -> tuple[Any, dict[str, str]]:
    from .workloads_long import pecsched_trace

    named = bool(parts) and "=" not in parts[0]
    source = parts[0].strip() if named else "splitwise_conv"
    opts = _options(parts[1:] if named else parts, spec)
    return partial(pecsched_trace, source, n=_pop(opts, "n", _count("n", 1, MAX_SEED), 2000, spec),
                   pct=_pop(opts, "pct", _real("pct", high=100.0), 95.0, spec),
                   lo=_pop(opts, "lo", _count("lo"), 100_000, spec), hi=_pop(opts, "hi", _count("hi"), 500_000, spec),
                   seed=_pop(opts, "seed", _SEED, 0, spec),
                   time_scale=_pop(opts, "time_scale", _real("time_scale"), 1.0, spec)), opts


def _medha_spec(kind: str, parts: list[str], spec: str) -> tuple[Any, dict[str, str]]:
    from .workloads_long import medha_mix

    opts = _options(parts, spec)
    B = _pop(opts, "B", _count("B", 1, MAX_REQUESTS), None, spec)
    if B is None:
        raise ValueError(f"workload spec {spec!r}: B (number of requests) is required")
    return partial(medha_mix, B, long_frac=_pop(opts, "long_frac", _real("long_frac", allow_low=True, high=1.0),
                                                0.05, spec),
                   lo=_pop(opts, "lo", _count("lo"), 128_000, spec), hi=_pop(opts, "hi", _count("hi"), 1_000_000, spec),
                   rate_per_s=_pop(opts, "rate", _real("rate"), 0.5, spec), seed=_pop(opts, "seed", _SEED, 0, spec),
                   short_cap=_pop(opts, "short_cap", _count("short_cap"), 8192, spec)), opts
