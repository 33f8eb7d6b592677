"""``lower_bound``: every bound method, the two that solve included — the bounds' public entry, above csp.

:func:`.combine.combine` runs the registered methods (:mod:`.methods`). Importing this module completes the
registry: it imports csp, whose :mod:`infermax.csp.bound_methods` registers ``search`` (the class-state A*),
and registers ``milp`` (the exact MILP, through the public ``solve_optimal``, names resolved as a user's call
resolves them), which csp cannot run itself (it sits below that name resolution).
"""
from __future__ import annotations

from typing import Any, Callable

import infermax.csp.bound_methods  # noqa: F401 - registers ``search``

from .combine import Bound, combine
from .methods import BoundContext, BoundMethod, register, registry_list


def lower_bound(workload: Any, limits: Any = None, cost: Any = None, objective: str = "latency",
                methods: tuple[str, ...] | None = None, upper: float | None = None,
                milp_max_requests: int = 6, milp_time_limit_s: float = 30.0, search_time_limit_s: float = 10.0,
                progress: Callable[[str], None] | None = None) -> Bound:
    """The best certified bound on ``objective`` over the chosen ``methods`` (default: all that apply).

    ``objective`` is ``metric[:tag]`` (`objectives`: latency, throughput, ttft, e2e, tpot,
    ttft_p99, e2e_p99, ...). Every value returned is a lower bound (an upper bound for throughput)
    on the objective of every valid schedule, for any linear cost model, online or offline, and
    under floating point: each method's value is lowered by the relative margin :data:`.combine.SAFETY`.

    ``upper`` (a known achievable latency, e.g. a heuristic's) steers the Lagrangian step
    sizes; it never changes validity. The MILP runs only for workloads of at most
    ``milp_max_requests`` requests; ``search`` only when named in ``methods``, for at most
    ``search_time_limit_s``. Methods that do not apply to ``objective`` are skipped.
    """
    return combine(workload, limits, cost, objective, methods, upper, milp_max_requests, milp_time_limit_s,
                   search_time_limit_s, progress)


def milp_bound(workload, limits, cost, objective: str, time_limit_s: float) -> tuple[float | None, dict]:
    """The certified bound of the exact MILP (``solve_optimal``, its default warm start and method)."""
    from infermax.optimal import solve_optimal

    try:
        res = solve_optimal(workload, limits=limits, cost=cost, objective=objective, time_limit_s=time_limit_s)
    except ValueError as exc:       # the inputs are checked already: the solver refuses this instance
        return None, {"not_applicable": f"solve_optimal refuses it: {exc}"}
    cert = {"status": res.status, "objective": res.objective, "backend": res.backend, "gap": res.gap}
    if res.bound is None:
        return None, {**cert, "not_applicable": f"no certified bound (status {res.status}, horizon "
                                                f"{'proven' if res.horizon_proven else 'not proven'})"}
    return float(res.bound), cert


def _milp(ctx: BoundContext) -> tuple[float | None, dict]:
    """The MILP on the whole workload, KV in blocks as given (the makespan's objective for throughput)."""
    spec = ctx.objective.spec
    return milp_bound(ctx.workload, ctx.block_limits, ctx.cost, "latency" if spec.via_makespan else spec.milp,
                      ctx.milp_time_limit_s)


def _small_enough(ctx: BoundContext) -> str | None:
    n = len(ctx.workload)
    return None if n <= ctx.milp_max_requests else f"{n} requests > milp_max_requests = {ctx.milp_max_requests}"


#: the objectives with a MILP objective (tags: solve_optimal solves them, but lower_bound leaves them to the
#: relaxations, as the optimum of a tag is not reported)
MILP = register(BoundMethod(name="milp", metrics=("latency", "throughput", "ttft", "e2e", "tpot"), tags=False,
                            run=_milp, applies=_small_enough, solves=True, margin=False,
                            doc="the dual bound of the exact MILP (solve_optimal), small instances"),
                before="search")


def __getattr__(name: str):
    """``METHODS``, ``METHODS_OF``, ``ON_REQUEST``, ``SOLVER_METHODS``: the registry's, complete here."""
    return registry_list(name, __name__)
