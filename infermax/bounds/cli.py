"""``infermax bound``: certified optimality gap of schedulers (exit 0 valid, 2 invalid, 3 beats the bound,
4 some schedulers refused the workload, 5 all did).

    infermax bound [--scheduler vllm,sarathi] [--objective ttft|e2e_p99|ttft:short|all|...] [--workload SPEC]
                   [--limits ...] [--cost ...] [--json] [-q]
    infermax bound --schedule DIR/schedule.json [--scheduler LABEL] [...]

``--objective`` takes one name or several, comma separated (latency, ttft, e2e, tpot, ttft_p99,
e2e_p99, ..., each but latency and throughput optionally ``:TAG``); ``all`` is latency, ttft, e2e,
tpot, ttft_p99 and e2e_p99: one row per scheduler and objective.

With ``--schedule`` the workload, limits and cost are those stored with the schedule
(``workload.json``, ``limits.json``, ``cost.json`` beside it, else its meta; see
:func:`infermax.rundir.schedule_inputs`) unless given; the output says which.
"""
from __future__ import annotations

import argparse
import math
import sys

SHOW = ("latency_s", "tps", "ttft_mean_s", "tpot_mean_s", "num_evictions", "num_batches")
DEFAULT_SCHEDULER = "vllm"
DEFAULT_WORKLOAD = "fixed:I=64,O=64,B=256"


def _progress(total: int, enabled: bool):
    """A tqdm bar over the check's steps (stderr); returns (callback, close)."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc="bound", leave=False, file=sys.stderr, disable=None)

    def step(name: str) -> None:
        bar.set_postfix_str(name)
        bar.update(1)

    return step, bar.close


def _inputs(args: argparse.Namespace):
    """(schedule, workload, limits, cost, judged, notes) for this command line."""
    if not args.schedule:
        return None, args.workload or DEFAULT_WORKLOAD, args.limits, args.cost, None, []
    from infermax.rundir import load_schedule, schedule_inputs

    schedule = load_schedule(args.schedule)
    return (schedule, *schedule_inputs(args.schedule, schedule, args.workload, args.limits, args.cost))


def cmd_bound(args: argparse.Namespace) -> int:
    from infermax.inputs import resolve_inputs
    from infermax.multirun import left_out
    from infermax.output import dumps_json
    from infermax.rundir import judged_line
    from infermax.schedulers import get_scheduler, split_specs

    from . import ALL, METHODS, parse_objective
    from .check import INVALID, REFUSED, check_schedulers

    objectives = list(ALL) if args.objective == "all" else [o.strip() for o in args.objective.split(",")]
    for objective in objectives:
        parse_objective(objective)                # unknown names fail before any work
    if args.cluster:
        return _cluster_bound(args, [o for o in objectives if o != "tpot" or args.objective != "all"])
    methods = None if args.methods is None else tuple(split_specs(args.methods))
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown or methods == ():
        raise ValueError(f"--methods {args.methods!r}: unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    schedule, workload, limits, cost, judged, notes = _inputs(args)
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    if schedule is not None:
        names: list[str | None] = [args.scheduler]           # only a label for a schedule made elsewhere
    else:
        names = split_specs(DEFAULT_SCHEDULER if args.scheduler is None else args.scheduler)
        if not names:
            raise ValueError(f"--scheduler {args.scheduler!r} names no scheduler")
        for name in names:
            get_scheduler(name)  # unknown names fail before any work
        if args.scheduler is None:
            workload.check_fits(limits)
            names, left = left_out(names, workload, limits)
            notes = notes + left
    _check_claims(args, objectives, names)
    if (judged is not None or notes) and not args.json:
        if judged is not None:
            print(judged_line(judged))
        for note in notes:
            print(f"note: {note}")
    step, close = _progress(len(names) * 2 + len(objectives) * (6 if not args.no_optimum else 5),
                            not (args.json or args.quiet))
    try:
        results = check_schedulers(names, workload, limits, cost, objectives=objectives, schedule=schedule,
                                   claimed_latency_s=args.claimed_latency, claimed_value_s=args.claimed_value,
                                   optimum=not args.no_optimum, methods=methods,
                                   search_time_limit_s=args.search_time_limit, progress=step)
    finally:
        close()
    exit_code = _exit_code(results)
    if args.json:
        extra = {"judged_against": judged, "notes": notes} if judged is not None else {"notes": notes} if notes \
            else {}
        if len(results) == 1:
            print(dumps_json({**results[0].to_dict(), **extra}))
        else:
            print(dumps_json({"exit_code": exit_code, "results": [r.to_dict() for r in results], **extra}))
        return exit_code
    for r in results:
        if r.error and r.exit_code != REFUSED:
            print(f"infermax: error: {r.scheduler}: {r.error}", file=sys.stderr)
    refused = list({r.scheduler: r for r in results if r.exit_code == REFUSED}.values())
    valid = [r for r in results if r.exit_code not in (INVALID, REFUSED)]
    if valid:
        _print_checks(valid, objectives, len(names), not args.no_optimum)
    for r in refused:
        print(f"{r.scheduler}: refused: {r.error}")
    if refused:
        print(f"infermax: error: {len(refused)} of {len(names)} schedulers refused the workload "
              f"({', '.join(r.scheduler for r in refused)}; reasons above){'' if valid else '; no results'}",
              file=sys.stderr)
    return exit_code


def _print_checks(valid: list, objectives: list[str], num_names: int, optimum: bool) -> None:
    """The table of verdicts, why the optimum is missing, each bound method's value, and the metrics."""
    from infermax.output import print_table

    if objectives == ["latency"]:
        rows = [{"scheduler": r.scheduler, "latency_s": r.latency_s, "bound_s": r.bound_s,
                 "optimum_s": r.optimum_s if r.optimum_s is not None else float("nan"),
                 "certified_gap_%": 100 * r.gap, "bound_method": r.bound_method} for r in valid]
    else:
        rows = [{"scheduler": r.scheduler, "objective": r.objective, "value": r.value_s, "bound": r.bound_s,
                 "optimum": r.optimum_s if r.optimum_s is not None else float("nan"),
                 "certified_gap_%": 100 * r.gap, "bound_method": r.bound_method} for r in valid]
    print_table(rows, list(rows[0]))
    for objective, note in {r.objective: r.optimum_note for r in valid if r.optimum_note and optimum}.items():
        print(f"{objective + ' ' if len(objectives) > 1 else ''}optimum not reported: {note}")
    for r in valid:
        prefix = f"{r.scheduler}: " if num_names > 1 else ""
        prefix += f"{r.objective} " if len(objectives) > 1 else ""
        unit = "tokens/s" if r.objective == "throughput" else "s"
        print(prefix + "bound methods: " + ", ".join(f"{k} {v:.6g} {unit}" for k, v in r.bound_values.items()))
    shown = list({r.scheduler: r for r in valid}.values())
    keys = ("scheduler", *SHOW) if len(shown) > 1 else SHOW
    print_table([{"scheduler": r.scheduler, **r.metrics} for r in shown], keys)


