"""Long-context workloads: PecSched's long-tail traces, Medha's mixes, and SLOs.

- ``pecsched:splitwise_conv,n=2000`` — PecSched §6.2: requests whose input is
  above the 95th percentile (``pct``) of a real trace become long, with inputs
  drawn uniformly from [``lo``, ``hi``] = [100K, 500K]; outputs and arrival times
  keep the trace's. Tags: ``short`` / ``long``.
- ``medha:B=400,long_frac=0.05,rate=0.5`` — Medha §5.1: short requests from
  a real conversation trace (Splitwise conv, capped at 8K tokens, standing in for
  ShareGPT4) plus a fraction ``long_frac`` of long requests with inputs uniform in
  [128K, 1M] and outputs log-normal with median 518 and p90 808 (the paper's
  Medha-SWE decode lengths); Poisson arrivals at ``rate`` requests/s.

SLO options for every spec: ``ttft_slo`` (s) + ``ttft_slo_per_1k`` (s per 1000
prompt tokens) give each request's TTFT deadline, ``tpot_slo`` (s) its TPOT one.
"""
from __future__ import annotations

import math

import numpy as np

from ..types import MAX_TOKENS, Request, Workload
from . import MAX_REQUESTS, MAX_SEED, arrivals, check_count, check_real, load_trace

SWE_DECODE_MEDIAN, SWE_DECODE_P90 = 518, 808


def with_slos(workload: Workload, ttft_s: float | None = None, ttft_per_1k_s: float = 0.0,
              tpot_s: float | None = None) -> Workload:
    """A copy of ``workload`` whose requests carry TTFT (base + per-1K-token) and TPOT deadlines."""
    if ttft_s is None and tpot_s is None:
        return workload
    for name, v in (("ttft_slo", ttft_s), ("tpot_slo", tpot_s)):
        if v is not None:
            check_real(f"workload {name}", v, unit=" s")
    check_real("workload ttft_slo_per_1k", ttft_per_1k_s, allow_low=True, unit=" s")
    reqs = tuple(Request(id=r.id, input_len=r.input_len, output_len=r.output_len, arrival_s=r.arrival_s,
                         ttft_slo_s=None if ttft_s is None else ttft_s + ttft_per_1k_s * r.input_len / 1000,
                         tpot_slo_s=tpot_s, tag=r.tag) for r in workload.requests)
    return Workload(requests=reqs, name=workload.name)


def _check_lengths(kind: str, lo: int, hi: int) -> None:
    """The long-input range [lo, hi]: 1 <= lo <= hi < 2^31."""
    check_count(f"{kind} workload: lo", lo, 1, MAX_TOKENS)
    check_count(f"{kind} workload: hi", hi, 1, MAX_TOKENS)
    if lo > hi:
        raise ValueError(f"{kind} workload: need lo <= hi, got lo={lo}, hi={hi}")


def pecsched_trace(source: str = "splitwise_conv", n: int | None = 2000, pct: float = 95.0,
                   lo: int = 100_000, hi: int = 500_000, seed: int = 0, time_scale: float = 1.0) -> Workload:
    """PecSched's long-tail construction over a real trace (PecSched §6.2)."""
    check_real("pecsched workload: pct", pct)
    if not 0 < pct < 100:
        raise ValueError(f"pecsched workload: pct must be in (0, 100), got {pct}")
    _check_lengths("pecsched", lo, hi)
    check_count("pecsched workload: seed", seed, 0, MAX_SEED)
    base = load_trace(source, n=n, time_scale=time_scale)
    ins = base.input_lens.copy()
    cut = np.percentile(ins, pct)
    long = ins > cut
    rng = np.random.default_rng(seed)
    ins[long] = rng.integers(lo, hi + 1, size=int(long.sum()))
    reqs = tuple(Request(id=i, input_len=int(ins[i]), output_len=int(base.output_lens[i]),
                         arrival_s=float(base.arrivals_s[i]), tag="long" if long[i] else "short")
                 for i in range(len(base)))
    extra = "".join(f",{k}={v:g}" for k, v, d in (("lo", lo, 100_000), ("hi", hi, 500_000),
                                                     ("time_scale", time_scale, 1.0)) if v != d)
    return Workload(requests=reqs, name=f"pecsched:{source},n={len(base)},pct={pct:g},seed={seed}{extra}")


def medha_mix(B: int, long_frac: float = 0.05, lo: int = 128_000, hi: int = 1_000_000,
              rate_per_s: float | None = 0.5, seed: int = 0, short_source: str = "splitwise_conv",
              short_cap: int = 8192) -> Workload:
    """Medha's short + long-context mix (Medha §5.1)."""
    check_count("medha workload: B", B, 1, MAX_REQUESTS)
    check_real("medha workload: long_frac", long_frac, allow_low=True)
    if not 0 <= long_frac <= 1:
        raise ValueError(f"medha workload: long_frac must be in [0, 1], got {long_frac}")
    _check_lengths("medha", lo, hi)
    check_count("medha workload: short_cap", short_cap, 1, MAX_TOKENS)
    check_count("medha workload: seed", seed, 0, MAX_SEED - 1)
    rng = np.random.default_rng(seed)
    shorts = load_trace(short_source, n=None, max_len=short_cap)
    pick = rng.integers(0, len(shorts), size=B)
    ins, outs = shorts.input_lens[pick].copy(), shorts.output_lens[pick].copy()
    long = rng.random(B) < long_frac
    sigma = math.log(SWE_DECODE_P90 / SWE_DECODE_MEDIAN) / 1.2816
    ins[long] = rng.integers(lo, hi + 1, size=int(long.sum()))
    outs[long] = np.maximum(1, np.round(SWE_DECODE_MEDIAN * rng.lognormal(0.0, sigma, int(long.sum()))))
    t = arrivals(B, rate_per_s, 1.0, seed + 1)
    reqs = tuple(Request(id=i, input_len=int(ins[i]), output_len=int(outs[i]), arrival_s=float(t[i]),
                         tag="long" if long[i] else "short") for i in range(B))
    return Workload(requests=reqs, name=f"medha:B={B},long_frac={long_frac:g},seed={seed}")
