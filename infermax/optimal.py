"""Names to Schedules and Policies, then the MILP: the thin layer above csp and the schedulers.

:mod:`infermax.csp` solves over Schedules and a :class:`~infermax.policy.Policy` and runs no scheduler
(docs/design.md, "Boundaries"). This module reads the names a user gives — a warm start ``"best"`` (every
registered scheduler) or ``"vllm"``, ``better_than="vllm"``, a policy ``"like=vllm"`` — runs the heuristics
they name (:mod:`infermax.heuristics`) and calls :func:`infermax.csp.solve_optimal`. Its
:func:`solve_optimal` is ``infermax.solve_optimal``; :func:`check_solve_options` checks a sweep's solver
block before any instance is solved.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping

from .costmodel import CostModel
from .csp import backends
from .csp.api import METHODS, OptimalResult, _check_options
from .csp.api import solve_optimal as _solve_optimal
from .csp.budget import Budget
from .csp.milp.build import Strengthening
from .csp.milp.objectives import split_objective, trace_objective
from .csp.progress import SolveProgress
from .heuristics import heuristic_schedules
from .policy import Policy
from .schedulers.registry import get_scheduler
from .types import Limits, Schedule, Workload

__all__ = ["check_solve_options", "policy_from_spec", "policy_of", "reference_of", "solve_optimal",
           "warm_start_source"]


def policy_of(name: str) -> Policy:
    """The class a registered scheduler belongs to (from its ``describe()``)."""
    return Policy.from_description(get_scheduler(name).describe(), name)


def policy_from_spec(spec: str | None) -> Policy:
    """A class from a spec: ``"no-eviction,no-hybrid,no-chunked,P=512,R_max=4"``
    (:meth:`Policy.from_spec`), or a scheduler's, ``"like=vllm"`` (the items before it are checked, the
    ones after it ignored)."""
    if spec is None or not spec.strip():
        return Policy.from_spec(spec)
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    for k, part in enumerate(parts):
        key, _, raw = part.partition("=")
        if key.strip().lower().replace("_", "-") == "like":
            Policy.from_spec(",".join(parts[:k]))         # the items before it: their errors as before
            return policy_of(raw.strip())
    return Policy.from_spec(spec)


def warm_start_source(source: "str | Schedule | None") -> Any:
    """What csp takes for a ``warm_start`` option: a scheduler name (or "best", every registered one) becomes
    a callable that simulates them (:func:`infermax.heuristics.heuristic_schedules`); anything else stays."""
    if not isinstance(source, str):
        return source

    def schedules(workload: Workload, limits: Limits, cost, deadline: float) -> list[tuple[str, Schedule]]:
        return heuristic_schedules(workload, limits, cost, source, deadline)

    return schedules


def reference_of(better_than: "float | str | None") -> Any:
    """What csp takes for ``better_than``: a scheduler name becomes a callable giving its simulated value of
    the objective; a value stays."""
    if not isinstance(better_than, str):
        return better_than

    def value(workload: Workload, limits: Limits, cost, objective: str) -> float:
        from .engine import simulate

        sim = simulate(workload, better_than, limits, cost)
        return trace_objective(sim.trace, sim.metrics, objective)

    return value


def solve_optimal(workload: "Workload | str", limits: "Limits | str | None" = None,
                  cost: "CostModel | str | None" = None, objective: str = "latency", backend: str = "cpsat",
                  time_limit_s: float = 60.0, *, policy: "Policy | str | None" = None,
                  warm_start: "str | Schedule | None" = "best", horizon: int | None = None,
                  better_than: "float | str | None" = None, by: float = 0.10, threads: int | None = None,
                  rel_gap: float = 1e-4, strengthening: Strengthening | None = None, method: str = "auto",
                  log_solver: bool = False, solver_params: dict | None = None,
                  max_horizon: int | None = None,
                  progress: "Callable[[SolveProgress], None] | None" = None,
                  stop_early: bool = True) -> OptimalResult:
    """Solve the CSP of InferMax §3.3 for ``workload`` and return the replayed optimum.

    objective: one of ``OBJECTIVES``, or ``completion``/``ttft``/``tpot`` over the requests of one
    tag, ``"ttft:short"`` (the others must still be served). backend: see :mod:`infermax.csp.backends`.
    policy: restrict to a scheduler class (``Policy`` or a spec such as
    ``"no-eviction"``, ``"like=vllm"``). warm_start: "best" (every registered
    scheduler), a scheduler name, a Schedule, or None (the horizon then comes
    from a sequential schedule). better_than: a value, or a scheduler name whose
    replayed value is used; the model then asks for a schedule at least ``by``
    (fraction) better. method: "per-request" (the §3.3 model), "aggregate" (class
    flows, :mod:`infermax.csp.milp.aggregate`), "search" (exact A* over class states,
    :mod:`infermax.csp.search`) or "auto": for offline latency, the search first; if it does not
    finish, the aggregate model where it is exact or bounds the problem
    (interchangeable requests), then the per-request model on whatever gap remains,
    every bound found on the way kept.

    The names are read here (:func:`policy_from_spec`, :func:`warm_start_source`, :func:`reference_of`);
    :func:`infermax.csp.solve_optimal` does the rest, in the same order as ever.

    ``time_limit_s`` bounds the whole call (warm start, bounds, model building included:
    :mod:`infermax.csp.budget`). The result's ``bound`` is certified for every backend and objective: the
    best of the solver's (only where its horizon is proven to hold an optimum) and of the
    horizon-free bounds of :func:`infermax.lower_bound`; ``status`` is "optimal" only when the
    gap to it is within ``rel_gap``; with ``stop_early`` (the default) the call returns as soon as
    that is so (the warm start may already be proven optimal by the bound), otherwise every stage
    runs (to compare backends, say). ``progress`` is called with a :class:`SolveProgress` at
    every stage and improvement. Ctrl-C (KeyboardInterrupt) stops the solve and returns the best
    schedule found so far (``info["stopped"]`` says why). Raises ValueError for an instance no
    schedule can serve or a bad option.
    """
    if isinstance(policy, str):
        policy = policy_from_spec(policy)
    return _solve_optimal(workload, limits, cost, objective, backend, time_limit_s, policy=policy,
                          warm_start=warm_start_source(warm_start), horizon=horizon,
                          better_than=reference_of(better_than), by=by, threads=threads, rel_gap=rel_gap,
                          strengthening=strengthening, method=method, log_solver=log_solver,
                          solver_params=solver_params, max_horizon=max_horizon, progress=progress,
                          stop_early=stop_early)


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
    named("policy", lambda v: None if v is None or isinstance(v, Policy) else policy_from_spec(v))
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
