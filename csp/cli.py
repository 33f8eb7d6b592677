"""``infermax solve``: the optimal schedule of a workload (the MILP of InferMax §3.3).

    infermax solve --workload fixed:I=64,O=4,B=4 --limits M=128,C=4096 --objective latency \\
                   --backend cpsat --time-limit 60 [--no-eviction] [--better-than vllm] [--out DIR] [--json] [-q]

Progress (stage, best objective, certified bound, gap) goes to stderr, one line per change, once a
solve has run for more than a couple of seconds; ``-q`` silences it (``--json`` too). Ctrl-C stops
the solve: the best schedule found so far is written to ``--out`` and printed, and the exit status
is 130. ``--out DIR`` writes ``schedule.json`` (its meta names the workload, limits and cost model),
``workload.json`` and ``result.json``, so that ``infermax replay DIR/schedule.json`` judges it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .api import METHODS
from .backends import SolveStatus, backend_names
from .milp.objectives import OBJECTIVES, TAGGABLE
from .milp.policy import Policy

SUMMARY = ("status", "method", "objective", "bound", "bound_method", "gap", "wall_s", "num_batches", "num_evictions",
           "horizon", "horizon_proven", "warm_start", "stopped")


def add_subcommands(subparsers) -> None:
    """Add ``solve`` to the main ``infermax`` parser."""
    p = subparsers.add_parser("solve", help="optimal schedule by MILP/CP (InferMax §3.3)",
                              description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, help="workload spec, e.g. fixed:I=64,O=4,B=4")
    p.add_argument("--limits", default=None, help="e.g. M=128,C=4096,P=512,R_max=4")
    p.add_argument("--cost", default=None, help="cost model name or JSON path (default: A100 Llama-2-7B)")
    p.add_argument("--objective", default="latency",
                   help=f"one of {', '.join(OBJECTIVES)}, or {'/'.join(TAGGABLE)}:TAG over one request tag "
                        f"(e.g. ttft:short; default latency)")
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
    p.add_argument("--out", help="directory for schedule.json, workload.json and result.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_solve)


def _policy(args: argparse.Namespace) -> Policy:
    from infermax.optimal import policy_from_spec

    base = policy_from_spec(args.policy)
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


class _ProgressLines:
    """One stderr line per progress event, held back until the solve has run ``after_s`` seconds."""

    def __init__(self, enabled: bool, after_s: float = 2.0) -> None:
        self.enabled, self.after_s = enabled, after_s
        self.held = None
        self.shown = False

    def __call__(self, event) -> None:
        if not self.enabled:
            return
        if not self.shown and event.elapsed_s < self.after_s and event.stage != "done":
            self.held = event
            return
        if not self.shown and self.held is not None and event.stage != "done":
            print(self.held.line(), file=sys.stderr, flush=True)
        self.shown = True
        if event.stage != "done" or event.elapsed_s >= self.after_s:
            print(event.line(), file=sys.stderr, flush=True)


def cmd_solve(args: argparse.Namespace) -> int:
    """``infermax solve``: solve, write the run directory and result.json if asked, print the summary.

    Its branches are the command's output options (--out, --json, --better-than, Ctrl-C), read top to bottom.
    """
    from infermax.inputs import resolve_inputs
    from infermax.optimal import solve_optimal
    from infermax.output import dumps_json
    from infermax.rundir import out_dir

    workload, limits, cost = resolve_inputs(args.workload, args.limits, args.cost)
    if args.out:
        out_dir(args.out)          # an --out that cannot be written fails before the solve
    show = _ProgressLines(enabled=not (args.json or args.quiet))
    r = solve_optimal(workload, limits, cost, objective=args.objective, backend=args.backend,
                      time_limit_s=args.time_limit, policy=_policy(args),
                      warm_start=None if args.warm_start == "none" else args.warm_start,
                      horizon=args.horizon, better_than=_better_than(args.better_than), by=args.by,
                      threads=args.threads, rel_gap=args.gap, method=args.method, progress=show)
    summary = {**r.summary(), "stopped": r.info.get("stopped"), "bound_method": r.info.get("bound_method")}
    if args.out:
        _write_solve(Path(args.out), r, summary, workload, limits, cost)
    interrupted = str(r.info.get("stopped", "")).startswith("interrupted")
    if args.json:
        print(dumps_json({**summary, "metrics": r.metrics}))
    else:
        _print_solve(args, r, summary)
    if interrupted:
        where = f"; best schedule written to {args.out}" if args.out and r.schedule is not None else ""
        print(f"infermax: interrupted{where}", file=sys.stderr)
        return 130
    return 0


def _write_solve(out: Path, r: Any, summary: dict[str, Any], workload: Any, limits: Any, cost: Any) -> None:
    """The run directory (when there is a schedule; its meta names its instance too) and result.json."""
    from infermax.output import dumps_json
    from infermax.rundir import write_run
    from infermax.types import Schedule

    if r.schedule is not None:
        meta = {**r.schedule.meta, "workload": workload.name, "limits": limits.to_dict(), "cost": cost.describe()}
        write_run(out, Schedule(r.schedule.batches, meta), workload, limits, cost)
    (out / "result.json").write_text(dumps_json({**summary, "metrics": r.metrics}))


def _print_solve(args: argparse.Namespace, r: Any, summary: dict[str, Any]) -> None:
    """The summary, one key a line; why nothing was found under --better-than."""
    width = max(len(k) for k in SUMMARY)
    for key in SUMMARY:
        value = summary.get(key)
        if isinstance(value, float):
            value = f"{value:.6g}"
        print(f"{key.rjust(width)}  {value}")
    if r.status == SolveStatus.INFEASIBLE and args.better_than is not None:
        print(f"no schedule is {args.by:.0%} better than {args.better_than}"
              + ("" if r.horizon_proven else f" within {r.horizon} batches"))
