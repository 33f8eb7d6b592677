"""check_scheduler: how far is a scheduler from optimal, with a certificate.

Simulates the scheduler (or takes a schedule produced elsewhere), replays it —
the judge — and compares its replayed value of the chosen ``objective`` (latency by
default; any name of `objectives`: ttft, e2e, tpot, ttft_p99, ttft:short, ...) with the
best certified lower bound and, for small instances, with the solver optimum. Exit codes (the CLI
returns them): 0 valid; 2 invalid schedule (replay's error); 3 the scheduler's
own claim beats the certified bound, which can only be an accounting bug; 4 (:func:`check_schedulers`
only) the scheduler refused the instance (a ValueError: e.g. no chunked prefill for a prompt
longer than ``min(C, P)``), reported beside the others.

The bound (and the solver optimum) of an instance is the same for every scheduler checked against
it: :func:`check_schedulers` computes it once per objective (:func:`reference_bound`) and
:func:`check_scheduler` takes it as ``reference``. When the optimum is not reported,
``optimum_note`` says why (not asked, no exact solver for the objective, too many requests, or the
solver's status within its time limit).

A scheduler may state its own result through an optional ``reported_metrics()``
method (a dict with ``latency_s``, and for other objectives the key of
``infermax.metrics`` such as ``ttft_mean_s``, ``e2e_p99_s``); an external simulator
passes ``claimed_value_s`` (``claimed_latency_s`` for the latency). Claims are never
trusted: they are checked against the bound and against replay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from infermax.engine import simulate
from infermax.inputs import resolve_inputs
from infermax.metrics import metrics as compute_metrics
from infermax.replay import replay
from infermax.schedulers import get_scheduler
from infermax.state import ScheduleError
from infermax.types import Schedule

from .objectives import members, parse_objective, trace_value

VALID, INVALID, BEATS_BOUND, REFUSED = 0, 2, 3, 4


@dataclass(frozen=True, kw_only=True)
class Reference:
    """What a scheduler's value is compared with on one instance and objective: the best certified
    bound (``value``, by ``method``; ``values`` of every method) and the solver optimum, or
    ``optimum_note`` saying why there is none."""

    value: float
    method: str
    values: dict[str, float]
    optimum_s: float | None = None
    optimum_note: str | None = None


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
    optimum_note: str | None = None         # why ``optimum_s`` is None (None when it is reported)
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Certified optimality gap: (value - bound) / value (throughput: (bound - value) / bound)."""
        if self.value_s is None or self.bound_s is None:
            return None
        if parse_objective(self.objective).spec.sense == "max":      # throughput: the bound is a ceiling
            return (self.bound_s - self.value_s) / self.bound_s
        return (self.value_s - self.bound_s) / self.value_s if self.value_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "exit_code": self.exit_code,
                "valid": None if self.exit_code == REFUSED else self.exit_code != INVALID,
                "objective": self.objective, "value_s": self.value_s, "claimed_value_s": self.claimed_value_s,
                "latency_s": self.latency_s, "claimed_latency_s": self.claimed_latency_s, "bound_s": self.bound_s,
                "bound_method": self.bound_method, "bound_values": self.bound_values, "optimum_s": self.optimum_s,
                "optimum_note": self.optimum_note, "certified_gap": self.gap, "error": self.error,
                "metrics": self.metrics}


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


