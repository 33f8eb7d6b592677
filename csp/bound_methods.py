"""The bound method of :mod:`infermax.bounds` that csp runs: ``search``, the class-state A* (:mod:`.search`).

Importing csp registers it into the bounds' registry (:mod:`infermax.bounds.methods`): csp's own horizon-free
bound of a solve (:func:`infermax.bounds.combine.combine`) and :func:`infermax.bounds.lower_bound` with
``methods=(..., "search")`` run it from there. The bounds' combining layer stays below csp, csp does not
reach the bounds' public entry above it.
"""
from __future__ import annotations

import logging
import math

from infermax.bounds.methods import BoundContext, BoundMethod, register, with_safety

from .milp.policy import Policy
from .search import astar

log = logging.getLogger(__name__)


def search_bound(workload, limits, cost, time_limit_s: float) -> tuple[float | None, dict]:
    """The class-state A* (``infermax.csp.search``) from the start, for ``time_limit_s`` at most, with no
    incumbent to prune by (a pruned frontier would bound only the schedules better than the incumbent)."""
    if not (isinstance(time_limit_s, (int, float)) and not isinstance(time_limit_s, bool) and time_limit_s > 0):
        raise ValueError(f"search_time_limit_s must be a number > 0, got {time_limit_s!r}")
    policy = Policy()
    ok, why = astar.is_applicable(workload, limits, cost, policy)
    if not ok:
        log.info("bound method search skipped: %s", why)
        return None, {"not_applicable": why}
    r = astar.exact_search(workload, policy.effective_limits(limits), cost, policy, upper_s=math.inf,
                           time_budget_s=float(time_limit_s))
    # finished, bound_s is the optimum; stopped, the least f on the frontier
    return with_safety((float(r.bound_s), {"complete": r.is_complete, "expanded": r.num_expanded,
                                           "generated": r.num_generated}))


def _search(ctx: BoundContext) -> tuple[float | None, dict]:
    """On the whole workload, KV in tokens (the relaxations' limits)."""
    return search_bound(ctx.workload, ctx.limits, ctx.cost, ctx.search_time_limit_s)


#: the makespan's; the value is certified (lowered by the safety margin) by :func:`search_bound` itself
SEARCH = register(BoundMethod(name="search", metrics=("latency", "throughput"), run=_search, on_request=True,
                              solves=True, margin=False,
                              doc="the class-state A* stopped after search_time_limit_s (offline, linear cost)"))
