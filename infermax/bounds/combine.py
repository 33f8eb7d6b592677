"""Combining the bound methods: each applicable one runs, the best certified value is the bound.

The methods are those of the registry (:mod:`.methods`): the relaxations register there, and the two that
solve (``milp``, the exact MILP, and ``search``, the class-state A*) register from the layers above, which
can run them: :mod:`infermax.csp.bound_methods` (``search``, when csp is imported) and
:mod:`infermax.bounds.api` (``milp``, through the public ``solve_optimal``). csp runs this for the
horizon-free bound of a solve (every method but ``milp``). So this module, and every relaxation, stays
below csp (docs/design.md).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from infermax.inputs import resolve_inputs

from .costs import coefficients_of
from .methods import SAFETY, BoundContext, applicable, get_method, method_names, methods_of, registry_list, with_safety
from .objectives import members, parse_objective, subset

log = logging.getLogger(__name__)

__all__ = ["SAFETY", "Bound", "cheap_methods", "combine", "with_safety"]


def cheap_methods(objective: str) -> tuple[str, ...]:
    """The registered methods of ``objective`` that need no solver budget (all but those that solve and those
    run on request): what ``check_scheduler`` and the benchmarks run by default."""
    return tuple(m for m in methods_of(objective) if not get_method(m).solves and not get_method(m).on_request)


def __getattr__(name: str):
    """``METHODS``, ``METHODS_OF``, ``ON_REQUEST``, ``SOLVER_METHODS``, ``OBJECTIVES``: the registry's lists,
    read at each use (:func:`.methods.registry_list`)."""
    return registry_list(name, __name__)


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
            progress: Callable[[str], None] | None = None) -> Bound:
    """The best certified bound on ``objective`` over the chosen ``methods`` (default: all registered ones
    that apply, but those run on request).

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
    spec = obj.spec
    fits = applicable(obj)
    methods = tuple(m for m in fits if not get_method(m).on_request) if methods is None else tuple(methods)
    unknown = [m for m in methods if get_method(m) is None]
    if unknown:
        raise ValueError(f"unknown bound method(s) {sorted(unknown)}; use {', '.join(method_names())} (the "
                         f"solving ones, milp and search, register when infermax.bounds.lower_bound and "
                         f"infermax.csp are imported)")
    methods = tuple(m for m in methods if m in fits)
    if not methods:
        raise ValueError(f"none of the bound methods given applies to objective {objective!r}; "
                         f"use {', '.join(fits)}")
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    workload.check_fits(limits)
    chosen = subset(workload, members(workload, obj.tag))   # a tag: its requests alone (module docstring)
    if obj.metric == "tpot" and int(chosen.output_lens.max()) <= 1:
        raise ValueError(f"objective {objective!r} needs a request with output_len > 1 (TPOT is undefined "
                         f"otherwise)")
    block_limits = limits           # the MILP models the blocks; the relaxations count tokens in M_b
    if limits.block_size > 1:
        limits = limits.replace(M=limits.num_blocks * limits.block_size, block_size=1)
    ctx = BoundContext(objective=obj, workload=workload, chosen=chosen, limits=limits, block_limits=block_limits,
                       cost=cost, coefficients=coefficients_of(cost), upper=upper,
                       milp_max_requests=milp_max_requests, milp_time_limit_s=milp_time_limit_s,
                       search_time_limit_s=search_time_limit_s)
    values = ctx.values
    certs: dict[str, dict] = {}
    walls: dict[str, float] = {}
    skipped: dict[str, str] = {}     # method: why it does not apply here
    for name in methods:
        method = get_method(name)
        why = method.applies(ctx)
        if why is not None:
            skipped[name] = why
            continue
        if progress is not None:
            progress(name)
        t0 = time.perf_counter()
        try:
            value, cert = method.run(ctx)
        except ImportError as exc:  # an optional solver is missing: say so, use the other methods
            log.warning("bound method %s skipped: %s", name, exc)
            skipped[name] = f"an optional solver is missing: {exc}"
            continue
        walls[name] = time.perf_counter() - t0
        if value is None:
            skipped[name] = cert.get("not_applicable") or "no bound found"
            continue
        if method.margin:
            value, cert = with_safety((value, cert))
        values[name], certs[name] = value, cert
    if not values:
        why = "".join(f"; {name}: {reason}" for name, reason in skipped.items())
        raise ValueError(f"no bound method gave a bound for objective {objective!r} (tried {', '.join(methods)}"
                         f"{why})")
    best = max(values, key=values.get)
    if spec.via_makespan:   # tokens/s over the latency bound: an upper bound on throughput
        tokens = float(workload.output_lens.sum())
        values = {k: tokens / v if v > 0 else math.inf for k, v in values.items()}
    return Bound(value=values[best], method=best, objective=objective, certificate=certs[best], values=values,
                 wall_s=walls, skipped=skipped)
