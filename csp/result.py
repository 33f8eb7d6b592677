"""OptimalResult, and how a backend's answer becomes one: extract, replay, compare, bound, gap.

Every schedule in a result has been replayed by ``infermax.replay``; its
objective is the replayed value. ``solver_objective`` is the model's price of
the same schedule (its canonical assignment, so no slack of a time-limited
incumbent is left in it); the two agree to 1e-6, and ``info["replay_rel_diff"]``
records by how much they differ.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermax.metrics import metrics as compute_metrics
from infermax.replay import replay
from infermax.types import Schedule

from .backends import SolveResult, SolveStatus
from .milp.formulation import Formulation
from .milp.objectives import MAXIMISED, trace_objective
from .warmstart import WarmStart

log = logging.getLogger(__name__)

REPLAY_RTOL = 1e-6
#: a bound beyond the value it bounds by at most this (relative) is equal to it: rounding of the two sums
GAP_RTOL = 1e-12


class InvalidBoundError(RuntimeError):
    """A certified bound beyond the value of a valid schedule (:func:`relative_gap`): a bug, never an answer."""


@dataclass(frozen=True, kw_only=True)
class OptimalResult:
    """A solve: the replayed schedule, its objective, the solver's bound and the gap between them.

    status: a :class:`~.backends.SolveStatus` (a str): "optimal" (gap <= rel_gap and the horizon
    provably holds an optimum), "feasible", "infeasible" (no schedule within the horizon /
    better-than target) or "unknown" (nothing found in time). ``objective`` is in the
    objective's unit (seconds; tokens/s for throughput).
    """

    schedule: Schedule | None
    objective: float | None
    bound: float | None
    gap: float | None
    status: SolveStatus
    backend: str
    wall_s: float
    objective_name: str = "latency"
    solver_objective: float | None = None
    horizon: int = 0
    horizon_proven: bool = False
    warm_start: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.status, SolveStatus):
            raise ValueError(f"OptimalResult.status must be a SolveStatus ({', '.join(s.name for s in SolveStatus)}), "
                             f"got {self.status!r}")

    @property
    def is_optimal(self) -> bool:
        return self.status == SolveStatus.OPTIMAL

    def summary(self) -> dict[str, Any]:
        return {"objective_name": self.objective_name, "status": self.status, "objective": self.objective,
                "bound": self.bound, "gap": self.gap, "backend": self.backend, "wall_s": self.wall_s,
                "horizon": self.horizon, "horizon_proven": self.horizon_proven,
                "num_batches": len(self.schedule) if self.schedule is not None else None,
                "num_evictions": self.metrics.get("num_evictions"), "warm_start": self.warm_start,
                "method": self.info.get("method")}


def replayed(schedule: Schedule, workload, limits, cost, objective: str) -> tuple[dict[str, Any], float]:
    """The replayed schedule's metrics and its value of ``objective`` (per-tag ones from the trace)."""
    trace = replay(schedule, workload, limits, cost)
    metrics = compute_metrics(trace)
    return metrics, trace_objective(trace, metrics, objective)


def conservative_bound(fm: Formulation, res: SolveResult) -> float | None:
    """The solver's bound made safe against the integer backend's grid.

    On CP-SAT, times sit on a grid of ``continuous_step_s``: along the chain of
    batches each end is at most one step after its exact value, an arrival
    row can push a start up by one more step, and an event time (completion,
    first token) by one more again — (J + 2) steps in all. Objective
    coefficients carry a rounding error too (relative, and its worst absolute
    effect over the variables' domains). The bound is lowered by all of them so
    that it stays a valid lower bound on the replayed objective.
    """
    if res.bound is None:
        return None
    bound = res.bound
    if fm.v.end and res.backend == "cpsat":
        bound -= (fm.horizon + 2) * fm.model.continuous_step_s
    rounding = float(res.info.get("objective_rounding_rel", 0.0))
    return bound - abs(bound) * 2 * rounding - float(res.info.get("objective_rounding_abs", 0.0))


def meets(ws: WarmStart, objective: str, target: float) -> bool:
    """Whether the warm start already reaches a better-than target (in the model's minimised units)."""
    value = ws.latency_s if objective in MAXIMISED else ws.value
    return value <= target


