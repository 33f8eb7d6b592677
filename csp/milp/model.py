"""A small solver-neutral MILP/CP model: variables, linear rows, indicators, products.

The formulation (:mod:`.formulation`) writes into a :class:`Model`; a backend
(:mod:`.backends`) only translates it. The data structure is deliberately
plain — lists of rows over integer variable indices — in the style of the
OR-Tools model_builder samples, with just enough operator sugar
(``2 * x + y <= 3``) to keep the constraint families readable.

Three kinds of constraint:

- a linear row ``lb <= Σ a_k x_k <= ub``;
- the same row guarded by an enforcement conjunction ``(x_1 = v_1) ∧ …`` (an
  *indicator*): CP-SAT and Gurobi take it natively, the others get the big-M row
  of InferMax eq. (6) with M computed from the variable bounds
  (:mod:`.linearize`);
- a product ``z = x·y`` (``sense="eq"``) or ``z >= x·y`` (``sense="ge"``, enough
  when z only appears with a non-negative objective weight): CP-SAT multiplies
  natively, MIP backends get an exact linearisation.

Continuous variables (times in seconds) are allowed; integer-only backends
represent them on a grid of ``Model.continuous_step_s``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

import numpy as np

from ..budget import BudgetExhausted

Number = Union[int, float]


class LinExpr:
    """Σ coef·var + constant, over variable indices (immutable in use)."""

    __slots__ = ("terms", "constant")

    def __init__(self, terms: Mapping[int, float] | None = None, constant: float = 0.0) -> None:
        self.terms: dict[int, float] = dict(terms or {})
        self.constant = float(constant)

    @staticmethod
    def of(x: "ExprLike") -> "LinExpr":
        if isinstance(x, LinExpr):
            return x
        if isinstance(x, Var):
            return LinExpr({x.index: 1.0})
        if isinstance(x, (int, float, np.integer, np.floating)):
            return LinExpr(constant=float(x))
        raise TypeError(f"cannot use {x!r} in a linear expression")

    def _combine(self, other: "ExprLike", sign: float) -> "LinExpr":
        o = LinExpr.of(other)
        terms = dict(self.terms)
        for k, v in o.terms.items():
            terms[k] = terms.get(k, 0.0) + sign * v
        return LinExpr(terms, self.constant + sign * o.constant)

    def __add__(self, other):
        return self._combine(other, 1.0)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1.0)

    def __rsub__(self, other):
        return LinExpr.of(other)._combine(self, -1.0)

    def __neg__(self):
        return LinExpr({k: -v for k, v in self.terms.items()}, -self.constant)

    def __mul__(self, scalar: Number):
        if not isinstance(scalar, (int, float, np.integer, np.floating)):
            raise TypeError("a linear expression can only be scaled by a number")
        s = float(scalar)
        return LinExpr({k: s * v for k, v in self.terms.items()}, s * self.constant)

    __rmul__ = __mul__

    def __le__(self, other):
        return Relation(self - other, -math.inf, 0.0)

    def __ge__(self, other):
        return Relation(self - other, 0.0, math.inf)

    def __eq__(self, other):  # type: ignore[override]
        return Relation(self - other, 0.0, 0.0)

    __hash__ = None  # type: ignore[assignment]


ExprLike = Union[LinExpr, "Var", int, float]


@dataclass(frozen=True, slots=True)
class Var:
    """A model variable (an index into the model's arrays)."""

    index: int
    model_id: int

    def _e(self) -> LinExpr:
        return LinExpr({self.index: 1.0})

    def __add__(self, o):
        return self._e() + o

    __radd__ = __add__

    def __sub__(self, o):
        return self._e() - o

    def __rsub__(self, o):
        return LinExpr.of(o) - self._e()

    def __neg__(self):
        return -self._e()

    def __mul__(self, s):
        return self._e() * s

    __rmul__ = __mul__

    def __le__(self, o):
        return self._e() <= o

    def __ge__(self, o):
        return self._e() >= o

    def __eq__(self, o):  # type: ignore[override]
        if isinstance(o, Var) and o.index == self.index and o.model_id == self.model_id:
            return True
        return self._e() == o

    def __hash__(self) -> int:
        return hash((self.index, self.model_id))


@dataclass(frozen=True, slots=True)
class Relation:
    """``lb <= expr <= ub`` before it is added to a model."""

    expr: LinExpr
    lb: float
    ub: float


@dataclass(frozen=True, slots=True)
class Row:
    """A linear constraint ``lb <= Σ coefs·vars <= ub``, active when every ``enforce`` literal holds."""

    vars: np.ndarray          # int64 variable indices
    coefs: np.ndarray         # float64
    lb: float
    ub: float
    family: str
    enforce: tuple[tuple[int, int], ...] = ()   # ((var, value), ...): active iff all var == value


@dataclass(frozen=True, slots=True)
class Product:
    """``z = x·y`` (sense "eq") or ``z >= x·y`` (sense "ge"); x is y for a square."""

    z: int
    x: int
    y: int
    sense: str
    family: str


@dataclass
class Model:
    """Variables, rows, products and a linear objective (minimised)."""

    name: str = "infermax"
    continuous_step_s: float = 1e-10
    names: list[str] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    products: list[Product] = field(default_factory=list)
    objective: LinExpr = field(default_factory=LinExpr)
    hint: dict[int, float] = field(default_factory=dict)
    #: ``time.perf_counter()`` value after which building stops (:class:`~.budget.BudgetExhausted`)
    deadline: float = math.inf

    # --- variables ---------------------------------------------------------------
    def int_var(self, lb: Number, ub: Number, name: str) -> Var:
        if lb > ub:
            raise ValueError(f"variable {name}: empty domain [{lb}, {ub}]")
        return self._add(float(lb), float(ub), True, name)

    def bool_var(self, name: str) -> Var:
        return self._add(0.0, 1.0, True, name)

    def num_var(self, lb: Number, ub: Number, name: str) -> Var:
        """A continuous variable (a time in seconds)."""
        return self._add(float(lb), float(ub), False, name)

    def const(self, value: Number, name: str = "const") -> Var:
        return self._add(float(value), float(value), True, name)

    def _add(self, lb: float, ub: float, integer: bool, name: str) -> Var:
        self.names.append(name)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        if len(self.names) % 4096 == 0 and time.perf_counter() > self.deadline:
            raise BudgetExhausted(f"the time limit ran out while building the model ({len(self.names)} variables, "
                                  f"{len(self.rows)} rows)", rows=len(self.rows))
        return Var(len(self.names) - 1, id(self))

    @property
    def num_vars(self) -> int:
        return len(self.names)

    def is_bool(self, index: int) -> bool:
        return self.integer[index] and self.lb[index] >= 0 and self.ub[index] <= 1

    # --- constraints -------------------------------------------------------------
    def add(self, rel: Relation, family: str, enforce: Iterable[tuple[Var, int]] = ()) -> None:
        """Add ``rel`` (built with <=, >=, ==), optionally only when every (var, value) holds."""
        if not isinstance(rel, Relation):
            raise TypeError(f"{family}: expected a relation built with <=, >= or ==, got {rel!r}")
        e = rel.expr
        items = [(k, v) for k, v in e.terms.items() if v != 0.0]
        lits = tuple((v.index, int(val)) for v, val in enforce)
        for k, _val in lits:
            if not self.is_bool(k):
                raise ValueError(f"{family}: enforcement literal {self.names[k]} is not boolean")
        lb, ub = rel.lb - e.constant, rel.ub - e.constant
        if not items:
            if (lb > 1e-9 or ub < -1e-9) and not lits:
                raise ValueError(f"{family}: constant constraint is infeasible ({lb} <= 0 <= {ub})")
            return
        idx = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
        co = np.fromiter((v for _, v in items), dtype=np.float64, count=len(items))
        self.rows.append(Row(idx, co, lb, ub, family, lits))
        if len(self.rows) % 1024 == 0 and time.perf_counter() > self.deadline:
            raise BudgetExhausted(f"the time limit ran out while building the model ({len(self.rows)} rows, "
                                  f"family {family})", rows=len(self.rows))

    def add_product(self, z: Var, x: Var, y: Var, family: str, sense: str = "eq") -> None:
        if sense not in ("eq", "ge"):
            raise ValueError(f"product sense must be 'eq' or 'ge', got {sense!r}")
        self.products.append(Product(z.index, x.index, y.index, sense, family))

    def minimize(self, expr: ExprLike) -> None:
        self.objective = LinExpr.of(expr)

    # --- evaluation --------------------------------------------------------------
    # complexity: one check per kind of model part (bounds, integrality, rows, indicators, products), in order
    def evaluate(self, values: np.ndarray, tol: float = 1e-6) -> list[str]:
        """Names of the violated bounds/rows/products under ``values`` (empty = feasible).

        Its branches are the kinds of constraint (bounds, integrality, rows by sense, indicators, products)."""
        v = np.asarray(values, dtype=np.float64)
        bad: list[str] = []
        lo, hi = np.asarray(self.lb), np.asarray(self.ub)
        for k in np.flatnonzero((v < lo - tol) | (v > hi + tol))[:20]:
            bad.append(f"bound {self.names[k]} = {v[k]} not in [{lo[k]}, {hi[k]}]")
        for k in np.flatnonzero(np.asarray(self.integer) & (np.abs(v - np.round(v)) > tol))[:20]:
            bad.append(f"integrality {self.names[k]} = {v[k]}")
        for r in self.rows:
            if r.enforce and any(abs(v[k] - val) > 0.5 for k, val in r.enforce):
                continue
            act = float(np.dot(r.coefs, v[r.vars]))
            scale = max(1.0, abs(r.lb) if math.isfinite(r.lb) else 0.0, abs(r.ub) if math.isfinite(r.ub) else 0.0)
            if act < r.lb - tol * scale or act > r.ub + tol * scale:
                names = ", ".join(f"{c:g}*{self.names[k]}={v[k]:g}" for k, c in zip(r.vars[:6], r.coefs[:6]))
                bad.append(f"row [{r.family}] {r.lb} <= {act} <= {r.ub}: {names}")
        for p in self.products:
            xy = v[p.x] * v[p.y]
            if (p.sense == "eq" and abs(v[p.z] - xy) > tol * max(1, abs(xy))) or v[p.z] < xy - tol * max(1, abs(xy)):
                bad.append(f"product [{p.family}] {self.names[p.z]} = {v[p.z]} vs {xy}")
        return bad

    def objective_value(self, values: np.ndarray) -> float:
        o = self.objective
        return o.constant + sum(c * float(values[k]) for k, c in o.terms.items())

    def stats(self) -> dict[str, int]:
        """Sizes, for logs and benchmarks."""
        return {"variables": self.num_vars,
                "integer": int(sum(self.integer)),
                "boolean": int(sum(self.is_bool(k) for k in range(self.num_vars))),
                "rows": len(self.rows),
                "indicators": sum(1 for r in self.rows if r.enforce),
                "products": len(self.products),
                "nonzeros": int(sum(r.vars.size for r in self.rows))}
