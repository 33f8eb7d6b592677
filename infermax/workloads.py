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
"""
from __future__ import annotations

import csv
import io
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .types import Request, Workload, parse_count

MIX_SETS = {"S": (8, 16), "L": (512, 1024)}
MIX_GROUPS = ("SISO", "SILO", "LISO", "LILO")
BUILTIN_TRACES = ("splitwise_conv", "splitwise_code")


def arrivals(num: int, rate_per_s: float | None, cv: float = 1.0, seed: int = 0) -> np.ndarray:
    """Arrival times (s) of ``num`` requests: Poisson (cv=1) or gamma inter-arrivals; 0 if no rate."""
    if rate_per_s is None:
        return np.zeros(num)
    if not rate_per_s > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate_per_s!r}")
    if not cv > 0:
        raise ValueError(f"cv must be > 0, got {cv!r}")
    rng = np.random.default_rng(seed)
    mean = 1.0 / rate_per_s
    if cv == 1.0:
        gaps = rng.exponential(mean, size=num)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, mean / shape, size=num)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def fixed(I: int, O: int, B: int, rate_per_s: float | None = None, cv: float = 1.0,
          seed: int = 0) -> Workload:
    """B identical requests with prompt I and output O (infermax.txt §4.1)."""
    for name, v in (("I", I), ("O", O), ("B", B)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"fixed workload: {name} must be a positive integer, got {v!r}")
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
    if B < len(groups):
        raise ValueError(f"mix workload: B must be >= the number of groups ({len(groups)}), got {B}")
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
    if source in BUILTIN_TRACES:
        ref = resources.files("infermax").joinpath("data", "traces", f"{source}.csv")
        return ref.read_text(), source
    path = Path(source)
    if not path.exists():
        raise ValueError(f"trace file {source!r} does not exist (built-in traces: {', '.join(BUILTIN_TRACES)})")
    return path.read_text(), path.name


def _parse_time(raw: str, fmt: str) -> float:
    if fmt == "vidur":
        return float(raw)
    import pandas as pd  # Azure timestamps are datetimes

    return pd.Timestamp(raw).value / 1e9


def load_trace(source: str, n: int | None = None, skip: int = 0, time_scale: float = 1.0,
               offline: bool = False, max_len: int | None = None) -> Workload:
    """Load a Splitwise/Vidur or Azure trace CSV; rows are validated one by one."""
    text, label = _trace_text(source)
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    fmt = next((k for k, cols in _TRACE_FORMATS.items() if all(c in header for c in cols)), None)
    if fmt is None:
        raise ValueError(f"trace {label!r}: header {header} matches neither "
                         f"{list(_TRACE_FORMATS['vidur'])} nor {list(_TRACE_FORMATS['azure'])}")
    cols = [header.index(c) for c in _TRACE_FORMATS[fmt]]
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    for lineno, row in enumerate(reader, start=2):
        if lineno - 2 < skip or not row or not any(cell.strip() for cell in row):
            continue
        if n is not None and len(ins) >= n:
            break
        try:
            t, i, o = (row[c].strip() for c in cols)
            tv, iv, ov = _parse_time(t, fmt), int(float(i)), int(float(o))
        except (IndexError, ValueError) as exc:
            raise ValueError(f"trace {label!r} line {lineno}: malformed row {row!r} ({exc})") from None
        if iv < 1 or ov < 1:
            field = _TRACE_FORMATS[fmt][1] if iv < 1 else _TRACE_FORMATS[fmt][2]
            bad = iv if iv < 1 else ov
            raise ValueError(f"trace {label!r} line {lineno}: {field} must be >= 1, got {bad}")
        if max_len is not None:
            iv, ov = min(iv, max_len), min(ov, max_len)
        times.append(tv)
        ins.append(iv)
        outs.append(ov)
    if not ins:
        raise ValueError(f"trace {label!r}: no request rows read (skip={skip}, n={n})")
    t = np.asarray(times, dtype=np.float64)
    if np.any(np.diff(t) < 0):
        order = np.argsort(t, kind="stable")
        t, ins, outs = t[order], [ins[k] for k in order], [outs[k] for k in order]
    t = np.zeros_like(t) if offline else (t - t[0]) / time_scale
    return Workload.from_lengths(ins, outs, t, name=f"trace:{label},n={len(ins)}")


# --- spec strings ------------------------------------------------------------
def _options(parts: list[str], spec: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    for part in parts:
        if "=" not in part:
            raise ValueError(f"workload spec {spec!r}: item {part!r} must look like KEY=VALUE")
        k, v = part.split("=", 1)
        opts[k.strip()] = v.strip()
    return opts


def _pop(opts: dict[str, str], key: str, cast: Any, default: Any, spec: str) -> Any:
    if key not in opts:
        return default
    raw = opts.pop(key)
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"workload spec {spec!r}: {key} has a bad value {raw!r}") from None


def _count(name: str):
    return lambda raw: parse_count(raw, name)


def workload_from_spec(spec: str) -> Workload:
    """Parse a workload spec string (see the module docstring); a ``.json`` path loads a saved workload."""
    if isinstance(spec, str) and spec.endswith(".json") and ":" not in spec.split("/")[0]:
        path = Path(spec)
        if not path.exists():
            raise ValueError(f"workload file {spec!r} does not exist")
        import json

        return Workload.from_dict(json.loads(path.read_text()))
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"workload spec must look like KIND:OPTIONS (fixed:, mix:, trace:), got {spec!r}")
    kind, rest = spec.split(":", 1)
    parts = [p for p in rest.split(",") if p.strip()]
    kind = kind.strip().lower()
    slo_keys = ("ttft_slo", "ttft_slo_per_1k", "tpot_slo")
    slo = _options([p for p in parts if p.split("=", 1)[0].strip() in slo_keys], spec)
    parts = [p for p in parts if p.split("=", 1)[0].strip() not in slo_keys]
    wl = _parse_kind(kind, parts, spec)
    from .workloads_long import with_slos

    return with_slos(wl, ttft_s=_pop(slo, "ttft_slo", float, None, spec),
                     ttft_per_1k_s=_pop(slo, "ttft_slo_per_1k", float, 0.0, spec),
                     tpot_s=_pop(slo, "tpot_slo", float, None, spec))


def _parse_kind(kind: str, parts: list[str], spec: str) -> Workload:
    if kind in ("pecsched", "medha"):
        from .workloads_long import medha_mix, pecsched_trace

        if kind == "pecsched":
            source = parts[0].strip() if parts and "=" not in parts[0] else "splitwise_conv"
            opts = _options(parts[1:] if parts and "=" not in parts[0] else parts, spec)
            wl = pecsched_trace(source, n=_pop(opts, "n", _count("n"), 2000, spec),
                                pct=_pop(opts, "pct", float, 95.0, spec), lo=_pop(opts, "lo", _count("lo"), 100_000, spec),
                                hi=_pop(opts, "hi", _count("hi"), 500_000, spec), seed=_pop(opts, "seed", int, 0, spec),
                                time_scale=_pop(opts, "time_scale", float, 1.0, spec))
        else:
            opts = _options(parts, spec)
            B = _pop(opts, "B", _count("B"), None, spec)
            if B is None:
                raise ValueError(f"workload spec {spec!r}: B (number of requests) is required")
            wl = medha_mix(B, long_frac=_pop(opts, "long_frac", float, 0.05, spec),
                           lo=_pop(opts, "lo", _count("lo"), 128_000, spec), hi=_pop(opts, "hi", _count("hi"), 1_000_000, spec),
                           rate_per_s=_pop(opts, "rate", float, 0.5, spec), seed=_pop(opts, "seed", int, 0, spec),
                           short_cap=_pop(opts, "short_cap", _count("short_cap"), 8192, spec))
    elif kind == "trace":
        if not parts:
            raise ValueError(f"workload spec {spec!r}: name a trace file or {BUILTIN_TRACES}")
        source, opts = parts[0].strip(), _options(parts[1:], spec)
        wl = load_trace(source, n=_pop(opts, "n", _count("n"), None, spec),
                        skip=_pop(opts, "skip", _count("skip"), 0, spec),
                        time_scale=_pop(opts, "time_scale", float, 1.0, spec),
                        offline=bool(_pop(opts, "offline", int, 0, spec)),
                        max_len=_pop(opts, "max_len", _count("max_len"), None, spec))
    elif kind in ("fixed", "mix"):
        head = parts[0] if kind == "mix" and parts and "=" not in parts[0] else None
        opts = _options(parts[1:] if head else parts, spec)
        seed = _pop(opts, "seed", int, 0, spec)
        rate = _pop(opts, "rate", float, None, spec)
        cv = _pop(opts, "cv", float, 1.0, spec)
        B = _pop(opts, "B", _count("B"), None, spec)
        if B is None:
            raise ValueError(f"workload spec {spec!r}: B (number of requests) is required")
        if kind == "fixed":
            I = _pop(opts, "I", _count("I"), None, spec)
            O = _pop(opts, "O", _count("O"), None, spec)
            if I is None or O is None:
                raise ValueError(f"workload spec {spec!r}: fixed needs I and O")
            wl = fixed(I, O, B, rate_per_s=rate, cv=cv, seed=seed)
        else:
            if head is None:
                raise ValueError(f"workload spec {spec!r}: name the groups first, e.g. mix:LILO+SISO,B=512")
            wl = mix([g.strip().upper() for g in head.split("+")], B, seed=seed, rate_per_s=rate, cv=cv)
    else:
        raise ValueError(f"workload spec {spec!r}: unknown kind {kind!r}; use fixed, mix, trace, pecsched or medha")
    if opts:
        raise ValueError(f"workload spec {spec!r}: unknown option(s) {', '.join(sorted(opts))}")
    return wl