# complexity: one branch per solver outcome (schedule or warm start, bound, gap, status), read in order
def make_result(fm: Formulation, res: SolveResult, ws: WarmStart | None, objective: str, J: int, proven: bool,
                hinted: bool, rel_gap: float, t0: float, target: float | None,
                extract: Callable[[np.ndarray, dict], Schedule], method: str,
                reassign: Callable[[Schedule], np.ndarray]) -> OptimalResult:
    """The :class:`OptimalResult` of a MILP solve: its schedule (the solver's, else the warm start's),
    replayed and compared with the solver's objective, the certified bound, the gap and the status.

    Its branches are where the schedule comes from and which of the bound's sources are valid, read in
    the order the result is assembled.
    """
    workload, limits, cost = fm.workload, fm.limits, fm.cost
    info: dict[str, Any] = {"method": method, "model": fm.model.stats(), "solver_status": res.status,
                            "solver_wall_s": res.wall_s,
                            "hinted": hinted, "batch_count_lb": fm.info.get("batch_count_lb"),
                            "target": target, **res.info}
    warm = {"scheduler": ws.name, "objective": ws.value} if ws is not None else None
    schedule, value, metrics, source = None, None, {}, None
    if res.has_solution:
        meta = {"solver": res.backend, "objective": objective, "policy": fm.policy.to_dict(), "horizon": J,
                "limits": limits.to_dict(), "cost": cost.describe()}
        schedule = extract(res.values, {**meta, "method": method})
        source = "solver"
    elif ws is not None and (target is None or meets(ws, objective, target)):
        schedule, source = ws.schedule, "warm-start"
    if schedule is not None:
        metrics, value = replayed(schedule, workload, limits, cost, objective)
    info["solution_from"] = source
    info["solver_raw_objective"] = res.objective
    # the model's price of the returned schedule: its canonical assignment (no slack left in epigraph
    # variables of a time-limited incumbent) evaluated by the objective row
    solver_obj = fm.model.objective_value(reassign(schedule)) if source == "solver" else res.objective
    bound = conservative_bound(fm, res)
    if not proven:      # the solver's bound holds for schedules of at most J batches only: not certified
        info["bound_within_horizon"] = bound
        bound = None
    if objective in MAXIMISED:
        solver_obj = as_throughput(workload, solver_obj)
        bound = as_throughput(workload, bound)
    if source == "solver" and solver_obj is not None:
        diff = abs(value - solver_obj) / max(abs(value), 1e-300)
        info["replay_rel_diff"] = diff
        if diff > REPLAY_RTOL and method == "per-request":
            log.warning("replayed %s %.9g differs from the model's %.9g (rel %.2e)", objective, value,
                        solver_obj, diff)
    gap = relative_gap(value, bound, objective)
    status = res.status
    if status == SolveStatus.OPTIMAL and not is_within(gap, rel_gap):
        status = SolveStatus.FEASIBLE
        info["optimal_within_horizon"] = not proven
    if status == SolveStatus.UNKNOWN and schedule is not None:
        status = SolveStatus.FEASIBLE
    if status == SolveStatus.INFEASIBLE and not proven:
        info["infeasible_within_horizon"] = True
    info["bound_method"] = method if bound is not None else None
    return OptimalResult(schedule=schedule, objective=value, bound=bound, gap=gap, status=status,
                         backend=res.backend, wall_s=time.perf_counter() - t0, objective_name=objective,
                         solver_objective=solver_obj, horizon=J, horizon_proven=proven, warm_start=warm,
                         metrics=metrics, info=info)


def as_throughput(workload, latency_s: float | None) -> float | None:
    """tokens/s of a latency (a latency bound becomes a throughput bound); None for none or <= 0."""
    return float(workload.output_lens.sum()) / latency_s if latency_s and latency_s > 0 else None


def is_within(gap: float | None, rel_gap: float) -> bool:
    """Whether a certified ``gap`` proves optimality at ``rel_gap`` (a relative 1e-9 of rounding allowed)."""
    return gap is not None and gap <= rel_gap * (1 + 1e-9)


def is_better_bound(a: float | None, b: float | None, objective: str) -> bool:
    """Whether bound ``a`` is tighter than ``b`` (higher when minimising, lower for throughput)."""
    if a is None:
        return False
    return b is None or (a < b if objective in MAXIMISED else a > b)


def relative_gap(value: float | None, bound: float | None, objective: str) -> float | None:
    """How far ``value`` may be from the optimum, relative: throughput is maximised, the rest minimised.

    Never clamped: a bound beyond the value of a schedule that exists by more than :data:`GAP_RTOL` is
    wrong, and :class:`InvalidBoundError` says so (within it the two are equal: gap 0). A value of 0 (a
    schedule that costs nothing) has gap 0 at a bound of 0 and an unknown (infinite) one below."""
    if value is None or bound is None:
        return None
    if value == bound:            # (also both infinite: the throughput of schedules that take no time)
        return 0.0
    sign = -1.0 if objective in MAXIMISED else 1.0       # as minimisation: value - bound >= 0
    slack = sign * (value - bound)
    if slack < -GAP_RTOL * max(abs(value), abs(bound)):
        raise InvalidBoundError(f"the certified bound {bound!r} on {objective} is beyond the value {value!r} of a "
                                f"valid schedule: a bug in infermax's bound or judge")
    if slack <= 0.0:
        return 0.0
    scale = abs(bound) if objective in MAXIMISED else abs(value)
    return slack / scale if 0.0 < scale < math.inf else math.inf


