"""What every backend returns, and the errors they raise.

A backend is a module with ``NAME``, ``PIP`` (the install command),
``is_available()`` and ``solve(model, time_limit_s, threads, hint, rel_gap, log)``.
Solvers are imported inside those functions, never at module import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np


class SolveStatus(str, Enum):
    """How a solve ended. A ``str``, so that ``status == SolveStatus.OPTIMAL``, JSON and printing keep the plain names.

    OPTIMAL: within the gap asked for, on a horizon proven to hold an optimum; FEASIBLE: a schedule
    without that proof; INFEASIBLE: no schedule (within the horizon, or better than the target);
    UNKNOWN: nothing found in time.
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class BackendUnavailable(ImportError):
    """The solver package of a backend is not installed (an ImportError: the CLI reports it as bad input)."""

    def __init__(self, name: str, pip: str) -> None:
        super().__init__(f"backend {name!r} needs a solver that is not installed; install it with: {pip}")


class ModelTooLarge(ValueError):
    """The solver's licence caps the model size (e.g. gurobipy's pip licence): this instance is too large for
    this backend (a ValueError: the CLI reports it as bad input, exit status 2)."""


@dataclass(frozen=True)
class SolveResult:
    """A backend's answer: status, variable values (None without a solution), objective and bound."""

    status: SolveStatus
    values: np.ndarray | None
    objective: float | None
    bound: float | None
    wall_s: float
    backend: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.status, SolveStatus):    # a backend converts its solver's status itself
            raise ValueError(f"SolveResult.status must be a SolveStatus ({', '.join(s.name for s in SolveStatus)}), "
                             f"got {self.status!r}")

    @property
    def has_solution(self) -> bool:
        return self.values is not None


def hint_vector(model, hint: dict[int, float] | None) -> dict[int, float]:
    """The hint to pass on: ``hint`` if given, else the model's own."""
    return dict(model.hint) if hint is None else dict(hint)


#: the size the objective is solved at by MIP backends: values near 1e3-1e4 keep every solver's
#: absolute tolerances (HiGHS's mip_abs_gap is 1e-6 by default) far below a relative 1e-9
OBJECTIVE_MAGNITUDE = 1e3
#: relative error allowed for a MIP solver's dual bound beyond its gap tolerances (LP feasibility and
#: optimality tolerances of 1e-9..1e-7 on an objective scaled to ~1e3): taken off every MIP bound
MIP_BOUND_MARGIN = 1e-9


def objective_scale(model, value: float | None = None) -> float:
    """A power of ten that brings the objective to ~1e3 (or its largest coefficient near 1-10).

    Costs in seconds span 1e-9 (prefill attention per token²) to 1e-2 (a batch), and an online
    objective is a single time variable worth ~0.01-100 s: MIP solvers treat differences below their
    absolute tolerances (1e-6) as zero, so the objective is solved in scaled units. ``value`` (the
    objective at the warm start) sets the scale so that the optimum is ~1e3-1e4; without one, the
    largest coefficient is brought near 1.
    """
    if value is not None and math.isfinite(value) and value > 0:
        return 10.0 ** (math.floor(math.log10(OBJECTIVE_MAGNITUDE)) - math.floor(math.log10(value)))
    big = max((abs(c) for c in model.objective.terms.values()), default=1.0) or 1.0
    return 10.0 ** (-math.floor(math.log10(big)))


