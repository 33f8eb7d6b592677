"""Durations do not depend on where the clock starts (docs/design.md invariant 7; issue 36 §1).

A workload shifted by 1e6, 1.7e9 (a Unix timestamp) or 1e12 s gives the same metrics, traces, bounds
and judge verdicts as the workload itself, to the last bit, in the simulator, ``replay``, the cluster
engine and its judge (the solvers: ``tests/test_oracle.py``). Arrivals sit on a grid of 2^-12 s, so
that every shifted arrival is an exact float: the shifted workload is the same instance, on another
clock. The issue's reproducers, and the gap that is never clamped, close the file.
"""
from __future__ import annotations

import numpy as np
import pytest

import infermax
from infermax import Batch, Limits, Request, Schedule, Workload, metrics, replay, simulate
from infermax.bounds.cluster import cluster_lower_bound
from infermax.clock import first_arrival_s, on_relative_clock
from infermax.cluster import Cluster, simulate_cluster
from infermax.cluster.judge import replay_cluster
from infermax.csp import InvalidBoundError
from infermax.csp.result import relative_gap

SHIFTS_S = (1e6, 1.7e9, 1e12)
GRID_S = 2.0 ** -12
LIMITS = Limits(M=2048, C=256)


def on_grid(w: Workload) -> Workload:
    """``w`` with its arrivals rounded to the grid (exact under every shift of SHIFTS_S)."""
    arrivals = np.round(w.arrivals_s / GRID_S) * GRID_S
    return Workload(requests=tuple(Request(**{**r.to_dict(), "arrival_s": float(t)})
                                   for r, t in zip(w.requests, arrivals)), name=w.name)


def shifted(w: Workload, shift_s: float) -> Workload:
    moved = w.arrivals_s + shift_s
    assert np.array_equal(moved - shift_s, w.arrivals_s)      # exact: the same instance
    return Workload(requests=tuple(Request(**{**r.to_dict(), "arrival_s": float(t)})
                                   for r, t in zip(w.requests, moved)), name=w.name)


def same_bits(a: dict, b: dict) -> list[str]:
    """The keys whose values differ in any bit (NaN equals NaN)."""
    assert a.keys() == b.keys()
    def bits(v):
        return np.asarray(v, dtype=np.float64).tobytes()
    return [k for k in a if bits(a[k]) != bits(b[k])]


@pytest.fixture(scope="module")
def online() -> Workload:
    w = on_grid(Workload.from_spec("fixed:I=48,O=12,B=16,rate=40,seed=5"))
    assert not w.is_offline and first_arrival_s(w) == 0.0
    return w


def test_the_relative_clock_is_exact_and_leaves_a_clock_at_zero_alone(online):
    assert on_relative_clock(online) is online
    for shift in SHIFTS_S:
        rebased = on_relative_clock(shifted(online, shift))
        assert rebased.arrivals_s.tobytes() == online.arrivals_s.tobytes()
        assert [r.id for r in rebased] == [r.id for r in online] and rebased.name == online.name
    rng = np.random.default_rng(36)     # timestamps: within a factor 2 of the first, the subtraction is exact
    stamps = np.sort(1.7e9 + rng.uniform(0, 86_400, 50))
    w = Workload.from_lengths([4] * 50, [2] * 50, stamps.tolist())
    assert np.array_equal(on_relative_clock(w).arrivals_s + stamps[0], stamps)


def test_simulator_and_replay_are_bit_identical_under_shifts(online):
    """Every registered scheduler: metrics, trace and schedule; replay of the grid clock's schedule."""
    failures = []
    for name in infermax.schedulers.available():
        ref = simulate(online, name, LIMITS)
        for shift in SHIFTS_S:
            w = shifted(online, shift)
            got = simulate(w, name, LIMITS)
            if same_bits(got.metrics, ref.metrics) or got.trace.diff(ref.trace) or got.schedule != ref.schedule:
                failures.append(f"{name} +{shift:g} s: {same_bits(got.metrics, ref.metrics)} "
                                f"{got.trace.diff(ref.trace)}")
            judged = replay(ref.schedule, w, LIMITS)
            if judged.diff(ref.trace) or same_bits(metrics(judged), ref.metrics):
                failures.append(f"replay of {name}'s schedule +{shift:g} s: {judged.diff(ref.trace)}")
    assert not failures, "\n".join(failures)


CLUSTER = Cluster.from_spec("a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3")
#: the dispatcher's own wall-clock time per decision (measured on this machine, not simulated)
MEASURED = ("scheduling_decision_p99_s", "decision_share_p99_short", "decision_share_p99_long")


def simulated(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in MEASURED}


