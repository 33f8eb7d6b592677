"""Sweep throughput per executor on one grid, and a check that every executor gives the same table.

Prints wall time, cells/s and the speed-up over the serial executor, for the serial,
local (process pool) and — when Ray is installed — ray executors. The default grid
is a small slice of Fig. 5 (B = 256 so it stays quick); ``--paper`` runs B = 1024.

    python benchmarks/sweep_bench.py [--workers 2] [--paper] [--no-ray]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import time

from infermax.sweep import SweepConfig, run_cells, same_results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--paper", action="store_true", help="B = 1024 (the paper's high contention; minutes)")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    B = 1024 if args.paper else 256
    cfg = SweepConfig.from_dict({"workloads": {"grid": {"I": [1, 16, 64, 256, 1024], "O": [1, 32, 256], "B": [B]}},
                                 "schedulers": ["vllm", "sarathi", "sarathi-pc", "vllm-ef"],
                                 "limits": {"grid": {"M": [10_000, 100_000]}}})
    cells = cfg.cells()
    executors = ["serial", "local"]
    if not args.no_ray and importlib.util.find_spec("ray") is not None:
        executors.append("ray")
    print(f"{len(cells)} cells (B = {B}), workers = {args.workers}")
    print(f"{'executor':>8} {'wall_s':>8} {'cells/s':>8} {'speedup':>8} {'same':>5}")
    ref, base = None, None
    for name in executors:
        if name == "ray":
            import ray

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            t0 = time.perf_counter()
            ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
            print(f"{'':>8} (ray.init {time.perf_counter() - t0:.1f} s, not counted)")
        t0 = time.perf_counter()
        df = run_cells(cells, executor=name, workers=args.workers)
        wall = time.perf_counter() - t0
        if name == "ray":
            ray.shutdown()
        ref = df if ref is None else ref
        base = wall if base is None else base
        print(f"{name:>8} {wall:8.2f} {len(cells) / wall:8.1f} {base / wall:7.2f}x {str(same_results(df, ref)):>5}")


if __name__ == "__main__":
    main()
