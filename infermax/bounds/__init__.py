"""Certified lower bounds on the best achievable latency, and the scheduler checker.

``lower_bound(workload, limits, cost)`` combines several methods and returns the
best (largest) value, which no valid schedule can beat:

- ``work``: closed-form work bound (`work`), with the arrival bound online;
- ``lp``: LP relaxation of the aggregated class-count formulation (`lp`, HiGHS);
- ``lagrangian``: Lagrangian relaxation of the per-batch constraints with
  per-request shortest paths (`lagrangian`);
- ``milp``: the dual bound of the exact MILP (`infermax.solve_optimal`) when the
  instance is small enough.

``check_scheduler`` (in `check`) simulates a scheduler, replays its schedule and
states its certified optimality gap.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from infermax.engine import resolve_inputs

from .costs import coefficients_of
from .lagrangian import lagrangian_bound
from .lp import lp_bound
from .work import arrival_bound

log = logging.getLogger(__name__)

OBJECTIVES = ("latency",)
METHODS = ("work", "lp", "lagrangian", "milp")
#: relative safety margin taken off floating-point solver results (LP tolerances are ~1e-9)
SAFETY = 1e-7


@dataclass(frozen=True, kw_only=True)
class Bound:
    """``value`` (s) no valid schedule's latency can beat; ``method`` that gave it; the
    certificate of that method; ``values`` of every method tried; ``wall_s`` each took."""

    value: float
    method: str
    certificate: dict[str, Any] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)


def lower_bound(workload: Any, limits: Any = None, cost: Any = None, objective: str = "latency",
                methods: tuple[str, ...] = ("work", "lp", "lagrangian", "milp"), upper: float | None = None,
                milp_max_requests: int = 6, milp_time_limit_s: float = 30.0,
                progress: Callable[[str], None] | None = None) -> Bound:
    """The best certified lower bound on ``objective`` over the chosen ``methods``.

    ``upper`` (a known achievable value, e.g. a heuristic's latency) steers the
    Lagrangian step sizes; it never changes validity. The MILP runs only for
    workloads of at most ``milp_max_requests`` requests.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} has no bound yet; supported: {', '.join(OBJECTIVES)}")
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown bound method(s) {sorted(unknown)}; use {', '.join(METHODS)}")
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    workload.check_fits(limits)
    co = coefficients_of(cost)
    values: dict[str, float] = {}
    certs: dict[str, dict] = {}
    walls: dict[str, float] = {}
    runners = {
        "work": lambda: arrival_bound(co, workload, limits),
        "lp": lambda: _safe(lp_bound(co, workload, limits)),
        "lagrangian": lambda: _safe(lagrangian_bound(co, workload, limits, upper=upper)),
        "milp": lambda: _milp_bound(workload, limits, cost, milp_time_limit_s),
    }
    for name in methods:
        if name == "milp" and len(workload) > milp_max_requests:
            continue
        if progress is not None:
            progress(name)
        t0 = time.perf_counter()
        try:
            value, cert = runners[name]()
        except ImportError as exc:  # an optional solver is missing: say so, use the other methods
            log.warning("bound method %s skipped: %s", name, exc)
            continue
        walls[name] = time.perf_counter() - t0
        values[name], certs[name] = value, cert
    best = max(values, key=values.get)
    return Bound(value=values[best], method=best, certificate=certs[best], values=values, wall_s=walls)


def _safe(result: tuple[float, dict]) -> tuple[float, dict]:
    value, cert = result
    return value - SAFETY * abs(value), cert


def _milp_bound(workload, limits, cost, time_limit_s: float) -> tuple[float, dict]:
    from infermax.csp import solve_optimal

    res = solve_optimal(workload, limits=limits, cost=cost, objective="latency", time_limit_s=time_limit_s)
    return float(res.bound), {"status": res.status, "objective": float(res.objective), "backend": res.backend,
                              "gap": float(res.gap)}


from .check import CheckResult, check_scheduler  # noqa: E402  (uses lower_bound)

__all__ = ["Bound", "CheckResult", "check_scheduler", "lower_bound"]
