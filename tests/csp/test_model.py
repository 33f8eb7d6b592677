"""The solver-neutral model and its MILP translation (big-M rows, exact products)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.csp.milp.linearize import to_milp
from infermax.csp.milp.model import LinExpr, Model


def test_expressions_build_rows_with_bounds():
    m = Model()
    x, y = m.int_var(0, 5, "x"), m.int_var(0, 5, "y")
    m.add(2 * x + y - 3 <= 4, "f")
    m.add(x - y == 1, "g")
    r1, r2 = m.rows
    assert (r1.lb, r1.ub) == (-np.inf, 7.0) and dict(zip(r1.vars, r1.coefs)) == {0: 2.0, 1: 1.0}
    assert (r2.lb, r2.ub) == (1.0, 1.0)
    assert m.evaluate(np.array([2, 1])) == []
    bad = m.evaluate(np.array([4, 0]))
    assert len(bad) == 2 and "[f]" in bad[0]


def test_enforcement_needs_a_boolean_and_is_skipped_when_off():
    m = Model()
    x, b, k = m.int_var(0, 9, "x"), m.bool_var("b"), m.int_var(0, 3, "k")
    with pytest.raises(ValueError, match="not boolean"):
        m.add(x <= 2, "f", enforce=[(k, 1)])
    m.add(x <= 2, "f", enforce=[(b, 1)])
    assert m.evaluate(np.array([9, 0, 0])) == []
    assert m.evaluate(np.array([9, 1, 0])) != []


def test_constant_infeasible_row_is_rejected():
    m = Model()
    with pytest.raises(ValueError, match="infeasible"):
        m.add(LinExpr.of(3) <= 1, "f")


def _highs_extremes(model: Model, fixed: dict[int, float], target: int) -> tuple[float, float]:
    """min and max of variable ``target`` over the MILP with ``fixed`` variables pinned (SciPy's HiGHS,
    in process: these tests check the linearisation, not a backend)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n = model.num_vars
    lb, ub = np.array(model.lb, dtype=float), np.array(model.ub, dtype=float)
    for k, v in fixed.items():
        lb[k] = ub[k] = v
    A = np.zeros((len(model.rows), n))
    for r, row in enumerate(model.rows):
        A[r, row.vars] = row.coefs
    rows = LinearConstraint(A, [r.lb for r in model.rows], [r.ub for r in model.rows]) if model.rows else None
    out = []
    for sense in (1.0, -1.0):
        c = np.zeros(n)
        c[target] = sense
        res = milp(c, constraints=rows, integrality=np.array(model.integer, dtype=int), bounds=Bounds(lb, ub))
        assert res.status == 0, res.message
        out.append(sense * res.fun)
    return out[0], out[1]


@pytest.mark.solver
@settings(max_examples=12, deadline=None)
@given(xl=st.integers(0, 3), xw=st.integers(0, 40), yl=st.integers(-2, 3), yw=st.integers(0, 9),
       square=st.booleans(), data=st.data())
def test_products_are_linearised_exactly(xl, xw, yl, yw, square, data):
    m = Model()
    x = m.int_var(xl, xl + xw, "x")
    y = x if square else m.int_var(yl, yl + yw, "y")
    lo = min(a * b for a in (m.lb[x.index], m.ub[x.index]) for b in (m.lb[y.index], m.ub[y.index]))
    hi = max(a * b for a in (m.lb[x.index], m.ub[x.index]) for b in (m.lb[y.index], m.ub[y.index]))
    z = m.int_var(min(lo, 0), max(hi, 0), "z")
    m.add_product(z, x, y, "p", sense="eq")
    milp, _ = to_milp(m)
    assert not milp.products
    xv = data.draw(st.integers(xl, xl + xw))
    yv = xv if square else data.draw(st.integers(yl, yl + yw))
    fixed = {x.index: xv} if square else {x.index: xv, y.index: yv}
    assert _highs_extremes(milp, fixed, z.index) == pytest.approx((xv * yv, xv * yv), abs=1e-6)


@pytest.mark.solver
@pytest.mark.parametrize("big_m", ["tight", "loose"])
def test_indicator_becomes_big_m_rows(big_m):
    m = Model()
    x, b = m.int_var(0, 50, "x"), m.bool_var("b")
    m.add(x <= 7, "f", enforce=[(b, 1)])
    m.add(x >= 20, "g", enforce=[(b, 0)])
    milp, facts = to_milp(m, big_m=big_m)
    assert facts["big_m_rows"] == 2 and all(not r.enforce for r in milp.rows)
    assert _highs_extremes(milp, {b.index: 1}, x.index) == pytest.approx((0, 7))
    assert _highs_extremes(milp, {b.index: 0}, x.index) == pytest.approx((20, 50))
    assert (facts["max_big_m"] > 43) == (big_m == "loose")
