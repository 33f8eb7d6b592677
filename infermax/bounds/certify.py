"""Weak duality for an LP solved in floating point: a lower bound that does not trust the solver.

For min c·v s.t. A v <= b, lower <= v <= upper and ANY y >= 0, the Lagrangian
c·v + y·(A v - b) is <= c·v on the feasible set, and its minimum over the box is

    -y·b + Σ_j (g_j·lower_j if g_j >= 0 else g_j·upper_j),    g = c + Aᵀy,

so it is a lower bound on the LP's minimum whatever y is (−inf when some g_j < 0 has no finite upper
bound). HiGHS's multipliers make it the LP's value up to its tolerances; a badly conditioned LP shows
as a weaker bound, never a wrong one. Its float evaluation is lowered by a bound on its own rounding
(each m-term sum errs by at most m·eps·Σ|terms|, Higham's γ_m, here doubled).
"""
from __future__ import annotations

import numpy as np

EPS = np.finfo(np.float64).eps


def certified_dual(c: np.ndarray, A, b: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                   y: np.ndarray) -> tuple[float, float]:
    """(the dual value at ``y`` >= 0, a bound on its rounding); the first minus the second is <= c·v
    for every v with A v <= b and lower <= v <= upper (``lower`` finite, ``upper`` may hold inf)."""
    y = np.maximum(np.asarray(y, dtype=np.float64), 0.0)
    g = c + A.T @ y
    g_abs = np.abs(c) + abs(A).T @ y
    if np.any((g < 0) & ~np.isfinite(upper)):
        return -np.inf, 0.0
    at = np.where(g >= 0, lower, upper)
    at = np.where(np.isfinite(at), at, 0.0)        # (g = 0 on an unbounded side contributes nothing)
    dual = -float(y @ b) + float((g * at).sum())
    m = A.shape[0] + A.shape[1] + 2
    err = 2.0 * (m + 2) * EPS * (float(np.abs(y * b).sum()) + float((np.abs(at) * g_abs).sum()))
    return dual, err
