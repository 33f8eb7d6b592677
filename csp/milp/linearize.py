"""Turn indicators and products into plain MILP rows, for backends that lack them.

Indicators become the big-M rows of InferMax eq. (6). With ``big_m="tight"``
each M is the row's largest possible violation, computed from the variable
bounds (which the formulation keeps tight per request); ``"loose"`` uses one
model-wide M — the paper's "sufficiently large constant" — for the benchmark.

Products are linearised exactly:

- bool × bounded value: the four McCormick rows (exact for a 0/1 factor);
- a square with a small domain and sense "ge": the secants through consecutive
  integers, z >= (2a+1)x - a(a+1), exact at every integer x;
- otherwise the factor with the smaller range is expanded in binary,
  x = lb + Σ_b 2^b β_b, and each β_b·y is a bool × value product.

``products="mccormick"`` instead keeps only the McCormick under-estimator of
each product (valid lower bound, smaller model); the objective is then an
under-approximation whose gap to the replayed cost is reported.
"""
from __future__ import annotations

import copy
import math

from .model import LinExpr, Model, Row, Var

SMALL_SQUARE_DOMAIN = 64


def _activity_range(model: Model, row: Row) -> tuple[float, float]:
    lo = hi = 0.0
    for k, a in zip(row.vars, row.coefs):
        l, u = model.lb[k], model.ub[k]
        lo += a * (l if a > 0 else u)
        hi += a * (u if a > 0 else l)
    return lo, hi


def _var(model: Model, index: int) -> Var:
    return Var(int(index), id(model))


# complexity: one check per option (indicators, products, big-M), then one branch per row kind it translates
def to_milp(model: Model, *, indicators: str = "big-m", products: str = "exact",
            big_m: str = "tight") -> tuple[Model, dict]:
    """A copy of ``model`` whose rows a plain MILP solver accepts, plus facts about the translation.

    indicators: "big-m" (convert) or "native" (keep). products: "exact",
    "mccormick" or "native" (keep). The original variables keep their indices.
    Its branches are the kinds of row (linear, indicator, product) times the options, one per case.
    """
    if indicators not in ("big-m", "native") or products not in ("exact", "mccormick", "native"):
        raise ValueError(f"to_milp: bad options indicators={indicators!r}, products={products!r}")
    if big_m not in ("tight", "loose"):
        raise ValueError(f"big_m must be 'tight' or 'loose', got {big_m!r}")
    out = copy.copy(model)
    out.names, out.lb, out.ub, out.integer = list(model.names), list(model.lb), list(model.ub), list(model.integer)
    out.rows, out.products, out.hint = [], [], dict(model.hint)
    facts = {"big_m_rows": 0, "max_big_m": 0.0, "under_approximated": products == "mccormick"}
    loose = None
    if big_m == "loose" and indicators == "big-m":
        loose = 0.0
        for row in model.rows:
            if row.enforce:
                lo, hi = _activity_range(model, row)
                loose = max(loose, hi - row.ub if math.isfinite(row.ub) else 0.0,
                            row.lb - lo if math.isfinite(row.lb) else 0.0)
        loose = 10.0 * loose + 1.0
    for row in model.rows:
        if not row.enforce or indicators == "native":
            out.rows.append(row)
            continue
        _big_m_rows(out, row, loose, facts)
    for p in model.products:
        if products == "native":
            out.products.append(p)
        elif products == "mccormick":
            _mccormick(out, p.z, p.x, p.y, p.family, exact_bool=False, sense="ge")
        else:
            _exact_product(out, p.z, p.x, p.y, p.family, p.sense)
    return out, facts


