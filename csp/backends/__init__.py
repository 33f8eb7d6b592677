"""Solver backends: each translates a :class:`~infermax.csp.milp.model.Model` and solves it.

``cpsat`` (OR-Tools CP-SAT, the default), ``scip`` (OR-Tools MathOpt with SCIP),
``highs`` (highspy), ``gurobi`` (gurobipy; its pip licence caps the model size),
``cbc`` (PuLP with CBC).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .base import BackendUnavailable, ModelTooLarge, SolveResult, SolveStatus

_MODULES = {"cpsat": "cpsat", "scip": "mathopt", "highs": "highs", "gurobi": "gurobi", "cbc": "pulp"}
ALIASES = {"cp-sat": "cpsat", "ortools": "cpsat", "mathopt": "scip", "pulp": "cbc", "highspy": "highs",
           "gurobipy": "gurobi"}


def backend_names() -> list[str]:
    return list(_MODULES)


def get_backend(name: str) -> ModuleType:
    """The backend module for ``name`` (raises ValueError for an unknown name)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_MODULES)}")
    return importlib.import_module(f"{__name__}.{_MODULES[key]}")


def available_backends() -> list[str]:
    """Names of the backends whose solver is installed."""
    return [n for n in _MODULES if get_backend(n).is_available()]


__all__ = ["BackendUnavailable", "ModelTooLarge", "SolveResult", "SolveStatus", "available_backends", "backend_names",
           "get_backend"]
