"""check_scheduler: how far is a scheduler from optimal, with a certificate.

Simulates the scheduler (or takes a schedule produced elsewhere), replays it —
the judge — and compares its replayed value of the chosen ``objective`` (latency by
default; any name of `objectives`: ttft, e2e, tpot, ttft_p99, ttft:short, ...) with the
best certified lower bound and, for small instances, with the solver optimum. Exit codes (the CLI
returns them): 0 valid; 2 invalid schedule (replay's error); 3 the scheduler's
own claim beats the certified bound, which can only be an accounting bug.

A scheduler may state its own result through an optional ``reported_metrics()``
method (a dict with ``latency_s``, and for other objectives the key of
``infermax.metrics`` such as ``ttft_mean_s``, ``e2e_p99_s``); an external simulator
passes ``claimed_value_s`` (``claimed_latency_s`` for the latency). Claims are never
trusted: they are checked against the bound and against replay.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from infermax.engine import resolve_inputs, simulate
from infermax.metrics import metrics as compute_metrics
from infermax.replay import replay
from infermax.schedulers import get_scheduler
from infermax.state import ScheduleError
from infermax.types import Schedule

from .objectives import members, parse_objective, trace_value

VALID, INVALID, BEATS_BOUND = 0, 2, 3


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Verdict of a scheduler check; ``exit_code`` is 0, 2 or 3 (see module docstring)."""

    scheduler: str
    exit_code: int
    objective: str = "latency"
    value_s: float | None = None            # the replayed value of ``objective`` (tokens/s for throughput)
    claimed_value_s: float | None = None
    latency_s: float | None = None
    claimed_latency_s: float | None = None
    bound_s: float | None = None
    bound_method: str | None = None
    bound_values: dict[str, float] = field(default_factory=dict)
    optimum_s: float | None = None
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Certified optimality gap: (value - bound) / value (throughput: (bound - value) / bound)."""
        if self.value_s is None or self.bound_s is None:
            return None
        if self.objective == "throughput":
            return (self.bound_s - self.value_s) / self.bound_s
        return (self.value_s - self.bound_s) / self.value_s if self.value_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "exit_code": self.exit_code, "valid": self.exit_code != INVALID,
                "objective": self.objective, "value_s": self.value_s, "claimed_value_s": self.claimed_value_s,
                "latency_s": self.latency_s, "claimed_latency_s": self.claimed_latency_s, "bound_s": self.bound_s,
                "bound_method": self.bound_method, "bound_values": self.bound_values, "optimum_s": self.optimum_s,
                "certified_gap": self.gap, "error": self.error, "metrics": self.metrics}


def _label(scheduler: Any, schedule: Schedule | None) -> str:
    """What to call the schedule's author: the scheduler given, else the one its meta names."""
    if isinstance(scheduler, str):
        return scheduler
    if scheduler is not None:
        return getattr(scheduler, "name", type(scheduler).__name__)
    meta = schedule.meta.get("scheduler") if schedule is not None else None
    if isinstance(meta, dict) and isinstance(meta.get("name"), str):
        return meta["name"]
    if isinstance(meta, str):
        return meta
    if schedule is not None and schedule.meta.get("solver"):
        return f"solve:{schedule.meta['solver']}"
    return "unnamed schedule"


def _metric_key(objective) -> str:
    """The key of ``infermax.metrics`` (and of ``reported_metrics()``) for an untagged objective."""
    if objective.metric == "latency":
        return "latency_s"
    if objective.metric == "throughput":
        return "tps"
    stat = "mean" if objective.quantile is None else f"p{objective.quantile:g}"
    return f"{objective.metric}_{stat}_s"


