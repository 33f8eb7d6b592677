"""Workload spec strings: the grammar that turns ``fixed:I=64,O=32,B=1024`` into a Workload.

One spec string serves the CLI and the API (``Workload.from_spec``, which this
module installs on import: :func:`infermax.types.register_spec_reader`):

- ``fixed:I=64,O=32,B=1024`` — the paper's homogeneous grids (InferMax §4.1);
- ``mix:LILO+SISO,B=512,seed=1`` — App. A.3 mixes: S = {8, 16}, L = {512, 1024};
  B requests split evenly over the named groups, each length drawn uniformly from
  its set, then shuffled;
- ``trace:splitwise_conv,n=2000`` or ``trace:path.csv,n=2000`` — real traces: the
  Splitwise/Vidur CSV (``arrived_at,num_prefill_tokens,num_decode_tokens``) or the
  Azure LLM inference CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``); options
  ``skip`` (rows to skip), ``time_scale`` (divide inter-arrival times),
  ``offline=1`` (all arrive at 0), ``max_len`` (clip I and O);
- ``typed:types=short/64/32/2+long/512/128/0.5,n=1000`` — request types with length distributions and
  Poisson rates (:mod:`infermax.workloads.typed`; options ``seed``, ``offline=1``, ``tick``);
- ``pecsched:...`` and ``medha:...`` — the long-context workloads of
  :mod:`infermax.workloads.long`, which also gives every kind its SLO options.

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

from functools import partial
from pathlib import Path
from typing import Any

from ..types import MAX_TOKENS, Workload, parse_count, register_spec_reader
from . import BUILTIN_TRACES, MAX_REQUESTS, MAX_SEED, check_real, fixed, load_trace, mix
from .long import medha_mix, pecsched_trace, with_slos
from .typed import parse_types, typed


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
        raise ValueError(f"workload spec must look like KIND:OPTIONS (fixed:, mix:, trace:, typed:, pecsched:, medha:) "
                         f"or name a workload .json file, got {spec!r}{hint}")
    kind, rest = spec.split(":", 1)
    parts = [p for p in rest.split(",") if p.strip()]
    kind = kind.strip().lower()
    slo_keys = ("ttft_slo", "ttft_slo_per_1k", "tpot_slo")
    slo = _options([p for p in parts if p.split("=", 1)[0].strip() in slo_keys], spec)
    parts = [p for p in parts if p.split("=", 1)[0].strip() not in slo_keys]
    wl = _parse_kind(kind, parts, spec)
    return with_slos(wl, ttft_s=_pop(slo, "ttft_slo", _real("ttft_slo"), None, spec),
                     ttft_per_1k_s=_pop(slo, "ttft_slo_per_1k", _real("ttft_slo_per_1k", allow_low=True), 0.0, spec),
                     tpot_s=_pop(slo, "tpot_slo", _real("tpot_slo"), None, spec))


_SEED = _count("seed", 0, MAX_SEED - 1)


def _parse_kind(kind: str, parts: list[str], spec: str) -> Workload:
    """Read every option of one spec kind, refuse leftovers, then build (no work before all are checked)."""
    readers = {"fixed": _synthetic_spec, "mix": _synthetic_spec, "trace": _trace_spec,
               "pecsched": _pecsched_spec, "medha": _medha_spec, "typed": _typed_spec}
    if kind not in readers:
        raise ValueError(f"workload spec {spec!r}: unknown kind {kind!r}; use fixed, mix, trace, typed, pecsched "
                         f"or medha")
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
    named = bool(parts) and "=" not in parts[0]
    source = parts[0].strip() if named else "splitwise_conv"
    opts = _options(parts[1:] if named else parts, spec)
    return partial(pecsched_trace, source, n=_pop(opts, "n", _count("n", 1, MAX_SEED), 2000, spec),
                   pct=_pop(opts, "pct", _real("pct", high=100.0), 95.0, spec),
                   lo=_pop(opts, "lo", _count("lo"), 100_000, spec), hi=_pop(opts, "hi", _count("hi"), 500_000, spec),
                   seed=_pop(opts, "seed", _SEED, 0, spec),
                   time_scale=_pop(opts, "time_scale", _real("time_scale"), 1.0, spec)), opts


def _typed_spec(kind: str, parts: list[str], spec: str) -> tuple[Any, dict[str, str]]:
    opts = _options(parts, spec)
    types = _pop(opts, "types", parse_types, None, spec)
    n = _pop(opts, "n", _count("n", 1, MAX_REQUESTS), None, spec)
    if types is None or n is None:
        raise ValueError(f"workload spec {spec!r}: typed needs types=NAME/PROMPT/OUTPUT/RATE+... and n")
    return partial(typed, types, n, seed=_pop(opts, "seed", _SEED, 0, spec),
                   offline=_pop(opts, "offline", _flag("offline"), False, spec),
                   tick_s=_pop(opts, "tick", _real("tick"), None, spec)), opts


def _medha_spec(kind: str, parts: list[str], spec: str) -> tuple[Any, dict[str, str]]:
    opts = _options(parts, spec)
    B = _pop(opts, "B", _count("B", 1, MAX_REQUESTS), None, spec)
    if B is None:
        raise ValueError(f"workload spec {spec!r}: B (number of requests) is required")
    return partial(medha_mix, B, long_frac=_pop(opts, "long_frac", _real("long_frac", allow_low=True, high=1.0),
                                                0.05, spec),
                   lo=_pop(opts, "lo", _count("lo"), 128_000, spec), hi=_pop(opts, "hi", _count("hi"), 1_000_000, spec),
                   rate_per_s=_pop(opts, "rate", _real("rate"), 0.5, spec), seed=_pop(opts, "seed", _SEED, 0, spec),
                   short_cap=_pop(opts, "short_cap", _count("short_cap"), 8192, spec)), opts


register_spec_reader(workload_from_spec)
