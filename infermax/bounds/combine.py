"""Combining the bound methods: each applicable one runs, the best certified value is the bound.

The closed-form and LP methods run here; the two that solve (``milp``, the exact MILP, and ``search``, the
class-state A*) run :mod:`infermax.csp`, which sits above this module, so they are handed in as
``solver_methods``: :func:`infermax.bounds.lower_bound` hands both (:mod:`.api`), csp its search
(:mod:`infermax.csp.bound_methods`) for the horizon-free bound of a solve. So this module, and every
relaxation, stays below csp (docs/design.md).
"""
from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from infermax.inputs import resolve_inputs

from .chains import chain_bound
from .costs import coefficients_of
from .lagrangian import lagrangian_bound
from .lp import lp_bound
from .objectives import BASES, Objective, members, parse_objective, subset
from .order import EventBounds, event_bounds, quantile_of_sorted
from .requests import request_bounds
from .sharing import sharing_bound
from .work import arrival_bound

log = logging.getLogger(__name__)

OBJECTIVES = BASES
METHODS = ("work", "lp", "lagrangian", "requests", "order", "chains", "sharing", "milp", "search")
#: methods for each objective (``milp`` only on small instances and untagged means; any objective may
#: carry a ``:tag``, see `objectives`)
METHODS_OF = {"latency": ("work", "lp", "lagrangian", "milp", "search"),
              "throughput": ("work", "lp", "lagrangian", "milp", "search"),
              "ttft": ("requests", "order", "milp"), "e2e": ("requests", "order", "chains", "sharing", "milp"),
              "completion": ("requests", "order", "chains", "sharing", "milp"), "tpot": ("requests", "milp"),
              **{q: ("requests", "order") for q in BASES if "_p" in q}}
#: methods run only when asked for (their time is a budget the caller sets, not a property of the instance)
ON_REQUEST = ("search",)
#: methods that solve (their runners live in infermax.csp and come in as ``solver_methods``)
SOLVER_METHODS = ("milp", "search")
#: relative safety margin taken off every method's value (LP tolerances are ~1e-9; closed forms err ~1e-15)
SAFETY = 1e-7


def cheap_methods(objective: str) -> tuple[str, ...]:
    """The methods of ``objective`` that need no solver budget (all but ``milp`` and the on-request ones):
    what ``check_scheduler`` and the benchmarks run by default."""
    return tuple(m for m in METHODS_OF[objective.partition(":")[0]] if m != "milp" and m not in ON_REQUEST)


@dataclass(frozen=True, kw_only=True)
class Bound:
    """``value`` no valid schedule can beat (seconds; tokens/s for throughput, where it is an upper
    bound); ``method`` that gave it; the certificate of that method; ``values`` of every method tried;
    ``wall_s`` each took; ``skipped``: each method asked for (or applicable) that gave no value, and why."""

    value: float
    method: str
    objective: str = "latency"
    certificate: dict[str, Any] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


