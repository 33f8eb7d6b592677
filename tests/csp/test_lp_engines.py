"""The growing LPs of csp/backends/lp.py: both engines give one optimum and one sign of dual, before and
after a column is added (the column generation of the trajectory and configuration LPs relies on both)."""
from __future__ import annotations

import math

import pytest

from infermax.csp.backends import lp

ENGINES = [pytest.param(e, marks=pytest.mark.skipif(not lp.is_available(e), reason=f"{e} is not installed"))
           for e in lp.ENGINES]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_lp_grows_and_is_re_solved(engine):
    """min x + 2y, x + y >= 1, x <= 0.6: x = 0.6, y = 0.4 (1.4); the duals say a unit more demand costs 2
    (>= row) and a unit more room for x saves 1 (<= row). A column z (cost 0.5) that meets the demand
    alone then takes it all (0.5)."""
    model = lp.new_lp(engine)
    x = model.add_col(1.0, 0.0, math.inf, name="x")
    y = model.add_col(2.0, 0.0, math.inf, name="y")
    demand = model.add_row(1.0, math.inf, {x: 1.0, y: 1.0})
    room = model.add_row(-math.inf, 0.6, {x: 1.0})
    assert model.solve()
    assert model.objective_value == pytest.approx(1.4)
    assert model.row_duals()[[demand, room]] == pytest.approx([2.0, -1.0])
    assert model.add_col(0.5, 0.0, math.inf, {demand: 1.0}) == 2
    assert model.solve()
    assert model.objective_value == pytest.approx(0.5)
    assert model.row_duals() == pytest.approx([0.5, 0.0])


@pytest.mark.parametrize("engine", ENGINES)
def test_an_infeasible_lp_says_so(engine):
    model = lp.new_lp(engine)
    x = model.add_col(1.0, 0.0, 1.0)
    model.add_row(2.0, math.inf, {x: 1.0})
    assert not model.solve() and model.status


def test_an_unknown_engine_is_named():
    with pytest.raises(ValueError, match="glop, highs"):
        lp.new_lp("simplex")