@pytest.mark.parametrize("policy", ["fifo", "pecsched"])
def test_cluster_engine_and_judge_are_bit_identical_under_shifts(policy):
    w0 = on_grid(Workload.from_spec("pecsched:splitwise_conv,n=16,hi=200000"))
    options = {"sp_replicas": 2, **({"decode_replicas": 1} if policy == "pecsched" else {})}
    ref = simulate_cluster(w0, CLUSTER, policy, "vllm", **options)
    ref_judged = replay_cluster(ref.cluster_schedule(), w0).metrics()
    ref_bound = cluster_lower_bound(w0, CLUSTER, "ttft").values
    for shift in SHIFTS_S:
        w = shifted(w0, shift)
        got = simulate_cluster(w, CLUSTER, policy, "vllm", **options)
        assert not same_bits(simulated(got.metrics), simulated(ref.metrics)), shift
        assert not got.trace.diff(ref.trace), shift
        assert got.cluster_schedule().to_json() == ref.cluster_schedule().to_json()
        assert not same_bits(replay_cluster(got.cluster_schedule(), w).metrics(), ref_judged)
        assert not same_bits(replay_cluster(ref.cluster_schedule(), w).metrics(), ref_judged)
        assert cluster_lower_bound(w, CLUSTER, "ttft").values == ref_bound


def test_bounds_and_the_checker_are_bit_identical_under_shifts(online):
    small = Workload(requests=online.requests[:6], name="six")
    for objective in ("latency", "ttft", "e2e", "tpot", "e2e_p90"):
        ref = infermax.check_scheduler("sarathi", small, LIMITS, objective=objective, optimum=False)
        assert ref.exit_code == 0, ref.error
        for shift in SHIFTS_S:
            got = infermax.check_scheduler("sarathi", shifted(small, shift), LIMITS, objective=objective,
                                           optimum=False)
            assert (got.exit_code, got.value_s, got.bound_values) == (0, ref.value_s, ref.bound_values), objective


# --- issue 36 §1, as filed ----------------------------------------------------------------------------
EPOCH_S = 1700310147.5693192


def _epoch_instance():
    w = Workload(requests=[Request(id=0, input_len=6, output_len=1, arrival_s=EPOCH_S)])
    s = Schedule((Batch(ids=np.array([0]), tokens=np.array([6]), evict=np.array([], dtype=np.int64)),), {})
    return w, Limits(M=16, C=16), s


def test_issue_36_a_request_at_a_unix_timestamp():
    w, lim, s = _epoch_instance()
    batch_s = infermax.costmodel.get_cost_model(None).batch_time(np.array([6]), np.array([0]), np.array([False]))
    ttft = metrics(replay(s, w, lim))["ttft_mean_s"]
    assert ttft == batch_s                                                  # was 0.009209394454956055
    bound = infermax.lower_bound(w, lim, objective="ttft", methods=("requests",))
    assert bound.value <= ttft                                              # was 0.009209507676795074 > ttft
    assert infermax.check_scheduler(None, w, lim, objective="ttft", schedule=s, optimum=False).exit_code == 0
    r = infermax.solve_optimal(w, lim, objective="latency")
    assert r.status == "optimal" and r.bound <= r.objective == batch_s and r.gap >= 0


def test_issue_36_two_requests_at_unix_timestamps_solve_on_cp_sat():
    """Was ``ValueError: cpsat: variable end[0] has an unusable domain [0.0, 1700310147.6…]``."""
    w = Workload.from_lengths([6, 4], [1, 2], [EPOCH_S, EPOCH_S + 0.1])
    r = infermax.solve_optimal(w, Limits(M=16, C=16), objective="latency", backend="cpsat", time_limit_s=20)
    assert r.status in ("optimal", "feasible") and r.bound is not None and r.bound <= r.objective


# --- the gap is never clamped (issue 36 §1) --------------------------------------------------------
def test_a_bound_beyond_the_objective_is_an_error_never_a_zero_gap():
    with pytest.raises(InvalidBoundError, match="beyond the value"):
        relative_gap(0.0092093945, 0.0092095077, "latency")
    with pytest.raises(InvalidBoundError):
        relative_gap(120.0, 119.0, "throughput")           # throughput's bound is a ceiling
    assert relative_gap(1.0, 1.0 + 1e-15, "latency") == 0.0  # rounding of the two sums: equal
    assert relative_gap(2.0, 1.0, "latency") == 0.5
    assert relative_gap(100.0, 125.0, "throughput") == 0.2
    assert relative_gap(0.0, 0.0, "ttft") == 0.0             # a model in which the first tokens cost nothing
    assert relative_gap(float("inf"), float("inf"), "throughput") == 0.0
    assert relative_gap(None, 1.0, "latency") is None
