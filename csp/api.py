"""``solve_optimal``: build the §3.3 model, warm-start it, solve it, replay the answer.

    >>> from infermax.csp import solve_optimal
    >>> r = solve_optimal("fixed:I=4,O=4,B=4", limits="M=8,C=4096", time_limit_s=30)
    >>> r.status, r.gap <= 1e-4          # doctest: +SKIP
    ('optimal', True)

Steps: check the instance (a request that cannot fit is named before any
solver runs), find the warm start and the horizon, build the model, solve, and
turn the answer into a replayed :class:`~.result.OptimalResult`.
"""
from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from infermax.bounds.combine import combine
from infermax.bounds.methods import methods_of
from infermax.bounds.objectives import SPEC_OF_MILP, members
from infermax.costmodel import CostModel
from infermax.inputs import resolve_inputs
from infermax.metrics import metrics as compute_metrics
from infermax.replay import replay
from infermax.types import Limits, Schedule, Workload

from . import backends, bound_methods  # noqa: F401 - bound_methods registers the bound method ``search``
from .backends import SolveStatus
from .budget import (
    BUILD_SHARE,
    INCUMBENT_SHARE_WITH_TABLE,
    INCUMBENT_SHARE_WITHOUT_TABLE,
    LOWER_BOUND_SHARE,
    LP_SHARE_WITH_TABLE,
    LP_SHARE_WITHOUT_TABLE,
    MILP_RESERVE_WITH_TABLE,
    MILP_RESERVE_WITHOUT_TABLE,
    MIN_STAGE_S,
    PACKING_CAP_S,
    PACKING_SHARE,
    PROBE_CAP_S,
    PROBE_SHARE,
    REFUTE_SHARE,
    TABLE_SHARE,
    WARM_START_SHARE,
    Budget,
    BudgetExhausted,
    ModelTooLarge,
)
from .milp import aggregate
from .milp.build import Strengthening, backend_kwargs, build, check_size
from .milp.extract import to_schedule
from .milp.formulation import check_instance
from .milp.linearize import to_milp
from .milp.objectives import MAKESPAN, MAXIMISED, is_monotone, split_objective
from .milp.policy import Policy
from .milp.strengthening import batch_count_lower_bound
from .milp.trajectory import merge_chunks
from .progress import SolveProgress, Tracker
from .result import OptimalResult, make_result, meets, no_schedule, search_result
from .search import astar as search
from .search import batchcount, batchtable, classstate, trajectorylp
from .warmstart import WarmStart, assign, canonical_labels, find_warm_start, horizon_for_events, horizon_for_latency

log = logging.getLogger(__name__)

#: a warm start: a Schedule, (name, Schedule) pairs, or ``(workload, limits, cost, deadline) -> pairs``
WarmStartSource = "Schedule | Sequence[tuple[str, Schedule]] | Callable[..., Sequence[tuple[str, Schedule]]] | None"
#: a better-than reference: ``(workload, limits, cost, objective) -> value``
Reference = Callable[[Workload, Limits, CostModel, str], float]


