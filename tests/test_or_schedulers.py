"""The operations-research schedulers (issue 39): MC-SF, WAIT, Nested WAIT, and what they stand on — the unit
cost model, typed workloads and the fluid model. (The registry's generic tests hold them to every scheduler
invariant; these check that each one is the policy its paper describes.)"""
import math

import numpy as np
import pytest

from infermax import Limits, Request, Workload, replay, simulate
from infermax.costmodel import get_cost_model
from infermax.fluid import binding, equilibrium, fluid_types, stability_limit
from infermax.schedulers import get_scheduler

UNIT = get_cost_model("unit")


def reference_mcsf(I, O, T, M):
    """MC-SF in unit-time rounds, written from the paper's rule: in round t, a request started in round p
    holds I + (t - p) KV tokens for t in [p, p + O - 1] and completes at the end of round p + O - 1; waiting
    requests, shortest output first, are added while the KV of every started request stays <= M in every
    later round. Returns the mean latency (end of the completing round - arrival)."""
    n, start, t = len(I), [None] * len(I), 0
    while any(s is None for s in start):
        for i in sorted((i for i in range(n) if start[i] is None and T[i] <= t), key=lambda i: (O[i], T[i], i)):
            trial = start[:i] + [t] + start[i + 1:]
            ends = [trial[j] + O[j] - 1 for j in range(n) if trial[j] is not None]
            if all(sum(I[j] + u - trial[j] for j in range(n) if trial[j] is not None and trial[j] <= u
                       <= trial[j] + O[j] - 1) <= M for u in range(t, max(ends) + 1)):
                start = trial
            else:
                break                    # a prefix: the first that does not fit stops the round's admissions
        t += 1
    return float(np.mean([start[i] + O[i] - T[i] for i in range(n)]))


@pytest.mark.parametrize("seed", range(6))
def test_mcsf_is_the_papers_rule_in_unit_time(seed):
    rng = np.random.default_rng(seed)
    n = 7
    I, O = rng.integers(1, 5, n).tolist(), rng.integers(1, 9, n).tolist()
    T = ([0.0] * n) if seed % 2 else np.sort(rng.integers(0, 6, n)).astype(float).tolist()
    M = max(i + o - 1 for i, o in zip(I, O)) + 4
    w, lim = Workload.from_lengths(I, O, T), Limits(M=M, C=1000)
    r = simulate(w, "mcsf", lim, UNIT)
    assert replay(r.schedule, w, lim, UNIT) == r.trace
    assert r.metrics["num_evictions"] == 0
    assert r.metrics["e2e_mean_s"] == pytest.approx(reference_mcsf(I, O, T, M))


def test_mcsf_takes_the_shortest_first_and_a_prefix_unless_skip():
    # M = 10: the 2-token output (peak 5) and then the 9-token one (peak 12 > 10) — which never fits beside it
    w, lim = Workload.from_lengths([4, 4, 4], [9, 2, 3]), Limits(M=12, C=100)
    first = simulate(w, "mcsf", lim, UNIT).schedule.batches[0]
    assert sorted(first.ids.tolist()) == [1, 2]          # O = 2 and 3 first; O = 9 (peak 12) waits
    assert get_scheduler("mcsf:skip=true").policy.skip_on_fail


def test_mcsf_is_a_policy_of_the_family_without_staggering():
    p = get_scheduler("mcsf").policy
    assert (p.rank_key, p.lookahead, p.stagger, p.priority) == ("output", True, False, "decode")
    assert get_scheduler("sarathi-la").policy.stagger


def _gate_workload():
    # one long request runs; three short ones of type "s" arrive one by one
    return Workload(requests=[Request(id=0, input_len=16, output_len=400)]
                    + [Request(id=k, input_len=8, output_len=4, arrival_s=0.2 * k, tag="s") for k in (1, 2, 3)])


def test_wait_admits_a_type_as_a_cohort_once_its_threshold_is_reached():
    w, lim = _gate_workload(), Limits(M=1000, C=100)
    r = simulate(w, "wait:threshold=3", lim)
    assert replay(r.schedule, w, lim) == r.trace
    starts = {int(i): k for k, b in reversed(list(enumerate(r.schedule.batches))) for i in b.ids}
    assert starts[1] == starts[2] == starts[3] > starts[0]         # the three together, after the third arrived
    eager = simulate(w, "wait:threshold=1", lim).schedule.batches
    assert len({k for k, b in enumerate(eager) for i in b.ids if i in (1, 2, 3) and k}) > 1


def test_wait_thresholds_are_one_batch_of_fluid_arrivals():
    w, lim, cost = Workload.from_spec("typed:types=a/128/64/4+b/512/256/1,n=400"), Limits(M=100_000, C=4096), \
        get_cost_model(None)
    rate = 0.9 * 5 * stability_limit(fluid_types(w, 5.0), lim, cost)[0]     # 90 % of the fluid limit
    sched = get_scheduler(f"wait:rate={rate},scale=8")
    simulate(w, sched, lim)
    point = equilibrium(fluid_types(w, rate), cost)
    assert binding(point, lim) is None
    want = [max(1, math.floor(8 * point.admissions[n])) for n in sched._names]
    assert sched.thresholds.tolist() == want and max(want) > 1


