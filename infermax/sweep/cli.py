"""``infermax sweep`` and ``infermax plot``.

    infermax sweep config.yaml [--out results.parquet] [--executor local|serial|ray|ray://host:port]
                               [--workers 2] [--no-resume] [--retry-errors] [--json] [-q]
    infermax plot results.parquet [--x I] [--metric tps ...] [--hue scheduler] [--col O] [--row M]
                                  [--where "B == 1024"] [--kind grid|tradeoff] [--out fig.png] [--json]
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

#: exit status of a sweep in which every cell failed (a sweep with some failed cells exits 0: their errors are
#: rows of the table, in its ``error`` column)
EXIT_ALL_FAILED = 5
SHOW = ("workload", "scheduler", "system", "limits", "latency_s", "tps", "ttft_mean_s", "tpot_mean_s", "num_evictions",
        "served_fraction")      # (system and served_fraction: system cells, infermax.sweep.systems)


@contextmanager
def _sigterm_as_interrupt():
    """While a sweep runs, ``kill`` (SIGTERM) stops it like Ctrl-C: workers stopped, results written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _results_path(args: argparse.Namespace, cfg) -> Path:
    """The results parquet, checked before any cell runs (a directory or an unwritable folder is named)."""
    from ..rundir import out_dir

    out = Path(args.out or cfg.out or Path(args.config).with_suffix(".parquet"))
    if out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a directory; give the results file, "
                         f"e.g. {str(out / 'results.parquet')!r}")
    out_dir(out.parent)
    return out


# complexity: a front end: one branch per option and per way a sweep ends (done, killed, errors)
def cmd_sweep(args: argparse.Namespace) -> int:
    from ..output import dumps_json
    from .config import SweepConfig
    from .run import run_cells

    if args.workers < 1:
        raise ValueError(f"--workers must be an integer >= 1, got {args.workers}")
    cfg = SweepConfig.load(args.config)
    cells = cfg.cells()
    out = _results_path(args, cfg)
    bar, finished = None, [0]
    if not (args.json or args.quiet):
        from tqdm import tqdm

        bar = tqdm(total=len(cells), desc=cfg.name, unit="cell", file=sys.stderr, disable=None)

    def progress(done: int, total: int) -> None:
        finished[0] = done
        if bar is not None:
            bar.update(done - bar.n)

    try:
        with _sigterm_as_interrupt():
            df = run_cells(cells, out=out, executor=args.executor, workers=args.workers,
                           resume=not args.no_resume, retry_errors=args.retry_errors, progress=progress)
    except KeyboardInterrupt as exc:
        why = f" ({exc})" if str(exc) else ""
        raise KeyboardInterrupt(f"sweep stopped{why}; {finished[0]} of {len(cells)} cells are in {out}; "
                                f"run the same command again to resume") from None
    finally:
        if bar is not None:
            bar.close()
    errors = df[df["error"].notna()]
    summary = {"name": cfg.name, "cells": len(df), "errors": len(errors), "out": str(out),
               "csv": str(out.with_suffix(".csv"))}
    failed_all = len(errors) == len(df)
    if failed_all:
        summary |= {"error": f"every one of the {len(df)} cells failed; first: {errors['error'].iloc[0]}",
                    "type": "AllCellsFailed"}
    if args.json:
        print(dumps_json(summary))
        if failed_all:
            print(f"infermax: error: {summary['error']}", file=sys.stderr)
        return EXIT_ALL_FAILED if failed_all else 0
    from ..output import format_table

    cols = [c for c in SHOW if c in df]
    if not failed_all:
        print(format_table(df[df["error"].isna()][cols].to_dict("records"), cols))
    for _, row in errors.iterrows():
        print(f"error in {row['workload']} / {row['scheduler']} / {row['limits']}: {row['error']}", file=sys.stderr)
    print(f"{len(df)} cells ({len(errors)} errors) -> {out} and {out.with_suffix('.csv')}")
    if failed_all:
        print(f"infermax: error: {summary['error']}", file=sys.stderr)
        return EXIT_ALL_FAILED
    return 0


