"""OR-Tools CP-SAT: native indicators (enforcement literals) and native integer products.

CP-SAT is integer-only. Continuous variables (times, seconds) live on a grid
of ``model.continuous_step_s``; a row with fractional coefficients is scaled by
K / step (K a power of two as large as int64 allows) and rounded, and the
objective is scaled by a power of two keeping its activity below 2^60. Times
then carry at most one grid step of error per batch and coefficients a relative
rounding error near 1e-9 (``info["objective_rounding_rel"]``), far below the
1e-6 replay check.
"""
from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import Any

import numpy as np

from ..milp.model import Model
from .base import BackendUnavailable, SolveResult, SolveStatus, hint_vector

NAME = "cpsat"
PIP = "pip install ortools"
#: the portfolio used when no thread count is given: the LP-based default worker (which also runs
#: the LNS helpers), the max-LP worker and the LB-tree search; measured in benchmarks/milp_bench.py
DEFAULT_PORTFOLIO = ("default_lp", "max_lp", "lb_tree_search")
_LIMIT = 2 ** 62


def is_available() -> bool:
    try:
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def _power_of_two_below(x: float) -> float:
    return 2.0 ** math.floor(math.log2(x)) if x >= 1.0 else 1.0


def _common_denominator(coefs: np.ndarray, limit: int = 10 ** 6) -> int | None:
    """The least d <= limit making every coefficient integral (to 1e-9), or None."""
    if np.array_equal(coefs, np.round(coefs)):
        return 1                      # most rows: integer coefficients (no Fraction needed)
    d = 1
    for c in coefs:
        frac = Fraction(float(c)).limit_denominator(limit)
        if abs(float(frac) - c) > 1e-9 * max(1.0, abs(c)):
            return None
        d = d * frac.denominator // math.gcd(d, frac.denominator)
        if d > limit:
            return None
    return d


def _scaled_row(row, coefs: np.ndarray, ranges: np.ndarray, continuous: bool, step: float):
    """Integer coefficients and bounds for one row; see the module docstring.

    Rows over integer variables whose coefficients are rationals with a small
    common denominator d are multiplied by d, exactly (rounding a tight row such
    as Σ (1/3)·x <= y could make it infeasible). Otherwise the row is multiplied
    by K/step (K a power of two keeping the activity below 2^61), so a continuous variable's coefficient a·step becomes
    a·K, exactly. An equality over a continuous variable becomes the band
    [b, b + K - 1]: the variable takes the grid point at (or next to) the exact value.
    """
    denominator = None if continuous else _common_denominator(coefs)
    if denominator is not None:
        s, band = float(denominator), 0          # exact: rational coefficients with a small denominator
    else:
        activity = float(np.sum(np.abs(coefs) * ranges)) / step or 1.0
        K = _power_of_two_below(2.0 ** 61 / activity)
        s, band = K / step, (int(K) - 1 if continuous and row.lb == row.ub else 0)
    ic = np.round(coefs * s).astype(np.int64)
    lo = -_LIMIT if not math.isfinite(row.lb) else math.ceil(row.lb * s - 1e-6)
    hi = _LIMIT if not math.isfinite(row.ub) else math.floor(row.ub * s + 1e-6) + band
    return ic, lo, hi


