"""``infermax solve``: the optimal schedule of a workload (the MILP of infermax.txt §3.3).

    infermax solve --workload fixed:I=64,O=4,B=4 --limits M=128,C=4096 --objective latency \\
                   --backend cpsat --time-limit 60 [--no-eviction] [--better-than vllm] [--out DIR] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .api import METHODS
from .backends import BackendUnavailable, ModelTooLarge, backend_names
from .objectives import OBJECTIVES
from .policy import Policy

SUMMARY = ("status", "method", "objective", "bound", "gap", "wall_s", "num_batches", "num_evictions", "horizon",
           "horizon_proven", "warm_start")


def add_subcommands(subparsers) -> None:
    """Add ``solve`` to the main ``infermax`` parser."""
    p = subparsers.add_parser("solve", help="optimal schedule by MILP/CP (infermax.txt §3.3)",
                              description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, help="workload spec, e.g. fixed:I=64,O=4,B=4")
    p.add_argument("--limits", default=None, help="e.g. M=128,C=4096,P=512,R_max=4")
    p.add_argument("--cost", default=None, help="cost model name or JSON path (default: A100 Llama-2-7B)")
    p.add_argument("--objective", default="latency", choices=OBJECTIVES)
    p.add_argument("--backend", default="cpsat", help=f"one of {', '.join(backend_names())} (default cpsat)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds for the solver (default 60)")
    p.add_argument("--threads", type=int, default=None, help="solver threads (default: the backend's)")
    p.add_argument("--gap", type=float, default=1e-4, help="relative gap that counts as optimal (default 1e-4)")
    p.add_argument("--policy", default=None, help="policy class: no-eviction,no-hybrid,no-chunked,P=N,R_max=N "
                   "or like=SCHEDULER")
    p.add_argument("--no-eviction", action="store_true", help="optimum among eviction-free schedules")
    p.add_argument("--no-hybrid", action="store_true", help="no batch mixes decode and prefill requests")
    p.add_argument("--no-chunked-prefill", action="store_true", help="every (re)fill runs whole in one batch")
    p.add_argument("--warm-start", default="best", help="scheduler to start from, 'best' (all) or 'none'")
    p.add_argument("--better-than", default=None, help="a value or a scheduler: look for a schedule --by better")
    p.add_argument("--by", type=float, default=0.10, help="fraction for --better-than (default 0.10)")
    p.add_argument("--horizon", type=int, default=None, help="number of batches in the model (default: derived)")
    p.add_argument("--method", default="auto", choices=METHODS,
                   help="auto (default): class-state search first for offline latency, then the MILPs; "
                        "search, aggregate or per-request alone")
    p.add_argument("--out", help="directory for schedule.json and result.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_solve)


def _policy(args: argparse.Namespace) -> Policy:
    base = Policy.from_spec(args.policy)
    changes: dict[str, Any] = base.to_dict()
    if args.no_eviction:
        changes["allow_eviction"] = False
    if args.no_hybrid:
        changes["hybrid"] = False
    if args.no_chunked_prefill:
        changes["chunked_prefill"] = False
    return Policy(**changes)


def _better_than(raw: str | None) -> float | str | None:
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return raw


def cmd_solve(args: argparse.Namespace) -> int:
    from .api import solve_optimal

    try:
        r = solve_optimal(args.workload, args.limits, args.cost, objective=args.objective, backend=args.backend,
                          time_limit_s=args.time_limit, policy=_policy(args),
                          warm_start=None if args.warm_start == "none" else args.warm_start,
                          horizon=args.horizon, better_than=_better_than(args.better_than), by=args.by,
                          threads=args.threads, rel_gap=args.gap, method=args.method)
    except (BackendUnavailable, ModelTooLarge) as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "type": type(exc).__name__}))
        print(f"infermax: error: {exc}", file=sys.stderr)
        return 2
    summary = r.summary()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if r.schedule is not None:
            r.schedule.to_json(out / "schedule.json")
        (out / "result.json").write_text(json.dumps({**summary, "metrics": r.metrics}, indent=2, default=str))
    if args.json:
        print(json.dumps({**summary, "metrics": r.metrics}, default=str))
        return 0
    width = max(len(k) for k in SUMMARY)
    for key in SUMMARY:
        value = summary.get(key)
        if isinstance(value, float):
            value = f"{value:.6g}"
        print(f"{key.rjust(width)}  {value}")
    if r.status == "infeasible" and args.better_than is not None:
        print(f"no schedule is {args.by:.0%} better than {args.better_than}"
              + ("" if r.horizon_proven else f" within {r.horizon} batches"))
    return 0
