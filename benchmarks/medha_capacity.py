"""Medha's capacity sweep (Medha §5.2): 7 loads × 3 systems, Llama-3 8B on 16 A100s, an hour each.

Runs ``benchmarks/medha_capacity.yaml`` (:mod:`infermax.medha_capacity`) through
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

import infermax
from infermax.medha_capacity import LOADS_RPS, SYSTEMS, WINDOW_S, capacity_config, capacity_tables


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
