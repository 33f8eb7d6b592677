"""The ``infermax`` command line.

    infermax simulate [--scheduler vllm,sarathi] [--workload fixed:I=1024,O=1024,B=1024]
                      [--limits M=100000,C=4096] [--cost default] [--out DIR] [--json] [-q]
    infermax schedulers [--json]          (the replica schedulers, then the cluster policies)
    infermax replay DIR/schedule.json [--workload SPEC] [--limits ...] [--cost ...] [--json]
                    (a cluster schedule is judged by infermax.cluster.judge; its meta holds the limits)

Further commands (``solve``, ``bound``, ``profile``, ``costmodel``, ...) are added
by their packages through ``add_subcommands(subparsers)``. Every command takes
``--json``.

One error path for every command (:func:`main`): a handler raises, ``main``
prints one line ``infermax: error: ...`` on stderr (and, with ``--json``, the
object ``{"error": ..., "type": ...}`` on stdout). Exit status: 0 success, 2 bad
input (ValueError, a file that cannot be read or written, a usage error) or an
invalid schedule, 130 interrupted (Ctrl-C, or SIGTERM during a sweep), 1 an internal
error (``-v`` shows its traceback); ``bound``: 3 a value beats the certified bound.
Several schedulers (``simulate``, ``bound``; :mod:`infermax.multirun`): each runs on
its own, and one that refuses the workload is reported beside the others' results:
4 some refused, 5 every one refused (``sweep``: 5 every cell failed). Results already
computed are printed (and written with ``--out``) whatever a later scheduler does.
JSON output never holds NaN or Infinity (:func:`dumps_json`).

Default schedulers run the shipped traces: ``simulate``'s default set leaves out
those without chunked prefill (``vllm``, ``vllm-ef``) when a prompt is longer than
``min(C, P)`` (``trace:splitwise_conv`` has prompts of up to 14,050 tokens against
the default C = 4096), and a note names them; ``bound`` runs ``sarathi`` then.

A run directory (``simulate --out DIR``; ``solve --out DIR`` writes the same
files, :mod:`infermax.rundir`) holds what ``replay`` needs to judge exactly the
same instance again, plus ``metrics.json``, ``batches.csv`` and ``requests.csv``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

from .output import dumps_json, format_table
from .rundir import is_cluster_schedule, judged_line, load_schedule, one_line, out_dir, schedule_inputs, write_run

DEFAULT_WORKLOAD = "fixed:I=1024,O=1024,B=1024"
DEFAULT_SCHEDULERS = "vllm,sarathi,sarathi-pc,vllm-ef,sarathi-ef"
SUMMARY_KEYS = ("latency_s", "tps", "ttft_mean_s", "tpot_mean_s", "ttft_p99_s", "num_evictions",
                "num_batches", "running_size_mean", "kv_utilization_mean")
# packages that contribute commands; each module has add_subcommands(subparsers)
PLUGIN_MODULES = ("infermax.costmodel.cli", "infermax.csp.cli", "infermax.bounds.cli", "infermax.sweep.cli",
                  "infermax.execute.cli", "infermax.engines.cli", "infermax.analysis_cli")
EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 1, 130, 141


# --- output: the leaf module infermax.output (re-exported here) ---------------------------------


def print_table(rows: list[dict[str, Any]], keys: Sequence[str]) -> None:
    """Print :func:`infermax.output.format_table` of ``rows`` on stdout."""
    print(format_table(rows, keys))


class _Progress:
    """A tqdm bar over finished requests (stderr; silent when not a terminal, with --json or -q)."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="req", leave=False, file=sys.stderr, disable=None)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- simulate, schedulers ---------------------------------------------------------------------------
