"""The options of :func:`~.api.solve_optimal` checked on their own, before any instance is solved.

A sweep's ``solver`` block (:mod:`infermax.sweep_config`) is a mapping of these options; checking
it whole before the first cell runs turns a misspelt backend or a negative time limit into one
error naming the key and the value, not one failed cell per (workload, limits, cost).
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Mapping

from . import backends
from .api import METHODS, _check_options, solve_optimal
from .budget import Budget
from .milp.objectives import split_objective
from .milp.policy import Policy

#: the arguments of solve_optimal that are the instance or a callback, not options
NOT_OPTIONS = ("workload", "limits", "cost", "progress")


def option_names() -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(solve_optimal).parameters if p not in NOT_OPTIONS)


def check_solve_options(options: Mapping[str, Any], where: str = "solver") -> None:
    """ValueError naming ``where``, the key and the value of the first option ``solve_optimal`` would refuse
    whatever the instance (an objective's tag is checked against each workload when it is solved)."""
    known = option_names()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown}; solve_optimal takes {', '.join(known)}")

    def named(key: str, check) -> None:
        if key in options:
            try:
                check(options[key])
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{where}: {key} = {options[key]!r}: {exc}") from None

    named("backend", lambda v: backends.get_backend(v) if isinstance(v, str) else _fail("a backend name"))
    named("time_limit_s", Budget)
    named("objective", lambda v: split_objective(v) if isinstance(v, str) else _fail("an objective name"))
    named("method", lambda v: None if v in METHODS else _fail(f"one of {', '.join(METHODS)}"))
    named("policy", lambda v: None if v is None or isinstance(v, Policy) else Policy.from_spec(v))
    named("by", lambda v: _check_options(1e-4, None, None, v, None))
    named("rel_gap", lambda v: _check_options(v, None, None, 0.1, None))
    named("threads", lambda v: _check_options(1e-4, v, None, 0.1, None))
    named("horizon", lambda v: _check_options(1e-4, None, v, 0.1, None))
    named("max_horizon", lambda v: _check_options(1e-4, None, None, 0.1, v))
    named("warm_start", lambda v: None if v is None or isinstance(v, str) else _fail("a scheduler name, "
                                                                                     "'best' or None"))
    named("better_than", lambda v: None if v is None or isinstance(v, str) or (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)) else
        _fail("a finite number or a scheduler name"))


def _fail(what: str) -> None:
    raise ValueError(f"must be {what}")
