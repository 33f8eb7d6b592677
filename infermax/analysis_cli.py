"""``infermax capacity`` (:mod:`infermax.capacity`) and ``infermax trace-export``
(:mod:`infermax.chrome_trace`): parse, call the library, print."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .capacity import find_capacity
from .chrome_trace import cluster_trace, schedule_trace, write
from .cluster.schedule import ClusterSchedule
from .rundir import is_cluster_schedule, judged_line, load_schedule, schedule_inputs
from .types import Workload


def cmd_capacity(args: argparse.Namespace) -> int:
    def progress(res) -> None:
        if not args.quiet and not args.json:
            print(f"  bracket: passes at {res.rate_rps}, fails at {res.failing_rps} ({len(res.probes)} runs)",
                  flush=True)

    res = find_capacity(args.workload, args.scheduler, args.limits, args.cost or "default", args.target,
                        args.lo, args.hi, args.tol, args.executor, args.workers, args.max_rounds, progress)
    if args.json:
        print(json.dumps(res.to_dict()))
        return 0
    print(f"{'rate_rps':>10} {res.target.metric:>14}  met")
    for p in res.probes:
        print(f"{p.rate_rps:>10.4g} {p.value:>14.4g}  {'yes' if p.met else 'no'}")
    if res.rate_rps is None:
        print(f"capacity: none of the rates tried meets {res.target} (the lowest, {res.probes[0].rate_rps:g} "
              f"requests/s, gives {res.probes[0].value:.4g}); lower --lo")
    elif res.failing_rps is None:
        print(f"capacity: at least {res.rate_rps:.4g} requests/s (no rate tried failed {res.target}; raise --hi "
              f"or --max-rounds)")
    else:
        print(f"capacity: {res.rate_rps:.4g} requests/s meet {res.target} ({res.failing_rps:.4g} do not)")
    return 0


def cmd_trace_export(args: argparse.Namespace) -> int:
    if is_cluster_schedule(args.schedule):
        if args.limits:
            raise ValueError("--limits does not apply to a cluster schedule: its meta holds the replicas' limits")
        schedule = ClusterSchedule.from_json(Path(args.schedule))
        workload = args.workload or schedule.meta.get("workload")
        if not workload:
            raise ValueError("the cluster schedule's meta names no workload; pass --workload")
        doc = cluster_trace(schedule, Workload.from_spec(workload), args.cost, not args.no_requests)
    else:
        schedule = load_schedule(args.schedule)
        workload, limits, cost, judged, _ = schedule_inputs(args.schedule, schedule, args.workload, args.limits,
                                                            args.cost)
        print(judged_line(judged))
        doc = schedule_trace(schedule, workload, limits, cost, not args.no_requests)
    out = write(doc, args.out)
    print(f"wrote {out} ({len(doc['traceEvents'])} events): open it in https://ui.perfetto.dev "
          f"(Open trace file) or chrome://tracing (Load)")
    return 0


def _positive(text: str) -> float:
    v = float(text)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capacity", help="the highest arrival rate that meets a target (bisection over simulations)")
    p.add_argument("--workload", required=True, help="spec with {rate} where the rate goes, e.g. "
                   "'fixed:I=512,O=128,B=400,rate={rate}' (fixed:/mix:/medha: specs without a rate get rate= added)")
    p.add_argument("--scheduler", default="vllm", help="one scheduler (default vllm)")
    p.add_argument("--limits", default=None, help="e.g. M=100000,C=4096 (default M=100K, C=4096)")
    p.add_argument("--cost", default=None, help="cost model (default: A100 Llama-2-7B)")
    p.add_argument("--target", default="ttft_p99_s<=1.0", help="METRIC<=VALUE or METRIC>=VALUE over the run's "
                   "metrics, e.g. ttft_p99_s<=2.0, e2e_p99_s<=30, slo_attainment>=0.9 (default ttft_p99_s<=1.0)")
    p.add_argument("--lo", type=_positive, default=0.5, help="lowest rate, requests/s; must meet the target "
                   "(default 0.5)")
    p.add_argument("--hi", type=_positive, default=None, help="a rate that fails (default: doubled from --lo "
                   "until one fails)")
    p.add_argument("--tol", type=_positive, default=0.05, help="stop when the bracket is narrower than this "
                   "share of its lower end (default 0.05)")
    p.add_argument("--executor", default="local", help="serial, local (process pool), ray, or ray://host:port")
    p.add_argument("--workers", type=int, default=2, help="rates run at once per round (default 2)")
    p.add_argument("--max-rounds", type=int, default=12, help="most rounds of runs (default 12)")
    p.add_argument("-q", "--quiet", action="store_true", help="no bracket lines while searching")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_capacity)

    p = sub.add_parser("trace-export", help="a schedule (one replica or a cluster) as a Chrome-trace / Perfetto "
                       "JSON file")
    p.add_argument("schedule", help="schedule JSON (simulate --out writes one; a cluster schedule too)")
    p.add_argument("--out", required=True, help="the trace JSON to write")
    p.add_argument("--workload", help="workload spec (default: workload.json beside the schedule, else its meta)")
    p.add_argument("--limits", default=None, help="limits spec (default: limits.json beside it, else its meta)")
    p.add_argument("--cost", default=None, help="cost model (default: cost.json beside it, else its meta)")
    p.add_argument("--no-requests", action="store_true", help="leave out the per-request spans (big traces)")
    p.set_defaults(func=cmd_trace_export)