def cmd_simulate(args: argparse.Namespace) -> int:
    """Parse, run each scheduler (the decisions: :mod:`infermax.multirun`), print."""
    from .inputs import resolve_inputs
    from .multirun import exit_status, run_each, schedulers_to_run
    from .types import Workload

    if args.cluster:
        return _simulate_cluster(args)
    if args.policy:
        raise ValueError(f"--policy {args.policy!r} needs --cluster (a global policy spreads requests over replicas)")
    spec = f"trace:{args.trace}" if args.trace else args.workload
    given = Workload.from_spec(spec)     # --out stores it on its own clock; the run is on its relative one
    workload, limits, cost = resolve_inputs(given, args.limits, args.cost)
    workload.check_fits(limits)    # a request no scheduler can serve is bad input, not a refusal
    names, notes = schedulers_to_run(args.scheduler, DEFAULT_SCHEDULERS, workload, limits)
    if args.out:
        out_dir(args.out)    # so does an --out that cannot be written

    def run(name: str) -> dict[str, Any]:
        return _simulate_one(args, name, (given, workload, limits, cost), len(names) > 1)

    runs = run_each(names, run)
    rows = [row for _, row in runs.done]
    code = exit_status(runs)
    summary = {"workload": workload.name, "limits": limits.to_dict(), "cost": cost.name, "results": rows,
               "refused": [r.to_dict() for r in runs.refused], "notes": notes, "exit_code": code}
    if args.json:
        print(dumps_json(summary))
    elif rows or runs.refused:
        _print_simulate(summary, runs.refused, args.out)
    if runs.interrupted:
        raise KeyboardInterrupt(f"{len(rows)} of {len(names)} schedulers finished (shown above)" if rows else "")
    say_refused(runs.refused, len(names), bool(runs.done), args.verbose)
    return code


def _simulate_one(args: argparse.Namespace, name: str, inputs: tuple, several: bool) -> dict[str, Any]:
    """One scheduler's run, with its progress bar; written under --out as it finishes (a later refusal or Ctrl-C
    keeps it); its row."""
    from . import simulate
    from .schedulers import get_scheduler

    given, workload, limits, cost = inputs
    bar = _Progress(name, len(workload), enabled=not (args.json or args.quiet))
    try:
        result = simulate(workload, name, limits, cost, progress=bar)
    finally:
        bar.close()
    if args.out:
        out = Path(args.out) / name if several else Path(args.out)
        write_run(out, result.schedule, given, get_scheduler(name).limits_for(limits), cost)  # a preset's blocks
        (out / "metrics.json").write_text(dumps_json(result.metrics))
        result.batches_df.to_csv(out / "batches.csv")
        result.requests_df.to_csv(out / "requests.csv")
    return {"scheduler": name, **result.metrics}


def _print_simulate(summary: Mapping[str, Any], refused: Sequence[Any], out: str | None) -> None:
    """The inputs' line, the results' table, the refusals, the notes, what was written."""
    rows = summary["results"]
    print(f"workload {summary['workload']}  limits {summary['limits']}  cost {summary['cost']}")
    if rows:
        print_table(rows, ("scheduler", *SUMMARY_KEYS))
    for refusal in refused:
        print(refusal.line())
    for note in summary["notes"]:
        print(f"note: {note}")
    if out and rows:
        print(f"wrote schedule.json, workload.json, limits.json, cost.json, metrics.json, batches.csv, "
              f"requests.csv under {out}")


def say_refused(refusals, total: int, any_done: bool, verbose: bool) -> None:
    """On stderr: one line per scheduler that failed with an internal error (its traceback with -v), and
    one line for those that refused the workload (their reasons are on stdout, beside the results)."""
    for r in refusals:
        if r.internal:
            if verbose and r.traceback:
                print(r.traceback, end="", file=sys.stderr)
            print(f"infermax: error: {r.scheduler}: {r.reason}{'' if verbose else ' (run with -v for the traceback)'}",
                  file=sys.stderr)
    refused = [r.scheduler for r in refusals if not r.internal]
    if refused:
        print(f"infermax: error: {len(refused)} of {total} schedulers refused the workload ({', '.join(refused)}; "
              f"reasons above){'' if any_done else '; no results'}", file=sys.stderr)


