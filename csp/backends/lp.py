"""Linear programs that grow between solves: the column-generation LPs' one door to an LP solver.

The trajectory LP (:mod:`..trajectorylp`, on GLOP) and the configuration LP (:mod:`..configlp`, on
HiGHS) add rows and columns as column generation goes and re-solve after each round from the last
basis; they see only :class:`GrowingLP`, so the solver packages stay in this folder. Rows and
columns are numbered from 0 in the order they are added; a bound of ±``math.inf`` means none. The
objective is minimised. A row's dual is the derivative of the optimum with respect to the row's
bound — <= 0 on a binding upper bound, >= 0 on a binding lower bound — as both engines report it.

Solvers are imported when an LP is made, never at module import.
"""
from __future__ import annotations

import importlib.util
import math
from typing import Mapping, Protocol

import numpy as np

#: engine -> the package it needs
ENGINES = {"glop": "ortools", "highs": "highspy"}


def is_available(engine: str) -> bool:
    """The package of ``engine`` ("glop": OR-Tools, "highs": highspy) is installed."""
    return importlib.util.find_spec(ENGINES[engine]) is not None


class GrowingLP(Protocol):
    """An LP that rows and columns are added to between solves (module docstring)."""

    ENGINE: str

    def add_col(self, cost: float, lb: float, ub: float, coefs: Mapping[int, float] | None = None,
                name: str = "") -> int:
        """A new column with objective ``cost``, bounds [lb, ub] and ``coefs`` {row: a}; its number."""

    def add_row(self, lb: float, ub: float, coefs: Mapping[int, float] | None = None) -> int:
        """A new row lb <= Σ a·x <= ub over ``coefs`` {column: a}; its number."""

    def solve(self) -> bool:
        """Solve (from the last basis where there is one); whether an optimum was found (else see ``status``)."""

    @property
    def status(self) -> str:
        """The last solve's status in the engine's words."""

    @property
    def objective_value(self) -> float:
        """The optimum of the last solve."""

    def row_duals(self) -> np.ndarray:
        """Every row's dual after the last solve, in row order."""


def new_lp(engine: str) -> GrowingLP:
    """An empty minimisation LP on ``engine`` ("glop" or "highs"); ImportError if its package is missing."""
    if engine not in ENGINES:
        raise ValueError(f"LP engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    return _GlopLP() if engine == "glop" else _HighsLP()


class _GlopLP:
    """GLOP through OR-Tools' linear_solver wrapper; it re-solves incrementally after additions.

    If GLOP fails, it tries once more with the dual simplex, which it then keeps."""

    ENGINE = "GLOP"

    def __init__(self) -> None:
        from ortools.linear_solver import pywraplp

        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        self.inf = self.solver.infinity()
        self.objective = self.solver.Objective()
        self.objective.SetMinimization()
        self.cols: list = []
        self.rows: list = []
        self._status = "not solved"

    def _bound(self, x: float) -> float:
        return x if math.isfinite(x) else math.copysign(self.inf, x)

    def add_col(self, cost: float, lb: float, ub: float, coefs: Mapping[int, float] | None = None,
                name: str = "") -> int:
        x = self.solver.NumVar(self._bound(lb), self._bound(ub), name)
        for row, a in (coefs or {}).items():
            self.rows[row].SetCoefficient(x, a)
        self.objective.SetCoefficient(x, cost)
        self.cols.append(x)
        return len(self.cols) - 1

    def add_row(self, lb: float, ub: float, coefs: Mapping[int, float] | None = None) -> int:
        row = self.solver.Constraint(self._bound(lb), self._bound(ub))
        for col, a in (coefs or {}).items():
            row.SetCoefficient(self.cols[col], a)
        self.rows.append(row)
        return len(self.rows) - 1

    def solve(self) -> bool:
        code = self.solver.Solve()
        if code != self.solver.OPTIMAL:       # GLOP lost its way: once more with the other simplex
            self.solver.SetSolverSpecificParametersAsString("use_dual_simplex: true")
            code = self.solver.Solve()
        self._status = f"status {code}"
        return code == self.solver.OPTIMAL

    @property
    def status(self) -> str:
        return self._status

    @property
    def objective_value(self) -> float:
        return self.objective.Value()

    def row_duals(self) -> np.ndarray:
        return np.array([row.dual_value() for row in self.rows], dtype=np.float64)


class _HighsLP:
    """HiGHS in this process (highspy), silent; ``run`` starts from the last basis after additions."""

    ENGINE = "HiGHS"

    def __init__(self) -> None:
        import highspy

        from .highs import new_highs

        self.highspy, self.h = highspy, new_highs()
        self.inf = highspy.kHighsInf

    def _bound(self, x: float) -> float:
        return x if math.isfinite(x) else math.copysign(self.inf, x)

    def add_col(self, cost: float, lb: float, ub: float, coefs: Mapping[int, float] | None = None,
                name: str = "") -> int:
        coefs = coefs or {}
        self.h.addCol(cost, self._bound(lb), self._bound(ub), len(coefs),
                      np.fromiter(coefs, dtype=np.int32, count=len(coefs)),
                      np.fromiter(coefs.values(), dtype=np.float64, count=len(coefs)))
        return self.h.getNumCol() - 1

    def add_row(self, lb: float, ub: float, coefs: Mapping[int, float] | None = None) -> int:
        coefs = coefs or {}
        self.h.addRow(self._bound(lb), self._bound(ub), len(coefs),
                      np.fromiter(coefs, dtype=np.int32, count=len(coefs)),
                      np.fromiter(coefs.values(), dtype=np.float64, count=len(coefs)))
        return self.h.getNumRow() - 1

    def solve(self) -> bool:
        self.h.run()
        return self.h.getModelStatus() == self.highspy.HighsModelStatus.kOptimal

    @property
    def status(self) -> str:
        return self.h.modelStatusToString(self.h.getModelStatus())

    @property
    def objective_value(self) -> float:
        return self.h.getInfo().objective_function_value

    def row_duals(self) -> np.ndarray:
        return np.asarray(self.h.getSolution().row_dual)
