"""Certified gaps at scale: the paper's high-contention grid (issue 5).

B=1024, I in {16, 256, 1024}, O in {32, 1024}, M=100K, C=4096, default cost
model. For each cell: every registered heuristic is simulated (and replayed),
the best one is compared with the best lower bound; the table shows each bound
method's value and time. Target: gap <= 10 % on every cell, each bound <= 60 s.

    python benchmarks/bound_bench.py [--schedulers all|name,name]
"""
from __future__ import annotations

import argparse
import time

from infermax import Limits, Workload, replay, simulate
from infermax.bounds import lower_bound
from infermax.schedulers import available

METHODS = ("work", "lp", "lagrangian")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedulers", default="all")
    args = ap.parse_args()
    names = available() if args.schedulers == "all" else args.schedulers.split(",")
    lim = Limits(M=100_000, C=4096)
    head = (f"{'I':>5} {'O':>5} {'best heuristic':>16} {'latency_s':>10} {'bound_s':>9} {'gap_%':>6} "
            + " ".join(f"{m + '_s':>12}" for m in METHODS) + f" {'bound_wall_s':>12}")
    print(head)
    worst = 0.0
    for I in (16, 256, 1024):
        for O in (32, 1024):
            w = Workload.from_spec(f"fixed:I={I},O={O},B=1024")
            lat = {}
            for n in names:
                r = simulate(w, n, lim)
                lat[n] = r.metrics["latency_s"]
            best = min(lat, key=lat.get)
            r = simulate(w, best, lim)
            assert replay(r.schedule, w, lim) == r.trace
            t0 = time.perf_counter()
            b = lower_bound(w, lim, methods=METHODS, upper=lat[best])
            wall = time.perf_counter() - t0
            gap = (lat[best] - b.value) / lat[best]
            worst = max(worst, gap)
            print(f"{I:5d} {O:5d} {best:>16} {lat[best]:10.3f} {b.value:9.3f} {100 * gap:6.2f} "
                  + " ".join(f"{b.values[m]:12.3f}" for m in METHODS) + f" {wall:12.2f}")
    print(f"worst certified gap: {100 * worst:.2f} %")


if __name__ == "__main__":
    main()
