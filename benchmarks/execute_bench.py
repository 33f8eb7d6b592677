"""Predicted vs measured: the fitted CPU cost model against the executor, for vLLM and Sarathi.

Profiles the executed model on this machine (or reuses ``--profile DIR``), fits
the linear cost model, simulates each scheduler, runs its schedule on the model
and prints per scheduler: predicted and measured end-to-end latency (makespan),
their error, batch-time median/p90 absolute percentage error, and whether the
generated tokens equal the single-request reference. Target (issue 3/4): e2e
latency within 15% for vllm and sarathi. The load average is printed before and
after: on a shared machine other processes inflate wall times.

    python benchmarks/execute_bench.py [--profile DIR] [--workload SPEC] [--limits SPEC] [--repeats 10]
"""
from __future__ import annotations

import argparse
import os
import time

from infermax.execute.validation import DEFAULT_LIMITS, DEFAULT_WORKLOAD, validate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default=DEFAULT_WORKLOAD)
    ap.add_argument("--limits", default=DEFAULT_LIMITS)
    ap.add_argument("--schedulers", default="vllm,sarathi")
    ap.add_argument("--profile", help="profile directory to reuse (or to write into); default: a fresh profile")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    report = validate(args.schedulers, args.workload, args.limits, profile=args.profile, repeats=args.repeats,
                      num_threads=args.threads)
    s = report.summary()
    print(f"workload {s['workload']}  limits {s['limits']}  model {s['model']}  {s['stat']} of {s['repeats']} runs")
    print(f"profile {s['profile']}")
    print(f"{'scheduler':>10} {'batches':>8} {'pred_e2e_s':>11} {'meas_e2e_s':>11} {'e2e_err':>8} "
          f"{'batch_med_ape':>14} {'batch_p90_ape':>14} {'wall/cpu':>9} {'tokens':>7}")
    for name, r in s["schedulers"].items():
        print(f"{name:>10} {r['num_batches']:>8} {r['predicted_latency_s']:>11.4f} {r['measured_latency_s']:>11.4f} "
              f"{r['e2e_latency_signed_error']:>+8.1%} {r['batch_time_median_ape']:>14.1%} "
              f"{r['batch_time_p90_ape']:>14.1%} {r['measured_busy_s'] / r['measured_cpu_busy_s']:>9.2f} "
              f"{'same' if r['tokens_identical'] else 'DIFFER':>7}")
    print(f"all: batch median APE {s['batch_time_median_ape']:.1%}, p90 {s['batch_time_p90_ape']:.1%}, worst e2e "
          f"error {s['e2e_latency_error']:.1%}; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
