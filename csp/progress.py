"""What ``solve_optimal`` knows so far: the best schedule, the best certified bound, and who is told.

A :class:`Tracker` lives for one call. Each stage hands it what it found
(:meth:`Tracker.offer`); it keeps the better schedule and the tighter bound
(:func:`.result.combine`), and the horizon-free bound of
:func:`infermax.lower_bound` on the side, and reports every change to the
caller's ``progress`` callback as a :class:`SolveProgress`. When time runs out
or the user presses Ctrl-C, :meth:`Tracker.final` is still a complete,
replayed result: the best schedule known (the warm start at worst) with the
best certified bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .backends import SolveStatus
from .budget import Budget
from .result import OptimalResult, combine, from_warm_start, is_better_bound, is_within, relative_gap, with_bound
from .warmstart import WarmStart


@dataclass(frozen=True, slots=True)
class SolveProgress:
    """One progress event: the stage, seconds since the call began, and the best objective, bound and gap."""

    stage: str
    elapsed_s: float
    objective: float | None
    bound: float | None
    gap: float | None
    note: str = ""

    def line(self) -> str:
        """One human-readable line (what ``infermax solve`` prints)."""
        fmt = lambda x: "-" if x is None else f"{x:.6g}"
        gap = "-" if self.gap is None else f"{100 * self.gap:.3g}%"
        note = f"  ({self.note})" if self.note else ""
        return (f"[{self.elapsed_s:7.1f} s] {self.stage:<22} objective {fmt(self.objective)}  "
                f"bound {fmt(self.bound)}  gap {gap}{note}")


class Tracker:
    """The best result and bound of one ``solve_optimal`` call, and its progress reports."""

    def __init__(self, objective: str, rel_gap: float, budget: Budget,
                 callback: Callable[[SolveProgress], None] | None) -> None:
        self.objective, self.rel_gap, self.budget, self.callback = objective, rel_gap, budget, callback
        self.best: OptimalResult | None = None        # from the solving stages
        self.fallback: OptimalResult | None = None    # the warm start
        self.bound: Any = None                        # infermax.bounds.Bound, horizon-free
        self.finished = False                         # a stage gave the final answer (e.g. infeasible)
        self.stopped: str | None = None
        self._stage = "start"

    # --- what the stages report -------------------------------------------------
    def stage(self, name: str) -> None:
        self._stage = name
        self._emit()

    def warm_start(self, ws: WarmStart | None, workload, limits, cost) -> None:
        if ws is not None:
            self.fallback = from_warm_start(ws, workload, limits, cost, self.objective, self.budget.start)
            self._emit(f"from {ws.name}")

    def lower_bound(self, bound) -> None:
        self.bound = bound
        if bound is not None:
            self._emit(f"{bound.method} bound")

    def offer(self, result: OptimalResult, final: bool = False) -> None:
        """Keep ``result`` if it is better; a stage the user interrupted (Ctrl-C inside a solver that
        caught it and returned its best) re-raises KeyboardInterrupt once its answer is kept."""
        self.best = result if self.best is None else combine(self.best, result, self.rel_gap, self.budget.start)
        self.finished = self.finished or final
        self._emit(f"{result.info.get('method', '')}: {result.status}")
        if result.info.get("interrupted"):
            raise KeyboardInterrupt

    def stop(self, reason: str) -> None:
        self.stopped = reason
        self._emit(reason)

    # --- reading it -----------------------------------------------------------------
    def is_done(self) -> bool:
        """Nothing left to gain: a final answer, a certified gap within rel_gap, or no time left."""
        return self.finished or self.budget.expired or is_within(self._current()[2], self.rel_gap)

    def final(self) -> OptimalResult:
        """The best schedule known with the best certified bound (see module docstring)."""
        result = self.best
        if result is None:
            result = self.fallback
        elif self.fallback is not None and result.status != SolveStatus.INFEASIBLE and \
                result.info.get("target") is None:
            result = combine(self.fallback, result, self.rel_gap, self.budget.start)   # never worse than it
        if result is None:
            result = OptimalResult(schedule=None, objective=None, bound=None, gap=None, status=SolveStatus.UNKNOWN,
                                   backend="none", wall_s=self.budget.elapsed(), objective_name=self.objective,
                                   info={"method": "none", "solution_from": None})
        if self.bound is not None:
            result = with_bound(result, self.bound.value, f"lower_bound:{self.bound.method}", self.rel_gap,
                                self.budget.start)
        if self.stopped is not None:
            result.info["stopped"] = self.stopped
        self._stage = "done"
        self._emit(result.status, result)
        return result

    def _current(self) -> tuple[float | None, float | None, float | None]:
        """(objective, bound, gap) of the best known result and bound."""
        result = self.best if self.best is not None and self.best.objective is not None else self.fallback
        objective = result.objective if result is not None else None
        bound = result.bound if result is not None else None
        if self.bound is not None and is_better_bound(self.bound.value, bound, self.objective):
            bound = self.bound.value
        return objective, bound, relative_gap(objective, bound, self.objective)

    def _emit(self, note: str = "", result: OptimalResult | None = None) -> None:
        if self.callback is None:
            return
        if result is not None:
            objective, bound, gap = result.objective, result.bound, result.gap
        else:
            objective, bound, gap = self._current()
        self.callback(SolveProgress(self._stage, self.budget.elapsed(), objective, bound, gap, note))