def _simulate_cluster(args: argparse.Namespace) -> int:
    """``simulate --cluster SPEC [--policy fifo,reservation,priority]``: per policy and local scheduler
    (the decisions: :mod:`infermax.cluster.runs`)."""
    from .cluster import Cluster
    from .cluster.runs import check_limits_without_M, cluster_runs, engine_options, rescale_to_load, reserved_options
    from .schedulers import split_specs
    from .types import Workload

    cluster = Cluster.from_spec(args.cluster)
    check_limits_without_M(args.limits, cluster)
    workload = Workload.from_spec(f"trace:{args.trace}" if args.trace else args.workload)
    names = split_specs(DEFAULT_SCHEDULERS if args.scheduler is None else args.scheduler)
    runs = cluster_runs(names, args.policy, args.local)
    if args.out:
        out_dir(args.out)    # an --out that cannot be written fails before any work
    options = engine_options(sp_replicas=args.sp_replicas, decode_replicas=args.decode_replicas,
                             colocate_tokens=args.colocate_tokens, kvp_group_tokens=args.kvp_group_tokens)
    if args.load is not None:
        workload, cap = rescale_to_load(workload, cluster, args.load, runs[0][1], options)
        if not (args.json or args.quiet):
            print(f"capacity (FIFO, all requests at t = 0): {cap:.4g} requests/s; arrivals rescaled to "
                  f"load {args.load:g}", file=sys.stderr)
    extras = reserved_options(runs, args.reserved_replicas)
    details = [_cluster_run(args, workload, cluster, run, {**options, **extra}, len(runs) > 1)
               for run, extra in zip(runs, extras)]
    if args.json:
        print(dumps_json({"workload": workload.name, "cluster": cluster.describe(), "results": details}))
        return 0
    _print_cluster(workload, cluster, details)
    if args.out:
        print(f"wrote {', '.join(CLUSTER_RUN_FILES)} under {args.out}"
              f"{' (one POLICY/SCHEDULER folder per run)' if len(runs) > 1 else ''}")
    return 0


def _cluster_run(args: argparse.Namespace, workload: Any, cluster: Any, run: tuple[str, str],
                 options: Mapping[str, Any], several: bool) -> dict[str, Any]:
    """One (policy, scheduler) run, with its progress bar; written under --out as it finishes; its record."""
    from .cluster import simulate_cluster
    from .cluster.runs import run_record

    policy, name = run
    bar = _Progress(f"{policy}/{name}", len(workload), enabled=not (args.json or args.quiet))
    try:
        r = simulate_cluster(workload, cluster, policy, name, args.limits, args.cost, progress=bar, **options)
    finally:
        bar.close()
    record = run_record(policy, name, r)
    if args.out:
        write_cluster_run(Path(args.out) / policy / name if several else Path(args.out), r, workload, record)
    return record


def _print_cluster(workload: Any, cluster: Any, details: list[dict[str, Any]]) -> None:
    """The cluster runs' table, and their per-tag table when requests are tagged."""
    print(f"workload {workload.name}  cluster {cluster.to_spec()}  ({cluster.num_replicas} replicas, "
          f"M = {cluster.replica_kv_capacity_tokens}, cost {cluster.cost_model_name()})")
    rows = [{"policy": d["policy"], "scheduler": d["scheduler"], **d["metrics"]} for d in details]
    print_table(rows, ("policy", "scheduler", *SUMMARY_KEYS, "num_preemptions", "num_overtakes"))
    tags = [{"policy": d["policy"], "scheduler": d["scheduler"], "tag": tag, **vals}
            for d in details for tag, vals in d["by_tag"].items()]
    if tags:
        print_table(tags, ("policy", "scheduler", "tag", "num_requests", "queueing_p50_s", "queueing_p99_s",
                           "throughput_rps", "jct_mean_s", "num_unserved_by_last_arrival", "num_suspensions"))


CLUSTER_RUN_FILES = ("schedule.json", "workload.json", "cluster.json", "metrics.json")


def write_cluster_run(out: Path, result: Any, workload: Any, details: Mapping[str, Any]) -> None:
    """A cluster run directory: the cluster schedule (``infermax replay DIR/schedule.json`` judges it against
    the workload.json beside it), the workload as run (arrivals after ``--load``), the cluster spec, the metrics."""
    out = out_dir(out)
    result.cluster_schedule().to_json(out / "schedule.json")
    (out / "workload.json").write_text(json.dumps(workload.to_dict()))
    (out / "cluster.json").write_text(dumps_json(result.cluster.describe()))
    (out / "metrics.json").write_text(dumps_json(dict(details)))


