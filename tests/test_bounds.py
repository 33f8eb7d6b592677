"""Certified lower bounds: never above any valid schedule, and the checker's verdicts."""
import json

import numpy as np
import pytest
from factories import ALL_SCHEDULERS, small_instances
from hypothesis import HealthCheck, given, settings

from infermax import Limits, Workload, simulate
from infermax.bounds import SPECS, cheap_methods, check_scheduler, lower_bound
from infermax.bounds.costs import coefficients_of, formula_time
from infermax.bounds.lagrangian import fill_table
from infermax.cli import main
from infermax.costmodel import LinearCostModel, get_cost_model
from infermax.schedulers import Plan, Scheduler, get_scheduler
from infermax.state import Status

#: the latency's cheap methods (the registry's: work, lp, lagrangian today)
METHODS = cheap_methods("latency")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=small_instances(max_requests=10, max_len=30))
def test_bound_never_exceeds_any_heuristic(inst):
    workload, limits = inst
    bound = lower_bound(workload, limits, methods=METHODS)
    for name in ALL_SCHEDULERS:
        latency = simulate(workload, name, limits).metrics["latency_s"]
        assert bound.value <= latency * (1 + 1e-9), (name, bound.values, latency)
        for method, value in bound.values.items():
            assert value <= latency * (1 + 1e-9), (name, method, value, latency)


def test_formula_matches_the_cost_model_and_rejects_others():
    cost = get_cost_model()
    co = coefficients_of(cost)
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(1, 30))
        tok, kv, dec = rng.integers(1, 300, n), rng.integers(0, 3000, n), rng.random(n) < 0.4
        tok[dec] = 1
        assert formula_time(co, tok, kv, dec) == pytest.approx(cost.batch_time(tok, kv, dec), rel=1e-12)

    class Weird(LinearCostModel):
        def batch_time(self, tokens, kv_before, is_decode):
            return 2 * super().batch_time(tokens, kv_before, is_decode)

    with pytest.raises(ValueError, match="does not follow the linear formula"):
        coefficients_of(Weird(cost.coefficients))


def test_fill_dp_matches_brute_force():
    co = coefficients_of(get_cost_model())
    mu = np.array([1e-7, 1e-6, 0.0, 1e-4])
    cost, _ = fill_table(co, 5e-5, mu, 6)

    def brute(e):
        best = np.inf
        for mask in range(1 << (e - 1)):   # every composition of e into chunks
            cuts = [0] + [k + 1 for k in range(e - 1) if mask >> k & 1] + [e]
            total = sum((5e-5 + mu[1] + mu[2]) * (b - a) + co.prefill_attn_s * ((b - a) * a + (b - a) * (b - a + 1) / 2)
                        + mu[0] * b + mu[3] for a, b in zip(cuts, cuts[1:]))
            best = min(best, total)
        return best

    for e in range(1, 7):
        assert cost[e] == pytest.approx(brute(e), rel=1e-12)


def test_paper_cell_is_tight():
    w = Workload.from_spec("fixed:I=1024,O=32,B=1024")
    lim = Limits(M=100_000, C=4096)
    best = min(simulate(w, n, lim).metrics["latency_s"] for n in ("vllm", "sarathi-pc-la", "sarathi-nocp-la"))
    b = lower_bound(w, lim, methods=METHODS, upper=best)
    assert b.value <= best and (best - b.value) / best < 0.10
    assert set(b.values) == set(METHODS)


def test_online_arrival_bound_counts_late_work():
    w = Workload.from_lengths([8, 8, 8], [4, 4, 4], arrivals_s=[0.0, 0.0, 50.0])
    b = lower_bound(w, Limits(M=100, C=64), methods=("work",))
    assert b.value > 50.0 and b.certificate["from_arrival_s"] == 50.0
    assert b.value <= simulate(w, "vllm", Limits(M=100, C=64)).metrics["latency_s"]