def _horizon(objective: str, ws: WarmStart | None, workload: Workload, cost: CostModel, target_s: float | None,
             limits: Limits, policy: Policy, max_horizon: int | None) -> tuple[int, bool]:
    """(J, proven): batches in the model and whether J provably holds an optimal schedule.

    latency/throughput: every batch is busy time before the last completion; completion (mean
    end-to-end): the busy time before the last completion is at most B × the mean plus the spread of
    arrivals; ttft, and any objective over one tag's requests: the same for the batches up to the
    last such event, plus a tail that always exists (:func:`.warmstart.horizon_for_events`). tpot, and
    any objective under a cost model whose batches have no fixed cost (β = 0), have no proof (J is then the warm
    start's length plus a margin, and the model's bound is not reported).
    """
    base = len(ws.schedule) if ws is not None else 0
    unproven = max(base + max(2, base // 10), 1)
    name, tag = split_objective(objective)
    rule = SPEC_OF_MILP[name].horizon           # the objective table's horizon rule (None: no proof)
    if ws is None or rule is None:
        return unproven, False
    T = workload.arrivals_s
    spread = float(T.max() - T.min())
    value = ws.value if target_s is None else min(ws.value, target_s)
    if rule == "makespan":
        J = horizon_for_latency(ws.latency_s if target_s is None else min(ws.latency_s, target_s), workload, cost)
    elif rule == "completion" and tag is None:
        J = horizon_for_latency(len(workload) * value + spread, workload, cost)
    else:
        which = members(workload, tag)
        J = horizon_for_events(which.size * value + spread, workload, limits, cost, policy, which,
                               "first" if rule == "first" else "done")
    if J is None:                  # no proof (a cost model without a per-batch time): the model's bound is not reported
        return unproven, False
    # a model of up to ~2000 request-batch cells stays small; beyond that, cap and say so
    cap = max_horizon or max(3 * base, base + 8, 2000 // max(1, len(workload)))
    return (J, True) if J <= cap else (cap, False)


METHODS = ("auto", "per-request", "aggregate", "search")


def _check_options(rel_gap, threads, horizon, by, max_horizon) -> None:
    """Named errors for solver options (the CLI flags map onto these; ``time_limit_s`` is the Budget's)."""
    def bad_number(x) -> bool:
        return isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)

    if bad_number(rel_gap) or not 0 <= rel_gap < 1:
        raise ValueError(f"rel_gap must be a number in [0, 1), got {rel_gap!r}")
    for name, value in (("threads", threads), ("horizon", horizon), ("max_horizon", max_horizon)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer (or None), got {value!r}")
    if bad_number(by) or not 0 <= by < 1:
        raise ValueError(f"by must be a fraction in [0, 1), got {by!r}")


def solve_optimal(workload: "Workload | str", limits: "Limits | str | None" = None,
                  cost: "CostModel | str | None" = None, objective: str = "latency", backend: str = "cpsat",
                  time_limit_s: float = 60.0, *, policy: "Policy | str | None" = None,
                  warm_start: "WarmStartSource" = None, horizon: int | None = None,
                  better_than: "float | Reference | None" = None, by: float = 0.10, threads: int | None = None,
                  rel_gap: float = 1e-4, strengthening: Strengthening | None = None, method: str = "auto",
                  log_solver: bool = False, solver_params: dict | None = None,
                  max_horizon: int | None = None,
                  progress: "Callable[[SolveProgress], None] | None" = None,
                  stop_early: bool = True) -> OptimalResult:
    """Solve the CSP of InferMax §3.3 for ``workload`` and return the replayed optimum.

    objective: one of ``OBJECTIVES``, or ``completion``/``ttft``/``tpot`` over the requests of one
    tag, ``"ttft:short"`` (the others must still be served). backend: see :mod:`infermax.csp.backends`.
    policy: restrict to a class of schedules (``Policy`` or a spec of its class, ``"no-eviction,P=512"``).
    warm_start: a Schedule, (name, Schedule) pairs, a callable ``(workload, limits, cost, deadline)`` that
    returns such pairs (tried until ``deadline``, ``time.perf_counter()``), or None (the horizon then comes
    from a sequential schedule). better_than: a value, or a callable ``(workload, limits, cost, objective)``
    giving one; the model then asks for a schedule at least ``by`` (fraction) better. csp names no
    scheduler: :func:`infermax.solve_optimal` (:mod:`infermax.optimal`) reads "best", "vllm" and
    "like=vllm" into these. method: "per-request" (the §3.3 model), "aggregate" (class
    flows, :mod:`.aggregate`), "search" (exact A* over class states,
    :mod:`.search`) or "auto": for offline latency, the search first; if it does not
    finish, the aggregate model where it is exact or bounds the problem
    (interchangeable requests), then the per-request model on whatever gap remains,
    every bound found on the way kept.

    Long only in its arguments: the body checks them in order, then hands one :class:`Stage` to
    :func:`_solve`.

    ``time_limit_s`` bounds the whole call (warm start, bounds, model building included:
    :mod:`.budget`). The result's ``bound`` is certified for every backend and objective: the
    best of the solver's (only where its horizon is proven to hold an optimum) and of the
    horizon-free bounds of :func:`infermax.lower_bound`; ``status`` is "optimal" only when the
    gap to it is within ``rel_gap``; with ``stop_early`` (the default) the call returns as soon as
    that is so (the warm start may already be proven optimal by the bound), otherwise every stage
    runs (to compare backends, say). ``progress`` is called with a :class:`SolveProgress` at
    every stage and improvement. Ctrl-C (KeyboardInterrupt) stops the solve and returns the best
    schedule found so far (``info["stopped"]`` says why). Raises ValueError for an instance no
    schedule can serve or a bad option.
    """
    budget = Budget(time_limit_s)
    _check_options(rel_gap, threads, horizon, by, max_horizon)
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    base, tag = split_objective(objective, workload)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    policy = Policy.from_spec(policy) if not isinstance(policy, Policy) else policy
    strengthening = strengthening or Strengthening()
    eff = policy.effective_limits(limits)
    check_instance(workload, eff, policy)
    if base == "tpot" and not (workload.output_lens[members(workload, tag)] > 1).any():
        raise ValueError(f"objective {objective!r} needs a request with output_len > 1 (TPOT is undefined otherwise)")
    be = backends.get_backend(backend)
    if not be.is_available():
        raise backends.BackendUnavailable(be.NAME, be.PIP)
    track = Tracker(objective, rel_gap, budget, progress)
    try:
        _solve(workload, limits, cost, objective, policy, strengthening, be, budget, track, warm_start=warm_start,
               horizon=horizon, better_than=better_than, by=by, threads=threads, rel_gap=rel_gap, method=method,
               log_solver=log_solver, solver_params=solver_params, max_horizon=max_horizon, stop_early=stop_early)
    except KeyboardInterrupt:
        track.stop("interrupted (Ctrl-C)")
    except (BudgetExhausted, ModelTooLarge) as exc:
        track.stop(str(exc))
    return track.final()


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    """What every solving stage is handed: the instance, the model's horizon and the solver options."""

    workload: Workload
    limits: Limits
    cost: CostModel
    objective: str
    policy: Policy
    J: int                        # batches in the model
    proven: bool                  # whether J provably holds an optimal schedule
    be: Any                       # the backend module (:mod:`.backends`)
    threads: int | None
    rel_gap: float
    log_solver: bool
    solver_params: dict | None
    strengthening: Strengthening
    budget: Budget


@dataclass(frozen=True, kw_only=True, slots=True)
class Methods:
    """Which methods apply to this call (``method`` as asked, checked against the instance)."""

    asked: str                    # one of METHODS
    target: float | None          # the better-than bound (model side), or None
    aggregate_ok: bool            # the aggregate model is exact or a bound here (:func:`_methods`)
    search_ok: bool               # the class-state search applies here


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOutcome:
    """The class-state search's answer, with what the later stages take from it."""

    result: OptimalResult
    min_batches: int              # least batch count of the packing relaxation known to the search
    batch_table_complete: bool    # whether ``min_batches`` is exact (the table of batches left is complete)
    incumbent: str                # who found the schedule the search started from or returned

    def next_warm_start(self, ws: WarmStart | None) -> WarmStart | None:
        """The warm start of the next stage: the search's schedule if it has one, else ``ws``."""
        r = self.result
        if r.schedule is None or r.objective is None:
            return ws
        return WarmStart(self.incumbent, r.schedule, r.objective, r.metrics["latency_s"])


def _methods(method: str, workload: Workload, limits: Limits, cost: CostModel, objective: str, policy: Policy,
             target: float | None) -> Methods:
    """Which of the aggregate model and the class-state search apply; ValueError if ``method`` names one
    that does not."""
    eff = policy.effective_limits(limits)
    agg_ok = aggregate.is_applicable(workload, objective) and target is None and \
        (not policy.chunked_prefill or aggregate.chunking_bound_holds(eff, cost))
    if eff.block_size > 1:
        if method == "aggregate":
            raise ValueError(f"method 'aggregate' counts KV in tokens; Limits.block_size = {eff.block_size} > 1 "
                             f"needs method 'per-request' (or 'auto')")
        agg_ok = False       # its class flows count KV in tokens (their bounds stay valid, their schedules may not)
    if method == "aggregate" and not agg_ok:
        raise ValueError("method 'aggregate' needs the latency objective, an offline workload, no better-than "
                         "target, and either no chunked prefill or M <= C, M <= P and a linear non-attention "
                         "cost up to M tokens")
    search_ok, why = search.is_applicable(workload, eff, cost, policy)
    search_ok = search_ok and objective in MAKESPAN and target is None
    if method == "search" and not search_ok:
        raise ValueError(f"method 'search' needs the latency objective and no better-than target; "
                         f"{why or 'not the case here'}")
    return Methods(asked=method, target=target, aggregate_ok=agg_ok, search_ok=search_ok)


def _solve(workload, limits, cost, objective, policy, strengthening, be, budget: Budget, track: "Tracker", *,
           warm_start, horizon, better_than, by, threads, rel_gap, method, log_solver, solver_params,
           max_horizon, stop_early) -> None:
    """The stages of ``solve_optimal`` in order; each hands what it finds to ``track``.

    warm start -> horizon-free lower bound -> horizon -> class-state search -> aggregate MILP ->
    per-request MILP, each later stage skipped once the answer is proven (``stop_early``) or the
    budget has nothing left for it.
    """
    eff = policy.effective_limits(limits)
    methods = _methods(method, workload, limits, cost, objective, policy,
                       _target(better_than, by, objective, workload, limits, cost, policy))
    track.stage("warm start")
    candidates = _warm_start_schedules(warm_start, workload, limits, cost,
                                       deadline=budget.start + budget.total_s * WARM_START_SHARE)
    ws = find_warm_start(workload, limits, cost, objective, policy, candidates,
                         clean=strengthening.dominance and is_monotone(objective))
    track.warm_start(ws, workload, limits, cost)
    track.stage("lower bound")
    bound = _lower_bound(workload, eff, cost, objective, ws, budget)
    track.lower_bound(bound)
    target = methods.target
    if target is not None and bound is not None and _beyond(bound, target, objective, workload):
        track.offer(no_schedule(objective, be.NAME, 0, budget.start, ws, f"the certified bound {bound.value:.6g} "
                                f"({bound.method}) is worse than the target"), final=True)
        return
    if (stop_early and target is None and track.is_done()) or track.finished:
        return
    J, proven = _model_horizon(objective, ws, workload, cost, target, eff, policy, horizon, max_horizon)
    lb_y = batch_count_lower_bound(workload, eff)
    if J < lb_y:
        if proven:   # even the shortest schedule is too slow for the target: answered without a solver
            track.offer(no_schedule(objective, be.NAME, J, budget.start, ws,
                                    f"horizon {J} < batch-count lower bound {lb_y}"), final=True)
            return
        J = lb_y
    stage = Stage(workload=workload, limits=limits, cost=cost, objective=objective, policy=policy, J=J,
                  proven=proven, be=be, threads=threads, rel_gap=rel_gap, log_solver=log_solver,
                  solver_params=solver_params, strengthening=strengthening, budget=budget)
    _run_solvers(stage, methods, ws, track, stop_early)


def _model_horizon(objective: str, ws: WarmStart | None, workload: Workload, cost: CostModel, target: float | None,
                   limits: Limits, policy: Policy, horizon: int | None, max_horizon: int | None) -> tuple[int, bool]:
    """(J, proven) from :func:`_horizon`, overridden by the caller's ``horizon``, and never fewer batches than
    the longest output (one token per batch)."""
    J, proven = _horizon(objective, ws, workload, cost, target, limits, policy, max_horizon)
    if horizon is not None:
        proven = proven and horizon >= J
        J = int(horizon)
    return max(J, int(workload.output_lens.max())), proven


# complexity: the three methods in turn, one branch per budget, warm start and early exit between them
def _run_solvers(stage: Stage, methods: Methods, ws: WarmStart | None, track: "Tracker", stop_early: bool) -> None:
    """The class-state search, the aggregate MILP and the per-request MILP, each warm-started by the last.

    Its branches are the rules for which stages run (the method asked, what applies, the budget left,
    stop_early); they read top to bottom in stage order."""
    budget, method = stage.budget, methods.asked
    done = (lambda: track.finished or track.is_done()) if stop_early else (lambda: track.finished)
    least_batches = None
    if method == "search" or (method == "auto" and methods.search_ok and ws is not None):
        track.stage("class-state search")
        found = _solve_search(stage, ws=ws, reserve=method != "search")
        track.offer(found.result, final=method == "search" or found.result.status == SolveStatus.INFEASIBLE)
        if done():
            return
        least_batches = found.min_batches if found.batch_table_complete else None
        ws = found.next_warm_start(ws)
    if method == "aggregate" or (method == "auto" and methods.aggregate_ok and _has_class(stage.workload)):
        if budget.share() is None:
            return
        track.stage("aggregate MILP")
        first = _solve_aggregate(stage, ws=ws, least_batches=least_batches)
        track.offer(first, final=method == "aggregate" or first.status == SolveStatus.INFEASIBLE)
        if done() or budget.share(reserve_s=1.0) is None:
            return
        if first.schedule is not None:
            ws = WarmStart("aggregate", first.schedule, first.objective, first.metrics["latency_s"])
    if budget.share() is None:
        return
    track.stage("per-request MILP")
    track.offer(_solve_per_request(stage, ws=ws, target=methods.target), final=True)


def _has_class(workload: Workload) -> bool:
    """Whether two requests are interchangeable (the aggregate model has something to aggregate)."""
    return len(aggregate.num_identical_classes(workload)) < len(workload)


def _warm_start_schedules(source: "WarmStartSource", workload: Workload, limits: Limits, cost: CostModel,
                          deadline: float) -> list[tuple[str, Schedule]]:
    """The (name, schedule) pairs of a ``warm_start`` option: a Schedule as given ("given"), None none, the
    pairs as given, or what a callable returns by ``deadline`` (``time.perf_counter()``; csp runs no scheduler
    itself: :func:`infermax.optimal.warm_start_source` makes the callable that simulates the ones a name
    gives)."""
    if isinstance(source, Schedule):
        return [("given", source)]
    if source is None:
        return []
    if isinstance(source, str):
        raise ValueError(f"warm_start {source!r} names a scheduler; infermax.csp takes Schedules "
                         f"(infermax.solve_optimal runs the schedulers a name gives)")
    pairs = list(source(workload, limits, cost, deadline)) if callable(source) else list(source)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], Schedule)):
            raise ValueError(f"warm_start must give (name, Schedule) pairs, got {pair!r}")
    return pairs