def _where(df, expr: str | None):
    if not expr:
        return df
    try:
        return df.query(expr)
    except Exception as exc:  # noqa: BLE001 - pandas raises many types for a bad expression
        raise ValueError(f"--where {expr!r} is not a valid filter on columns {list(df.columns)}: "
                         f"{_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


# complexity: a front end: one refusal per bad input (file, rows, output) and one branch per plot kind
def cmd_plot(args: argparse.Namespace) -> int:
    import pandas as pd

    from .. import plots
    from ..output import dumps_json

    path = Path(args.results)
    if not path.exists():
        raise ValueError(f"results file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"results {str(path)!r} is a directory; give the .parquet (or .csv) `infermax sweep` wrote")
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow and pandas raise their own types for a file they cannot read
        raise ValueError(f"results {str(path)!r} is not a sweep results table ({type(exc).__name__}: "
                         f"{_first_line(exc)})") from None
    df = _where(df, args.where)
    if df.empty:
        raise ValueError("no rows to plot (check --where)")
    metrics = args.metric or ["tps"]
    if args.kind == "tradeoff":
        fig = plots.tradeoff(df, hue=args.hue, annotate=args.x if args.x in df else None)
    else:
        col = args.col if args.col is not None else ("O" if "O" in df else "")
        fig = plots.metric_grid(df, metrics, x=args.x, hue=args.hue, col=col or None, row=args.row,
                                logx=not args.linear_x, logy=args.log_y)
    out = Path(args.out or path.with_suffix(".png"))
    if out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a directory; give an image file, e.g. {str(out / 'fig.png')!r}")
    plots.save(fig, out)
    axes = [ax for ax in fig.axes if ax.has_data()]
    info = {"out": str(out), "panels": len(axes), "lines": sum(len(ax.lines) for ax in axes), "rows": len(df)}
    print(dumps_json(info) if args.json else f"wrote {out} ({info['panels']} panels, {info['lines']} lines)")
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a grid of workload x scheduler x limits x cost cells (resumable)")
    p.add_argument("config", help="sweep YAML (example: examples/grid.yaml; schema: python -m pydoc "
                   "infermax.sweep.config)")
    p.add_argument("--out", help="results parquet (a CSV is written beside it; default: the config's out, "
                   "else CONFIG.parquet)")
    p.add_argument("--executor", default="local", help="serial, local (process pool), ray, or ray://host:port")
    p.add_argument("--workers", type=int, default=2, help="processes of the local executor (default 2)")
    p.add_argument("--no-resume", action="store_true", help="run every cell again, even those already in --out")
    p.add_argument("--retry-errors", action="store_true", help="run again the cells that raised")
    p.add_argument("-q", "--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON summary (exit 5 when every cell failed)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plot", help="plot a sweep results table (metric vs x, one line per scheduler)")
    p.add_argument("results", help="results .parquet (or .csv) written by `infermax sweep`")
    p.add_argument("--x", default="I", help="x-axis column (default I)")
    p.add_argument("--metric", action="append", help="metric column (repeat for several rows; default tps)")
    p.add_argument("--hue", default="scheduler", help="one line per value of this column (default scheduler)")
    p.add_argument("--col", help="one panel per value of this column (default O when present; '' for one panel)")
    p.add_argument("--row", help="one row of panels per value of this column (with a single --metric)")
    p.add_argument("--where", help="pandas query to select rows, e.g. 'B == 1024 and M == 100000'")
    p.add_argument("--kind", choices=("grid", "tradeoff"), default="grid", help="grid (default) or TTFT/TPOT")
    p.add_argument("--linear-x", action="store_true", help="linear x axis (default log)")
    p.add_argument("--log-y", action="store_true", help="log y axis")
    p.add_argument("--out", help="image file (default: RESULTS.png)")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.set_defaults(func=cmd_plot)