class CheatingScheduler(Scheduler):
    """Runs vLLM but reports half of the batches it ran (and so half the latency)."""

    name = "cheater"

    def __init__(self):
        self.inner = get_scheduler("vllm")

    def reset(self, state):
        self.inner.reset(state)
        self._state = state

    def next_batch(self, state) -> Plan:
        return self.inner.next_batch(state)

    def reported_metrics(self):
        return {"latency_s": self._state.clock_s / 2, "num_batches": self._state.num_batches // 2}


class OverbookingScheduler(Scheduler):
    """Puts every waiting request in one batch, ignoring M."""

    name = "overbooker"

    def next_batch(self, state) -> Plan:
        idx = np.flatnonzero(state.status == Status.WAITING)
        return Plan(idx, state.inp[idx] - state.m[idx], np.zeros(0, dtype=np.int64))


def test_cheating_and_invalid_schedulers_are_caught():
    w = Workload.from_spec("fixed:I=32,O=16,B=64")
    lim = Limits(M=1000, C=4096)
    cheat = check_scheduler(CheatingScheduler(), w, lim, optimum=False)
    assert cheat.exit_code == 3 and "beats the certified bound" in cheat.error
    bad = check_scheduler(OverbookingScheduler(), w, lim, optimum=False)
    assert bad.exit_code == 2 and "[M]" in bad.error
    honest = check_scheduler("sarathi-la", w, lim, optimum=False)
    assert honest.exit_code == 0 and 0 <= honest.gap < 1


def test_truncated_schedule_is_invalid(tmp_path):
    w = Workload.from_spec("fixed:I=32,O=16,B=8")
    sched = simulate(w, "vllm").schedule
    short = type(sched)(sched.batches[:-1], sched.meta)
    res = check_scheduler("vllm", w, schedule=short, optimum=False)
    assert res.exit_code == 2 and "incomplete" in res.error


def test_bound_cli_json_and_exit_codes(capsys, tmp_path):
    code = main(["bound", "--scheduler", "sarathi", "--workload", "fixed:I=16,O=8,B=32", "--no-optimum", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["valid"] and out["bound_s"] <= out["latency_s"]
    code = main(["bound", "--scheduler", "test_bounds:CheatingScheduler", "--workload", "fixed:I=16,O=8,B=32",
                 "--no-optimum", "--json"])
    assert code == 3 and json.loads(capsys.readouterr().out)["exit_code"] == 3


def test_the_search_method_is_the_exact_solvers_search(capsys):
    """``search`` (on request) runs csp's class-state A*: finished, it is the proven optimum; on a workload it
    does not apply to, it names why; through ``infermax bound --methods`` it is one more row."""
    w, lim = Workload.from_lengths([3, 3, 5, 5], [4, 4, 2, 2]), Limits(M=10, C=16)
    b = lower_bound(w, lim, None, methods=("search",))
    assert b.method == "search" and b.certificate["complete"]
    from infermax.optimal import solve_optimal
    opt = solve_optimal(w, lim, time_limit_s=60)
    assert opt.status == "optimal" and opt.objective * (1 - 2e-7) <= b.value <= opt.objective
    assert "search" not in lower_bound(w, lim, None).values          # not among the defaults
    with pytest.raises(ValueError, match="search: the workload has arrival times"):
        lower_bound(Workload.from_lengths([3, 3], [4, 4], [0.0, 0.01]), lim, None, methods=("search",))
    with pytest.raises(ValueError, match="search_time_limit_s must be a number > 0, got 0"):
        lower_bound(w, lim, None, methods=("search",), search_time_limit_s=0)
    code = main(["bound", "--scheduler", "vllm", "--workload", "fixed:I=3,O=4,B=6", "--limits", "M=24,C=24",
                 "--methods", "work,search", "--no-optimum", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and set(out["bound_values"]) == {"work", "search"} and out["bound_s"] <= out["latency_s"]
    assert main(["bound", "--workload", "fixed:I=3,O=4,B=6", "--methods", "work,foo"]) == 2
    assert "--methods 'work,foo': unknown method(s) ['foo']" in capsys.readouterr().err


def test_unsupported_objective_and_methods_are_named():
    with pytest.raises(ValueError, match="objective 'p42'"):
        lower_bound("fixed:I=4,O=4,B=4", objective="p42")
    with pytest.raises(ValueError, match="applies to objective 'ttft'"):
        lower_bound("fixed:I=4,O=4,B=4", objective="ttft", methods=("lp",))


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=25, deadline=None)
@given(inst=small_instances(max_requests=8, max_len=24, online=True))
def test_every_objective_bound_stays_below_every_heuristic(inst):
    """Every objective of the table with every cheap method that bounds it (means, percentiles and the
    throughput, an upper bound: tokens over the latency bound) holds against every scheduler, online or
    offline."""
    workload, limits = inst
    bounds = {s: lower_bound(workload, limits, objective=s.name, methods=cheap_methods(s.name))
              for s in SPECS if s.metric != "tpot" or workload.output_lens.max() > 1}
    for name in ALL_SCHEDULERS:
        try:
            m = simulate(workload, name, limits).metrics
        except Exception:  # noqa: BLE001 - a scheduler that refuses this instance proves nothing here
            continue
        for spec, b in bounds.items():
            got = m[spec.metric_key]
            assert (got <= b.value if spec.sense == "max" else b.value <= got), (name, spec.name, b.values, got)


def test_request_bounds_are_exact_for_a_lone_request():
    """One request with nothing to share: a one-token prompt and one output token is one prefill batch,
    and the bound is that batch's time (up to the safety margin)."""
    w = Workload.from_lengths([1], [1])
    lim = Limits(M=4, C=4)
    m = simulate(w, "vllm", lim).metrics
    b = lower_bound(w, lim, objective="ttft")
    assert b.method == "requests"
    assert m["ttft_mean_s"] * (1 - 1e-6) <= b.value <= m["ttft_mean_s"]


def test_bounds_price_the_per_request_term():
    from infermax.costmodel import LinearCoefficients

    base = get_cost_model().coefficients
    co = LinearCoefficients.from_dict({**base.to_dict(), "request_s": 5e-4})
    cost = LinearCostModel(co, name="with-request-term")
    w = Workload.from_spec("mix:SISO+LISO,B=24,seed=3")
    lim = Limits(M=4000, C=2048)
    b = lower_bound(w, lim, cost, methods=METHODS)
    plain = lower_bound(w, lim, methods=METHODS)
    assert b.value > plain.value            # the term costs something ...
    for name in ("vllm", "sarathi", "sarathi-la", "rank-i"):
        assert b.value <= simulate(w, name, lim, cost).metrics["latency_s"]   # ... and the bound stays valid


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@pytest.mark.solver
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=small_instances(max_requests=3, max_len=6, online=False))
def test_bound_never_exceeds_the_proven_optimum(inst):
    pytest.importorskip("ortools")
    from infermax import solve_optimal

    workload, limits = inst
    res = solve_optimal(workload, limits=limits, time_limit_s=20)
    bound = lower_bound(workload, limits, methods=METHODS)
    assert res.status == "optimal"
    assert bound.value <= res.objective * (1 + 1e-9), (bound.values, res.objective)