def _beyond(bound, target: float, objective: str, workload: Workload) -> bool:
    """Whether a certified ``bound`` shows that no schedule reaches the model-side ``target``
    (seconds, minimised; for throughput the target is a latency and the bound a tokens/s ceiling)."""
    if objective in MAXIMISED:
        return float(workload.output_lens.sum()) / bound.value > target
    return bound.value > target


def _lower_bound(workload: Workload, limits: Limits, cost: CostModel, objective: str, ws: WarmStart | None,
                 budget: Budget):
    """The horizon-free certified bound of :func:`infermax.lower_bound` (None if it cannot be had): every
    registered method but ``milp`` (which solves this very model), the class-state search (:mod:`.bound_methods`)
    included."""
    if budget.share(LOWER_BOUND_SHARE) is None:
        return None
    try:
        return combine(workload, limits, cost, objective=objective,
                       methods=tuple(m for m in methods_of(split_objective(objective)[0]) if m != "milp"),
                       upper=ws.latency_s if ws is not None else None)
    except ValueError as exc:        # e.g. a cost model the bounds cannot read: the solver's bound stays
        log.info("no horizon-free bound: %s", exc)
        return None


# complexity: the search's stages in turn (table, beam, A*), one branch per budget and early exit
def _solve_search(stage: Stage, *, ws: WarmStart, reserve: bool) -> SearchOutcome:
    """The class-state search (:mod:`.search`): relaxation table, beam incumbents, then A*.

    Its time is what the budget has left, less a reserve for the MILPs when ``reserve`` (they keep
    :data:`.budget.MILP_RESERVE_WITH_TABLE` of the limit when the table of exact batches left is
    complete, A* being what closes gaps then, and :data:`.budget.MILP_RESERVE_WITHOUT_TABLE` when it is
    not). Of the search's time: :data:`.budget.TABLE_SHARE` for the table (if it cannot be built,
    :data:`.budget.REFUTE_SHARE` for the backend to refute small batch counts of the relaxation);
    pilot searches of width 1, 4, 16 and 64, then beams of width 8, 128 and 512, until the incumbent
    share has passed — each better schedule lowers the A* cutoff and is the incumbent if A* cannot
    finish; A* for the rest (its LP share for the trajectory LPs' tables, :mod:`.trajectorylp`, or,
    without the table, for the configuration LPs, :mod:`.configlp`).
    Its branches are those phases in order (table or refutation, incumbents, A*).
    """
    workload, limits, cost, policy, budget = stage.workload, stage.limits, stage.cost, stage.policy, stage.budget
    be, threads, rel_gap = stage.be, stage.threads, stage.rel_gap
    eff = policy.effective_limits(limits)
    reserves = (budget.total_s * MILP_RESERVE_WITH_TABLE, budget.total_s * MILP_RESERVE_WITHOUT_TABLE) \
        if reserve else (0.0, 0.0)
    sp_classes = [(I, O, len(idx)) for I, O, idx in classstate.classes_of(workload)]
    rest = batchtable.RemainingBatches(sp_classes, eff.M, eff.R_max,
                                       time_budget_s=budget.share(TABLE_SHARE, reserve_s=max(reserves)) or 0.0)
    min_batches, table_complete = rest.num_batches, rest.is_complete
    time_limit_s = max(0.0, budget.left() - reserves[0 if table_complete else 1])
    deadline = time.perf_counter() + time_limit_s
    if not rest.is_complete:         # only states near the goal are in it: lookups would cost more than they give
        rest = None
        refute_s = time_limit_s * REFUTE_SHARE
        if batchcount.is_applicable(eff) and refute_s >= MIN_STAGE_S:  # which batch counts can the relaxation not meet
            area = batchcount.area_bound(sp_classes, eff.M, eff.R_max)
            min_batches = batchcount.refute_batch_counts(
                sp_classes, eff.M, eff.R_max, max(min_batches, area),
                lambda model, tl: be.solve(model, tl, threads=threads), refute_s)
    best = ws
    beam_until = deadline - time_limit_s * (1 - (INCUMBENT_SHARE_WITH_TABLE if table_complete
                                                 else INCUMBENT_SHARE_WITHOUT_TABLE))
    runs = [("pilot", w) for w in (1, 4, 16, 64)] + [("beam", w) for w in (8, 128, 512)]
    for kind, width in runs:
        left = beam_until - time.perf_counter()
        if left <= MIN_STAGE_S:
            break
        if kind == "pilot":
            found = search.pilot_search(workload, eff, cost, policy, width=width, time_budget_s=left)
        else:
            found = search.beam_search(workload, eff, cost, policy, width=width, rest=rest, time_budget_s=left)
        if found is not None:
            latency = compute_metrics(replay(found[0], workload, limits, cost))["latency_s"]
            if latency < best.latency_s:
                best = WarmStart(f"search-{kind}-{width}", found[0], latency, latency)
    left = max(0.0, deadline - time.perf_counter())
    lp_share = (LP_SHARE_WITH_TABLE if table_complete else LP_SHARE_WITHOUT_TABLE) \
        if trajectorylp.is_available() else 0.0
    found = search.exact_search(workload, eff, cost, policy, upper_s=best.latency_s, time_budget_s=left,
                                rel_gap=rel_gap, min_batches=min_batches, rest=rest, lp_budget_s=left * lp_share,
                                refine_lp=not table_complete)
    result = search_result(found, workload, limits, cost, stage.objective, policy, ws, best, rel_gap, budget.start,
                           {"min_batches": min_batches, "batch_table_complete": table_complete,
                            "incumbent": best.name})
    return SearchOutcome(result=result, min_batches=min_batches, batch_table_complete=table_complete,
                         incumbent=best.name)


