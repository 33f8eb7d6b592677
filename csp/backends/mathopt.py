"""OR-Tools MathOpt with SCIP: native indicator constraints, products linearised exactly.

MathOpt indicators take one indicator variable; an enforcement conjunction of
several literals gets an AND variable first. SCIP accepts only one-sided
implied rows, so an equality becomes two indicator constraints.
"""
from __future__ import annotations

import datetime
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

NAME = "scip"
PIP = "pip install ortools"


def is_available() -> bool:
    try:
        from ortools.math_opt.python import mathopt
    except ImportError:
        return False
    return hasattr(mathopt.SolverType, "GSCIP")


# complexity: one backend: translate each row kind, hint, solve, read back each status, in order
def solve(model: Model, time_limit_s: float, threads: int | None = None, hint: dict[int, float] | None = None,
          rel_gap: float = 1e-4, log: bool = False, products: str = "exact", big_m: str = "tight") -> SolveResult:
    """Solve with MathOpt: translate the model row by row, hint, solve, read the values and status back.

    Long because it is the backend's whole translation loop, read top to bottom (variables, rows,
    indicators and products, objective, parameters, read-back); splitting it would scatter one solver's API.
    """
    if not is_available():
        raise BackendUnavailable(NAME, PIP)
    from ortools.math_opt.python import mathopt

    t0 = time.perf_counter()
    mip = prepare_mip(model, hint, "native", products, big_m)
    milp, facts, scale = mip.milp, mip.facts, mip.scale
    mo = mathopt.Model(name=milp.name)
    xs = [mo.add_variable(lb=milp.lb[k], ub=milp.ub[k], is_integer=milp.integer[k], name=f"x{k}")
          for k in range(milp.num_vars)]
    for row in milp.rows:
        expr = mathopt.LinearExpression(sum(float(c) * xs[k] for k, c in zip(row.vars, row.coefs)))
        lb = row.lb if math.isfinite(row.lb) else -math.inf
        ub = row.ub if math.isfinite(row.ub) else math.inf
        if not row.enforce:
            mo.add_linear_constraint(lb=lb, ub=ub, expr=expr)
            continue
        if len(row.enforce) == 1:
            k, val = row.enforce[0]
            ind, on_zero = xs[k], val == 0
        else:
            ind, on_zero = mo.add_binary_variable(), False
            for k, val in row.enforce:
                lit = xs[k] if val else 1 - xs[k]
                mo.add_linear_constraint(ind <= lit)
            mo.add_linear_constraint(ind >= sum((xs[k] if val else 1 - xs[k]) for k, val in row.enforce)
                                     - (len(row.enforce) - 1))
        # SCIP takes one-sided indicator rows only: a range or an equality becomes two
        for side in (dict(implied_lb=lb), dict(implied_ub=ub)):
            if math.isfinite(next(iter(side.values()))):
                mo.add_indicator_constraint(indicator=ind, activate_on_zero=on_zero, implied_expr=expr, **side)
    mo.minimize(sum(scale * c * xs[k] for k, c in milp.objective.terms.items()) + scale * milp.objective.constant)
    solver_rel, solver_abs = solver_gaps(rel_gap)
    left = max(0.05, float(time_limit_s) - (time.perf_counter() - t0))
    params = mathopt.SolveParameters(time_limit=datetime.timedelta(seconds=left), relative_gap_tolerance=solver_rel,
                                     absolute_gap_tolerance=solver_abs, enable_output=bool(log), random_seed=0)
    model_params = None
    if milp.hint:
        model_params = mathopt.ModelSolveParameters(solution_hints=[mathopt.SolutionHint(
            variable_values={xs[k]: float(v) for k, v in milp.hint.items()})])
    result = mathopt.solve(mo, mathopt.SolverType.GSCIP, params=params, model_params=model_params)
    wall = time.perf_counter() - t0
    reason = result.termination.reason
    T = mathopt.TerminationReason
    has = result.has_primal_feasible_solution()
    status = SolveStatus.OPTIMAL if reason == T.OPTIMAL else SolveStatus.INFEASIBLE if reason == T.INFEASIBLE else \
        SolveStatus.FEASIBLE if has else SolveStatus.UNKNOWN
    raw = result.termination.objective_bounds.dual_bound
    raw = raw if math.isfinite(raw) else None
    bound = certified_bound(raw, result.objective_value() if has else None, status, solver_rel, solver_abs)
    bound = bound / scale if bound is not None else None
    facts["termination"] = str(reason)
    facts["interrupted"] = result.termination.limit == mathopt.Limit.INTERRUPTED
    if not has:
        return SolveResult(status, None, None, bound, wall, NAME, facts)
    sol = result.variable_values()
    values = original_values(mip, [sol[xs[k]] for k in range(model.num_vars)])
    return SolveResult(status, values, result.objective_value() / scale, bound, wall, NAME, facts)
