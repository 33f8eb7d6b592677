"""Simulator speed on the paper's heaviest cell: B=1024, I=O=1024, M=100K, C=4096.

Prints, per scheduler, wall time, simulated batches/s and requests/s, and the
speed-up over a baseline run *in the same process*: the same simulator with the
decode fast-forward turned off (one scheduler decision per batch, as a
conventional simulator does). Target (issue 2): under 0.7 s per scheduler.

    python benchmarks/simulate_bench.py [--repeat 3] [--workload SPEC]
"""
from __future__ import annotations

import argparse
import time

from infermax import Limits, Workload, simulate


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="fixed:I=1024,O=1024,B=1024")
    ap.add_argument("--schedulers", default="vllm,sarathi,vllm-ef,sarathi-ef")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    w = Workload.from_spec(args.workload)
    lim = Limits(M=100_000, C=4096)
    print(f"workload {w.name}  limits {lim.to_dict()}  best of {args.repeat}")
    print(f"{'scheduler':>12} {'wall_s':>8} {'batches':>8} {'batches/s':>10} {'requests/s':>11} "
          f"{'baseline_s':>10} {'speedup':>8}")
    for name in args.schedulers.split(","):
        wall, res = best_of(args.repeat, lambda: simulate(w, name, lim))
        base, ref = best_of(1, lambda: simulate(w, name, lim, fast_forward=False))
        assert ref.trace == res.trace, "fast-forward changed the result"
        nb = res.metrics["num_batches"]
        print(f"{name:>12} {wall:8.3f} {nb:8d} {nb / wall:10.0f} {len(w) / wall:11.0f} {base:10.3f} "
              f"{base / wall:7.1f}x")


if __name__ == "__main__":
    main()