def certified_bound(bound: float | None, objective: float | None, status: str, rel_gap: float,
                    abs_gap: float) -> float | None:
    """The lower bound a MIP solver's answer certifies, in the solver's (scaled) units.

    A solver that stops on its gap tolerances may report a dual bound equal to its incumbent
    (HiGHS does; PuLP/CBC give no bound and only say "optimal"): nodes pruned because their bound
    came within ``abs_gap`` or ``rel_gap`` of the incumbent are gone from the open set. What stays
    certified is the lesser of the reported bound and ``incumbent - max(abs_gap, rel_gap·|incumbent|)``,
    lowered once more by :data:`MIP_BOUND_MARGIN` for the solver's LP tolerances. ``status`` is the
    backend's ("optimal": the incumbent is proven within those gaps even without a reported bound).
    """
    candidates = [b for b in (bound,) if b is not None and math.isfinite(b)]
    if objective is not None and math.isfinite(objective) and (candidates or status == SolveStatus.OPTIMAL):
        candidates.append(objective - max(abs_gap, rel_gap * abs(objective)))
    if not candidates:
        return None
    low = min(candidates)
    return low - MIP_BOUND_MARGIN * max(abs(low), abs(objective or 0.0))


def solver_gaps(rel_gap: float) -> tuple[float, float]:
    """(relative, absolute) gap tolerances a MIP backend passes to its solver for a requested ``rel_gap``.

    Half the requested gap, so that the certified bound (:func:`certified_bound`, which takes the
    solver's tolerance off) still proves ``rel_gap``; the absolute gap is negligible at
    :data:`OBJECTIVE_MAGNITUDE`.
    """
    return rel_gap / 2, 1e-9


@dataclass(frozen=True)
class MipInput:
    """What a MIP backend solves: the translated model (hint merged), its facts and objective scale."""

    milp: Any
    facts: dict[str, Any]
    scale: float
    num_original: int


def prepare_mip(model, hint: dict[int, float] | None, indicators: str, products: str, big_m: str) -> MipInput:
    """The common first step of the MIP backends: translate (:func:`~..linearize.to_milp`), merge the
    hint, and scale the objective from its value at the hint (:func:`objective_scale`)."""
    from ..milp.linearize import to_milp

    hints = hint_vector(model, hint)
    milp, facts = to_milp(model, indicators=indicators, products=products, big_m=big_m)
    if hint is not None:
        milp.hint = {**milp.hint, **hints}
    value = None
    if hints and len(hints) >= model.num_vars:
        x = np.zeros(model.num_vars)
        for k, v in hints.items():
            if k < model.num_vars:
                x[k] = v
        value = model.objective_value(x)
    scale = objective_scale(milp, value)
    facts["objective_scale"] = scale
    return MipInput(milp, facts, scale, model.num_vars)


def original_values(mip: MipInput, raw) -> np.ndarray:
    """The solver's values of the original model's variables, integers rounded."""
    values = np.asarray(raw, dtype=np.float64)[:mip.num_original]
    return np.where(np.array(mip.milp.integer[:mip.num_original]), np.round(values), values)


def run_isolated(fn, payload: dict, timeout_s: float, log: bool = False):
    """Run ``fn(payload)`` in a fresh Python process (``python -m infermax.csp.backends.child``).

    Used for solvers that are safer in a process of their own: a child that overruns ``timeout_s``
    is killed (and None returned), and a solver's native library never shares the caller's process.
    The child is a module run with ``-m``, never the caller's ``__main__``, so a plain script, a
    notebook or a REPL may call it without an ``if __name__ == "__main__":`` guard (multiprocessing's
    ``spawn`` re-imports the caller's main module and crashes there). ``fn`` must be a module-level
    function; the payload goes over stdin and the result comes back over stdout, both pickled. What
    the solver prints goes to stderr when ``log`` is true, else nowhere. Ctrl-C kills the child and
    re-raises KeyboardInterrupt.
    """
    import pickle
    import subprocess
    import sys

    request = pickle.dumps((fn.__module__, fn.__qualname__, payload, bool(log)), protocol=pickle.HIGHEST_PROTOCOL)
    proc = subprocess.Popen([sys.executable, "-m", "infermax.csp.backends.child"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=None if log else subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(request, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    except BaseException:       # KeyboardInterrupt included: never leave the solver running
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0 or not out:
        raise RuntimeError(f"the solver process for {fn.__qualname__} ended with status {proc.returncode} "
                           f"and no result")
    result = pickle.loads(out)
    if isinstance(result, BaseException):
        raise result
    return result