def _finite_claim(value: Any, what: str) -> float | None:
    """A claimed value as a float; ValueError naming ``what`` for NaN, an infinity or a non-number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _run(scheduler: Any, schedule: Schedule | None, workload, limits, cost,
         progress: Callable[[str], None] | None) -> tuple[str, Any, Schedule | None, Any]:
    """(label, scheduler object or None, schedule, replayed trace or the ScheduleError): simulate (unless a
    ``schedule`` is given) and replay. A scheduler that refuses the instance raises ValueError."""
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
        return name, sched, schedule, replay(schedule, workload, limits, cost)
    except ScheduleError as exc:
        return name, sched, schedule, exc


def reference_bound(workload: Any, limits: Any = None, cost: Any = None, *, objective: str = "latency",
                    upper: float | None = None, optimum: bool = True, optimum_max_requests: int = 6,
                    optimum_time_limit_s: float = 30.0, methods: tuple[str, ...] | None = None,
                    search_time_limit_s: float = 10.0, progress: Callable[[str], None] | None = None) -> Reference:
    """The certified bound and the solver optimum of one instance and objective, for every scheduler
    checked against it (``upper``: a known achievable latency, which only steers the Lagrangian)."""
    from . import cheap_methods, lower_bound

    obj = parse_objective(objective)
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    if methods is None:
        methods = cheap_methods(objective)
    bound = lower_bound(workload, limits, cost, objective=objective, upper=upper,
                        methods=tuple(methods), search_time_limit_s=search_time_limit_s, progress=progress)
    bound_values, best_value, best_method = dict(bound.values), bound.value, bound.method
    optimum_s, note = None, None
    if not optimum:
        note = "not asked (--no-optimum)"
    elif obj.solver_name is None:
        note = f"no exact solver for objective {objective!r} (quantiles and tags are bounded, not solved)"
    elif len(workload) > optimum_max_requests:
        note = f"too large: {len(workload)} requests > {optimum_max_requests} (the exact solve runs on small instances)"
    else:
        from infermax.optimal import solve_optimal

        if progress is not None:
            progress("milp")
        res = solve_optimal(workload, limits=limits, cost=cost, objective=obj.solver_name,
                            time_limit_s=optimum_time_limit_s)
        if res.status == "optimal":
            optimum_s = float(res.objective)
        else:
            gap = f", gap {100 * res.gap:.3g} %" if res.gap is not None else ""
            note = (f"not proven within the {optimum_time_limit_s:g} s time limit (solver status {res.status}{gap})"
                    if res.status in ("feasible", "unknown") else f"solver status {res.status}")
        if res.bound is not None:          # certified, as solve_optimal's bounds always are
            bound_values["milp"] = float(res.bound)
            better = res.bound < best_value if obj.spec.sense == "max" else res.bound > best_value
            if better:
                best_value, best_method = float(res.bound), "milp"
    return Reference(value=best_value, method=best_method, values=bound_values, optimum_s=optimum_s,
                     optimum_note=note)


def check_scheduler(scheduler: Any, workload: Any, limits: Any = None, cost: Any = None, *,
                    objective: str = "latency", schedule: Schedule | None = None,
                    claimed_latency_s: float | None = None, claimed_value_s: float | None = None,
                    optimum: bool = True, optimum_max_requests: int = 6, optimum_time_limit_s: float = 30.0,
                    methods: tuple[str, ...] | None = None, search_time_limit_s: float = 10.0,
                    progress: Callable[[str], None] | None = None, reference: Reference | None = None) -> CheckResult:
    """Check ``scheduler`` (a name, import path or instance) — or a ``schedule`` made elsewhere
    (``scheduler`` is then only its label; None: the scheduler named in the schedule's meta, if any) —
    on ``objective``. The solver optimum is sought for the untagged means and the latency only.
    ``methods``: the bound methods of :func:`~infermax.bounds.lower_bound` (default: the cheap ones that
    apply); name ``search`` to add the class-state A* for ``search_time_limit_s``. ``reference``: the
    instance's bound already computed (:func:`reference_bound`; the bound options are then unused).
    A claimed value that is NaN or infinite is refused (ValueError)."""
    obj = parse_objective(objective)
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    members(workload, obj.tag)             # an unknown tag fails before any work, naming the known ones
    if scheduler is None and schedule is None:
        raise ValueError("check_scheduler needs a scheduler or a schedule")
    claimed_latency_s = _finite_claim(claimed_latency_s, "claimed_latency_s")
    claimed_value_s = _finite_claim(claimed_value_s, "claimed_value_s")
    run = _run(scheduler, schedule, workload, limits, cost, progress)
    if reference is None and not isinstance(run[3], ScheduleError):
        reference = reference_bound(workload, limits, cost, objective=objective,
                                    upper=compute_metrics(run[3])["latency_s"], optimum=optimum,
                                    optimum_max_requests=optimum_max_requests,
                                    optimum_time_limit_s=optimum_time_limit_s, methods=methods,
                                    search_time_limit_s=search_time_limit_s, progress=progress)
    return _verdict(run, obj, objective, reference, claimed_latency_s, claimed_value_s)


# complexity: one branch per verdict (refused, claimed below the bound, measured below it, ok), in order
def _verdict(run, obj, objective: str, reference: Reference | None, claimed_latency_s: float | None,
             claimed_value_s: float | None) -> CheckResult:
    """The check of one replayed run (:func:`_run`) against the instance's ``reference``."""
    name, sched, schedule, trace = run
    if isinstance(trace, ScheduleError):
        return CheckResult(scheduler=name, objective=objective, exit_code=INVALID, error=str(trace))
    if obj.metric == "latency" and claimed_value_s is None:
        claimed_value_s = claimed_latency_s
    measured = compute_metrics(trace)
    value = trace_value(obj, trace)
    if claimed_value_s is None and obj.tag is None and sched is not None and hasattr(sched, "reported_metrics"):
        claim = sched.reported_metrics().get(obj.spec.metric_key)
        claimed_value_s = None if claim is None else float(claim)
    bound_values, best_value, best_method = dict(reference.values), reference.value, reference.method
    optimum_s = reference.optimum_s
    code, error = VALID, None
    tol = 1e-9 * max(1.0, abs(best_value))
    sign = -1.0 if obj.spec.sense == "max" else 1.0      # throughput's bound is a ceiling
    what = objective if obj.metric != "latency" else "latency"
    unit = obj.spec.unit
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
                       bound_values=bound_values, optimum_s=optimum_s, optimum_note=reference.optimum_note,
                       error=error, metrics=measured)


