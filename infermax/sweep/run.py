"""The sweep's runner: run cells (this process, a local process pool or Ray) into the results table,
resumable from and checkpointed to a parquet file.

The package :mod:`infermax.sweep` describes the table's columns, resuming and the executors;
:func:`run_cell` runs one cell (a scheduler, a solver or a cluster system), :func:`run_cells` many,
:func:`sweep` a whole config (:mod:`infermax.sweep.config`).
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .config import Cell, SweepConfig, config_columns

log = logging.getLogger(__package__)   # the package's logger, "infermax.sweep"

NONDETERMINISTIC_COLUMNS = ("wall_s", "solver_wall_s", "cpu_s")   # timings; every other column is reproducible


def _solve(cell: Cell) -> dict[str, Any]:
    """A solver cell: the replayed metrics of the schedule found, the solver's account, and the
    schedule itself as JSON (``schedule_json``; optimal schedules are expensive and small)."""
    import infermax

    from ..metrics import metrics
    from ..replay import replay

    res = infermax.solve_optimal(cell.workload, limits=cell.limits, cost=cell.cost, **json.loads(cell.solver))
    row: dict[str, Any] = {}
    if res.schedule is not None:
        row = metrics(replay(res.schedule, cell.workload, cell.limits, cell.cost))
    nan = float("nan")
    return {**row, "objective": nan if res.objective is None else float(res.objective),
            "bound": nan if res.bound is None else float(res.bound), "gap": nan if res.gap is None else float(res.gap),
            "status": str(res.status), "backend": str(res.backend), "solver_wall_s": float(res.wall_s),
            "schedule_json": None if res.schedule is None else res.schedule.to_json()}


def run_cell(cell: Cell) -> dict[str, Any]:
    """Run one cell; never raises for the cell's own failure (it goes to the ``error`` column)."""
    from ..engine import simulate

    start = time.perf_counter()
    row = config_columns(cell)
    try:
        if cell.system is not None:
            from .systems import run_system
            row |= run_system(cell.workload, cell.system)
        elif cell.solver is None:
            row |= simulate(cell.workload, cell.scheduler, cell.limits, cell.cost).metrics
        else:
            row |= _solve(cell)
        row["error"] = None
    except Exception as exc:  # noqa: BLE001 - a failing cell is a result, not a crash of the sweep
        row["error"] = f"{type(exc).__name__}: {exc}"
    row["wall_s"] = time.perf_counter() - start
    return row


# --- executors ------------------------------------------------------------------------------------
OnRow = Callable[[dict[str, Any]], None]


def _run_serial(cells: list[Cell], on_row: OnRow, workers: int) -> None:
    for cell in cells:
        on_row(run_cell(cell))


def _init_worker(parent_pid: int) -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it stops the workers; no traceback from each),
    and the worker dies with the sweep's process (:func:`_die_with`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(parent_pid)


def _die_with(pid: int, poll_s: float = 1.0) -> None:
    """End this process as soon as process ``pid`` has ended (a daemon thread waits on it).

    A sweep killed with SIGKILL cannot stop its workers; without this they wait for cells forever, and
    hold open the fork server's and the resource tracker's pipes, which keeps those alive too. The
    workers are the fork server's children, not the sweep's, so ``PR_SET_PDEATHSIG`` would wait for the
    wrong parent: the thread waits on a pidfd of the sweep's process (Linux), else polls it. Cells a
    dead sweep was running are lost with it, and a resumed sweep runs them again."""
    def wait() -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):       # not Linux >= 5.3: poll
            fd = None
        if fd is not None:
            select.select([fd], [], [])         # readable once the process has ended
        else:
            while _alive(pid):
                time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=wait, name="infermax-die-with-parent", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                     # alive, another user's (the pid was reused)
        return False
    return True


def _stop(pool) -> None:
    """Cancel the cells not started and terminate the workers now (a running cell may take minutes)."""
    terminate = getattr(pool, "terminate_workers", None)     # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    processes = list((pool._processes or {}).values())       # no public handle on the workers before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join(timeout=10)