def check_scheduler(scheduler: Any, workload: Any, limits: Any = None, cost: Any = None, *,
                    objective: str = "latency", schedule: Schedule | None = None,
                    claimed_latency_s: float | None = None, claimed_value_s: float | None = None,
                    optimum: bool = True, optimum_max_requests: int = 6, optimum_time_limit_s: float = 30.0,
                    methods: tuple[str, ...] | None = None, search_time_limit_s: float = 10.0,
                    progress: Callable[[str], None] | None = None) -> CheckResult:
    """Check ``scheduler`` (a name, import path or instance) — or a ``schedule`` made elsewhere
    (``scheduler`` is then only its label; None: the scheduler named in the schedule's meta, if any) —
    on ``objective``. The solver optimum is sought for the untagged means and the latency only.
    ``methods``: the bound methods of :func:`~infermax.bounds.lower_bound` (default: the cheap ones that
    apply); name ``search`` to add the class-state A* for ``search_time_limit_s``."""
    from . import cheap_methods, lower_bound

    obj = parse_objective(objective)
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    members(workload, obj.tag)             # an unknown tag fails before any work, naming the known ones
    if scheduler is None and schedule is None:
        raise ValueError("check_scheduler needs a scheduler or a schedule")
    if obj.metric == "latency" and claimed_value_s is None:
        claimed_value_s = claimed_latency_s
    name = _label(scheduler, schedule)
    sched = None
    try:
        if schedule is None:
            sched = get_scheduler(scheduler)
            name = sched.name
            if progress is not None:
                progress("simulate")
            schedule = simulate(workload, sched, limits, cost).schedule
        if progress is not None:
            progress("replay")
        trace = replay(schedule, workload, limits, cost)
    except ScheduleError as exc:
        return CheckResult(scheduler=name, objective=objective, exit_code=INVALID, error=str(exc))
    measured = compute_metrics(trace)
    value = trace_value(obj, trace)
    if claimed_value_s is None and obj.tag is None and sched is not None and hasattr(sched, "reported_metrics"):
        claim = sched.reported_metrics().get(_metric_key(obj))
        claimed_value_s = None if claim is None else float(claim)
    if methods is None:
        methods = cheap_methods(objective)
    bound = lower_bound(workload, limits, cost, objective=objective, upper=measured["latency_s"],
                        methods=tuple(methods), search_time_limit_s=search_time_limit_s, progress=progress)
    bound_values, best_value, best_method = dict(bound.values), bound.value, bound.method
    optimum_s = None
    if optimum and obj.solver_name is not None and len(workload) <= optimum_max_requests:
        from infermax.csp import solve_optimal

        if progress is not None:
            progress("milp")
        res = solve_optimal(workload, limits=limits, cost=cost, objective=obj.solver_name,
                            time_limit_s=optimum_time_limit_s)
        if res.status == "optimal":
            optimum_s = float(res.objective)
        if res.bound is not None:          # certified, as solve_optimal's bounds always are
            bound_values["milp"] = float(res.bound)
            better = res.bound < best_value if obj.metric == "throughput" else res.bound > best_value
            if better:
                best_value, best_method = float(res.bound), "milp"
    code, error = VALID, None
    tol = 1e-9 * max(1.0, abs(best_value))
    sign = -1.0 if obj.metric == "throughput" else 1.0      # throughput's bound is a ceiling
    what = objective if obj.metric != "latency" else "latency"
    unit = "tokens/s" if obj.metric == "throughput" else "s"
    if claimed_value_s is not None and sign * (claimed_value_s - best_value) < -tol:
        code = BEATS_BOUND
        error = (f"claimed {what} {claimed_value_s:.6g} {unit} beats the certified bound {best_value:.6g} {unit} "
                 f"({best_method}); replay measures {value:.6g} {unit}: an accounting bug")
    elif sign * (value - best_value) < -tol:
        code = BEATS_BOUND
        error = (f"replayed {what} {value:.6g} {unit} is below the certified bound "
                 f"{best_value:.6g} {unit} ({best_method}): an accounting bug in infermax")
    return CheckResult(scheduler=name, exit_code=code, objective=objective, value_s=value,
                       claimed_value_s=claimed_value_s, latency_s=measured["latency_s"],
                       claimed_latency_s=claimed_latency_s if claimed_latency_s is not None
                       else claimed_value_s if obj.metric == "latency" else None,
                       bound_s=best_value, bound_method=best_method,
                       bound_values=bound_values, optimum_s=optimum_s, error=error, metrics=measured)