@contextmanager
def _build_share(budget: Budget, what: str, estimated_rows: int | None):
    """The deadline of a model build: :data:`.budget.BUILD_SHARE` of what is left (the solver keeps the
    rest); a build that overruns it stops with :class:`.budget.BudgetExhausted` saying so."""
    share = budget.share(BUILD_SHARE)
    if share is None:
        raise BudgetExhausted(f"the time limit ({budget.total_s:g} s) left no time to build {what}")
    try:
        yield time.perf_counter() + share
    except BudgetExhausted as exc:
        done = f"{exc.rows:,}" if exc.rows is not None else "some"
        size = f" of about {estimated_rows:,}" if estimated_rows is not None else ""
        raise BudgetExhausted(f"{what} was not built within its share of the time limit ({share:.3g} s of "
                              f"{budget.total_s:g} s; stopped at {done}{size} rows): the answer is the best "
                              f"schedule and bound found before it", rows=exc.rows) from None


def _solve_per_request(stage: Stage, *, ws: WarmStart | None, target: float | None) -> OptimalResult:
    """The §3.3 model (:func:`build`), hinted with the warm start where it fits, solved in the time left."""
    workload, limits, cost, objective, policy = stage.workload, stage.limits, stage.cost, stage.objective, stage.policy
    J, be, budget, strengthening = stage.J, stage.be, stage.budget, stage.strengthening
    eff = policy.effective_limits(limits)
    with _build_share(budget, "the per-request model", check_size(workload, J, strengthening,
                                                                  "the per-request model")) as deadline:
        fm = build(workload, limits, cost, objective, policy, J, strengthening, target, deadline=deadline)
    hinted = False
    if ws is not None and len(ws.schedule) <= J and (target is None or meets(ws, objective, target)):
        x = assign(fm, canonical_labels(ws.schedule, workload, eff, cost, strengthening.symmetry))
        bad = fm.model.evaluate(x)
        if bad:   # the model must accept every valid schedule; if not, say so loudly and go on unhinted
            log.error("warm start violates the model (%d rows), first: %s", len(bad), bad[0])
        else:
            fm.model.hint = {k: float(x[k]) for k in range(fm.model.num_vars)}
            hinted = True
    model = fm.model
    if strengthening.indicators == "big-m":
        model, _ = to_milp(model, indicators="big-m", products="native", big_m=strengthening.big_m)
    budget.check("building the per-request model")
    res = be.solve(model, max(MIN_STAGE_S, budget.left()), threads=stage.threads, rel_gap=stage.rel_gap,
                   log=stage.log_solver, **backend_kwargs(be, strengthening, stage.solver_params))
    return make_result(fm, res, ws, objective, J, stage.proven, hinted, stage.rel_gap, budget.start, target,
                       lambda values, meta: to_schedule(fm, values, meta), "per-request", lambda sch: assign(fm, sch))