def _run_local(cells: list[Cell], on_row: OnRow, workers: int) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    if workers <= 1 or len(cells) <= 1:
        return _run_serial(cells, on_row, workers)
    # not fork: the caller may hold threads (a notebook kernel, a Ray driver). A fork server
    # that has imported infermax starts workers in ~0.1 s instead of ~1.5 s for spawn.
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
    else:
        ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(cells)), mp_context=ctx, initializer=_init_worker,
                               initargs=(os.getpid(),))
    try:
        pending = {pool.submit(run_cell, c) for c in cells}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                on_row(fut.result())
    except BaseException:          # Ctrl-C, SIGTERM turned into KeyboardInterrupt, or on_row failing
        _stop(pool)
        raise
    pool.shutdown(wait=True)


def _run_ray(cells: list[Cell], on_row: OnRow, workers: int, address: str | None = None) -> None:
    # read by Ray when imported: without it Ray's C++ failure handler answers SIGTERM with a stack dump
    # and an abort (exit 134) before Python sees the signal (the user's own setting is kept)
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError:
        raise ValueError("executor 'ray' needs Ray: pip install 'infermax[ray]'") from None
    with _sigterm_deferred() as terminated:
        started = not ray.is_initialized()
        if started:
            _init_ray(ray, address)
        try:
            remote = ray.remote(num_cpus=1, max_retries=1)(run_cell)
            pending = [] if terminated() else [remote.remote(c) for c in cells]
            while pending and not terminated():
                done, pending = ray.wait(pending, num_returns=min(len(pending), 16), timeout=0.5)
                for row in ray.get(done):
                    on_row(row)
            if terminated():
                raise KeyboardInterrupt("terminated (SIGTERM)")
        finally:
            if started:
                ray.shutdown()


@contextmanager
def _sigterm_deferred():
    """While Ray runs, a SIGTERM that this process handles in Python (the CLI turns it into Ctrl-C) is only
    noted, and the Ray loop raises KeyboardInterrupt between its calls: raised inside one (a C++ call
    in the middle of an RPC), it left Ray's teardown to crash the process (exit 139). Yields the test
    "was SIGTERM received?". An unhandled SIGTERM (the default: end the process) is left as it is."""
    got: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    if not callable(previous):
        yield lambda: False
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield lambda: bool(got)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _init_ray(ray, address: str | None) -> None:
    """``ray.init`` keeping this process's SIGTERM handler (:func:`_sigterm_deferred`): Ray's own, which it
    sets while it starts, would exit with status 15, or with 1 after a stack dump."""
    from ray._private import utils as ray_utils

    main = threading.current_thread() is threading.main_thread()
    keep = getattr(ray_utils, "set_sigterm_handler", None)
    if main and keep is not None:
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.INFO if log.isEnabledFor(logging.INFO) else logging.WARNING)
    finally:
        if main and keep is not None:
            ray_utils.set_sigterm_handler = keep


def _executor(spec: str) -> tuple[Callable[..., None], dict[str, Any]]:
    if spec == "serial":
        return _run_serial, {}
    if spec == "local":
        return _run_local, {}
    if spec == "ray":
        return _run_ray, {}
    if spec.startswith("ray://") or spec.startswith("ray:"):
        address = spec if spec.startswith("ray://") else spec[4:]
        return _run_ray, {"address": address}
    raise ValueError(f"executor must be serial, local, ray or ray://host:port, got {spec!r}")


# --- results table --------------------------------------------------------------------------------
def _read(out: Path):
    import pandas as pd

    if not out.exists():
        return None
    if out.is_dir():
        raise ValueError(f"sweep out {str(out)!r} is a directory; give a .parquet file")
    try:
        old = pd.read_parquet(out)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises its own types for a file that is not parquet
        raise ValueError(f"sweep out {str(out)!r} exists but is not a results table to resume from "
                         f"({type(exc).__name__}: {exc}); remove it or choose another out") from None
    if "cell_id" not in old:
        raise ValueError(f"sweep out {str(out)!r} is not a sweep results table (no cell_id column)")
    return old


