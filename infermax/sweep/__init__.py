"""Sweeps: run a grid of (workload x scheduler x limits x cost [x solver]) cells into one tidy table.

    >>> import infermax
    >>> df = infermax.sweep({"workloads": {"grid": {"I": [16, 64], "O": [8], "B": [32]}},
    ...                      "schedulers": ["vllm", "sarathi"]}, executor="serial")
    >>> len(df), bool(df["error"].isna().all())
    (4, True)

``infermax.sweep`` is this package, and calling it calls its function :func:`sweep`
(:mod:`infermax._callable`); its names are imported from it: ``from infermax.sweep import sweep,
run_cells, Cell``. The config (a YAML file, a dict or a :class:`SweepConfig`) is described in
:mod:`infermax.sweep.config`; ``examples/grid.yaml`` is a commented example. The modules:

- :mod:`.config`  the config's schema, its grid and its cells (:class:`SweepConfig`, :class:`Cell`)
- :mod:`.run`     running cells into the table (:func:`sweep`, :func:`run_cells`, :func:`run_cell`)
- :mod:`.systems` cells that run a whole serving system on a cluster
- :mod:`.cli`     the ``infermax sweep`` and ``infermax plot`` commands

Results: one row per cell, in grid order (workloads outermost, then schedulers,
limits, costs; solver cells after the schedulers). Columns: ``cell_id`` (a hash
of the cell's four specs and solver options), the specs (``workload``,
``scheduler``, ``limits`` in canonical form, ``cost``, ``solver``), the parsed
config (``kind``, ``I``, ``O``, ``B``, ... from the workload spec; ``policy`` =
scheduler name without options; ``M``, ``C``, ``P``, ``R_max``), every metric of
:func:`infermax.metrics` (solver cells add ``objective``, ``bound``, ``gap``,
``status``, ``backend``, ``solver_wall_s`` and ``schedule_json``), ``error`` (None, or the exception of a cell that
raised) and ``wall_s``. Every column but the timings is the same whichever executor
ran the cells (solver cells stopped by a time limit excepted). System cells (a whole
cluster system, config key ``systems``: :mod:`infermax.sweep.systems`) come after a
workload's solver cells, with their own columns (``system``, ``cluster``, per-tag
metrics, ``cpu_s``).

Resuming: with ``out`` set, rows already in ``out`` are kept and their cells are
not run again (``retry_errors=True`` re-runs cells that raised); rows of cells
outside this sweep stay in the file but not in the returned table. The table is
written to ``out`` (parquet) and beside it as CSV every ``checkpoint_s`` seconds
and at the end, also when interrupted.

Executors: ``"serial"`` (this process), ``"local"`` (a process pool, ``workers``
processes, default 2; interrupted, it terminates its workers before returning),
``"ray"`` (a local Ray instance, or the one already initialised) and
``"ray://host:port"`` (a Ray cluster; its workers need infermax installed, e.g.
through a ``runtime_env``).
"""
import sys

from .._callable import CallableModule
from .config import (
    DEFAULT_COSTS,
    DEFAULT_LIMITS,
    FIXED_TEMPLATE,
    Cell,
    SweepConfig,
    canonical_limits,
    config_columns,
    solver_label,
)
from .run import NONDETERMINISTIC_COLUMNS, run_cell, run_cells, same_results, sweep

__all__ = ["DEFAULT_COSTS", "DEFAULT_LIMITS", "FIXED_TEMPLATE", "NONDETERMINISTIC_COLUMNS", "Cell", "SweepConfig",
           "canonical_limits", "config_columns", "run_cell", "run_cells", "same_results", "solver_label", "sweep"]

sys.modules[__name__].__class__ = CallableModule
