"""HiGHS (highspy): a plain MILP — indicators become big-M rows, products exact linearisations.

HiGHS runs in a child process of its own (:func:`.base.run_isolated`): highspy
1.15 and ortools 9.15 both exported HiGHS symbols and could not share one
interpreter, and HiGHS has overrun its time limit on large models (NOTES.md); a
child can be killed. It gets the model as arrays and is killed if it overruns
its time limit by more than a few seconds. Its bound is the one its answer
certifies (:func:`.base.certified_bound`): HiGHS reports a dual bound equal to
its incumbent when it stops within its gap tolerances.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from ..milp.model import Model
from .base import (
    BackendUnavailable,
    SolveResult,
    SolveStatus,
    certified_bound,
    original_values,
    prepare_mip,
    run_isolated,
    solver_gaps,
)

NAME = "highs"
PIP = "pip install highspy"


def is_available() -> bool:
    """highspy is installed (it is only imported in the child process that solves)."""
    import importlib.util

    return importlib.util.find_spec("highspy") is not None


def new_highs(log: bool = False):
    """A ``highspy.Highs`` that prints nothing unless ``log``.

    highspy prints its banner on standard output while the object is being constructed, before any
    option can be set, so standard output (the file descriptor: HiGHS writes from C++) is pointed at
    the null device for the construction (what other threads print in that instant is lost with it);
    ``output_flag`` silences everything after it.
    """
    import highspy

    if log:
        return highspy.Highs()
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def lp_arrays(model: Model, obj_scale: float = 1.0) -> dict:
    """The model as plain arrays (row-wise matrix), picklable for the child process."""
    n = model.num_vars
    cost = np.zeros(n)
    for k, c in model.objective.terms.items():
        cost[k] = c
    starts = np.zeros(len(model.rows) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([r.vars.size for r in model.rows])
    return {"cost": cost * obj_scale, "offset": model.objective.constant * obj_scale,
            "col_lower": np.array(model.lb, dtype=np.float64), "col_upper": np.array(model.ub, dtype=np.float64),
            "row_lower": np.array([r.lb for r in model.rows], dtype=np.float64),
            "row_upper": np.array([r.ub for r in model.rows], dtype=np.float64),
            "starts": starts, "index": np.concatenate([r.vars for r in model.rows]) if model.rows else
            np.zeros(0, dtype=np.int64), "value": np.concatenate([r.coefs for r in model.rows]) if model.rows
            else np.zeros(0), "integer": np.array(model.integer, dtype=bool)}


def _solve_in_child(payload: dict) -> dict:
    """Build and solve the HiGHS model (runs in a spawned process)."""
    import highspy

    a, opt = payload["arrays"], payload["options"]
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a["cost"].size, a["row_lower"].size
    lp.col_cost_, lp.offset_ = a["cost"], a["offset"]
    lp.col_lower_, lp.col_upper_ = a["col_lower"], a["col_upper"]
    lp.row_lower_ = np.where(np.isfinite(a["row_lower"]), a["row_lower"], -inf)
    lp.row_upper_ = np.where(np.isfinite(a["row_upper"]), a["row_upper"], inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = a["starts"].astype(np.int32)
    lp.a_matrix_.index_ = a["index"].astype(np.int32)
    lp.a_matrix_.value_ = a["value"]
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in a["integer"]]
    h = new_highs(opt["output_flag"])
    for key, value in opt.items():
        h.setOptionValue(key, value)
    h.passModel(lp)
    if payload.get("hint") is not None:
        sol = highspy.HighsSolution()
        sol.col_value = payload["hint"].tolist()
        h.setSolution(sol)
    h.run()
    info = h.getInfo()
    ms = h.getModelStatus()
    has = info.primal_solution_status == 2          # kSolutionStatusFeasible
    return {"status": SolveStatus.OPTIMAL if ms == highspy.HighsModelStatus.kOptimal else
            SolveStatus.INFEASIBLE if ms == highspy.HighsModelStatus.kInfeasible else
            SolveStatus.FEASIBLE if has else SolveStatus.UNKNOWN,
            "values": np.array(h.getSolution().col_value) if has else None,
            "objective": float(info.objective_function_value) if has else None,
            "bound": float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else None,
            "highs_status": h.modelStatusToString(ms), "nodes": int(info.mip_node_count)}


def solve(model: Model, time_limit_s: float, threads: int | None = None, hint: dict[int, float] | None = None,
          rel_gap: float = 1e-4, log: bool = False, products: str = "exact", big_m: str = "tight") -> SolveResult:
    if not is_available():
        raise BackendUnavailable(NAME, PIP)
    t0 = time.perf_counter()
    mip = prepare_mip(model, hint, "big-m", products, big_m)
    milp, facts, scale = mip.milp, mip.facts, mip.scale
    solver_rel, solver_abs = solver_gaps(rel_gap)
    left = max(0.05, float(time_limit_s) - (time.perf_counter() - t0))
    options = {"output_flag": bool(log), "time_limit": left, "mip_rel_gap": solver_rel,
               "mip_abs_gap": solver_abs, "random_seed": 0}
    if threads:
        options["threads"] = int(threads)
    start = None
    if milp.hint:
        start = np.clip(np.zeros(milp.num_vars), milp.lb, milp.ub)
        for k, val in milp.hint.items():
            start[k] = val
    out = run_isolated(_solve_in_child, {"arrays": lp_arrays(milp, scale), "options": options, "hint": start},
                       timeout_s=left + max(5.0, 0.1 * left), log=log)
    wall = time.perf_counter() - t0
    if out is None:
        facts["highs_status"] = "killed after overrunning its time limit"
        return SolveResult(SolveStatus.UNKNOWN, None, None, None, wall, NAME, facts)
    facts.update(highs_status=out["highs_status"], nodes=out["nodes"], solver_bound=out["bound"])
    status = SolveStatus(out["status"])     # the child process sends the status's value
    bound = certified_bound(out["bound"], out["objective"], status, solver_rel, solver_abs)
    bound = bound / scale if bound is not None else None
    if out["values"] is None:
        return SolveResult(status if status != SolveStatus.OPTIMAL else SolveStatus.UNKNOWN, None, None, bound, wall,
                           NAME, facts)
    return SolveResult(status, original_values(mip, out["values"]), out["objective"] / scale, bound, wall, NAME, facts)
