"""Metrics from a Trace: one flat dict with stable keys (seconds, tokens, counts).

Keys: ``latency_s`` (makespan: last completion - first arrival), ``tps``
(generated tokens / latency), ``ttft_*``, ``tpot_*``, ``e2e_*``, ``queueing_*``
(``mean``, ``p50``, ``p90``, ``p99``; TPOT over requests with O > 1),
``num_batches``, ``num_evictions``, ``refill_tokens``, ``batch_size_mean``,
``running_size_mean``, ``kv_tokens_mean``, ``kv_tokens_max``,
``kv_utilization_mean``, ``num_requests``, ``generated_tokens``.
"""
from __future__ import annotations

import numpy as np

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
            "refill_tokens": refill,
            "batch_size_mean": float(b["num_requests"].mean()),
            "running_size_mean": float(b["num_running"].mean()),
            "kv_tokens_mean": float(b["kv_tokens"].mean()),
            "kv_tokens_max": int(b["kv_tokens"].max()),
            "kv_utilization_mean": float(b["kv_tokens"].mean() / trace.M),
            "busy_s": float(b["duration_s"].sum())}
    return out
