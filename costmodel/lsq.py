"""Relative least squares: the regression behind every fitted line of the cost model.

A fit minimises *relative* residuals (a 1 ms and a 100 ms measurement count
alike) with a soft-L1 loss, so one outlier does not bend a line. The operator
fits (:mod:`.fitting`) and the collective-communication fits
(:mod:`.communication`) both use it.
"""
from __future__ import annotations

import numpy as np

SOFT_L1_SCALE = 0.05   # relative residual beyond which the loss turns linear


def relative_lsq(X: np.ndarray, y: np.ndarray, lower: np.ndarray | float = 0.0) -> np.ndarray:
    """argmin_p Σ soft_l1((X p − y) / y) subject to p >= lower.

    Columns are scaled to unit norm first (a latency in seconds and a cost per
    byte differ by 10 orders of magnitude), so exact data are fitted exactly.
    """
    from scipy.optimize import least_squares, lsq_linear  # lazy: scipy.optimize costs ~0.4 s to import
    A = X / y[:, None]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    A = A / scale
    ones = np.ones(len(y))
    lb = np.broadcast_to(np.asarray(lower, dtype=np.float64), (X.shape[1],)) * scale
    start = lsq_linear(A, ones, bounds=(lb, np.inf), tol=1e-12).x
    if len(y) <= X.shape[1]:
        return start / scale
    result = least_squares(lambda p: A @ p - ones, np.maximum(start, lb), bounds=(lb, np.inf),
                           loss="soft_l1", f_scale=SOFT_L1_SCALE, ftol=1e-12, xtol=1e-12, gtol=1e-12)
    return result.x / scale
