"""check_scheduler: how far is a scheduler from optimal, with a certificate.

Simulates the scheduler (or takes a schedule produced elsewhere), replays it —
the judge — and compares its replayed latency with the best certified lower
bound and, for small instances, with the solver optimum. Exit codes (the CLI
returns them): 0 valid; 2 invalid schedule (replay's error); 3 the scheduler's
own claim beats the certified bound, which can only be an accounting bug.

A scheduler may state its own result through an optional ``reported_metrics()``
method (a dict with ``latency_s``); an external simulator passes
``claimed_latency_s``. Claims are never trusted: they are checked against the
bound and against replay.
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

VALID, INVALID, BEATS_BOUND = 0, 2, 3


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Verdict of a scheduler check; ``exit_code`` is 0, 2 or 3 (see module docstring)."""

    scheduler: str
    exit_code: int
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
        """Certified optimality gap: (latency - bound) / latency."""
        if self.latency_s is None or self.bound_s is None:
            return None
        return (self.latency_s - self.bound_s) / self.latency_s

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "exit_code": self.exit_code, "valid": self.exit_code != INVALID,
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


def check_scheduler(scheduler: Any, workload: Any, limits: Any = None, cost: Any = None, *,
                    schedule: Schedule | None = None, claimed_latency_s: float | None = None,
                    optimum: bool = True, optimum_max_requests: int = 6, optimum_time_limit_s: float = 30.0,
                    progress: Callable[[str], None] | None = None) -> CheckResult:
    """Check ``scheduler`` (a name, import path or instance) — or a ``schedule`` made elsewhere
    (``scheduler`` is then only its label; None: the scheduler named in the schedule's meta, if any)."""
    from . import lower_bound

    workload, limits, cost = resolve_inputs(workload, limits, cost)
    if scheduler is None and schedule is None:
        raise ValueError("check_scheduler needs a scheduler or a schedule")
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
        return CheckResult(scheduler=name, exit_code=INVALID, error=str(exc))
    measured = compute_metrics(trace)
    if claimed_latency_s is None and sched is not None and hasattr(sched, "reported_metrics"):
        claimed_latency_s = float(sched.reported_metrics()["latency_s"])
    bound = lower_bound(workload, limits, cost, upper=measured["latency_s"],
                        methods=("work", "lp", "lagrangian"), progress=progress)
    optimum_s = None
    if optimum and len(workload) <= optimum_max_requests:
        from infermax.csp import solve_optimal

        if progress is not None:
            progress("milp")
        res = solve_optimal(workload, limits=limits, cost=cost, time_limit_s=optimum_time_limit_s)
        if res.status == "optimal":
            optimum_s = float(res.objective)
        bound_values = dict(bound.values)
        best_value, best_method = bound.value, bound.method
        if res.bound is not None:          # certified, as solve_optimal's bounds always are
            bound_values["milp"] = float(res.bound)
            if res.bound > bound.value:
                best_value, best_method = float(res.bound), "milp"
    else:
        bound_values, best_value, best_method = dict(bound.values), bound.value, bound.method
    code, error = VALID, None
    tol = 1e-9 * max(1.0, best_value)
    if claimed_latency_s is not None and claimed_latency_s < best_value - tol:
        code = BEATS_BOUND
        error = (f"claimed latency {claimed_latency_s:.6g} s beats the certified bound {best_value:.6g} s "
                 f"({best_method}); replay measures {measured['latency_s']:.6g} s: an accounting bug")
    elif measured["latency_s"] < best_value - tol:
        code = BEATS_BOUND
        error = (f"replayed latency {measured['latency_s']:.6g} s is below the certified bound "
                 f"{best_value:.6g} s ({best_method}): an accounting bug in infermax")
    return CheckResult(scheduler=name, exit_code=code, latency_s=measured["latency_s"],
                       claimed_latency_s=claimed_latency_s, bound_s=best_value, bound_method=best_method,
                       bound_values=bound_values, optimum_s=optimum_s, error=error, metrics=measured)
