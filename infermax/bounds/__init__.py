"""Certified lower bounds on the best achievable value of an objective, and the scheduler checker.

``lower_bound(workload, limits, cost, objective)`` combines several methods and
returns the best value, which no valid schedule can beat. For the makespan
(``latency``, and ``throughput`` as tokens over it: an upper bound there):

- ``work``: closed-form work bound (`work`), with the arrival bound online;
- ``lp``: LP relaxation of the aggregated class-count formulation (`lp`, HiGHS; the value is the
  dual at HiGHS's multipliers, `certify`, so the solver's accuracy is not trusted);
- ``lagrangian``: Lagrangian relaxation of the per-batch constraints with
  per-request shortest paths (`lagrangian`);
- ``milp``: the dual bound of the exact MILP (`infermax.solve_optimal`) when the
  instance is small enough;
- ``search`` (on request only: ``methods=(..., "search")``, ``infermax bound --methods``):
  the class-state A* of ``infermax.csp.search`` — the search ``solve_optimal`` runs —
  stopped after ``search_time_limit_s``; the least f = g + h on its frontier is a bound
  (its h is admissible), the optimum when it finishes. Offline workloads under a linear
  cost model only (it says why not otherwise).

For TTFT, end-to-end latency (``e2e``, alias ``completion``) and TPOT — means,
percentiles (``ttft_p99``, ``e2e_p99``, also p50 and p90) and per request tag
(``ttft:short``; see `objectives`):

- ``requests``: what each request takes alone (`requests`);
- ``order``: order statistics of first-token and completion times, the maximum of
  own-time, fluid SRPT (release dates), windowed and batch-count bounds (`order`);
  not for TPOT;
- ``chains``: mean end-to-end latency, offline: the k-th completion also pays for the
  unfinished decode chains of the requests that finish soon after it, and for its own
  batches (`chains`; a convex relaxation closed by weak duality);
- ``sharing``: mean end-to-end latency, online or offline: in windows of time, the requests
  alive at least fill the running batch, whose time carries every member's work, and the
  backlog left by what the windows can complete (`sharing`; an LP closed by weak duality);
- ``milp``: as above, for the untagged means.

A per-tag bound is the bound of the tagged requests alone: dropping the other requests
from every batch leaves a valid schedule whose batches are no slower (`requests`).

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

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermax.inputs import resolve_inputs

from .chains import chain_bound
from .costs import coefficients_of
from .lagrangian import lagrangian_bound
from .lp import lp_bound
from .objectives import ALL, BASES, Objective, members, parse_objective, subset
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


def lower_bound(workload: Any, limits: Any = None, cost: Any = None, objective: str = "latency",
                methods: tuple[str, ...] | None = None, upper: float | None = None,
                milp_max_requests: int = 6, milp_time_limit_s: float = 30.0, search_time_limit_s: float = 10.0,
                progress: Callable[[str], None] | None = None) -> Bound:
    """The best certified bound on ``objective`` over the chosen ``methods`` (default: all that apply).

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
        "work": lambda: _safe(arrival_bound(co, workload, limits)),
        "lp": lambda: _safe(lp_bound(co, workload, limits)),
        "lagrangian": lambda: _safe(lagrangian_bound(co, workload, limits, upper=upper)),
        "requests": lambda: _safe(_requests_bound(co, chosen, limits, obj)),
        "order": lambda: _safe(_order_bound(events(obj.metric), obj)),
        "chains": lambda: _safe_or_none(_chains_bound(co, chosen, limits, obj, values.get("order", -math.inf))),
        "sharing": lambda: _safe_or_none(_sharing_bound(co, chosen, limits, obj, events)),
        "milp": lambda: _milp_bound(workload, block_limits, cost, obj.solver_name if obj.metric != "throughput"
                                    else "latency", milp_time_limit_s),
        "search": lambda: _search_bound(workload, limits, cost, search_time_limit_s),
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
    return result if result[0] is None else _safe(result)


def _safe(result: tuple[float, dict]) -> tuple[float, dict]:
    value, cert = result
    return value - SAFETY * abs(value), cert


def _milp_bound(workload, limits, cost, objective: str, time_limit_s: float) -> tuple[float | None, dict]:
    from infermax.csp import solve_optimal

    try:
        res = solve_optimal(workload, limits=limits, cost=cost, objective=objective, time_limit_s=time_limit_s)
    except ValueError as exc:       # the inputs are checked already: the solver refuses this instance
        return None, {"not_applicable": f"solve_optimal refuses it: {exc}"}
    cert = {"status": res.status, "objective": res.objective, "backend": res.backend, "gap": res.gap}
    if res.bound is None:
        return None, {**cert, "not_applicable": f"no certified bound (status {res.status}, horizon "
                                                f"{'proven' if res.horizon_proven else 'not proven'})"}
    return float(res.bound), cert


def _search_bound(workload, limits, cost, time_limit_s: float) -> tuple[float | None, dict]:
    """The class-state A* (``infermax.csp.search``) from the start, for ``time_limit_s`` at most, with no
    incumbent to prune by (a pruned frontier would bound only the schedules better than the incumbent)."""
    from infermax.csp import Policy
    from infermax.csp.search import astar

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
    return _safe((float(r.bound_s), {"complete": r.is_complete, "expanded": r.num_expanded,
                                     "generated": r.num_generated}))


from .check import CheckResult, check_scheduler  # noqa: E402  (uses lower_bound)

__all__ = ["ALL", "Bound", "CheckResult", "OBJECTIVES", "check_scheduler", "cheap_methods", "lower_bound",
           "parse_objective"]
