"""Medha's capacity experiment (Medha §5.2, Figs. 15–16): its ``infermax sweep`` config, and a run of it.

Llama-3 8B on two nodes of 8 A100s; loads of 0.25–1.75 requests/s; at each load an
hour of Poisson arrivals of the Medha mix with 5 % long requests
(:func:`infermax.workloads.long.medha_mix`: short prompts from a real conversation
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

:func:`capacity_config` is the sweep config (``benchmarks/medha_capacity.yaml`` is it at full
scale; notebook 09 runs it smaller through ``notebooks/claims_capacity.py``), :func:`capacity_tables`
the figures' tables of its results. Run as a script, it runs the sweep through
:func:`infermax.sweep` and prints its CPU time (this process and its workers) and
the tables of Fig. 15 (median and p99 TTFT) and Fig. 16 (median and p99 decode
latency, TPOT), with the fraction of requests served in the hour. Target (issue
21): the whole sweep in ≤ 5 CPU-minutes on this machine.

    python benchmarks/medha_capacity.py [--executor local|serial|ray] [--workers 2]
        [--systems medha,loongserve,sarathi] [--loads 0.25,0.75,1.75] [--window 3600] [--out PATH]
"""
from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import infermax

# --- the config ------------------------------------------------------------------------------------------------
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


# --- the run -------------------------------------------------------------------------------------------------------
def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executor", default="local")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)}")
    ap.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS_RPS), help="requests/s")
    ap.add_argument("--window", type=float, default=WINDOW_S, help="seconds of arrivals, and of measurement")
    ap.add_argument("--long-fracs", default="0.05", help="shares of long requests (Fig. 15(b): 0.05; (a): 0)")
    ap.add_argument("--out", default=None, help="parquet to keep (resumable); default: none, every cell runs")
    args = ap.parse_args()
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; known: {', '.join(SYSTEMS)}")
    loads = [float(x) for x in args.loads.split(",")]
    fracs = [float(x) for x in args.long_fracs.split(",")]
    cfg = capacity_config(loads, {s: SYSTEMS[s] for s in names}, args.window, fracs)
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    df = infermax.sweep(cfg, out=args.out, executor=args.executor, workers=args.workers, resume=args.out is not None)
    wall = time.perf_counter() - wall0
    # the cells' own CPU time (in whichever process ran them) plus this process's (sweep bookkeeping; with
    # "serial" the cells ran here too, so only the part outside them is added)
    cells_cpu = float(df["cpu_s"].sum())
    here = _cpu_s() - cpu0 - (cells_cpu if args.executor == "serial" else 0.0)
    cpu = cells_cpu + max(here, 0.0)
    print(f"{len(df)} cells ({len(fracs)} mixes x {len(loads)} loads x {len(names)} systems, {args.window:g} s each): "
          f"{cpu:.1f} CPU-s ({cpu / 60:.2f} CPU-min; target <= 5; cells {cells_cpu:.1f}), {wall:.1f} s wall, "
          f"executor {args.executor}")
    print("per cell, CPU s:")
    print(df.pivot_table(index=["long_frac", "rate"], columns="policy", values="cpu_s", sort=False).round(1)
          .to_string())
    tables = capacity_tables(df)
    for metric, title in (("ttft_p50_s", "median TTFT, s (Fig. 15; inf: half the requests had no first token "
                                         "in the window)"), ("ttft_p99_s", "p99 TTFT, s"),
                          ("ttft_p50_s_short", "median TTFT of short requests, s"),
                          ("tpot_p50_s", "median decode latency (TPOT), s (Fig. 16)"), ("tpot_p99_s", "p99 TPOT, s"),
                          ("served_fraction", "share of arrived requests with a first token in the window"),
                          ("served_fraction_long", "... of the long ones")):
        if metric in tables:
            print(f"\n{title}\n{tables[metric].to_string(float_format=lambda v: f'{v:.4g}')}")
    if "medha" in names and "loongserve" in names:
        t = tables["ttft_p50_s"]
        print("\nmedian TTFT, loongserve / medha:", (t["loongserve"] / t["medha"]).round(1).to_string())
    if args.out:
        print(f"\nresults in {Path(args.out)}")


if __name__ == "__main__":
    main()