def _check_claims(args: argparse.Namespace, objectives: list[str], names: list) -> None:
    """A claim must be a finite number, and one scheduler's on one objective."""
    for flag, value in (("--claimed-latency", args.claimed_latency), ("--claimed-value", args.claimed_value)):
        if value is None:
            continue
        if not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number of seconds (tokens/s for throughput), got {value}")
        if len(objectives) > 1 or len(names) > 1:
            raise ValueError(f"{flag} {value:g} is one scheduler's claim on one objective; got "
                             f"{len(names)} scheduler(s) and {len(objectives)} objective(s) "
                             f"({', '.join(objectives)})")


def _exit_code(results) -> int:
    """The most serious verdict: 3 (a value beats the bound) > 2 (an invalid schedule) > 5 (every
    scheduler refused the instance) > 4 (some did) > 0."""
    from .check import REFUSED

    codes = {r.exit_code for r in results}
    for code in (3, 2):
        if code in codes:
            return code
    if REFUSED in codes:
        return 5 if codes == {REFUSED} else 4
    return 0


def _cluster_bound(args: argparse.Namespace, objectives: list[str]) -> int:
    """``bound --cluster SPEC``: each cluster policy's value against the fluid cluster bound
    (:mod:`infermax.bounds.cluster`); exit 3 when a value beats it."""
    from infermax.cluster import POLICIES, Cluster, simulate_cluster
    from infermax.output import dumps_json, print_table
    from infermax.schedulers import split_specs
    from infermax.types import Workload

    from .cluster import attention_kept, cluster_lower_bound, measured_value

    for flag in ("schedule", "limits"):
        if getattr(args, flag):
            raise ValueError(f"--{flag} is not taken with --cluster (M and C come from the cluster's replicas)")
    cluster = Cluster.from_spec(args.cluster)
    policies = split_specs(args.scheduler or "fifo")
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"--scheduler {policy!r} is not a cluster policy; with --cluster use "
                             f"{', '.join(POLICIES)}")
    workload = Workload.from_spec(args.workload or DEFAULT_WORKLOAD)
    share = attention_kept(policies)
    bounds = {o: cluster_lower_bound(workload, cluster, o, args.cost, attention=share) for o in objectives}
    rows, code = [], 0
    for policy in policies:
        res = simulate_cluster(workload, cluster, policy, args.local, cost=args.cost)
        for o, b in bounds.items():
            value = measured_value(o, res)
            sign = -1.0 if o == "throughput" else 1.0
            beats = sign * (value - b.value) < -1e-9 * max(1.0, abs(b.value))
            code = max(code, 3 if beats else 0)
            gap = (b.value - value) / b.value if o == "throughput" else (value - b.value) / value if value else 0.0
            rows.append({"policy": policy, "objective": o, "value": value, "bound": b.value,
                         "certified_gap_%": 100 * gap, "bound_method": b.method})
    if args.json:
        print(dumps_json({"exit_code": code, "workload": workload.name, "cluster": cluster.to_spec(),
                          "results": rows}))
        return code
    print(f"workload {workload.name}  cluster {cluster.to_spec()}  ({cluster.num_replicas} replicas; the bound "
          f"holds for every cluster policy)")
    print_table(rows, list(rows[0]))
    return code


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bound", help="certified optimality gap of schedulers (exit 2: invalid, 3: beats bound, "
                       "4/5: some/all schedulers refused the workload)")
    p.add_argument("--scheduler", default=None,
                   help=f"registered name(s), comma separated, or package.module:Class (default {DEFAULT_SCHEDULER}, "
                        "or sarathi when a prompt is longer than min(C, P), as in the shipped traces); "
                        "with --schedule, only a label (default: the scheduler its meta names)")
    p.add_argument("--workload", default=None, help=f"workload spec (default {DEFAULT_WORKLOAD}; with --schedule: "
                   "workload.json beside it, else its meta)")
    p.add_argument("--limits", default=None, help="limits spec, e.g. M=100000,C=4096 (with --schedule: "
                   "limits.json beside it, else its meta)")
    p.add_argument("--cost", default=None, help="cost model name or JSON path (with --schedule: cost.json beside "
                   "it, else its meta)")
    p.add_argument("--schedule", help="judge this schedule JSON (made elsewhere) instead of simulating")
    p.add_argument("--objective", default="latency",
                   help="what to bound: latency (default), throughput, ttft, e2e, tpot, ttft_p99, e2e_p99 "
                        "(also _p50, _p90), each but latency/throughput optionally as NAME:TAG (requests tagged "
                        "TAG); several comma separated, or all")
    p.add_argument("--claimed-latency", type=float, help="the latency (s) the scheduler claims for itself")
    p.add_argument("--claimed-value", type=float, help="the value of --objective the scheduler claims for itself "
                   "(exit 3 if it beats the certified bound)")
    p.add_argument("--methods", default=None,
                   help="bound methods, comma-separated (default: the cheap ones that apply to the objective: "
                        "work,lp,lagrangian for latency; requests,order for the others, and chains,sharing for mean "
                        "e2e); add 'search' for the exact solver's class-state A* (offline, linear cost) within "
                        "--search-time-limit")
    p.add_argument("--search-time-limit", type=float, default=10.0,
                   help="seconds for the 'search' bound method (default 10)")
    p.add_argument("--cluster", default=None,
                   help="a cluster spec (e.g. a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3): --scheduler "
                        "names cluster policies, each checked against the fluid cluster bound (latency, "
                        "throughput, ttft, e2e and their percentiles, :TAG)")
    p.add_argument("--local", default=None, help="with --cluster: the replicas' scheduler (default: the policy's "
                   "own, else vllm; loongserve needs a chunking one such as sarathi-pc)")
    p.add_argument("--no-optimum", action="store_true", help="never run the exact MILP")
    p.add_argument("--json", action="store_true", help="one JSON object (for CI; several schedulers: "
                   "{exit_code, results: [...]})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bound)
