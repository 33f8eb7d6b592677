"""The ``infermax`` command line.

    infermax simulate [--scheduler vllm,sarathi] [--workload fixed:I=1024,O=1024,B=1024]
                      [--limits M=100000,C=4096] [--cost default] [--out DIR] [--json]
    infermax schedulers [--json]
    infermax replay schedule.json --workload SPEC [--limits ...] [--cost ...] [--json]

Further commands (``solve``, ``bound``, ``profile``, ``costmodel``, ...) are added
by their packages through ``add_subcommands(subparsers)``. Every command takes
``--json``. Exit status: 0 success, 2 bad input or an invalid schedule.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Sequence

DEFAULT_WORKLOAD = "fixed:I=1024,O=1024,B=1024"
DEFAULT_SCHEDULERS = "vllm,sarathi,sarathi-pc,vllm-ef,sarathi-ef"
SUMMARY_KEYS = ("latency_s", "tps", "ttft_mean_s", "tpot_mean_s", "ttft_p99_s", "num_evictions",
                "num_batches", "running_size_mean", "kv_utilization_mean")
# packages that contribute commands; each module has add_subcommands(subparsers)
PLUGIN_MODULES = ("infermax.costmodel.cli", "infermax.csp.cli", "infermax.bounds.cli", "infermax.sweep_cli",
                  "infermax.execute.cli")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], keys: Sequence[str]) -> None:
    """A plain aligned table on stdout (the CLI's only output format besides JSON)."""
    cells = [[_fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))


class _Progress:
    """A tqdm bar over finished requests (stderr; silent when not a terminal or with --json)."""

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


def _write_outputs(out: Path, result, workload) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result.schedule.to_json(out / "schedule.json")
    (out / "workload.json").write_text(json.dumps(workload.to_dict()))
    (out / "metrics.json").write_text(json.dumps(result.metrics, indent=2))
    result.batches_df.to_csv(out / "batches.csv")
    result.requests_df.to_csv(out / "requests.csv")


def cmd_simulate(args: argparse.Namespace) -> int:
    from . import simulate
    from .engine import resolve_inputs
    from .schedulers import get_scheduler

    spec = f"trace:{args.trace}" if args.trace else args.workload
    workload, limits, cost = resolve_inputs(spec, args.limits, args.cost)
    rows = []
    names = [s.strip() for s in args.scheduler.split(",") if s.strip()]
    for name in names:
        get_scheduler(name)  # unknown names fail before any work
    for name in names:
        bar = _Progress(name, len(workload), enabled=not args.json and not args.no_progress)
        try:
            result = simulate(workload, name, limits, cost, progress=bar)
        finally:
            bar.close()
        rows.append({"scheduler": name, **result.metrics})
        if args.out:
            _write_outputs(Path(args.out) / name if len(names) > 1 else Path(args.out), result, workload)
    summary = {"workload": workload.name, "limits": limits.to_dict(), "cost": cost.name, "results": rows}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"workload {workload.name}  limits {limits.to_dict()}  cost {cost.name}")
        print_table(rows, ("scheduler", *SUMMARY_KEYS))
        if args.out:
            print(f"wrote schedule.json, workload.json, metrics.json, batches.csv, requests.csv under {args.out}")
    return 0


def cmd_schedulers(args: argparse.Namespace) -> int:
    from .schedulers import describe_all

    table = describe_all()
    if args.json:
        print(json.dumps(table))
    else:
        width = max(map(len, table))
        for name, doc in table.items():
            print(f"{name.ljust(width)}  {doc}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from .metrics import metrics
    from .replay import replay
    from .types import Schedule

    schedule = Schedule.from_json(Path(args.schedule))
    workload = args.workload or schedule.meta.get("workload")
    if workload is None:
        raise ValueError("replay needs --workload (the schedule's meta names none)")
    limits = args.limits if args.limits is not None else _limits_from_meta(schedule.meta)
    trace = replay(schedule, workload, limits, args.cost)
    result = {"valid": True, **metrics(trace)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"valid schedule: {len(schedule)} batches")
        print_table([result], SUMMARY_KEYS)
    return 0


def _limits_from_meta(meta: dict) -> str | None:
    lim = meta.get("limits")
    if not lim:
        return None
    return ",".join(f"{k}={'none' if v is None else v}" for k, v in lim.items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infermax", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="simulate schedulers on a workload and summarise the metrics")
    p.add_argument("--scheduler", default=DEFAULT_SCHEDULERS, help="name(s), comma separated "
                   f"(default {DEFAULT_SCHEDULERS}); see `infermax schedulers`")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"workload spec (default {DEFAULT_WORKLOAD})")
    p.add_argument("--trace", help="a trace CSV (Splitwise/Vidur or Azure format); overrides --workload")
    p.add_argument("--limits", default=None, help="e.g. M=100000,C=4096,P=512,R_max=128 (default M=100K, C=4096)")
    p.add_argument("--cost", default=None, help="cost model name or JSON path (default: A100 Llama-2-7B)")
    p.add_argument("--out", help="directory for schedule.json, metrics and DataFrames (CSV)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("schedulers", help="list the registered schedulers")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedulers)

    p = sub.add_parser("replay", help="judge a schedule JSON written by anyone (exit 2 if invalid)")
    p.add_argument("schedule", help="schedule JSON file")
    p.add_argument("--workload", help="workload spec or workload.json (default: the schedule's meta)")
    p.add_argument("--limits", default=None, help="limits spec (default: the schedule's meta, else defaults)")
    p.add_argument("--cost", default=None)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad input and invalid schedules (ScheduleError is a ValueError)
        if getattr(args, "json", False):
            print(json.dumps({"error": str(exc), "type": type(exc).__name__}))
        print(f"infermax: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
