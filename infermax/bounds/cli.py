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
import sys

DEFAULT_SCHEDULER = "vllm"
SHOW = ("latency_s", "tps", "ttft_mean_s", "tpot_mean_s", "num_evictions", "num_batches")
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
    """Parse, call :func:`~infermax.bounds.check.check_schedulers` (the decisions: :mod:`infermax.bounds.check`),
    print."""
    from infermax.inputs import resolve_inputs

    from .check import check_claims, check_schedulers, parse_methods, parse_objectives, schedulers_to_check
    from .combine import cheap_methods

    objectives = parse_objectives(args.objective)                # unknown names fail before any work
    if args.cluster:
        return _cluster_bound(args, parse_objectives(args.objective, cluster=True))
    methods = parse_methods(args.methods)
    schedule, workload, limits, cost, judged, notes = _inputs(args)
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    names: list[str | None] = [args.scheduler]               # only a label for a schedule made elsewhere
    if schedule is None:
        names, left = schedulers_to_check(args.scheduler, workload, limits, DEFAULT_SCHEDULER)
        notes = notes + left
    check_claims(args.claimed_latency, args.claimed_value, objectives, names)
    if not args.json:
        _print_inputs(judged, notes)
    steps = len(names) * 2 + sum(len(methods or cheap_methods(o)) + (not args.no_optimum) for o in objectives)
    step, close = _progress(steps, not (args.json or args.quiet))   # simulate and replay, each method, the MILP
    try:
        results = check_schedulers(names, workload, limits, cost, objectives=objectives, schedule=schedule,
                                   claimed_latency_s=args.claimed_latency, claimed_value_s=args.claimed_value,
                                   optimum=not args.no_optimum, methods=methods,
                                   search_time_limit_s=args.search_time_limit, progress=step)
    finally:
        close()
    if args.json:
        return _print_json(results, judged, notes)
    return _print_text(results, objectives, len(names), not args.no_optimum)


def _print_inputs(judged, notes: list[str]) -> None:
    """What a schedule made elsewhere is judged against, and the notes (schedulers left out, ...)."""
    from infermax.rundir import judged_line

    if judged is not None:
        print(judged_line(judged))
    for note in notes:
        print(f"note: {note}")


def _print_json(results: list, judged, notes: list[str]) -> int:
    """One JSON object: one scheduler's result, or ``{exit_code, results}``; returns the exit code."""
    from infermax.output import dumps_json

    from .check import exit_code

    code = exit_code(results)
    extra = {"judged_against": judged, "notes": notes} if judged is not None else {"notes": notes} if notes else {}
    if len(results) == 1:
        print(dumps_json({**results[0].to_dict(), **extra}))
    else:
        print(dumps_json({"exit_code": code, "results": [r.to_dict() for r in results], **extra}))
    return code


def _print_text(results: list, objectives: list[str], num_names: int, optimum: bool) -> int:
    """The errors on stderr, the verdicts of the valid results, the refusals; returns the exit code."""
    from .check import INVALID, REFUSED, exit_code

    for r in results:
        if r.error and r.exit_code != REFUSED:
            print(f"infermax: error: {r.scheduler}: {r.error}", file=sys.stderr)
    refused = list({r.scheduler: r for r in results if r.exit_code == REFUSED}.values())
    valid = [r for r in results if r.exit_code not in (INVALID, REFUSED)]
    if valid:
        _print_checks(valid, objectives, num_names, optimum)
    for r in refused:
        print(f"{r.scheduler}: refused: {r.error}")
    if refused:
        print(f"infermax: error: {len(refused)} of {num_names} schedulers refused the workload "
              f"({', '.join(r.scheduler for r in refused)}; reasons above){'' if valid else '; no results'}",
              file=sys.stderr)
    return exit_code(results)


def _print_checks(valid: list, objectives: list[str], num_names: int, optimum: bool) -> None:
    """The table of verdicts, why the optimum is missing, each bound method's value, and the metrics."""
    from infermax.output import format_table

    from .objectives import spec_of

    rows = [_verdict_row(r, objectives == ["latency"]) for r in valid]
    print(format_table(rows, list(rows[0])))
    for objective, note in {r.objective: r.optimum_note for r in valid if r.optimum_note and optimum}.items():
        print(f"{objective + ' ' if len(objectives) > 1 else ''}optimum not reported: {note}")
    for r in valid:
        prefix = f"{r.scheduler}: " if num_names > 1 else ""
        prefix += f"{r.objective} " if len(objectives) > 1 else ""
        unit = spec_of(r.objective).unit
        print(prefix + "bound methods: " + ", ".join(f"{k} {v:.6g} {unit}" for k, v in r.bound_values.items()))
    shown = list({r.scheduler: r for r in valid}.values())
    keys = ("scheduler", *SHOW) if len(shown) > 1 else SHOW
    print(format_table([{"scheduler": r.scheduler, **r.metrics} for r in shown], keys))


def _verdict_row(r, latency_only: bool) -> dict:
    """One row of the verdicts' table (the latency's own column names when latency is the only objective)."""
    optimum = r.optimum_s if r.optimum_s is not None else float("nan")
    if latency_only:
        return {"scheduler": r.scheduler, "latency_s": r.latency_s, "bound_s": r.bound_s, "optimum_s": optimum,
                "certified_gap_%": 100 * r.gap, "bound_method": r.bound_method}
    return {"scheduler": r.scheduler, "objective": r.objective, "value": r.value_s, "bound": r.bound_s,
            "optimum": optimum, "certified_gap_%": 100 * r.gap, "bound_method": r.bound_method}


def _cluster_bound(args: argparse.Namespace, objectives: list[str]) -> int:
    """``bound --cluster SPEC``: each cluster policy's value against the fluid cluster bound
    (:mod:`infermax.bounds.cluster`; the decisions: :mod:`infermax.cluster.check`); exit 3 when a value beats it."""
    from infermax.cluster import Cluster
    from infermax.cluster.check import check_policies, policies_to_check
    from infermax.output import dumps_json, format_table
    from infermax.types import Workload

    for flag in ("schedule", "limits"):
        if getattr(args, flag):
            raise ValueError(f"--{flag} is not taken with --cluster (M and C come from the cluster's replicas)")
    cluster = Cluster.from_spec(args.cluster)
    policies = policies_to_check(args.scheduler)
    workload = Workload.from_spec(args.workload or DEFAULT_WORKLOAD)
    rows, code = check_policies(workload, cluster, policies, objectives, args.local, args.cost)
    if args.json:
        print(dumps_json({"exit_code": code, "workload": workload.name, "cluster": cluster.to_spec(),
                          "results": rows}))
        return code
    print(f"workload {workload.name}  cluster {cluster.to_spec()}  ({cluster.num_replicas} replicas; the bound "
          f"holds for every cluster policy)")
    print(format_table(rows, list(rows[0])))
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