def cmd_schedulers(args: argparse.Namespace) -> int:
    from .cluster.policies import describe_policies
    from .schedulers import describe_all

    table, policies = describe_all(), describe_policies()
    if args.json:      # the replica schedulers by name, as before, and the cluster policies under one key
        print(dumps_json({**table, "cluster_policies": policies}))
    else:
        width = max(map(len, [*table, *policies]))
        for name, doc in table.items():
            print(f"{name.ljust(width)}  {doc}")
        print("\ncluster policies (with --cluster; each replica runs a scheduler above, --local):")
        for name, doc in policies.items():
            print(f"{name.ljust(width)}  [cluster] {doc}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from .metrics import metrics
    from .replay import replay
    from .state import ScheduleError

    if is_cluster_schedule(args.schedule):
        return _replay_cluster(args)
    schedule = load_schedule(args.schedule)
    workload, limits, cost, judged, notes = schedule_inputs(args.schedule, schedule, args.workload, args.limits,
                                                            args.cost)
    if not args.json:
        print(judged_line(judged))
        for note in notes:
            print(f"note: {note}")
    try:
        trace = replay(schedule, workload, limits, cost)
    except ScheduleError as exc:
        if args.json:
            print(dumps_json({"valid": False, "error": str(exc), "type": type(exc).__name__,
                              "judged_against": judged, "notes": notes}))
        print(f"infermax: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = {"valid": True, **metrics(trace)}
    if args.json:
        print(dumps_json({**result, "judged_against": judged, "notes": notes}))
    else:
        print(f"valid schedule: {len(schedule)} batches")
        print_table([result], SUMMARY_KEYS)
    return 0


def _replay_cluster(args: argparse.Namespace) -> int:
    """``replay`` of a cluster schedule (infermax.cluster.judge): the workload from --workload or its meta."""
    from .cluster.judge import ClusterScheduleError, replay_cluster
    from .cluster.schedule import ClusterSchedule

    if args.limits:
        raise ValueError("--limits does not apply to a cluster schedule: its meta holds the replicas' limits")
    try:
        schedule = ClusterSchedule.from_json(Path(args.schedule))     # (a field it cannot read: rule "format")
        beside = Path(args.schedule).parent / "workload.json"     # simulate --cluster --out writes it
        workload = args.workload or (str(beside) if beside.is_file() else schedule.meta.get("workload"))
        if not workload:
            raise ValueError("the cluster schedule's meta names no workload and there is no workload.json beside "
                             "it; pass --workload")
        if not args.json:
            source = "--workload" if args.workload else "beside the schedule" if beside.is_file() else \
                "the schedule's meta"
            print(f"judged against workload {workload} ({source}), cluster {schedule.meta.get('cluster')} "
                  f"(the schedule's meta)")
        out = replay_cluster(schedule, workload, args.cost)
    except ClusterScheduleError as exc:
        if args.json:
            print(dumps_json({"valid": False, "rule": exc.rule, "error": str(exc), "type": type(exc).__name__}))
        print(f"infermax: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = {"valid": True, "num_replicas": len(schedule.replicas), "num_gangs": len(schedule.gangs),
              "num_migrations": out.num_migrations, "num_gang_suspensions": out.num_suspensions, **out.metrics()}
    if args.json:
        print(dumps_json(result))
    else:
        print(f"valid cluster schedule: {len(schedule.replicas)} replicas, "
              f"{sum(len(s) for s in schedule.replicas)} batches, {len(schedule.gangs)} gangs, "
              f"{out.num_migrations} migrations, {out.num_suspensions} suspensions")
        print_table([result], SUMMARY_KEYS)
    return 0


# --- parser and the one error path -------------------------------------------------------------------
class UsageError(ValueError):
    """A command line argparse cannot parse (reported like every other error, exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        command = self.prog.removeprefix("infermax").strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="infermax", description="Simulate, judge, bound and solve LLM-inference schedules.")
    parser.add_argument("--version", action="version", version=f"infermax {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details; tracebacks of "
                        "internal errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="simulate schedulers on a workload and summarise the metrics")
    p.add_argument("--scheduler", default=None, help="name(s), comma separated; see `infermax schedulers` "
                   f"(default {DEFAULT_SCHEDULERS}, less those without chunked prefill when a prompt is longer "
                   "than min(C, P), as in the shipped traces: a note names them). A scheduler that refuses the "
                   "workload is reported beside the others' results (exit 4; 5 if every one refused)")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"workload spec (default {DEFAULT_WORKLOAD})")
    p.add_argument("--trace", help="a trace CSV (Splitwise/Vidur or Azure format); overrides --workload")
    p.add_argument("--limits", default=None, help="e.g. M=100000,C=4096,P=512,R_max=128 (default M=100K, C=4096)")
    p.add_argument("--cost", default=None, help="cost model name or JSON path (default: A100 Llama-2-7B)")
    p.add_argument("--out", help="directory for schedule.json, workload.json, limits.json, cost.json, metrics "
                   "and DataFrames (CSV); one subdirectory per scheduler when several. With --cluster: the "
                   "cluster schedule, workload.json, cluster.json and metrics.json (POLICY/SCHEDULER folders "
                   "when several runs); `infermax replay DIR/schedule.json` judges either")
    p.add_argument("--cluster", help="simulate on many replicas, e.g. a100:nodes=4,gpus_per_node=8,"
                   "model=mistral-7b-v0.3,tp=1 (M per replica from GPU memory; --scheduler is each replica's)")
    p.add_argument("--policy", help="with --cluster: global policies, comma separated (fifo, reservation, "
                   "priority, pecsched, pecsched-pe/-dis/-col/-fsp, medha-3d/-2d/-3d-static/-3d-pp; default fifo); "
                   "cluster policy names may also be given to --scheduler, each replica then running --local")
    p.add_argument("--local", default=None, help="with --cluster and cluster policies in --scheduler: each "
                   "replica's scheduler (default sarathi: chunked prefill, as colocation needs; medha under "
                   "the medha-* policies)")
    p.add_argument("--load", type=float, help="with --cluster: rescale the arrivals to this multiple of the "
                   "cluster's capacity (1.0 = FIFO's maximum throughput, measured first; PecSched §6.6)")
    p.add_argument("--sp-replicas", type=int, help="with --cluster: most replicas per long request's gang "
                   "(default one node)")
    p.add_argument("--decode-replicas", type=int, help="with --cluster: replicas for short decodes under "
                   "disaggregation (default PecSched §6.2's 4/4/1/1)")
    p.add_argument("--reserved-replicas", type=int, help="with --cluster and the reservation policy: replicas "
                   "that serve long requests only (default: the majority, in whole gangs; PecSched §6.3)")
    p.add_argument("--colocate-tokens", type=int, help="with --cluster: short prefill tokens colocated with a "
                   "long decode per replica and step (default 512)")
    p.add_argument("--kvp-group-tokens", type=int, help="with --cluster and kvp > 1: most KV tokens of one request "
                   "per KVP group before it onboards the next (default: the longest request over the kvp groups)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("schedulers", help="list the registered schedulers and the cluster policies")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedulers)

    p = sub.add_parser("replay", help="judge a schedule JSON written by anyone (exit 2 if invalid)")
    p.add_argument("schedule", help="schedule JSON file (reads workload.json, limits.json, cost.json beside it)")
    p.add_argument("--workload", help="workload spec or workload.json (default: workload.json beside the "
                   "schedule, else the schedule's meta)")
    p.add_argument("--limits", default=None, help="limits spec (default: limits.json beside the schedule, else "
                   "its meta, else defaults)")
    p.add_argument("--cost", default=None, help="cost model (default: cost.json beside the schedule, else its "
                   "meta, else the default model)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)

    for module in PLUGIN_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # that feature is not part of this installation
            raise
        mod.add_subcommands(sub)
    return parser


def error_message(exc: BaseException) -> str:
    """One line naming the thing that failed (a file's name and the system's reason for OSErrors)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    return one_line(str(exc))


def fail(message: str, kind: str, json_mode: bool, code: int) -> int:
    """Report an error the one way every command does; returns the exit status."""
    if json_mode:
        print(json.dumps({"error": message, "type": kind}))
    print(f"infermax: error: {message}" if code != EXIT_INTERRUPTED else f"infermax: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode, verbose = "--json" in argv, bool({"-v", "--verbose"} & set(argv))
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(message)s")
        json_mode = bool(getattr(args, "json", False))
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (`infermax ... | head`): nothing left to say
        try:  # and Python must not complain when it flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as exc:
        return fail(f"interrupted{f': {exc}' if str(exc) else ''}", "KeyboardInterrupt", json_mode,
                    EXIT_INTERRUPTED)
    except (ValueError, OSError, ImportError) as exc:  # bad input, unreadable files, invalid schedules
        return fail(error_message(exc), type(exc).__name__, json_mode, EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - a bug: one line, the traceback with -v
        if verbose:
            traceback.print_exc()
        return fail(f"internal error: {type(exc).__name__}: {error_message(exc)}"
                    f"{'' if verbose else ' (run with -v for the traceback)'}", type(exc).__name__, json_mode,
                    EXIT_INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
