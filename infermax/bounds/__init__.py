"""Certified lower bounds on the best achievable value of an objective, and the scheduler checker.

``lower_bound(workload, limits, cost, objective)`` combines several methods and
returns the best value, which no valid schedule can beat. For the makespan
(``latency``, and ``throughput`` as tokens over it: an upper bound there):

- ``work``: closed-form work bound (`work`), with the arrival bound online;
- ``lp``: LP relaxation of the aggregated class-count formulation (`lp`, HiGHS);
- ``lagrangian``: Lagrangian relaxation of the per-batch constraints with
  per-request shortest paths (`lagrangian`);
- ``milp``: the dual bound of the exact MILP (`infermax.solve_optimal`) when the
  instance is small enough.

For the means of TTFT, end-to-end latency (``completion``) and TPOT:
``requests``, what each request takes alone (`requests`), and ``milp`` as above.

KV in blocks (``Limits.block_size`` = b > 1): the relaxations count KV in tokens
within M_b = b·(M // b). Every schedule valid in blocks holds Σ m <= Σ b·ceil(m/b)
<= M_b tokens, so it is valid for the token relaxation too and each bound stays
below its value; ignoring the rounding of each request's KV only loosens them.
The ``milp`` method solves the block model itself.

Every value is lowered by a relative :data:`SAFETY` margin, so that rounding in
its own arithmetic (or an LP solver's tolerances) can never lift it above the
replayed value of a schedule: a bound is valid under floating point, always.

``check_scheduler`` (in `check`) simulates a scheduler, replays its schedule and
states its certified optimality gap.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from infermax.engine import resolve_inputs

from .costs import coefficients_of
from .lagrangian import lagrangian_bound
from .lp import lp_bound
from .requests import mean_bound
from .work import arrival_bound

log = logging.getLogger(__name__)

OBJECTIVES = ("latency", "throughput", "ttft", "completion", "tpot")
METHODS = ("work", "lp", "lagrangian", "requests", "milp")
#: methods for each objective (``milp`` only on small instances)
METHODS_OF = {"latency": ("work", "lp", "lagrangian", "milp"), "throughput": ("work", "lp", "lagrangian", "milp"),
              "ttft": ("requests", "milp"), "completion": ("requests", "milp"), "tpot": ("requests", "milp")}
#: relative safety margin taken off every method's value (LP tolerances are ~1e-9; closed forms err ~1e-15)
SAFETY = 1e-7


@dataclass(frozen=True, kw_only=True)
class Bound:
    """``value`` no valid schedule can beat (seconds; tokens/s for throughput, where it is an upper
    bound); ``method`` that gave it; the certificate of that method; ``values`` of every method tried;
    ``wall_s`` each took."""

    value: float
    method: str
    objective: str = "latency"
    certificate: dict[str, Any] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)


def lower_bound(workload: Any, limits: Any = None, cost: Any = None, objective: str = "latency",
                methods: tuple[str, ...] | None = None, upper: float | None = None,
                milp_max_requests: int = 6, milp_time_limit_s: float = 30.0,
                progress: Callable[[str], None] | None = None) -> Bound:
    """The best certified bound on ``objective`` over the chosen ``methods`` (default: all that apply).

    ``upper`` (a known achievable latency, e.g. a heuristic's) steers the Lagrangian step
    sizes; it never changes validity. The MILP runs only for workloads of at most
    ``milp_max_requests`` requests. Methods that do not apply to ``objective`` are skipped.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} has no bound; supported: {', '.join(OBJECTIVES)}")
    methods = METHODS_OF[objective] if methods is None else tuple(methods)
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown bound method(s) {sorted(unknown)}; use {', '.join(METHODS)}")
    methods = tuple(m for m in methods if m in METHODS_OF[objective])
    if not methods:
        raise ValueError(f"none of the bound methods given applies to objective {objective!r}; "
                         f"use {', '.join(METHODS_OF[objective])}")
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    workload.check_fits(limits)
    block_limits = limits           # the MILP models the blocks; the relaxations count tokens in M_b
    if limits.block_size > 1:
        limits = limits.replace(M=limits.num_blocks * limits.block_size, block_size=1)
    co = coefficients_of(cost)
    values: dict[str, float] = {}
    certs: dict[str, dict] = {}
    walls: dict[str, float] = {}
    minimised = "latency" if objective == "throughput" else objective
    runners = {
        "work": lambda: _safe(arrival_bound(co, workload, limits)),
        "lp": lambda: _safe(lp_bound(co, workload, limits)),
        "lagrangian": lambda: _safe(lagrangian_bound(co, workload, limits, upper=upper)),
        "requests": lambda: _safe(mean_bound(co, workload, limits, minimised)),
        "milp": lambda: _milp_bound(workload, block_limits, cost, minimised, milp_time_limit_s),
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
        if value is None:
            continue
        values[name], certs[name] = value, cert
    if not values:
        raise ValueError(f"no bound method gave a bound for objective {objective!r} (tried {', '.join(methods)})")
    best = max(values, key=values.get)
    if objective == "throughput":   # tokens/s over the latency bound: an upper bound on throughput
        tokens = float(workload.output_lens.sum())
        values = {k: tokens / v if v > 0 else math.inf for k, v in values.items()}
    return Bound(value=values[best], method=best, objective=objective, certificate=certs[best], values=values,
                 wall_s=walls)


def _safe(result: tuple[float, dict]) -> tuple[float, dict]:
    value, cert = result
    return value - SAFETY * abs(value), cert


def _milp_bound(workload, limits, cost, objective: str, time_limit_s: float) -> tuple[float | None, dict]:
    from infermax.csp import solve_optimal

    res = solve_optimal(workload, limits=limits, cost=cost, objective=objective, time_limit_s=time_limit_s)
    cert = {"status": res.status, "objective": res.objective, "backend": res.backend, "gap": res.gap}
    return (None if res.bound is None else float(res.bound)), cert


from .check import CheckResult, check_scheduler  # noqa: E402  (uses lower_bound)

__all__ = ["Bound", "CheckResult", "check_scheduler", "lower_bound"]