def _big_m_rows(out: Model, row: Row, loose: float | None, facts: dict) -> None:
    """lb <= a·x <= ub when all literals hold  ->  a·x <= ub + M·Σ(1 - lit), a·x >= lb - M·Σ(1 - lit)."""
    lo, hi = _activity_range(out, row)
    slack = LinExpr()
    for k, val in row.enforce:
        slack = slack + ((1 - _var(out, k)) if val == 1 else _var(out, k))
    expr = LinExpr(dict(zip(row.vars.tolist(), row.coefs.tolist())))
    if math.isfinite(row.ub) and hi > row.ub:
        M = loose if loose is not None else hi - row.ub
        if not math.isfinite(M):
            raise ValueError(f"indicator row [{row.family}] has an unbounded variable; cannot use big-M")
        out.add(expr <= row.ub + M * slack, row.family + "/bigM")
        facts["big_m_rows"] += 1
        facts["max_big_m"] = max(facts["max_big_m"], M)
    if math.isfinite(row.lb) and lo < row.lb:
        M = loose if loose is not None else row.lb - lo
        if not math.isfinite(M):
            raise ValueError(f"indicator row [{row.family}] has an unbounded variable; cannot use big-M")
        out.add(expr >= row.lb - M * slack, row.family + "/bigM")
        facts["big_m_rows"] += 1
        facts["max_big_m"] = max(facts["max_big_m"], M)


def _mccormick(out: Model, z: int, x: int, y: int, family: str, exact_bool: bool, sense: str) -> None:
    """McCormick envelope of z = x·y over the bounds (exact when x is 0/1 and exact_bool)."""
    Z, X, Y = (_var(out, a) for a in (z, x, y))
    xl, xu, yl, yu = out.lb[x], out.ub[x], out.lb[y], out.ub[y]
    out.add(Z >= xl * Y + yl * X - xl * yl, family + "/mc")
    out.add(Z >= xu * Y + yu * X - xu * yu, family + "/mc")
    if sense == "eq":
        out.add(Z <= xu * Y + yl * X - xu * yl, family + "/mc")
        out.add(Z <= xl * Y + yu * X - xl * yu, family + "/mc")


# complexity: its three cases (boolean factor, small square, binary expansion), as the docstring says
def _exact_product(out: Model, z: int, x: int, y: int, family: str, sense: str) -> None:
    """Rows making z = x·y (``sense`` "eq") or z >= x·y ("ge") exact: McCormick if a factor is boolean,
    secants for a small square, else the smaller-range factor in binary with one McCormick part per bit
    (helpers hinted from the factors). Its branches are these three cases."""
    if out.is_bool(x) or out.is_bool(y):
        bx, other = (x, y) if out.is_bool(x) else (y, x)
        _mccormick(out, z, bx, other, family, exact_bool=True, sense=sense)
        return
    if x == y and sense == "ge" and out.ub[x] - out.lb[x] <= SMALL_SQUARE_DOMAIN:
        Z, X = _var(out, z), _var(out, x)
        for a in range(int(out.lb[x]), int(out.ub[x])):
            out.add(Z >= (2 * a + 1) * X - a * (a + 1), family + "/secant")
        return
    # expand the factor with the smaller range in binary
    if out.ub[y] - out.lb[y] < out.ub[x] - out.lb[x]:
        x, y = y, x
    xl, xu = int(out.lb[x]), int(out.ub[x])
    nbits = max(1, int(xu - xl).bit_length())
    X, Z = _var(out, x), _var(out, z)
    bits = [out.bool_var(f"{out.names[x]}.bit{b}") for b in range(nbits)]
    out.add(X == xl + sum((2 ** b * bit for b, bit in enumerate(bits)), LinExpr()), family + "/binary")
    parts = []
    for b, bit in enumerate(bits):
        u = out.num_var(min(0.0, out.lb[y]), max(0.0, out.ub[y]), f"{out.names[z]}.part{b}")
        _mccormick(out, u.index, bit.index, y, family, exact_bool=True, sense=sense)
        parts.append(u)
    rhs = xl * _var(out, y) + sum((2 ** b * u for b, u in enumerate(parts)), LinExpr())
    out.add(Z == rhs if sense == "eq" else Z >= rhs, family + "/binary")
    if x in out.hint and y in out.hint:           # hint the helpers from the hinted factors
        val = int(round(out.hint[x])) - xl
        for b, (bit, u) in enumerate(zip(bits, parts)):
            out.hint[bit.index] = float((val >> b) & 1)
            out.hint[u.index] = float((val >> b) & 1) * out.hint[y]
