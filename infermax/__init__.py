"""infermax: LLM-inference scheduling — simulate heuristic schedulers, judge any
schedule with one cost model, and compare against optimal schedules and bounds.

    >>> import infermax
    >>> r = infermax.simulate("fixed:I=64,O=32,B=256", scheduler="vllm")
    >>> r.metrics["latency_s"] > 0
    True

``infermax.replay``, ``infermax.metrics``, ``infermax.sweep`` and ``infermax.execute`` are
functions, each exported from the module (or subpackage) of the same name; those
modules stay importable by name: ``from infermax.sweep import run_cells``,
``from infermax.execute.validation import validate``.
"""
from . import (
    schedulers,
    workload_spec,  # noqa: F401 - installs the grammar behind Workload.from_spec before a spec is read
)
from .engine import SchedulerStuckError, SimResult, simulate
from .execute import execute
from .metrics import metrics, metrics_by_tag
from .policy import Policy
from .replay import replay
from .schedulers import register_scheduler
from .starvation import starvation
from .state import ScheduleError
from .sweep import sweep
from .trace import Trace
from .types import Batch, Limits, Request, Schedule, Workload

__all__ = ["Batch", "Bound", "OptimalResult", "Policy", "check_scheduler", "lower_bound", "solve_optimal", "Limits",
           "Request", "Schedule", "ScheduleError", "SchedulerStuckError", "SimResult",
           "Trace", "Workload", "execute", "metrics", "metrics_by_tag", "register_scheduler", "replay", "schedulers",
           "simulate", "starvation", "sweep"]
__version__ = "0.1.0"

_LAZY = {"solve_optimal": "infermax.csp", "OptimalResult": "infermax.csp",
         "lower_bound": "infermax.bounds", "Bound": "infermax.bounds",
         "check_scheduler": "infermax.bounds"}


def __getattr__(name: str):
    """Solver-backed names load on first use (the solvers are optional extras)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'infermax' has no attribute {name!r}")
