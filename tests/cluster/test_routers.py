"""Vidur's global schedulers as cluster policies (infermax/cluster/routers.py): round-robin, random and
least outstanding requests send every request the moment it arrives; the cluster judge accepts their
schedules; on one replica they are the single-replica simulator."""
from __future__ import annotations

import numpy as np
import pytest

from infermax import Limits, Workload, simulate
from infermax.cluster import Cluster, ClusterPolicy, ClusterSchedule, replay_cluster, simulate_cluster
from infermax.cluster.routers import ROUTES, Router

CLUSTER = Cluster.from_spec("a100:nodes=1,gpus_per_node=4,model=llama2-7b")
ONLINE = "fixed:I=256,O=64,B=80,rate=40,seed=3"


@pytest.fixture(scope="module")
def online():
    return Workload.from_spec(ONLINE)


@pytest.mark.parametrize("route", ROUTES)
def test_every_request_is_sent_on_arrival_and_the_judge_agrees(online, route):
    res = simulate_cluster(online, CLUSTER, route, "vllm")
    np.testing.assert_array_equal(res.dispatch_s, online.arrivals_s)      # never held in a global queue
    assert np.isfinite(res.trace.requests["completion_s"]).all()
    out = replay_cluster(ClusterSchedule.from_json(res.cluster_schedule().to_json()), online)
    for key in ("first_token_s", "completion_s"):
        np.testing.assert_array_equal(out.requests[key], res.trace.requests[key], err_msg=key)
    assert out.metrics()["e2e_mean_s"] == res.metrics["e2e_mean_s"]


def test_round_robin_sends_request_k_to_replica_k_mod_R(online):
    res = simulate_cluster(online, CLUSTER, "round-robin", "sarathi")
    order = np.argsort(online.arrivals_s, kind="stable")
    np.testing.assert_array_equal(res.replica_of[order], np.arange(len(online)) % 4)


def test_random_repeats_itself_and_its_seed_changes_it(online):
    a = simulate_cluster(online, CLUSTER, "random", "vllm").replica_of
    b = simulate_cluster(online, CLUSTER, "random", "vllm").replica_of
    c = simulate_cluster(online, CLUSTER, ClusterPolicy("random", "fifo", route="random", route_seed=7),
                         "vllm").replica_of
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert set(a.tolist()) == {0, 1, 2, 3}


def test_lor_counts_the_requests_waiting_to_start():
    # all at t = 0: each dispatch counts at once, so 10 requests spread 3, 3, 2, 2
    w = Workload.from_spec("fixed:I=64,O=8,B=10")
    res = simulate_cluster(w, CLUSTER, "lor", "vllm")
    np.testing.assert_array_equal(np.bincount(res.replica_of, minlength=4), [3, 3, 2, 2])
    # online and lightly loaded, every request starts before the next arrives: nobody waits anywhere, so
    # replica 0 (the lowest index) takes them all — Vidur's count is the replica queue, not the running work
    sparse = Workload.from_spec("fixed:I=64,O=8,B=10,rate=1,seed=1")
    assert set(simulate_cluster(sparse, CLUSTER, "lor", "vllm").replica_of.tolist()) == {0}


@pytest.mark.parametrize("route", ROUTES)
def test_one_replica_is_the_simulator_bit_for_bit(online, route):
    one = Cluster.from_spec("a100:nodes=1,gpus_per_node=1,model=llama2-7b")
    lim = Limits(M=one.replica_kv_capacity_tokens, C=4096)
    a = simulate(online, "sarathi", lim, one.cost_model_name())
    b = simulate_cluster(online, one, route, "sarathi", lim)
    assert a.trace == b.trace
    assert a.schedule.batches == b.schedules[0].batches


def test_the_router_is_checked():
    with pytest.raises(ValueError, match="ClusterPolicy.route must be one of round-robin, random, lor"):
        Router("nearest", 4, lambda r: 0)
    rr = Router("round-robin", 4, lambda r: 0)
    mask = np.array([True, False, True, True])
    assert [rr.choose(mask) for _ in range(5)] == [0, 2, 3, 0, 2]
    assert rr.choose(np.zeros(4, dtype=bool)) is None
