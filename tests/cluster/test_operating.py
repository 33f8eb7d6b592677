"""The operating point (short and long capacity and load), vLLM's max_num_seqs, the ring's balance, starvation."""
from __future__ import annotations

import numpy as np
import pytest

from infermax import Limits, Request, Workload, starvation
from infermax.cluster import Cluster, replay_cluster, simulate_cluster
from infermax.cluster.operating import (
    OperatingPoint,
    at_class_load,
    class_rate_rps,
    operating_point,
    replica_capacity_rps,
)

FOUR = Cluster.from_spec("a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3")
W = Workload.from_spec("pecsched:splitwise_conv,n=160,hi=300000")


@pytest.fixture(scope="module")
def per_replica():
    return replica_capacity_rps(W, FOUR, "short", "vllm")


def test_a_class_load_is_its_rate_over_its_capacity(per_replica):
    assert per_replica > 0
    w = at_class_load(W, 0.5, per_replica * FOUR.num_replicas)
    assert class_rate_rps(w, "short") == pytest.approx(0.5 * per_replica * FOUR.num_replicas)
    assert [r.tag for r in w.requests] == [r.tag for r in W.requests]          # the trace's order is kept
    op = operating_point(w, FOUR, "vllm", fifo_capacity=2.0, short_per_replica=per_replica, long_capacity=0.1)
    assert op.short_load == pytest.approx(0.5) and op.long_load == pytest.approx(op.long_rate_rps / 0.1)
    assert op.load == pytest.approx(op.rate_rps / 2.0)
    assert op.rate_rps == pytest.approx(op.short_rate_rps + op.long_rate_rps)
    short = np.array([r.tag == "short" for r in w.requests])
    assert op.short_kv_tokens == int((w.input_lens + w.output_lens - 1)[short].sum())
    assert op.kv_capacity_tokens == FOUR.replica_kv_capacity_tokens * 4
    assert set(op.as_dict()) >= {"short_load", "long_load", "load", "short_capacity_rps"}


def test_one_replica_s_capacity_is_its_steady_state_not_its_latency(per_replica):
    # the cluster's short requests all at t = 0 fit the replicas at once: their n / makespan is a latency
    # measure, below what a replica kept full serves
    short = Workload(requests=tuple(Request(id=r.id, input_len=r.input_len, output_len=r.output_len)
                                    for r in W.requests if r.tag == "short"))
    offline = len(short) / simulate_cluster(short, FOUR, "fifo", "vllm").metrics["latency_s"]
    assert per_replica * FOUR.num_replicas > 2 * offline
    with pytest.raises(ValueError, match="no request tagged 'medium'"):
        replica_capacity_rps(W, FOUR, "medium")
    with pytest.raises(ValueError, match="hold_factor must be an integer >= 2, got 1"):
        replica_capacity_rps(W, FOUR, hold_factor=1)


def test_reservation_queues_short_requests_once_its_short_replicas_are_overloaded(per_replica):
    # §3.2: the replicas reserved for long requests cannot serve short ones: with the short requests at 60 % of
    # the cluster's short capacity its one short-only replica of four is overloaded, PecSched's are not
    w = at_class_load(W, 0.6, per_replica * FOUR.num_replicas)
    rsv = simulate_cluster(w, FOUR, "reservation", "vllm", sp_replicas=2)
    pec = simulate_cluster(w, FOUR, "pecsched", "vllm", sp_replicas=2, decode_replicas=1)
    assert rsv.options["reserved_replicas"] == 3
    assert rsv.by_tag["short"]["queueing_p99_s"] > 2 * pec.by_tag["short"]["queueing_p99_s"]


def test_every_replica_holds_at_most_max_num_seqs_running_requests():
    w = Workload.from_spec("fixed:I=64,O=64,B=300")
    one = Cluster.from_spec("a100:nodes=1,gpus_per_node=1,model=mistral-7b-v0.3")
    r = simulate_cluster(w, one, "fifo", "vllm")
    assert r.options["max_num_seqs"] == 256 and Limits(**r.schedules[0].meta["limits"]).R_max == 256
    assert r.trace.batches["num_running"].max() == 256
    free = simulate_cluster(w, one, "fifo", "vllm", max_num_seqs=None)
    assert free.trace.batches["num_running"].max() == 300
    given = simulate_cluster(w, one, "fifo", "vllm", limits=Limits(C=4096, R_max=100))    # the limits' own wins
    assert given.trace.batches["num_running"].max() == 100
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1 or None"):
            simulate_cluster(w, one, "fifo", "vllm", max_num_seqs=bad)


def test_the_baselines_ring_is_striped_unless_asked_contiguous():
    w = Workload.from_spec("pecsched:splitwise_conv,n=60,hi=300000")
    striped = simulate_cluster(w, FOUR, "fifo", "vllm", sp_replicas=2)
    plain = simulate_cluster(w, FOUR, "fifo", "vllm", sp_replicas=2, ring_attention="contiguous")
    assert {g.sp_plan for g in striped.gangs} == {"ring-striped/megatron"}
    assert {g.sp_plan for g in plain.gangs} == {"ring/megatron"}
    by_request = {g.request: g.prefill_s for g in striped.gangs}
    assert all(g.prefill_s > by_request[g.request] for g in plain.gangs if len(g.members) > 1)
    for r in (striped, plain):                       # the judge prices each gang with the run's own ring
        replay_cluster(r.cluster_schedule(), w)
    assert "ring_attention" not in simulate_cluster(w, FOUR, "pecsched", "vllm", sp_replicas=2,
                                                       decode_replicas=1).options
    with pytest.raises(ValueError, match="ring_attention must be one of striped, contiguous, got 'zigzag'"):
        simulate_cluster(w, FOUR, "fifo", "vllm", ring_attention="zigzag")


def test_starvation_is_measured_against_fifo_on_the_same_trace():
    w = Workload.from_spec("pecsched:splitwise_conv,n=120,hi=300000")
    runs = {p: simulate_cluster(w, FOUR, p, "vllm", sp_replicas=2) for p in ("fifo", "priority")}
    fifo = starvation(runs["fifo"], runs["fifo"])
    assert fifo["num_starved"] == 0 and fifo["starved_share"] == 0.0      # FIFO never starves against itself
    pri = starvation(runs["priority"], runs["fifo"])
    assert 0 <= pri["num_starved"] <= min(pri["num_fifo_served"], pri["num_unserved"])
    other = Workload.from_spec("pecsched:splitwise_conv,n=100,hi=300000")
    with pytest.raises(ValueError, match="they must be runs of the same workload"):
        starvation(runs["priority"], simulate_cluster(other, FOUR, "fifo", "vllm", sp_replicas=2))
    with pytest.raises(ValueError, match="no request is tagged 'huge'"):
        starvation(runs["priority"], runs["fifo"], tag="huge")


def test_operating_point_is_a_plain_record():
    op = OperatingPoint(rate_rps=2.0, short_rate_rps=1.75, long_rate_rps=0.25, fifo_capacity_rps=1.0,
                        short_capacity_rps=3.5, long_capacity_rps=0.125, short_kv_tokens=10, kv_capacity_tokens=100)
    assert (op.load, op.short_load, op.long_load) == (2.0, 0.5, 2.0)
