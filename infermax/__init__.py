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

Importing the package loads only the types and the workload grammar (``Workload.from_spec``); every
other name loads its module on first use (PEP 562), so ``import infermax.costmodel`` stays light.
"""
import importlib
import importlib.util
import sys
import types as _types

from . import workload_spec  # noqa: F401 - installs the grammar behind Workload.from_spec before a spec is read
from .types import Batch, Limits, Request, Schedule, Workload

__all__ = ["Batch", "Bound", "OptimalResult", "Policy", "check_scheduler", "lower_bound", "solve_optimal", "Limits",
           "Request", "Schedule", "ScheduleError", "SchedulerStuckError", "SimResult",
           "Trace", "Workload", "execute", "metrics", "metrics_by_tag", "register_scheduler", "replay", "schedulers",
           "simulate", "starvation", "sweep"]
__version__ = "0.1.0"

#: each public name -> the module that defines it (loaded on first use)
_LAZY = {"SchedulerStuckError": "infermax.engine", "SimResult": "infermax.engine", "simulate": "infermax.engine",
         "execute": "infermax.execute", "metrics": "infermax.metrics", "metrics_by_tag": "infermax.metrics",
         "Policy": "infermax.policy", "replay": "infermax.replay", "register_scheduler": "infermax.schedulers",
         "schedulers": "infermax.schedulers", "starvation": "infermax.starvation", "ScheduleError": "infermax.state",
         "sweep": "infermax.sweep", "Trace": "infermax.trace",
         "solve_optimal": "infermax.optimal", "OptimalResult": "infermax.csp",
         "lower_bound": "infermax.bounds", "Bound": "infermax.bounds", "check_scheduler": "infermax.bounds"}
#: names that are the module itself
_MODULES = ("schedulers",)
#: functions named as the module that defines them: the name stays the function once the module is imported
_SHADOWED = tuple(n for n, m in _LAZY.items() if m == f"{__name__}.{n}" and n not in _MODULES)


def __getattr__(name: str):
    """A public name loads its module on first use; any other submodule is an attribute as an import makes it."""
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if name in _MODULES else getattr(module, name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'infermax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Package(_types.ModuleType):
    """The package's module type: importing ``infermax.replay`` (say) binds the function, not the module, to
    ``infermax.replay``, as the eager imports this package once made did."""

    def __setattr__(self, name: str, value) -> None:
        if name in _SHADOWED and isinstance(value, _types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