@pytest.mark.parametrize("name", ["wait", "nested-wait"])
def test_wait_thresholds_stay_finite_when_no_rate_fits_the_limits(name):
    # arrivals 1e-38 s apart: even the smallest rate scale overflows M = 1, so the stability limit is 0; the
    # admissions per batch are then their limit at scale -> 0, not 0 / 0 (which cast NaN to a negative threshold)
    w = Workload(requests=[Request(id=0, input_len=1, output_len=1, arrival_s=0.0),
                           Request(id=1, input_len=1, output_len=1, arrival_s=1.175494351e-38)])
    lim = Limits(M=1, C=2, P=2)
    assert stability_limit(fluid_types(w, None), lim, get_cost_model(None))[0] == 0.0
    sched = get_scheduler(name)
    with np.errstate(all="raise"):
        r = simulate(w, sched, lim)
    assert (sched.thresholds if name == "wait" else sched._n).min() >= 1
    assert len(replay(r.schedule, w, lim).request_frame()) == 2


def test_nested_wait_never_reads_an_output_length_before_it_completes():
    base = Workload.from_lengths([20, 12, 30, 8], [50, 9, 70, 33], [0.0, 0.0, 0.01, 0.02])
    longer = Workload.from_lengths([20, 12, 30, 8], [50, 9, 90, 33], [0.0, 0.0, 0.01, 0.02])
    lim, spec = Limits(M=400, C=64), "nested-wait:first_segment=4,threshold=2"
    a, b = (simulate(w, spec, lim).schedule.batches for w in (base, longer))
    # up to the batch in which request 2 completes in the shorter run, both runs batch the same
    last = max(k for k, x in enumerate(a) if 2 in x.ids)
    for x, y in zip(a[:last + 1], b[:last + 1]):
        assert x.ids.tolist() == y.ids.tolist() and x.tokens.tolist() == y.tokens.tolist()
    assert len(b) > len(a)


def test_nested_wait_pauses_a_request_at_a_boundary_until_its_cohort_forms():
    # request 0 reaches the 4-token boundary while request 1 (arrived later) still runs segment 1: 0 waits
    w, lim = Workload.from_lengths([8, 8], [30, 30], [0.0, 0.02]), Limits(M=1000, C=64)
    r = simulate(w, "nested-wait:first_segment=4,threshold=2", lim)
    assert replay(r.schedule, w, lim) == r.trace
    paused = [k for k, b in enumerate(r.schedule.batches) if 0 not in b.ids and 1 in b.ids]
    assert paused and r.metrics["num_evictions"] == 0
    with pytest.raises(ValueError, match="buffer"):
        get_scheduler("nested-wait:buffer=1.5")


# --- what they stand on -------------------------------------------------------------------------------------
def test_unit_time_costs_one_round_per_batch():
    assert UNIT.batch_time(np.array([100, 1]), np.array([0, 50]), np.array([False, True])) == 1.0
    r = simulate("fixed:I=4,O=3,B=2", "mcsf", Limits(M=100, C=100), UNIT)
    assert r.metrics["latency_s"] == 3.0 == len(r.schedule.batches)
    with pytest.raises(ValueError, match="no options"):
        get_cost_model("unit@tp=2")


def test_typed_workloads_have_their_types_rates_and_ticks():
    w = Workload.from_spec("typed:types=a/10-20/e8/3+b/5/7/1,n=4000,seed=2,tick=0.5")
    tags = np.array([r.tag for r in w.requests])
    assert 0.7 < (tags == "a").mean() < 0.8
    a = [r for r in w.requests if r.tag == "a"]
    assert {r.input_len for r in a} <= set(range(10, 21)) and {(r.input_len, r.output_len) for r in w.requests
                                                                if r.tag == "b"} == {(5, 7)}
    assert np.allclose(w.arrivals_s * 2, np.round(w.arrivals_s * 2)) and w.arrivals_s[0] == 0.0
    assert (len(w) - 1) / w.arrivals_s.max() == pytest.approx(4.0, rel=0.1)
    for bad, word in [("typed:types=a/1/2,n=3", "NAME/PROMPT/OUTPUT/RATE"), ("typed:types=a/0/2/1,n=3", "PROMPT"),
                      ("typed:types=a/1/2/-1,n=3", "RATE"), ("typed:types=a/1/2/1", "needs")]:
        with pytest.raises(ValueError, match=word):
            Workload.from_spec(bad)


def test_the_fluid_equilibrium_is_the_fixed_point_and_the_limit_is_where_it_breaks():
    w, lim, cost = Workload.from_spec("typed:types=a/128/64/4+b/512/256/1,n=500"), Limits(M=100_000, C=4096), \
        get_cost_model(None)
    types = fluid_types(w)
    point = equilibrium(types, cost)
    co = cost.coefficients
    n = point.tokens
    again = (max(a + b * n for a, b in co.nonattn_lines) + co.decode_bias_s + co.prefill_bias_s
             + co.decode_kv_s * point.batch_time_s * sum(t.rate_per_s * (t.prompt_x_output - t.prompt
                                                                         + (t.output_sq - t.output) / 2) for t in types)
             + co.prefill_attn_s * point.batch_time_s * sum(t.rate_per_s * (t.prompt_sq + t.prompt) / 2 for t in types))
    assert again == pytest.approx(point.batch_time_s, rel=1e-9)
    rho, why = stability_limit(types, lim, cost)
    assert binding(equilibrium(types, cost, rho * 0.999), lim) is None
    assert binding(equilibrium(types, cost, rho * 1.001), lim) == why
    unit_rho, unit_why = stability_limit(types, lim, UNIT)          # unit time: only the limits bind
    assert equilibrium(types, UNIT, unit_rho).batch_time_s == 1.0 and unit_why in ("M", "C")
    with pytest.raises(ValueError, match="offline"):
        equilibrium(fluid_types(Workload.from_spec("fixed:I=4,O=4,B=3")), cost)
