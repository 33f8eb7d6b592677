"""infermax: LLM-inference scheduling — simulate heuristic schedulers, judge any
schedule with one cost model, and compare against optimal schedules and bounds.

    >>> import infermax
    >>> r = infermax.simulate("fixed:I=64,O=32,B=256", scheduler="vllm")
    >>> r.metrics["latency_s"] > 0
    True

``infermax.replay``, ``infermax.metrics``, ``infermax.starvation``, ``infermax.sweep`` and
``infermax.execute`` are modules (or subpackages) that each define a function of their own name, and
calling the module calls that function (:mod:`infermax._callable`): ``infermax.replay(schedule, w)`` is
``infermax.replay.replay(schedule, w)``; their other names are attributes as usual
(``infermax.sweep.run_cells``, ``infermax.execute.validation.validate``).

Importing the package loads only the types and the workload grammar (``Workload.from_spec``); every
other name loads its module on first use (PEP 562), so ``import infermax.costmodel`` stays light.
"""
import importlib
import importlib.util

from .types import Batch, Limits, Request, Schedule, Workload
from .workloads import spec as _spec  # noqa: F401 - installs the grammar behind Workload.from_spec before a spec is read

__all__ = ["Batch", "Bound", "OptimalResult", "Policy", "check_scheduler", "lower_bound", "solve_optimal", "Limits",
           "Request", "Schedule", "ScheduleError", "SchedulerStuckError", "SimResult",
           "Trace", "Workload", "execute", "metrics", "metrics_by_tag", "register_scheduler", "replay", "schedulers",
           "simulate", "starvation", "sweep"]
__version__ = "0.1.0"

#: each public name -> the module that defines it (loaded on first use); a name that is its module's own
#: name (``schedulers``, ``replay``, ``sweep``, ...) is the module itself
_LAZY = {"SchedulerStuckError": "infermax.engine", "SimResult": "infermax.engine", "simulate": "infermax.engine",
         "execute": "infermax.execute", "metrics": "infermax.metrics", "metrics_by_tag": "infermax.metrics",
         "Policy": "infermax.policy", "replay": "infermax.replay", "register_scheduler": "infermax.schedulers",
         "schedulers": "infermax.schedulers", "starvation": "infermax.starvation", "ScheduleError": "infermax.state",
         "sweep": "infermax.sweep", "Trace": "infermax.trace",
         "solve_optimal": "infermax.optimal", "OptimalResult": "infermax.csp",
         "lower_bound": "infermax.bounds", "Bound": "infermax.bounds", "check_scheduler": "infermax.bounds"}


def __getattr__(name: str):
    """A public name loads its module on first use; any other submodule is an attribute as an import makes it."""
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if _LAZY[name] == f"{__name__}.{name}" else getattr(module, name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'infermax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

