"""Medha's capacity experiment (Medha §5.2, Figs. 15–16) as an ``infermax sweep`` config.

Llama-3 8B on two nodes of 8 A100s; loads of 0.25–1.75 requests/s; at each load an
hour of Poisson arrivals of the Medha mix with 5 % long requests
(:func:`infermax.workloads_long.medha_mix`: short prompts from a real conversation
trace capped at 8K, long ones uniform in [128K, 1M] with Medha-SWE decode lengths),
measured over that hour (:mod:`infermax.cluster.window`: requests without a first
token by then count as +∞, the paper's truncated CDFs). The systems (§5.2):

- ``medha``: one replica of TP 8 × SPP 2 over the 16 GPUs (the paper's plan) under the
  ``medha-3d`` cluster policy, whose replica *executes* the two sequence-pipeline stages
  (:mod:`infermax.cluster.plans`: a prompt's next chunk enters stage 1 while the previous one
  is in stage 2; a decode waits one whole pass), running the ``medha`` scheduler (ILRS slack
  priority, adaptive chunking, prefill–prefill batching);
- ``loongserve``: 8 instances of TP 2 under the ``loongserve`` cluster policy
  (:mod:`infermax.cluster.elastic`), each instance running ``sarathi-pc`` (whole
  prompts up to C, chunks only beyond it: only a refill of a long KV would chunk);
- ``sarathi``: one replica of TP 8 × PP 2 running ``sarathi`` (FCFS, decode first,
  512-token chunks; the paper's vLLM beyond 32K context).

``benchmarks/medha_capacity.yaml`` is this config at full scale;
``benchmarks/medha_capacity.py`` runs it and prints the figures' tables.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

LOADS_RPS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75)
WINDOW_S = 3600.0
TP8_PP2 = "a100:nodes=2,model=llama3-8b,tp=8,pp=2"
TP8_SPP2 = "a100:nodes=2,model=llama3-8b,tp=8,spp=2"
TP2 = "a100:nodes=2,model=llama3-8b,tp=2"
SYSTEMS: dict[str, dict[str, Any]] = {
    "medha": {"cluster": TP8_SPP2, "policy": "medha-3d", "scheduler": "medha"},
    "loongserve": {"cluster": TP2, "policy": "loongserve", "scheduler": "sarathi-pc"},
    "sarathi": {"cluster": TP8_PP2, "scheduler": "sarathi"},
}


def workload_spec(rate_rps: float, window_s: float = WINDOW_S, long_frac: float = 0.05, seed: int = 0) -> str:
    """The Medha mix arriving at ``rate_rps`` for ``window_s`` seconds (B = rate × window requests)."""
    if not isinstance(rate_rps, (int, float)) or isinstance(rate_rps, bool) or not rate_rps > 0:
        raise ValueError(f"capacity sweep: load must be a number > 0 (requests/s), got {rate_rps!r}")
    if not isinstance(window_s, (int, float)) or isinstance(window_s, bool) or not 0 < window_s < float("inf"):
        raise ValueError(f"capacity sweep: window_s must be a finite number > 0 (seconds), got {window_s!r}")
    B = max(1, round(rate_rps * window_s))
    return f"medha:B={B},long_frac={long_frac:g},rate={rate_rps:g},seed={seed}"


def capacity_config(loads: Sequence[float] = LOADS_RPS, systems: "Mapping[str, Mapping[str, Any]] | None" = None,
                    window_s: float = WINDOW_S, long_fracs: Sequence[float] = (0.05,), seed: int = 0) -> dict[str, Any]:
    """The sweep config (a dict for :func:`infermax.sweep`): one cell per mix (share of long requests:
    Fig. 15(b) 0.05, Fig. 15(a) 0), load and system."""
    systems = SYSTEMS if systems is None else systems
    if not systems:
        raise ValueError("capacity sweep: systems must name at least one system")
    if not loads:
        raise ValueError("capacity sweep: loads must list at least one load (requests/s)")
    if isinstance(long_fracs, (int, float)) or not long_fracs:
        raise ValueError(f"capacity sweep: long_fracs must be a non-empty list of shares, got {long_fracs!r}")
    return {"name": "medha-capacity",
            "workloads": [workload_spec(r, window_s, f, seed) for f in long_fracs for r in loads],
            "systems": [{"name": name, **dict(block), "window_s": window_s} for name, block in systems.items()]}


def capacity_tables(df: Any) -> dict[str, Any]:
    """Per metric a table (rows: share of long requests and load in requests/s, columns: system) of a capacity
    sweep's results."""
    if df["error"].notna().any():
        bad = df[df["error"].notna()].iloc[0]
        raise ValueError(f"capacity sweep: cell {bad['policy']} at {bad['workload']} failed: {bad['error']}")
    out = {}
    for metric in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "served_fraction",
                   "ttft_p50_s_short", "ttft_p50_s_long", "served_fraction_long"):
        if metric in df:
            out[metric] = df.pivot_table(index=["long_frac", "rate"], columns="policy", values=metric, sort=False)
    return out
