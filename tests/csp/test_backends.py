"""Every installed backend finds the same optimum of small instances."""
from __future__ import annotations

import pytest

from infermax import Limits, Workload
from infermax.csp import solve_optimal
from infermax.csp.backends import ModelTooLarge, available_backends, backend_names, get_backend

pytestmark = pytest.mark.solver

INSTANCES = [
    ("two requests, forced eviction", Workload.from_lengths([2, 2], [3, 3]), Limits(M=5, C=64)),
    ("heterogeneous", Workload.from_lengths([3, 1], [2, 3]), Limits(M=5, C=64)),
    ("single request, chunking by P", Workload.from_lengths([5], [2]), Limits(M=8, C=64, P=3)),
]


def test_backend_registry_names_every_backend():
    assert set(backend_names()) == {"cpsat", "scip", "highs", "gurobi", "cbc"}
    assert "cpsat" in available_backends()
    for name in backend_names():
        be = get_backend(name)
        assert be.PIP.startswith("pip install") and callable(be.is_available) and callable(be.solve)


@pytest.mark.parametrize("label,workload,limits", INSTANCES, ids=[i[0] for i in INSTANCES])
def test_available_backends_agree(cost, label, workload, limits):
    results, too_large = {}, set()
    for name in available_backends():
        try:
            r = solve_optimal(workload, limits, cost, backend=name, time_limit_s=60, method="per-request",
                              rel_gap=1e-6)
        except ModelTooLarge:
            too_large.add(name)
            continue
        assert r.status == "optimal", (name, r.status, r.info)
        assert r.info["solution_from"] == "solver", name
        results[name] = r.objective
    assert set(results) | too_large == set(available_backends()) and len(results) >= 3
    ref = results["cpsat"]
    for name, value in results.items():
        assert value == pytest.approx(ref, rel=1e-6), (name, results)


def test_gurobi_size_limit_is_reported(cost):
    if "gurobi" not in available_backends():
        pytest.skip("gurobipy not installed")
    with pytest.raises(ModelTooLarge, match="2000 variables / 2000 constraints"):
        solve_optimal("fixed:I=16,O=4,B=4", "M=32,C=4096", cost, backend="gurobi", time_limit_s=10,
                      method="per-request")
