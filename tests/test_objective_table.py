"""The objective table (``infermax.bounds.objectives.SPECS``) and the bound-method registry
(``infermax.bounds.methods``): every list of names derives from them, the MILP has a builder for each
objective that names one (and no other), and a method registered is run and listed everywhere."""
from __future__ import annotations

import pytest

import infermax.bounds as bounds
from infermax import Limits, Workload, simulate
from infermax.bounds import lower_bound
from infermax.bounds.check import parse_methods
from infermax.bounds.methods import BoundMethod, register, registered, unregister
from infermax.bounds.objectives import ALL, BASES, SPEC_OF, SPECS, parse_objective
from infermax.csp.milp import objectives as milp

W = Workload.from_lengths([3, 5, 2], [4, 2, 3])
LIMITS = Limits(M=16, C=8)


def test_every_milp_objective_of_the_table_has_a_builder_and_every_builder_a_row():
    named = {s.milp for s in SPECS if s.milp is not None}
    assert named == set(milp.BUILDERS) == set(milp.OBJECTIVES)
    for name in milp.OBJECTIVES:
        spec = milp.SPEC_OF_MILP[name]
        assert (name in milp.MONOTONE) == spec.monotone and (name in milp.TAGGABLE) == spec.taggable
        assert milp.METRIC_OF[name] == spec.metric_key
        assert milp.split_objective(spec.name) == (name, None)
    for spec in SPECS:
        if spec.milp is None:
            with pytest.raises(ValueError, match="quantiles are bounds only"):
                milp.split_objective(spec.name)


def test_the_names_derive_from_the_table():
    assert BASES == tuple(n for s in SPECS for n in (s.name, *s.aliases))
    assert ALL == ("latency", "ttft", "e2e", "tpot", "ttft_p99", "e2e_p99")
    assert bounds.OBJECTIVES == BASES
    for name, spec in SPEC_OF.items():
        obj = parse_objective(name)
        assert obj.spec is spec and obj.metric == spec.metric and obj.quantile == spec.quantile
        if spec.taggable:
            assert parse_objective(f"{name}:short").spec is spec
        else:
            with pytest.raises(ValueError, match="no per-tag bound"):
                parse_objective(f"{name}:short")


def test_every_metric_key_is_a_key_of_the_metrics():
    m = simulate(W, "vllm", LIMITS).metrics
    assert all(spec.metric_key in m for spec in SPECS), [s.metric_key for s in SPECS if s.metric_key not in m]


def test_the_public_method_lists_are_the_registry():
    assert bounds.METHODS == tuple(m.name for m in registered())
    assert bounds.METHODS == ("work", "lp", "lagrangian", "requests", "order", "chains", "sharing", "milp", "search")
    assert bounds.METHODS_OF["latency"] == bounds.METHODS_OF["throughput"] == ("work", "lp", "lagrangian", "milp",
                                                                               "search")
    assert bounds.METHODS_OF["completion"] == bounds.METHODS_OF["e2e"] == ("requests", "order", "chains", "sharing",
                                                                           "milp")
    assert bounds.METHODS_OF["tpot"] == ("requests", "milp") and bounds.METHODS_OF["e2e_p99"] == ("requests", "order")
    assert bounds.ON_REQUEST == ("search",) and bounds.SOLVER_METHODS == ("milp", "search")
    assert bounds.cheap_methods("e2e:short") == ("requests", "order", "chains", "sharing")


def test_a_registered_method_is_run_and_listed_then_gone():
    def half_work(ctx):
        from infermax.bounds.work import arrival_bound

        value, cert = arrival_bound(ctx.coefficients, ctx.workload, ctx.limits)
        return value / 2, {**cert, "halved": True}

    register(BoundMethod(name="half-work", metrics=("latency",), run=half_work), before="milp")
    try:
        assert bounds.METHODS.index("half-work") == bounds.METHODS.index("milp") - 1
        assert "half-work" in bounds.METHODS_OF["latency"] and "half-work" not in bounds.METHODS_OF["throughput"]
        assert "half-work" in bounds.cheap_methods("latency")
        assert parse_methods("work,half-work") == ("work", "half-work")
        b = lower_bound(W, LIMITS, methods=("work", "half-work"))
        assert b.values["half-work"] == pytest.approx(b.values["work"] / 2, rel=1e-6) and b.method == "work"
        with pytest.raises(ValueError, match="none of the bound methods given applies to objective 'ttft'"):
            lower_bound(W, LIMITS, objective="ttft", methods=("half-work",))
        with pytest.raises(ValueError, match="is registered already"):
            register(BoundMethod(name="half-work", metrics=("latency",), run=half_work))
    finally:
        unregister("half-work")
    assert "half-work" not in bounds.METHODS
    with pytest.raises(ValueError, match=r"--methods 'half-work': unknown method"):
        parse_methods("half-work")


def test_registering_bad_methods_names_the_field():
    with pytest.raises(ValueError, match=r"metrics \('jct',\) name no objective"):
        BoundMethod(name="bad", metrics=("jct",), run=lambda ctx: (0.0, {}))
    with pytest.raises(ValueError, match="run must be callable"):
        BoundMethod(name="bad", metrics=("latency",), run=None)
    with pytest.raises(ValueError, match="no method 'nonesuch' to register it before"):
        register(BoundMethod(name="bad", metrics=("latency",), run=lambda ctx: (0.0, {})), before="nonesuch")
    with pytest.raises(KeyError, match="no bound method 'bad' is registered"):
        unregister("bad")