# complexity: one backend: translate each row kind, hint, solve, read back each status, in order
def solve(model: Model, time_limit_s: float, threads: int | None = None, hint: dict[int, float] | None = None,
          rel_gap: float = 1e-4, log: bool = False, params: dict | None = None) -> SolveResult:
    """Solve with CP-SAT; ``params`` are extra CpSolver parameters (name -> value).

    Long because it is the backend's whole translation loop, read top to bottom (scaled integer
    variables, rows, indicators and products, hint, parameters, read-back); splitting it would scatter
    one solver's API."""
    if not is_available():
        raise BackendUnavailable(NAME, PIP)
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    step = model.continuous_step_s
    cp = cp_model.CpModel()
    scale_of = np.array([1.0 if model.integer[k] else step for k in range(model.num_vars)])
    xs = []
    for k in range(model.num_vars):
        lo, hi = model.lb[k] / scale_of[k], model.ub[k] / scale_of[k]
        lo_i, hi_i = math.ceil(lo - 1e-9), math.floor(hi + 1e-9)
        if not (-_LIMIT < lo_i <= hi_i < _LIMIT):
            raise ValueError(f"cpsat: variable {model.names[k]} has an unusable domain [{model.lb[k]}, {model.ub[k]}]")
        xs.append(cp.NewIntVar(lo_i, hi_i, model.names[k]))
    ranges = np.maximum(np.abs(np.array(model.lb)), np.abs(np.array(model.ub))) / scale_of
    deadline = t0 + float(time_limit_s)
    for r, row in enumerate(model.rows):
        if r % 2048 == 2047 and time.perf_counter() > deadline:     # translation counts in the time limit
            return SolveResult(SolveStatus.UNKNOWN, None, None, None, time.perf_counter() - t0, NAME,
                               {"stopped": f"time limit reached while translating row {r} of {len(model.rows)}"})
        coefs = row.coefs * scale_of[row.vars]
        ic, lo, hi = _scaled_row(row, coefs, ranges[row.vars], bool((scale_of[row.vars] != 1.0).any()), step)
        expr = cp_model.LinearExpr.WeightedSum([xs[k] for k in row.vars], ic.tolist())
        ct = cp.AddLinearConstraint(expr, lo, hi)
        if row.enforce:
            ct.OnlyEnforceIf([xs[k] if val else xs[k].Not() for k, val in row.enforce])
    for p in model.products:
        if p.sense == "eq":
            cp.AddMultiplicationEquality(xs[p.z], [xs[p.x], xs[p.y]])
        else:
            lo = min(model.lb[p.x] * model.lb[p.y], model.lb[p.x] * model.ub[p.y], model.ub[p.x] * model.lb[p.y],
                     model.ub[p.x] * model.ub[p.y])
            hi = max(model.lb[p.x] * model.lb[p.y], model.lb[p.x] * model.ub[p.y], model.ub[p.x] * model.lb[p.y],
                     model.ub[p.x] * model.ub[p.y])
            aux = cp.NewIntVar(int(lo) if p.x != p.y else max(0, int(lo)), int(hi), f"prod{p.z}")
            cp.AddMultiplicationEquality(aux, [xs[p.x], xs[p.y]])
            cp.Add(xs[p.z] >= aux)
    # objective: scaled to integers
    terms = [(k, c * scale_of[k]) for k, c in model.objective.terms.items() if c != 0.0]
    activity = sum(abs(c) * max(abs(model.lb[k]), abs(model.ub[k])) / scale_of[k] for k, c in terms) or 1.0
    obj_scale = 2.0 ** math.floor(math.log2(2.0 ** 60 / activity))
    icoef = [int(round(c * obj_scale)) for _, c in terms]
    rounding = max((abs(c * obj_scale - ic) / max(abs(c * obj_scale), 1e-300) for (_, c), ic in zip(terms, icoef)),
                   default=0.0)
    # rigorous: |true - scaled objective| <= Σ_k |c_k·S - round(c_k·S)|·max|x_k| / S at every point of the domain
    rounding_abs = sum(abs(c * obj_scale - ic) * max(abs(model.lb[k]), abs(model.ub[k])) / scale_of[k]
                       for (k, c), ic in zip(terms, icoef)) / obj_scale
    cp.Minimize(cp_model.LinearExpr.WeightedSum([xs[k] for k, _ in terms], icoef))
    for k, val in hint_vector(model, hint).items():
        v = int(round(val / scale_of[k]))
        cp.AddHint(xs[k], v)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(0.05, deadline - time.perf_counter())
    if threads is None and not (params or {}).get("subsolvers"):
        prm.num_workers = len(DEFAULT_PORTFOLIO)
        prm.subsolvers.extend(DEFAULT_PORTFOLIO)
    else:
        prm.num_workers = int(threads or 2)
    prm.relative_gap_limit = float(rel_gap)
    prm.log_search_progress = bool(log)
    prm.random_seed = 0
    prm.catch_sigint_signal = False     # Ctrl-C reaches Python, which stops the search (_solve_interruptibly)
    # OR-Tools 9.15's inclusion presolve proved a feasible point infeasible on an online latency model
    # (tests/csp/test_cpsat_presolve.py: it reported 0.05420 s "optimal" where 0.05146 s is feasible in the
    # same CP-SAT model, as HiGHS and CP-SAT without presolve agree); a certified bound cannot use it
    prm.presolve_inclusion_work_limit = 0
    for name, value in (params or {}).items():
        if isinstance(value, (list, tuple)):
            getattr(prm, name).extend(value)
        else:
            setattr(prm, name, value)
    status, interrupted = _solve_interruptibly(solver, cp)
    wall = time.perf_counter() - t0
    name = {cp_model.OPTIMAL: SolveStatus.OPTIMAL, cp_model.FEASIBLE: SolveStatus.FEASIBLE,
            cp_model.INFEASIBLE: SolveStatus.INFEASIBLE}.get(status, SolveStatus.UNKNOWN)
    if status == cp_model.MODEL_INVALID:
        raise ValueError(f"cpsat rejected the model: {cp.Validate()}")
    info = {"objective_scale": obj_scale, "objective_rounding_rel": rounding, "objective_rounding_abs": rounding_abs,
            "cpsat_status": solver.StatusName(status), "conflicts": solver.NumConflicts(),
            "branches": solver.NumBranches(), "interrupted": interrupted}
    const = model.objective.constant
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = np.array([solver.Value(x) for x in xs], dtype=np.float64) * scale_of
        return SolveResult(name, values, solver.ObjectiveValue() / obj_scale + const,
                           solver.BestObjectiveBound() / obj_scale + const, wall, NAME, info)
    bound = solver.BestObjectiveBound() / obj_scale + const if status == cp_model.UNKNOWN else None
    return SolveResult(name, None, None, bound, wall, NAME, info)


def _solve_interruptibly(solver, cp) -> tuple[int, bool]:
    """Solve on a worker thread so that Ctrl-C in the main thread stops the search and keeps its answer.

    CP-SAT releases the GIL while it searches; the main thread waits on an event (an interrupted
    ``Thread.join`` is unreliable), and on KeyboardInterrupt asks the solver to stop, waits for its
    best solution, and reports ``interrupted``. Returns (status, interrupted).
    """
    import threading

    out: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            out["status"] = solver.Solve(cp)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="cpsat-solve", daemon=True).start()
    interrupted = False
    while True:
        try:
            while not done.wait(0.1):
                pass
            break
        except KeyboardInterrupt:
            interrupted = True
            solver.StopSearch()
    if "error" in out:
        raise out["error"]
    return out["status"], interrupted