def _solve_aggregate(stage: Stage, *, ws: WarmStart | None, least_batches: int | None = None) -> OptimalResult:
    """The aggregate model (:mod:`.milp.aggregate`) after probing the batch count.

    least_batches: the packing relaxation's exact least batch count if already known (the search's table).
    """
    workload, limits, cost, objective, policy = stage.workload, stage.limits, stage.cost, stage.objective, stage.policy
    J, be, budget, threads, rel_gap = stage.J, stage.be, stage.budget, stage.threads, stage.rel_gap
    eff = policy.effective_limits(limits)
    # probe the batch count first: exactly-Y schedules with small Y are often refuted in a fraction of a second
    lb_y = batch_count_lower_bound(workload, eff)
    packing = None
    if batchcount.is_applicable(eff):      # exact least batch count of the packing relaxation, if quick
        if least_batches is None:
            packing = batchcount.min_batch_count(workload, eff, upper=J, time_budget_s=budget.share(
                PACKING_SHARE, cap_s=PACKING_CAP_S) or 0.0)
            least_batches = packing.num_batches
        lb_y = max(lb_y, least_batches)
    lb_probe = lb_y
    if (probe_s := budget.share(PROBE_SHARE, cap_s=PROBE_CAP_S)) is not None:
        lb_probe = aggregate.probe_batch_count(
            workload, limits, cost, policy, lb_y, J,
            lambda model, tl: be.solve(model, tl, threads=threads, rel_gap=rel_gap), probe_s)
    if lb_probe > J:
        return no_schedule(objective, be.NAME, J, budget.start, ws, f"no schedule has <= {J} batches")
    with _build_share(budget, "the aggregate model", None) as deadline:
        fm = aggregate.build_aggregate(workload, limits, cost, policy, J, min_batches=lb_probe, deadline=deadline)
    fm.info["batch_count_probed"] = lb_probe
    if packing is not None:
        fm.info["batch_count_search"] = {"num_batches": packing.num_batches, "is_exact": packing.is_exact,
                                         "states_max": packing.states_max, "wall_s": round(packing.wall_s, 3)}
    hinted = False
    if ws is not None:
        merged = merge_chunks(ws.schedule, workload, eff, cost)
        if merged is not None and len(merged) <= J:
            x = aggregate.assign_aggregate(fm, merged)
            bad = fm.model.evaluate(x)
            if bad:
                log.error("aggregated warm start violates the model (%d rows), first: %s", len(bad), bad[0])
            else:
                fm.model.hint = {k: float(x[k]) for k in range(fm.model.num_vars)}
                hinted = True
    budget.check("building the aggregate model")
    res = be.solve(fm.model, max(MIN_STAGE_S, budget.left()), threads=threads, rel_gap=rel_gap,
                   log=stage.log_solver, **backend_kwargs(be, stage.strengthening, stage.solver_params))
    return make_result(fm, res, ws, objective, J, stage.proven, hinted, rel_gap, budget.start, None,
                       lambda values, meta: aggregate.to_schedule(fm, values, meta), "aggregate",
                       lambda sch: aggregate.assign_aggregate(fm, sch))


def _target(better_than, by: float, objective: str, workload: Workload, limits: Limits, cost: CostModel,
            policy: Policy) -> float | None:
    """The model-side bound (seconds, minimised) for a better-than question, or None."""
    if better_than is None:
        return None
    if not 0 <= by < 1:
        raise ValueError(f"by must be a fraction in [0, 1), got {by!r}")
    if isinstance(better_than, str):
        raise ValueError(f"better_than {better_than!r} names a scheduler; infermax.csp takes a value "
                         f"(infermax.solve_optimal simulates the scheduler a name gives)")
    ref = better_than(workload, limits, cost, objective) if callable(better_than) else float(better_than)
    if objective in MAXIMISED:
        tokens = float(workload.output_lens.sum())
        return tokens / (ref * (1 + by))
    return ref * (1 - by)
