"""``infermax bound``: certified optimality gap of a scheduler (exit 0 valid, 2 invalid, 3 beats the bound)."""
from __future__ import annotations

import argparse
import json
import sys

SHOW = ("latency_s", "tps", "ttft_mean_s", "tpot_mean_s", "num_evictions", "num_batches")


def cmd_bound(args: argparse.Namespace) -> int:
    from infermax.cli import print_table
    from infermax.types import Schedule

    from .check import check_scheduler

    bar = None
    if not args.json:
        from tqdm import tqdm

        bar = tqdm(total=6 if not args.no_optimum else 5, desc="bound", leave=False, file=sys.stderr, disable=None)

    def progress(step: str) -> None:
        if bar is not None:
            bar.set_postfix_str(step)
            bar.update(1)

    schedule = Schedule.from_json(args.schedule) if args.schedule else None
    try:
        result = check_scheduler(args.scheduler, args.workload, args.limits, args.cost, schedule=schedule,
                                 claimed_latency_s=args.claimed_latency, optimum=not args.no_optimum,
                                 progress=progress)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(result.to_dict()))
        return result.exit_code
    if result.error:
        print(f"infermax bound: {result.error}", file=sys.stderr)
    if result.exit_code == 2:
        return 2
    row = {"scheduler": result.scheduler, "latency_s": result.latency_s, "bound_s": result.bound_s,
           "optimum_s": result.optimum_s if result.optimum_s is not None else float("nan"),
           "certified_gap_%": 100 * result.gap, "bound_method": result.bound_method}
    print_table([row], list(row))
    print("bound methods: " + ", ".join(f"{k} {v:.6g} s" for k, v in result.bound_values.items()))
    print_table([result.metrics], SHOW)
    return result.exit_code


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bound", help="certified optimality gap of a scheduler (exit 2: invalid, 3: beats bound)")
    p.add_argument("--scheduler", default="vllm",
                   help="registered name (see `infermax schedulers`) or package.module:Class")
    p.add_argument("--workload", default="fixed:I=64,O=64,B=256", help="workload spec")
    p.add_argument("--limits", default=None, help="limits spec, e.g. M=100000,C=4096")
    p.add_argument("--cost", default=None, help="cost model name or JSON path")
    p.add_argument("--schedule", help="judge this schedule JSON (made elsewhere) instead of simulating")
    p.add_argument("--claimed-latency", type=float, help="the latency (s) the scheduler claims for itself")
    p.add_argument("--no-optimum", action="store_true", help="never run the exact MILP")
    p.add_argument("--json", action="store_true", help="one JSON object (for CI)")
    p.set_defaults(func=cmd_bound)
