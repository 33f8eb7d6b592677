"""PecSched's fast SP (PecSched §5.3) on a gang of replicas."""
from __future__ import annotations

import numpy as np
import pytest

from infermax.cluster import Cluster
from infermax.cluster.fastsp import fast_sp_prefill

MISTRAL = Cluster.from_spec("a100:nodes=4,model=mistral-7b-v0.3,net_gbps=400")
LLAMA70 = Cluster.from_spec("a100:nodes=4,model=llama3.1-70b,tp=4,net_gbps=400")


@pytest.mark.parametrize("cluster", [MISTRAL, LLAMA70], ids=["mistral", "llama70"])
@pytest.mark.parametrize("n", [2_000, 100_000, 500_000])
def test_a_gang_of_one_costs_what_the_replica_costs(cluster, n):
    alone = cluster.cost_model().batch_time(np.array([n]), np.array([0]), np.array([False]))
    plan = fast_sp_prefill(cluster, n, [3])
    assert plan.time_s == pytest.approx(alone, rel=1e-12)
    assert plan.network_bytes == 0 and plan.ring_exposed_s == 0


@pytest.mark.parametrize("cluster", [MISTRAL, LLAMA70], ids=["mistral", "llama70"])
def test_more_replicas_are_faster_and_the_network_costs_something(cluster):
    n = 300_000
    times = [fast_sp_prefill(cluster, n, range(k)).time_s for k in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(times, times[1:]))
    per_node = cluster.gpus_per_node // cluster.replica_gpus
    same = fast_sp_prefill(cluster, n, range(2))
    across = fast_sp_prefill(cluster, n, [0, per_node])            # two replicas on two nodes
    assert across.nodes == 2 and same.nodes == 1
    assert across.network_bytes > 0 == same.network_bytes
    assert across.time_s >= same.time_s - 1e-9 * same.time_s or across.attention != same.attention


@pytest.mark.parametrize("cluster", [MISTRAL, LLAMA70], ids=["mistral", "llama70"])
@pytest.mark.parametrize("n", [2_000, 300_000])
def test_fast_sp_is_never_slower_than_plain_ring_on_the_same_gang(cluster, n):
    for gang in (range(2), range(cluster.num_replicas)):
        fast, ring = fast_sp_prefill(cluster, n, gang), fast_sp_prefill(cluster, n, gang, ring_only=True)
        assert fast.time_s <= ring.time_s * (1 + 1e-12)
        assert ring.attention == "ring" and fast.attention in ("megatron", "ulysses")


@pytest.mark.parametrize("n, gang, message", [
    (0, [0], "num_tokens must be an integer >= 1, got 0"),
    (10, [], "gang must be distinct replica indices in [0, 32)"),
    (10, [0, 0], "gang must be distinct"),
    (10, [32], "got (32,)"),
])
def test_bad_gangs_are_refused(n, gang, message):
    with pytest.raises(ValueError) as info:
        fast_sp_prefill(MISTRAL, n, gang)
    assert message in str(info.value)