def combine(first: OptimalResult, second: OptimalResult, rel_gap: float, t0: float) -> OptimalResult:
    """The better schedule of two solves of the same problem (the second on a tie: the later stage
    knows more), with the better of their bounds."""
    sign = -1.0 if first.objective_name in MAXIMISED else 1.0          # compare as minimisation
    best = second if (second.objective is not None and (first.objective is None
                                                       or sign * second.objective <= sign * first.objective)) else first
    bounds = [sign * b for b in (first.bound, second.bound) if b is not None]
    bound = sign * max(bounds) if bounds else None
    gap = relative_gap(best.objective, bound, best.objective_name)
    status = SolveStatus.OPTIMAL if is_within(gap, rel_gap) else \
        best.status if best.status != SolveStatus.OPTIMAL else SolveStatus.FEASIBLE
    bound_from = max((first, second), key=lambda r: -math.inf if r.bound is None else sign * r.bound)
    methods = {**first.info.get("methods", {}), **second.info.get("methods", {})}
    methods[first.info["method"]] = first.summary()
    methods[second.info["method"]] = second.summary()
    info = {**best.info, "methods": methods, "bound_method": bound_from.info.get("bound_method")}
    return dataclasses.replace(best, bound=bound, gap=gap, status=status, wall_s=time.perf_counter() - t0,
                               warm_start=first.warm_start or second.warm_start, info=info)


def with_bound(result: OptimalResult, bound: float | None, method: str, rel_gap: float, t0: float) -> OptimalResult:
    """``result`` with a certified ``bound`` from elsewhere (e.g. :func:`infermax.lower_bound`) if it is tighter."""
    objective = result.objective_name
    info = dict(result.info)
    new = result.bound
    if is_better_bound(bound, result.bound, objective):
        new, info["bound_method"] = bound, method
    gap = relative_gap(result.objective, new, objective)
    status = result.status
    if result.objective is not None and status != SolveStatus.INFEASIBLE:
        status = SolveStatus.OPTIMAL if is_within(gap, rel_gap) else SolveStatus.FEASIBLE
    return dataclasses.replace(result, bound=new, gap=gap, status=status, wall_s=time.perf_counter() - t0, info=info)


def from_warm_start(ws: WarmStart, workload, limits, cost, objective: str, t0: float) -> OptimalResult:
    """The warm start as a result (no bound yet): what ``solve_optimal`` returns if nothing beats it in time."""
    metrics, value = replayed(ws.schedule, workload, limits, cost, objective)
    return OptimalResult(schedule=ws.schedule, objective=value, bound=None, gap=None,
                         status=SolveStatus.FEASIBLE, backend="warm-start", wall_s=time.perf_counter() - t0,
                         objective_name=objective, horizon=len(ws.schedule), horizon_proven=False,
                         warm_start={"scheduler": ws.name, "objective": ws.value}, metrics=metrics,
                         info={"method": "warm-start", "solution_from": "warm-start", "bound_method": None})


def no_schedule(objective: str, backend: str, J: int, t0: float, ws: WarmStart | None, why: str) -> OptimalResult:
    return OptimalResult(schedule=None, objective=None, bound=None, gap=None, status=SolveStatus.INFEASIBLE,
                         backend=backend,
                         wall_s=time.perf_counter() - t0, objective_name=objective, horizon=J, horizon_proven=True,
                         warm_start={"scheduler": ws.name, "objective": ws.value} if ws else None,
                         info={"reason": why, "solution_from": None})


def search_result(found, workload, limits, cost, objective: str, policy, ws: WarmStart, best: WarmStart,
                  rel_gap: float, t0: float, extra: dict[str, Any]) -> OptimalResult:
    """An OptimalResult from :func:`.search.exact_search` (its path, else ``best`` known), replayed.

    The search's latency bound is lowered by a relative 1e-12 so that summation order cannot lift it
    above the replayed value of the same schedule.
    """
    schedule, source = (found.schedule, "search") if found.schedule is not None else \
        (best.schedule, "warm-start" if best is ws else best.name)
    metrics, value = replayed(schedule, workload, limits, cost, objective)
    bound = found.bound_s * (1 - 1e-12)
    if objective in MAXIMISED:
        bound = as_throughput(workload, bound)
    gap = relative_gap(value, bound, objective)
    status = SolveStatus.OPTIMAL if found.is_complete and is_within(gap, rel_gap) else SolveStatus.FEASIBLE
    info = {"method": "search", "bound_method": "search", "solution_from": source,
            "solver_status": "complete" if found.is_complete else "stopped", "solver_wall_s": found.wall_s, "search": {
                "expanded": found.num_expanded, "generated": found.num_generated, "value_s": found.value_s,
                "complete": found.is_complete, "trajectory_lp": found.trajectory_lp, **extra}}
    if found.value_s is not None:
        info["replay_rel_diff"] = abs(metrics["latency_s"] - found.value_s) / metrics["latency_s"]
    if source != "warm-start":
        schedule = Schedule(schedule.batches, {"solver": "search", "method": "search", "objective": objective,
                                               "policy": policy.to_dict(), "limits": limits.to_dict(),
                                               "cost": cost.describe()})
    return OptimalResult(schedule=schedule,
                         objective=value, bound=bound, gap=gap, status=status, backend="search",
                         wall_s=time.perf_counter() - t0, objective_name=objective,
                         solver_objective=found.value_s, horizon=len(schedule), horizon_proven=True,
                         warm_start={"scheduler": ws.name, "objective": ws.value}, metrics=metrics, info=info)
