"""PuLP with CBC: a plain MILP (big-M indicators, exact product linearisation).

PuLP reports status "Optimal" even when CBC stopped at its time limit with a
feasible solution; the solution status (``prob.sol_status``) tells them apart.
CBC gives no dual bound through PuLP, so the bound is known only when optimal,
and then only up to the gap CBC was given (:func:`.base.certified_bound`).
"""
from __future__ import annotations

import math
import time

from ..milp.model import Model
from .base import (
    BackendUnavailable,
    SolveResult,
    SolveStatus,
    certified_bound,
    original_values,
    prepare_mip,
    solver_gaps,
)

NAME = "cbc"
PIP = "pip install pulp"


def is_available() -> bool:
    try:
        import pulp
    except ImportError:
        return False
    try:
        return pulp.PULP_CBC_CMD(msg=False).available()
    except Exception:   # noqa: BLE001 - a broken CBC binary is "not available"
        return False


# complexity: one backend: translate each row kind, hint, solve, read back each status, in order
def solve(model: Model, time_limit_s: float, threads: int | None = None, hint: dict[int, float] | None = None,
          rel_gap: float = 1e-4, log: bool = False, products: str = "exact", big_m: str = "tight") -> SolveResult:
    """Solve with PuLP (CBC): translate the model row by row, hint, solve, read the values and status back.

    Long because it is the backend's whole translation loop, read top to bottom (variables, rows,
    indicators and products, objective, parameters, read-back); splitting it would scatter one solver's API.
    """
    if not is_available():
        raise BackendUnavailable(NAME, PIP)
    import pulp

    t0 = time.perf_counter()
    mip = prepare_mip(model, hint, "big-m", products, big_m)
    milp, facts, scale = mip.milp, mip.facts, mip.scale
    prob = pulp.LpProblem(milp.name.replace("-", "_"), pulp.LpMinimize)
    xs = [pulp.LpVariable(f"x{k}", lowBound=milp.lb[k], upBound=milp.ub[k],
                          cat=pulp.LpInteger if milp.integer[k] else pulp.LpContinuous) for k in range(milp.num_vars)]
    prob += pulp.lpSum(scale * c * xs[k] for k, c in milp.objective.terms.items()) + scale * milp.objective.constant
    for r, row in enumerate(milp.rows):
        expr = pulp.lpSum(float(c) * xs[k] for k, c in zip(row.vars, row.coefs))
        if row.lb == row.ub:
            prob += (expr == row.lb), f"r{r}"
            continue
        if math.isfinite(row.lb):
            prob += (expr >= row.lb), f"r{r}l"
        if math.isfinite(row.ub):
            prob += (expr <= row.ub), f"r{r}u"
    for k, val in milp.hint.items():
        xs[k].setInitialValue(val)
    solver_rel, solver_abs = solver_gaps(rel_gap)
    left = max(0.05, float(time_limit_s) - (time.perf_counter() - t0))
    solver = pulp.PULP_CBC_CMD(msg=bool(log), timeLimit=left, gapRel=solver_rel, gapAbs=solver_abs,
                               threads=threads, warmStart=bool(milp.hint))
    started = time.perf_counter()
    try:
        prob.solve(solver)
    except pulp.PulpSolverError as e:
        # CBC stopped by its time limit may leave no solution file; out of time that is "unknown", not an error
        if time.perf_counter() - started < 0.9 * left:
            raise
        facts["pulp_error"] = str(e)
        return SolveResult(SolveStatus.UNKNOWN, None, None, None, time.perf_counter() - t0, NAME, facts)
    wall = time.perf_counter() - t0
    sol = prob.sol_status
    facts["pulp_status"], facts["pulp_sol_status"] = pulp.LpStatus[prob.status], int(sol)
    out_of_time = time.perf_counter() - started >= 0.9 * left
    if (sol == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible) and not out_of_time:
        return SolveResult(SolveStatus.INFEASIBLE, None, None, None, wall, NAME, facts)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return SolveResult(SolveStatus.UNKNOWN, None, None, None, wall, NAME, facts)
    values = original_values(mip, [x.value() if x.value() is not None else 0.0 for x in xs[:model.num_vars]])
    scaled = pulp.value(prob.objective)
    obj = scaled / scale
    if sol == pulp.LpSolutionOptimal:
        bound = certified_bound(None, scaled, SolveStatus.OPTIMAL, solver_rel, solver_abs) / scale
        return SolveResult(SolveStatus.OPTIMAL, values, obj, bound, wall, NAME, facts)
    return SolveResult(SolveStatus.FEASIBLE, values, obj, None, wall, NAME, facts)
