"""What every backend returns, and the errors they raise.

A backend is a module with ``NAME``, ``PIP`` (the install command),
``is_available()`` and ``solve(model, time_limit_s, threads, hint, rel_gap, log)``.
Solvers are imported inside those functions, never at module import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATUSES = ("optimal", "feasible", "infeasible", "unknown")


class BackendUnavailable(RuntimeError):
    """The solver package of a backend is not installed."""

    def __init__(self, name: str, pip: str) -> None:
        super().__init__(f"backend {name!r} needs a solver that is not installed; install it with: {pip}")


class ModelTooLarge(RuntimeError):
    """The solver's licence caps the model size (e.g. gurobipy's pip licence)."""


@dataclass(frozen=True)
class SolveResult:
    """A backend's answer: status, variable values (None without a solution), objective and bound."""

    status: str
    values: np.ndarray | None
    objective: float | None
    bound: float | None
    wall_s: float
    backend: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"SolveResult.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def has_solution(self) -> bool:
        return self.values is not None


def hint_vector(model, hint: dict[int, float] | None) -> dict[int, float]:
    """The hint to pass on: ``hint`` if given, else the model's own."""
    return dict(model.hint) if hint is None else dict(hint)


def objective_scale(model) -> float:
    """A power of ten that brings the largest objective coefficient near 1-10.

    Costs in seconds span 1e-9 (prefill attention per token²) to 1e-2 (a batch);
    MIP solvers treat tiny costs as noise, so the objective is solved in scaled units.
    """
    big = max((abs(c) for c in model.objective.terms.values()), default=1.0) or 1.0
    return 10.0 ** (-math.floor(math.log10(big)))


@dataclass(frozen=True)
class MipInput:
    """What a MIP backend solves: the translated model (hint merged), its facts and objective scale."""

    milp: Any
    facts: dict[str, Any]
    scale: float
    num_original: int


def prepare_mip(model, hint: dict[int, float] | None, indicators: str, products: str, big_m: str) -> MipInput:
    """The common first step of the MIP backends: translate (:func:`~..linearize.to_milp`), merge the hint."""
    from ..linearize import to_milp

    hints = hint_vector(model, hint)
    milp, facts = to_milp(model, indicators=indicators, products=products, big_m=big_m)
    if hint is not None:
        milp.hint = {**milp.hint, **hints}
    return MipInput(milp, facts, objective_scale(milp), model.num_vars)


def original_values(mip: MipInput, raw) -> np.ndarray:
    """The solver's values of the original model's variables, integers rounded."""
    values = np.asarray(raw, dtype=np.float64)[:mip.num_original]
    return np.where(np.array(mip.milp.integer[:mip.num_original]), np.round(values), values)


def run_isolated(fn, payload: dict, timeout_s: float):
    """Run ``fn(payload)`` in a fresh (spawned) Python process and return its result.

    Used for solvers whose native libraries cannot share a process with others
    (highspy 1.15 and ortools 9.15 each export HiGHS symbols; whichever loads
    second fails). A child that overruns ``timeout_s`` is terminated and None is
    returned.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(fn, payload, child), daemon=True)
    proc.start()
    child.close()
    result = None
    try:
        if parent.poll(timeout_s):
            result = parent.recv()
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join(5)
        parent.close()
    if isinstance(result, BaseException):
        raise result
    return result


def _child_main(fn, payload, conn) -> None:
    try:
        conn.send(fn(payload))
    except BaseException as exc:  # noqa: BLE001 - shipped back to the parent and re-raised there
        conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()