def _write(df, out: Path) -> None:
    """Parquet at ``out`` and CSV beside it, each replaced atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, writer in ((out, df.to_parquet), (out.with_suffix(".csv"), df.to_csv)):
        tmp = path.with_name(f".{path.name}.tmp")
        writer(tmp, index=False)
        os.replace(tmp, path)


def _table(rows: dict[str, dict[str, Any]], order: list[str]):
    """Rows of the current cells in grid order, then any other kept rows by cell id."""
    import pandas as pd

    keys = [k for k in order if k in rows] + sorted(set(rows) - set(order))
    records = [rows[k] for k in keys]
    df = pd.DataFrame(records, columns=_column_order(records))
    df["error"] = df["error"].astype(object).where(df["error"].notna(), None)
    return df


def _column_order(records: list[dict[str, Any]]) -> list[str]:
    """Config columns, then results as the first successful row lists them, then error and wall_s."""
    config = dict.fromkeys(k for r in records for k in _config_keys(r))
    results = dict.fromkeys(k for r in sorted(records, key=lambda r: isinstance(r.get("error"), str))
                            for k in r if k not in config)
    results.pop("error", None)
    results.pop("wall_s", None)
    return [*config, *results, "error", "wall_s"]


def _config_keys(row: dict[str, Any]) -> list[str]:
    return list(config_columns(Cell(row["workload"], row["scheduler"], row["limits"], row["cost"],
                                    row["solver"] if isinstance(row.get("solver"), str) else None,
                                    row["system_json"] if isinstance(row.get("system_json"), str) else None)))


# complexity: one loop with its options (workers, resume, retry, progress, checkpoints); a cell's work is elsewhere
def run_cells(cells: Iterable[Cell], out: "str | Path | None" = None, executor: str = "local",
              workers: int = 2, resume: bool = True, retry_errors: bool = False,
              progress: Callable[[int, int], None] | None = None, checkpoint_s: float = 10.0):
    """Run ``cells`` (skipping those already in ``out`` when resuming) and return their table.

    The file ``out`` keeps the rows of other cells it held (after this sweep's rows);
    the returned table has exactly one row per cell, in the order given.

    ``progress(done, total)`` is called after each finished cell (the CLI draws a bar).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    cells = list(dict.fromkeys(cells))
    order = [c.cell_id for c in cells]
    path = Path(out) if out is not None else None
    rows: dict[str, dict[str, Any]] = {}
    if path is not None and resume and (old := _read(path)) is not None:
        for rec in old.to_dict("records"):
            if not (retry_errors and isinstance(rec.get("error"), str)):
                rows[rec["cell_id"]] = rec
    todo = [c for c in cells if c.cell_id not in rows]
    log.info("sweep: %d cells, %d already done, %d to run on %s", len(cells), len(cells) - len(todo),
             len(todo), executor)
    run, kwargs = _executor(executor)
    done, last_write = len(cells) - len(todo), time.monotonic()

    def on_row(row: dict[str, Any]) -> None:
        nonlocal done, last_write
        rows[row["cell_id"]] = row
        done += 1
        if progress is not None:
            progress(done, len(cells))
        if path is not None and time.monotonic() - last_write > checkpoint_s:
            _write(_table(rows, order), path)
            last_write = time.monotonic()

    if progress is not None:
        progress(done, len(cells))
    try:
        if todo:
            run(todo, on_row, workers, **kwargs)
    finally:
        if path is not None and rows:
            _write(_table(rows, order), path)
    return _table({k: rows[k] for k in order}, order)


def sweep(config: "str | Path | Mapping[str, Any] | SweepConfig", out: "str | Path | None" = None,
          executor: str = "local", workers: int = 2, resume: bool = True, retry_errors: bool = False,
          progress: Callable[[int, int], None] | None = None):
    """Run every cell of ``config`` (YAML path, dict or SweepConfig; schema in
    :mod:`infermax.sweep.config`) and return the results table (columns: :mod:`infermax.sweep`).

    ``out`` (default: the config's ``out``) is the parquet file that makes the
    sweep resumable; a CSV is written beside it. ``executor``: ``"serial"``,
    ``"local"`` (``workers`` processes), ``"ray"`` or ``"ray://host:port"``.
    ``progress(done, total)`` is called after each finished cell.
    """
    cfg = SweepConfig.load(config)
    return run_cells(cfg.cells(), out=out if out is not None else cfg.out, executor=executor, workers=workers,
                     resume=resume, retry_errors=retry_errors, progress=progress)


def same_results(a, b) -> bool:
    """True when two results tables agree exactly on every column but the timings."""
    import pandas as pd

    a, b = (t.drop(columns=list(NONDETERMINISTIC_COLUMNS), errors="ignore").reset_index(drop=True) for t in (a, b))
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    try:  # values must match exactly; dtypes may differ after a parquet round trip (object vs str)
        pd.testing.assert_frame_equal(a, b, check_exact=True, check_dtype=False)
    except AssertionError:
        return False
    return True
