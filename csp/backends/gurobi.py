"""Gurobi (gurobipy): native indicator constraints; products linearised exactly.

The pip wheel ships a size-limited licence: at most 2000 variables and 2000
linear constraints (and only 200 variables once a model has quadratic terms,
which is why products are linearised rather than passed as bilinear
constraints). A larger model fails with GurobiError 10010; this backend turns
that into :class:`ModelTooLarge` naming the limit and the model's size.
"""
from __future__ import annotations

import math
import time

from ..milp.model import Model
from .base import (
    BackendUnavailable,
    ModelTooLarge,
    SolveResult,
    SolveStatus,
    certified_bound,
    original_values,
    prepare_mip,
    solver_gaps,
)

NAME = "gurobi"
PIP = "pip install gurobipy"
#: the pip licence's caps (Gurobi error 10010, "Model too large for size-limited license")
SIZE_LIMIT = {"variables": 2000, "constraints": 2000}


def is_available() -> bool:
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return False
    return True


def _size_error(num_vars: int, num_cons: int) -> ModelTooLarge:
    return ModelTooLarge(
        f"gurobi: the model has {num_vars} variables and {num_cons} linear constraints, over the size-limited "
        f"pip licence of gurobipy ({SIZE_LIMIT['variables']} variables / {SIZE_LIMIT['constraints']} "
        f"constraints, GurobiError 10010); use a smaller instance or horizon, another backend (cpsat), or a "
        f"full Gurobi licence")


# complexity: one backend: translate each row kind, hint, solve, read back each status, in order
def solve(model: Model, time_limit_s: float, threads: int | None = None, hint: dict[int, float] | None = None,
          rel_gap: float = 1e-4, log: bool = False, products: str = "exact", big_m: str = "tight") -> SolveResult:
    """Solve with Gurobi: translate the model row by row, hint, solve, read the values and status back.

    Long because it is the backend's whole translation loop, read top to bottom (variables, rows,
    indicators and products, objective, parameters, read-back); splitting it would scatter one solver's API.
    """
    if not is_available():
        raise BackendUnavailable(NAME, PIP)
    import gurobipy as gp
    from gurobipy import GRB

    t0 = time.perf_counter()
    mip = prepare_mip(model, hint, "native", products, big_m)
    model, scale, hints = mip.milp, mip.scale, mip.milp.hint
    try:
        env = gp.Env(params={"OutputFlag": int(bool(log))})
        g = gp.Model(model.name, env=env)
        xs = [g.addVar(lb=model.lb[k], ub=model.ub[k], vtype=GRB.INTEGER if model.integer[k] else GRB.CONTINUOUS,
                       name=f"x{k}") for k in range(model.num_vars)]
        for row in model.rows:
            expr = gp.LinExpr(row.coefs.tolist(), [xs[k] for k in row.vars])
            sides = [(s, b) for s, b in ((GRB.GREATER_EQUAL, row.lb), (GRB.LESS_EQUAL, row.ub)) if math.isfinite(b)]
            if row.lb == row.ub:
                sides = [(GRB.EQUAL, row.lb)]
            if not row.enforce:
                for sense, rhs in sides:
                    g.addLConstr(expr, sense, rhs)
                continue
            if len(row.enforce) == 1:
                (k, val), = row.enforce
                lit, on = xs[k], val
            else:
                lit, on = g.addVar(vtype=GRB.BINARY), 1
                lits = []
                for k, val in row.enforce:
                    if val:
                        lits.append(xs[k])
                    else:
                        neg = g.addVar(vtype=GRB.BINARY)
                        g.addLConstr(neg + xs[k], GRB.EQUAL, 1)
                        lits.append(neg)
                g.addGenConstrAnd(lit, lits)
            for sense, rhs in sides:
                g.addGenConstrIndicator(lit, bool(on), expr, sense, rhs)
        g.setObjective(gp.LinExpr([scale * c for c in model.objective.terms.values()],
                                  [xs[k] for k in model.objective.terms]) + scale * model.objective.constant,
                       GRB.MINIMIZE)
        g.update()
        size = (g.NumVars, g.NumConstrs + g.NumGenConstrs + g.NumQConstrs)
        solver_rel, solver_abs = solver_gaps(rel_gap)
        g.Params.TimeLimit = max(0.05, float(time_limit_s) - (time.perf_counter() - t0))
        g.Params.MIPGap = solver_rel
        g.Params.MIPGapAbs = solver_abs
        g.Params.Seed = 0
        if threads:
            g.Params.Threads = int(threads)
        for k, val in hints.items():
            xs[k].Start = val
        g.optimize()
    except gp.GurobiError as exc:
        if getattr(exc, "errno", None) == 10010 or "size-limited" in str(exc):
            raise _size_error(*(size if "size" in locals() else (model.num_vars, len(model.rows)))) from exc
        raise
    wall = time.perf_counter() - t0
    st = g.Status
    has = g.SolCount > 0
    status = SolveStatus.OPTIMAL if st == GRB.OPTIMAL else SolveStatus.INFEASIBLE if st == GRB.INFEASIBLE else \
        SolveStatus.FEASIBLE if has else SolveStatus.UNKNOWN
    raw = g.ObjBound if has or st == GRB.TIME_LIMIT else None
    raw = raw if raw is not None and math.isfinite(raw) else None
    bound = certified_bound(raw, g.ObjVal if has else None, status, solver_rel, solver_abs)
    bound = bound / scale if bound is not None else None
    info = {"gurobi_status": int(st), "nodes": float(g.NodeCount), "objective_scale": scale,
            "interrupted": st == GRB.INTERRUPTED}
    if not has:
        return SolveResult(status, None, None, bound, wall, NAME, info)
    values = original_values(mip, [x.X for x in xs[:mip.num_original]])
    return SolveResult(status, values, g.ObjVal / scale, bound, wall, NAME, info)