# complexity: one loop over schedulers and objectives with one branch per refusal and option
def check_schedulers(schedulers: Sequence[Any], workload: Any, limits: Any = None, cost: Any = None, *,
                     objectives: Sequence[str] = ("latency",), schedule: Schedule | None = None,
                     claimed_latency_s: float | None = None, claimed_value_s: float | None = None,
                     optimum: bool = True, optimum_max_requests: int = 6, optimum_time_limit_s: float = 30.0,
                     methods: tuple[str, ...] | None = None, search_time_limit_s: float = 10.0,
                     progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """:func:`check_scheduler` for each scheduler and objective (scheduler-major), each scheduler simulated
    once and each objective's bound computed once for all of them (``upper``: the best latency among
    them). A scheduler that refuses the instance gets a result with exit code 4 and its reason as
    ``error``, beside the others'. A claim (``claimed_*``) needs one scheduler and one objective."""
    objs = [parse_objective(o) for o in objectives]
    workload, limits, cost = resolve_inputs(workload, limits, cost)
    for obj in objs:
        members(workload, obj.tag)
    if (claimed_latency_s is not None or claimed_value_s is not None) and len(objectives) * len(schedulers) > 1:
        raise ValueError(f"a claimed value is one scheduler's claim on one objective; got {len(schedulers)} "
                         f"scheduler(s) and {len(objectives)} objectives ({', '.join(objectives)})")
    claimed_latency_s = _finite_claim(claimed_latency_s, "claimed_latency_s")
    claimed_value_s = _finite_claim(claimed_value_s, "claimed_value_s")
    runs: list[tuple[Any, Any]] = []                         # (run, or the refusal's message)
    for scheduler in schedulers:
        try:
            runs.append((_run(scheduler, schedule, workload, limits, cost, progress), None))
        except ValueError as exc:
            runs.append((None, str(exc)))
    latencies = [compute_metrics(r[3])["latency_s"] for r, _ in runs if r is not None
                 and not isinstance(r[3], ScheduleError)]
    refs = {o: reference_bound(workload, limits, cost, objective=o, upper=min(latencies), optimum=optimum,
                               optimum_max_requests=optimum_max_requests, optimum_time_limit_s=optimum_time_limit_s,
                               methods=methods, search_time_limit_s=search_time_limit_s, progress=progress)
            for o in objectives} if latencies else {}
    out = []
    for scheduler, (run, refusal) in zip(schedulers, runs):
        for o, obj in zip(objectives, objs):
            if run is None:
                out.append(CheckResult(scheduler=_label(scheduler, schedule), objective=o, exit_code=REFUSED,
                                       error=refusal))
            else:
                out.append(_verdict(run, obj, o, refs.get(o), claimed_latency_s, claimed_value_s))
    return out


# --- the decisions behind ``infermax bound`` (the command line parses, calls these and prints) ----------------
def parse_objectives(spec: str, cluster: bool = False) -> list[str]:
    """The objective names of ``spec`` (comma separated, or ``all``: :data:`~infermax.bounds.objectives.ALL`,
    less ``tpot`` for a cluster), each checked (an unknown one fails before any work)."""
    from .objectives import ALL

    objectives = list(ALL) if spec == "all" else [o.strip() for o in spec.split(",")]
    for objective in objectives:
        parse_objective(objective)
    return [o for o in objectives if o != "tpot" or spec != "all"] if cluster else objectives


def parse_methods(spec: str | None) -> tuple[str, ...] | None:
    """The bound methods of ``spec`` (comma separated; ``None``: the default ones), each a known one."""
    from infermax.schedulers import split_specs

    from .api import METHODS  # the complete registry (the solving methods register with lower_bound)

    methods = None if spec is None else tuple(split_specs(spec))
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown or methods == ():
        raise ValueError(f"--methods {spec!r}: unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    return methods


def schedulers_to_check(spec: str | None, workload: Any, limits: Any, default: str) -> tuple[list[str], list[str]]:
    """(names, notes): the schedulers of ``spec`` (comma separated), each known; ``None``: those of ``default``,
    each left out with a note (sarathi then runs) when it cannot serve the workload, which must fit the limits."""
    from infermax.multirun import schedulers_to_run

    if spec is None:
        workload.check_fits(limits)
    return schedulers_to_run(spec, default, workload, limits)


def check_claims(claimed_latency_s: float | None, claimed_value_s: float | None, objectives: Sequence[str],
                 names: Sequence[Any]) -> None:
    """A claim must be a finite number, and one scheduler's on one objective."""
    for flag, value in (("--claimed-latency", claimed_latency_s), ("--claimed-value", claimed_value_s)):
        if value is None:
            continue
        if not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number of seconds (tokens/s for throughput), got {value}")
        if len(objectives) > 1 or len(names) > 1:
            raise ValueError(f"{flag} {value:g} is one scheduler's claim on one objective; got "
                             f"{len(names)} scheduler(s) and {len(objectives)} objective(s) "
                             f"({', '.join(objectives)})")


def exit_code(results: Sequence[CheckResult]) -> int:
    """The most serious verdict: 3 (a value beats the bound) > 2 (an invalid schedule) > 5 (every
    scheduler refused the instance) > 4 (some did) > 0."""
    codes = {r.exit_code for r in results}
    for code in (BEATS_BOUND, INVALID):
        if code in codes:
            return code
    if REFUSED in codes:
        return 5 if codes == {REFUSED} else 4
    return VALID