# complexity: one branch per bound method and its applicability test, tried in the documented order
def combine(workload: Any, limits: Any = None, cost: Any = None, objective: str = "latency",
            methods: tuple[str, ...] | None = None, upper: float | None = None,
            milp_max_requests: int = 6, milp_time_limit_s: float = 30.0, search_time_limit_s: float = 10.0,
            progress: Callable[[str], None] | None = None,
            solver_methods: Mapping[str, Callable[..., tuple[float | None, dict]]] | None = None) -> Bound:
    """The best certified bound on ``objective`` over the chosen ``methods`` (default: all that apply);
    ``solver_methods``: the runners of ``milp`` and ``search`` (:data:`SOLVER_METHODS`), which solve.

    ``objective`` is ``metric[:tag]`` (`objectives`: latency, throughput, ttft, e2e, tpot,
    ttft_p99, e2e_p99, ...). Every value returned is a lower bound (an upper bound for throughput)
    on the objective of every valid schedule, for any linear cost model, online or offline, and
    under floating point: each method's value is lowered by the relative margin :data:`SAFETY`.

    ``upper`` (a known achievable latency, e.g. a heuristic's) steers the Lagrangian step
    sizes; it never changes validity. The MILP runs only for workloads of at most
    ``milp_max_requests`` requests; ``search`` only when named in ``methods``, for at most
    ``search_time_limit_s``. Methods that do not apply to ``objective`` are skipped.
    """
    obj = parse_objective(objective)
    base = objective.partition(":")[0]
    applicable = METHODS_OF[base] if obj.solver_name is not None else \
        tuple(m for m in METHODS_OF[base] if m != "milp")
    methods = tuple(m for m in applicable if m not in ON_REQUEST) if methods is None else tuple(methods)
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown bound method(s) {sorted(unknown)}; use {', '.join(METHODS)}")
    methods = tuple(m for m in methods if m in applicable)
    if not methods:
        raise ValueError(f"none of the bound methods given applies to objective {objective!r}; "
                         f"use {', '.join(applicable)}")
    solvers = dict(solver_methods or {})
    unrun = [m for m in methods if m in SOLVER_METHODS and m not in solvers]
    if unrun:
        raise ValueError(f"bound method(s) {unrun} solve and need their runner in solver_methods "
                         f"(infermax.bounds.lower_bound hands them)")
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    workload.check_fits(limits)
    chosen = subset(workload, members(workload, obj.tag))   # a tag: its requests alone (module docstring)
    if obj.metric == "tpot" and int(chosen.output_lens.max()) <= 1:
        raise ValueError(f"objective {objective!r} needs a request with output_len > 1 (TPOT is undefined "
                         f"otherwise)")
    block_limits = limits           # the MILP models the blocks; the relaxations count tokens in M_b
    if limits.block_size > 1:
        limits = limits.replace(M=limits.num_blocks * limits.block_size, block_size=1)
    co = coefficients_of(cost)
    values: dict[str, float] = {}
    certs: dict[str, dict] = {}
    walls: dict[str, float] = {}
    skipped: dict[str, str] = {}     # method: why it does not apply here
    events = functools.cache(lambda metric: event_bounds(co, chosen, limits, metric))   # order and sharing read them
    runners = {
        "work": lambda: with_safety(arrival_bound(co, workload, limits)),
        "lp": lambda: with_safety(lp_bound(co, workload, limits)),
        "lagrangian": lambda: with_safety(lagrangian_bound(co, workload, limits, upper=upper)),
        "requests": lambda: with_safety(_requests_bound(co, chosen, limits, obj)),
        "order": lambda: with_safety(_order_bound(events(obj.metric), obj)),
        "chains": lambda: _safe_or_none(_chains_bound(co, chosen, limits, obj, values.get("order", -math.inf))),
        "sharing": lambda: _safe_or_none(_sharing_bound(co, chosen, limits, obj, events)),
        "milp": lambda: solvers["milp"](workload, block_limits, cost, obj.solver_name if obj.metric != "throughput"
                                        else "latency", milp_time_limit_s),
        "search": lambda: solvers["search"](workload, limits, cost, search_time_limit_s),
    }
    for name in methods:
        if name == "milp" and len(workload) > milp_max_requests:
            skipped[name] = f"{len(workload)} requests > milp_max_requests = {milp_max_requests}"
            continue
        if progress is not None:
            progress(name)
        t0 = time.perf_counter()
        try:
            value, cert = runners[name]()
        except ImportError as exc:  # an optional solver is missing: say so, use the other methods
            log.warning("bound method %s skipped: %s", name, exc)
            skipped[name] = f"an optional solver is missing: {exc}"
            continue
        walls[name] = time.perf_counter() - t0
        if value is None:
            skipped[name] = cert.get("not_applicable") or "no bound found"
            continue
        values[name], certs[name] = value, cert
    if not values:
        why = "".join(f"; {name}: {reason}" for name, reason in skipped.items())
        raise ValueError(f"no bound method gave a bound for objective {objective!r} (tried {', '.join(methods)}"
                         f"{why})")
    best = max(values, key=values.get)
    if obj.metric == "throughput":   # tokens/s over the latency bound: an upper bound on throughput
        tokens = float(workload.output_lens.sum())
        values = {k: tokens / v if v > 0 else math.inf for k, v in values.items()}
    return Bound(value=values[best], method=best, objective=objective, certificate=certs[best], values=values,
                 wall_s=walls, skipped=skipped)


def _requests_bound(co, workload, limits, obj: Objective) -> tuple[float, dict]:
    """Each request alone (`requests`): the mean, or the quantile of the sorted per-request bounds."""
    per = request_bounds(co, workload, limits)[f"{obj.metric}_s"]
    if obj.metric == "tpot":
        per = per[workload.output_lens > 1]
    value = float(per.mean()) if obj.quantile is None else quantile_of_sorted(np.sort(per), obj.quantile)
    return value, {"per_request_min_s": float(per.min()), "per_request_max_s": float(per.max()),
                   "num_requests": int(per.size)}


def _order_bound(b: EventBounds, obj: Objective) -> tuple[float, dict]:
    """Order statistics of the event times (`order`, ``b``): the mean flow, or the quantile of the flows."""
    value = b.mean_flow_s if obj.quantile is None else quantile_of_sorted(b.flow_s, obj.quantile)
    return value, {"num_requests": int(b.flow_s.size), "first_flow_s": float(b.flow_s[0]),
                   "last_flow_s": float(b.flow_s[-1])}


def _chains_bound(co, workload, limits, obj: Objective, floor: float) -> tuple[float | None, dict]:
    """Decode chains (`chains`): the mean end-to-end latency, offline (``floor``: a bound already known,
    so that splits that cannot beat it stop early)."""
    if obj.quantile is not None:
        return None, {"not_applicable": "a quantile (the chain bound is on the mean)"}
    return chain_bound(co, workload, limits, floor)


def _sharing_bound(co, workload, limits, obj: Objective, events) -> tuple[float | None, dict]:
    """Shared batches and backlog in windows (`sharing`): the mean end-to-end latency (``events(metric)``:
    the order statistics, computed once for `order` and this)."""
    if obj.quantile is not None:
        return None, {"not_applicable": "a quantile (the sharing bound is on the mean)"}
    return sharing_bound(co, workload, limits, events("e2e").absolute_s)


def _safe_or_none(result: tuple[float | None, dict]) -> tuple[float | None, dict]:
    return result if result[0] is None else with_safety(result)


def with_safety(result: tuple[float, dict]) -> tuple[float, dict]:
    """(value, certificate) with the value lowered by the relative margin :data:`SAFETY`."""
    value, cert = result
    return value - SAFETY * abs(value), cert
