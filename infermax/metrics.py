"""Metrics from a Trace: one flat dict with stable keys (seconds, tokens, counts).

Keys: ``latency_s`` (makespan: last completion - first arrival), ``tps``
(generated tokens / latency), ``ttft_*``, ``tpot_*``, ``e2e_*``, ``queueing_*``
(``mean``, ``p50``, ``p90``, ``p99``; TPOT over requests with O > 1),
``num_batches``, ``num_evictions``, ``refill_tokens``, ``batch_size_mean``,
``running_size_mean``, ``kv_tokens_mean``, ``kv_tokens_max``,
``kv_utilization_mean``, ``num_requests``, ``generated_tokens``,
``num_suspensions`` (prefills paused and resumed). With SLOs on the requests:
``ttft_attainment``, ``tpot_attainment``, ``slo_attainment`` (fractions) and
``goodput_rps`` (requests meeting all their SLOs per second of latency).
:func:`metrics_by_tag` adds, per request tag (e.g. short/long), the queueing
delay percentiles, throughput, mean JCT and the requests first served only after the last arrival.

Calling the module calls :func:`metrics`: ``infermax.metrics(trace)``.
"""
from __future__ import annotations

import sys

import numpy as np

from ._callable import CallableModule
from .trace import Trace

STAT_KEYS = ("mean", "p50", "p90", "p99")


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return {f"{prefix}_{k}_s": float("nan") for k in STAT_KEYS}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {f"{prefix}_mean_s": float(v.mean()), f"{prefix}_p50_s": float(p50),
            f"{prefix}_p90_s": float(p90), f"{prefix}_p99_s": float(p99)}


def metrics(trace: Trace) -> dict[str, float]:
    """Compute the metrics dict of a trace (see module docstring for the keys)."""
    b, r = trace.batches, trace.requests
    arrival, first, done = r["arrival_s"], r["first_token_s"], r["completion_s"]
    out_len = r["output_len"]
    latency = float(done.max() - arrival.min())
    generated = int(out_len.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_len > 1, (done - first) / (out_len - 1), np.nan)
    out: dict[str, float] = {"latency_s": latency, "tps": generated / latency if latency > 0 else float("inf"),
                             "num_requests": int(out_len.size), "generated_tokens": generated}
    out |= _stats("ttft", first - arrival)
    out |= _stats("tpot", tpot)
    out |= _stats("e2e", done - arrival)
    out |= _stats("queueing", r["first_scheduled_s"] - arrival)
    refill = int(r["refill_tokens"].sum())
    out |= {"num_batches": trace.num_batches, "num_evictions": int(r["num_evictions"].sum()),
            "refill_tokens": refill, **_batch_means(b, trace.M),
            "busy_s": float(b["duration_s"].sum()),
            "num_suspensions": int(r["num_suspensions"].sum())}
    out |= slo_metrics(trace)
    return out


def _batch_means(b: dict[str, np.ndarray], M: int) -> dict[str, float]:
    """Batch size, running requests and KV per batch. Without batches (the cluster judge's replay of a run
    whose every request ran on a gang: gang steps are no replica's batches) the means are NaN, the max 0."""
    if not b["kv_tokens"].size:
        nan = float("nan")
        return {"batch_size_mean": nan, "running_size_mean": nan, "kv_tokens_mean": nan, "kv_tokens_max": 0,
                "kv_utilization_mean": nan}
    return {"batch_size_mean": float(b["num_requests"].mean()), "running_size_mean": float(b["num_running"].mean()),
            "kv_tokens_mean": float(b["kv_tokens"].mean()), "kv_tokens_max": int(b["kv_tokens"].max()),
            "kv_utilization_mean": float(b["kv_tokens"].mean() / M)}


def slo_metrics(trace: Trace) -> dict[str, float]:
    """TTFT / TPOT attainment over the requests that carry that SLO, and goodput (empty if no SLO)."""
    r = trace.requests
    ttft_slo, tpot_slo = r["ttft_slo_s"], r["tpot_slo_s"]
    has_ttft, has_tpot = ~np.isnan(ttft_slo), ~np.isnan(tpot_slo)
    if not (has_ttft.any() or has_tpot.any()):
        return {}
    ttft = r["first_token_s"] - r["arrival_s"]
    out_len = r["output_len"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_len > 1, (r["completion_s"] - r["first_token_s"]) / (out_len - 1), 0.0)
    ok_ttft = ~has_ttft | (ttft <= ttft_slo)
    ok_tpot = ~has_tpot | (tpot <= tpot_slo)
    latency = float(r["completion_s"].max() - r["arrival_s"].min())
    out = {"slo_attainment": float((ok_ttft & ok_tpot).mean()),
           "goodput_rps": float((ok_ttft & ok_tpot).sum() / latency) if latency > 0 else float("nan")}
    if has_ttft.any():
        out["ttft_attainment"] = float(ok_ttft[has_ttft].mean())
    if has_tpot.any():
        out["tpot_attainment"] = float(ok_tpot[has_tpot].mean())
    return out


def metrics_by_tag(trace: Trace) -> dict[str, dict[str, float]]:
    """Per request tag: queueing delay p1/p25/p50/p75/p99 (s), throughput (requests/s over the
    makespan), mean JCT (arrival to completion, s), TTFT median, suspensions, and
    ``num_unserved_by_last_arrival``: the requests first scheduled only after the last arrival. An
    overloaded cluster leaves those under every policy: starvation, a policy's doing, is measured against
    the same workload's FIFO run by :func:`infermax.starvation.starvation`."""
    r = trace.requests
    latency = float(r["completion_s"].max() - r["arrival_s"].min())
    last_arrival = float(r["arrival_s"].max())
    out: dict[str, dict[str, float]] = {}
    for tag in sorted(set(r["tag"].tolist())):
        sel = r["tag"] == tag
        queue = r["first_scheduled_s"][sel] - r["arrival_s"][sel]
        pct = np.percentile(queue, [1, 25, 50, 75, 99])
        out[tag or "untagged"] = {
            "num_requests": int(sel.sum()),
            **{f"queueing_p{p}_s": float(v) for p, v in zip((1, 25, 50, 75, 99), pct)},
            "ttft_p50_s": float(np.median(r["first_token_s"][sel] - r["arrival_s"][sel])),
            "throughput_rps": float(sel.sum() / latency) if latency > 0 else float("nan"),
            "jct_mean_s": float((r["completion_s"][sel] - r["arrival_s"][sel]).mean()),
            "num_suspensions": int(r["num_suspensions"][sel].sum()),
            "num_unserved_by_last_arrival": int(((r["first_scheduled_s"][sel] > last_arrival)
                                & (r["arrival_s"][sel] < last_arrival)).sum()),
        }
    return out


sys.modules[__name__].__class__ = CallableModule   # calling the module calls metrics (infermax._callable)
