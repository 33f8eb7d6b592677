"""Placement rules of PecSched §6.2: shortest local queue, same node first, least total queue."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from infermax.cluster import Cluster
from infermax.cluster.placement import choose_gang, replicas_needed, reservation_split, shortest_queue

C = Cluster.from_spec("a100:nodes=4,model=mistral-7b-v0.3,net_gbps=400")     # 32 replicas, 8 per node


def test_shortest_queue_ties_to_the_lowest_index_and_skips_ineligible():
    q = np.array([5, 3, 3, 9])
    assert shortest_queue(q, np.ones(4, bool)) == 1
    assert shortest_queue(q, np.array([True, False, True, True])) == 2
    assert shortest_queue(q, np.zeros(4, bool)) is None


def test_replicas_needed_covers_the_kv():
    M = C.replica_kv_capacity_tokens
    assert replicas_needed(C, 1) == 1 and replicas_needed(C, M) == 1 and replicas_needed(C, M + 1) == 2
    with pytest.raises(ValueError, match="needs 33 replicas"):
        replicas_needed(C, 32 * M + 1)
    with pytest.raises(ValueError, match="peak_kv_tokens must be an integer >= 1, got 0"):
        replicas_needed(C, 0)


@pytest.mark.parametrize("seed", range(12))
def test_the_gang_is_on_the_fewest_nodes_with_the_least_total_queue(seed):
    rng = np.random.default_rng(seed)
    small = Cluster.from_spec("a100:nodes=3,gpus_per_node=4,model=mistral-7b-v0.3")   # 12 replicas
    q = rng.integers(0, 50, small.num_replicas)
    eligible = rng.random(small.num_replicas) < 0.7
    for k in (1, 2, 3, 5):
        gang = choose_gang(small, k, q, eligible)
        reps = [r for r in range(small.num_replicas) if eligible[r]]
        if len(reps) < k:
            assert gang is None
            continue
        assert len(gang) == k and all(eligible[r] for r in gang)
        nodes = len({small.replicas[r].node for r in gang})
        best = min((len({small.replicas[r].node for r in c}), sum(q[r] for r in c))
                   for c in itertools.combinations(reps, k))
        assert nodes == best[0]
        if nodes == 1:       # exact on one node; across nodes the greedy fills the fullest nodes first
            assert sum(q[r] for r in gang) == best[1]


def test_reservation_leaves_short_requests_fewer_replicas_than_long_ones():
    # PecSched §6.3: "fewer GPUs are reserved for short requests than for long ones"
    long_only, short_only = reservation_split(C, 500_000, gang=8)
    assert (long_only ^ short_only).all() and long_only[-24:].all() and long_only.sum() == 24   # 3 of 4 nodes
    assert reservation_split(C, 500_000)[0].sum() == 17                  # one-replica gangs: a bare majority
    small = Cluster.from_spec("a100:nodes=2,gpus_per_node=4,model=mistral-7b-v0.3")   # whole gangs leave none
    assert reservation_split(small, 1000, gang=4)[0].sum() == 5
    two = Cluster.from_spec("a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3")
    assert reservation_split(two, 1000)[0].tolist() == [False, True]
    # at least what the longest input's KV needs, and one replica left for short requests
    assert reservation_split(C, 20 * C.replica_kv_capacity_tokens)[0].sum() == 20
    with pytest.raises(ValueError, match="leaving none"):
        reservation_split(C, 32 * C.replica_kv_capacity_tokens)


def test_reserved_replicas_option():
    assert reservation_split(C, 500_000, gang=8, reserved=8)[0].sum() == 8
    for bad in (7, 32, 2.5, True):
        with pytest.raises(ValueError, match=r"reserved_replicas must be an integer in \[8, 31\].*got"):
            reservation_split(C, 500_000, gang=8, reserved=bad)
