"""Command-line layer of infermax.execute: ``infermax validate``.

    infermax validate [--scheduler vllm,sarathi] [--workload fixed:I=64,O=16,B=16]
                      [--limits M=1024,C=256] [--profile DIR] [--device cpu|cuda]
                      [--out DIR] [--json] [-q]

``add_subcommands(subparsers)`` adds the command; its handler returns an exit
status (0 success, 1 tokens differ from the reference or KV blocks leaked); bad
input raises ValueError, which ``infermax.cli.main`` reports (one line, exit 2).
torch is imported only when the command runs.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_subcommands"]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _text(summary: dict[str, Any]) -> str:
    lines = [f"workload {summary['workload']}  limits {summary['limits']}  device {summary['device']}  "
             f"model {summary['model']}  ({summary['stat']} of {summary['repeats']} runs)",
             f"profile {summary['profile']}",
             f"{'scheduler':<14}{'batches':>8}{'evict':>6}{'tokens':>8}{'batch med APE':>14}{'p90 APE':>9}"
             f"{'pred e2e s':>11}{'meas e2e s':>11}{'e2e err':>9}{'vs CPU':>8}{'wall/CPU':>9}"]
    for name, r in summary["schedulers"].items():
        ok = "same" if r["tokens_identical"] and r["blocks_in_use"] == 0 else "DIFFER"
        lines.append(f"{name:<14}{r['num_batches']:>8}{r['num_evictions']:>6}{ok:>8}"
                     f"{_fmt(r['batch_time_median_ape']):>14}{_fmt(r['batch_time_p90_ape']):>9}"
                     f"{r['predicted_latency_s']:>11.4f}{r['measured_latency_s']:>11.4f}"
                     f"{r['e2e_latency_signed_error']:>+9.1%}{r['cpu_time_e2e_latency_signed_error']:>+8.1%}"
                     f"{r['measured_wall_over_cpu']:>9.2f}")
    lines.append(f"all: tokens identical {summary['tokens_identical']}, batch median APE "
                 f"{_fmt(summary['batch_time_median_ape'])}, p90 {_fmt(summary['batch_time_p90_ape'])}, "
                 f"worst e2e latency error {_fmt(summary['e2e_latency_error'])} "
                 f"({_fmt(summary['cpu_time_e2e_latency_error'])} against CPU time)")
    return "\n".join(lines)


def _write_outputs(report: Any, out: Path) -> list[Path]:
    from infermax.output import dumps_json

    from .validation import plot_validation

    out.mkdir(parents=True, exist_ok=True)
    rows = report.batch_rows()
    with open(out / "validation_batches.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "validation.json").write_text(dumps_json(report.summary()))
    return [out / "validation_batches.csv", out / "validation.json", plot_validation(report, out / "validation.png")]


class _StageBar:
    """One tqdm bar per stage (profile passes, schedule runs) on stderr; silent with --json or -q."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.bar, self.stage = enabled, None, None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self.stage:
            self.close()
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=stage, unit="pass" if stage == "profile" else "run", leave=False,
                            file=sys.stderr, disable=None)
            self.stage = stage
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.stage = None, None


def cmd_validate(args: argparse.Namespace) -> int:
    from infermax.output import dumps_json
    from infermax.rundir import out_dir

    from .validation import validate

    if args.out:
        out_dir(args.out)           # an --out that cannot be written fails before any measurement
    bar = _StageBar(enabled=not (args.json or args.quiet))
    try:
        report = validate(args.scheduler, args.workload, args.limits, profile=args.profile, device=args.device,
                          model=args.model, seed=args.seed, repeats=args.repeats, num_threads=args.threads,
                          progress=bar)
    finally:
        bar.close()
    summary = report.summary()
    written = _write_outputs(report, Path(args.out)) if args.out else []
    if args.json:
        print(dumps_json(summary))
    else:
        print(_text(summary))
        for path in written:
            print(f"wrote {path}")
    return 0 if summary["tokens_identical"] else 1


def add_subcommands(subparsers: Any) -> None:
    """Add ``validate`` to an argparse subparsers object."""
    from .validation import DEFAULT_LIMITS, DEFAULT_WORKLOAD

    p = subparsers.add_parser("validate", help="profile + fit a cost model, then execute schedules on a real "
                              "model: predicted vs measured time, tokens vs a reference decode")
    p.add_argument("--scheduler", default="vllm", help="name(s), comma separated (default vllm)")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"workload spec (default {DEFAULT_WORKLOAD})")
    p.add_argument("--limits", default=DEFAULT_LIMITS, help=f"limits spec (default {DEFAULT_LIMITS})")
    p.add_argument("--profile", help="profile directory to reuse, or to write to when empty "
                   "(default: profile into a temporary directory)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    p.add_argument("--model", default="llama-tiny", help="model spec, profiled and executed (default llama-tiny)")
    p.add_argument("--repeats", type=int, default=10, help="runs of each schedule; each batch keeps the min "
                   "on CPU, the median on CUDA (default 10)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompts seed")
    p.add_argument("--out", help="directory for validation.png, validation_batches.csv, validation.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_validate)
