"""The Lagrangian tables of the trajectory and configuration LPs, for every batch count worth solving.

:class:`TrajectoryBound` solves the trajectory LP (:mod:`.trajectorylp`) for each batch count Y a
better schedule may have and keeps, per Y, its Lagrangian tables (φ, V); where time is left and it
applies, the configuration LP (:mod:`.configlp`) adds its own. :meth:`TrajectoryBound.remaining`
turns them into a lower bound on the time left from any class state, which
:meth:`.classstate.ClassStateSpace.bound` takes.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from . import configlp
from .trajectorylp import TrajectoryLP

log = logging.getLogger(__name__)


class TrajectoryBound:
    """Lagrangian tables of the trajectory LP for every batch count a better schedule may have.

    Built for Y = ``y_min``, ``y_min`` + 1, … while the class-state bound for Y batches stays below
    ``upper_s`` (no schedule with more batches can beat the incumbent) and time is left; a Y not
    reached is bounded by the class-state bound alone. ``root_bound`` is the least over all Y.
    With ``refine`` (and the configuration LP applicable, :mod:`.configlp`), the time left then goes to
    configuration LPs, the Y of least root bound first; each adds its own tables (a state's bound for Y
    is the largest of its tables') and raises that Y's root bound to its Lagrangian value, converged or
    not. ``refined``: Y -> (configuration LP bound, converged).
    """

    def __init__(self, sp, y_min: int, upper_s: float, time_budget_s: float, refine: bool = False):
        t0 = time.perf_counter()
        deadline = t0 + time_budget_s
        h_of = lambda y: sp.bound_for(sp.start, y, 0)
        self.tables: dict[int, list[tuple[list[float], list[list[float]]]]] = {}
        self.root: dict[int, float] = {}
        self.refined: dict[int, tuple[float, bool]] = {}
        self._prices: dict = {}          # Y -> the trajectory LP's best item prices (configuration LPs start there)
        self.is_converged = True
        self._memo: dict = {}                       # (state, batches spent) -> remaining()
        Y = first = max(y_min, sp.least_batches(sp.start))
        while h_of(Y) <= upper_s and time.perf_counter() < deadline:
            got = self._solve(TrajectoryLP(sp, Y), deadline, h_of)
            if got is None:
                break
            self.is_converged &= got[1]
            self._prices[Y] = got[2]
            Y += 1
        self.y_max = max(self.tables, default=Y - 1)
        if refine and configlp.is_available() and configlp.applies(sp):
            while time.perf_counter() < deadline:
                todo = sorted((r, y) for y, r in self.root.items() if y not in self.refined and r <= upper_s)
                if not todo:
                    break
                y = todo[0][1]
                got = self._solve(configlp.ConfigLP(sp, y), deadline, h_of, start=self._prices.get(y))
                self.refined[y] = (-math.inf, False) if got is None else got[:2]
        self.root_bound = float(min([h_of(max(Y, self.y_max + 1))] +
                                    [self.root.get(y, h_of(y)) for y in range(first, self.y_max + 1)]))
        self.wall_s = time.perf_counter() - t0

    def _solve(self, lp, deadline: float, h_of, **kwargs) -> tuple | None:
        """Solve ``lp`` (a trajectory or configuration LP), keep its tables and raise its Y's root bound:
        (bound, converged, the prices of its best Lagrangian), or None if the LP solver gave up (the
        tables built so far stay valid)."""
        try:
            bound, phi, V, converged = lp.solve(deadline, **kwargs)
        except RuntimeError as exc:
            log.warning("trajectory bound: %s for Y=%d failed: %s", type(lp).__name__, lp.Y, exc)
            return None
        if phi is not None:
            self.tables.setdefault(lp.Y, []).append((np.cumsum(phi[::-1])[::-1].tolist() + [0.0], V.tolist()))
            self.root[lp.Y] = float(max(bound, h_of(lp.Y), self.root.get(lp.Y, -math.inf)))
        return float(bound), converged, getattr(lp, "best_prices", None)

    def remaining(self, s: tuple, spent: int, y_left: int, h_of) -> float:
        """A lower bound on the time left from state ``s`` after ``spent`` batches, with at least ``y_left``
        batches left: the least over totals Y of max(class-state bound for Y - spent batches,
        Lagrangian bound for Y); ``h_of(y)`` is the class-state bound for y batches left."""
        key = (s, spent)
        best = self._memo.get(key)
        if best is not None:
            return best
        nz = [(q, n) for q, n in enumerate(s) if n]
        best = h_of(max(y_left, self.y_max + 1 - spent))       # totals past the tables
        for Y in range(spent + y_left, self.y_max + 1):
            h = h_of(Y - spent)
            if h >= best:
                break                                          # h grows with Y: nothing further is lower
            for cum, V in self.tables.get(Y, ()):
                row = V[spent]
                lag = cum[spent] + sum(n * row[q] for q, n in nz)
                if lag > h:
                    h = lag
            if h < best:
                best = h
        self._memo[key] = best
        return best
