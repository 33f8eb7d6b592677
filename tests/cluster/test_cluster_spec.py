"""The cluster spec: parsing, replicas and their KV capacity, links (PecSched §6.2's testbed)."""
from __future__ import annotations

import pytest

from infermax.cluster import Cluster
from infermax.costmodel.specs import get_model_spec, kv_capacity_tokens

TESTBED = {  # PecSched Table 5 on 4 nodes x 8 A100-80GB
    "mistral-7b-v0.3": (1, 32), "phi3-14b": (1, 32), "yi-34b": (4, 8), "llama3.1-70b": (4, 8),
}


@pytest.mark.parametrize("model", sorted(TESTBED))
def test_the_papers_testbed_has_the_papers_replicas(model):
    tp, replicas = TESTBED[model]
    c = Cluster.from_spec(f"a100:nodes=4,gpus_per_node=8,model={model},tp={tp},net_gbps=400")
    assert (c.num_gpus, c.num_replicas) == (32, replicas)
    assert {len(r.gpus) for r in c.replicas} == {tp}
    assert sorted(g for r in c.replicas for g in r.gpus) == list(range(32))     # every GPU, once
    assert all(r.node == r.gpus[0] // 8 == r.gpus[-1] // 8 for r in c.replicas)  # TP stays inside a node
    assert c.replica_kv_capacity_tokens == kv_capacity_tokens(model, "a100", 0.9, tp=tp)
    assert Cluster.from_spec(c.to_spec()) == c
    assert c.cost_model_name() == f"scaled:a100/{model}" + (f"@tp={tp}" if tp > 1 else "")
    assert "scaled by the roofline ratio" in c.cost_model().description


def test_a_measured_model_uses_its_fitted_cost_model():
    assert Cluster.from_spec("a100:nodes=1,model=llama2-70b,tp=4").cost_model_name() == "a100/llama2-70b@tp=4"
    assert Cluster.from_spec("h100:model=llama2-7b").cost_model_name() == "h100/llama2-7b"


def test_model_sizes_match_their_names():
    sizes = {m: get_model_spec(m).num_params / 1e9 for m in TESTBED}
    assert 7.0 < sizes["mistral-7b-v0.3"] < 7.5 and 13.5 < sizes["phi3-14b"] < 14.5
    assert 34 < sizes["yi-34b"] < 35 and 70 < sizes["llama3.1-70b"] < 71
    assert get_model_spec("meta-llama/Llama-3.1-70B").name == "llama3.1-70b"
    assert get_model_spec("microsoft/Phi-3-medium-4k-instruct").name == "phi3-14b"


def test_transfers_are_dearer_across_nodes_and_grow_with_bytes():
    c = Cluster.from_spec("a100:nodes=2,model=mistral-7b-v0.3,net_gbps=400")
    kv = c.kv_bytes(100_000)
    assert kv == 100_000 * 2 * 32 * 8 * 128 * 2
    intra, inter = c.transfer_s(kv, 0, 1), c.transfer_s(kv, 0, 8)
    assert c.same_node(0, 7) and not c.same_node(0, 8)
    assert 0 < intra < inter
    assert inter >= kv / (400e9 / 8 / 8)                    # no faster than one GPU's share of the NIC
    assert c.transfer_s(kv, 3, 3) == 0.0 and c.transfer_s(2 * kv, 0, 8) > inter
    wider = Cluster.from_spec("a100:nodes=2,model=mistral-7b-v0.3,net_gbps=800")
    assert wider.transfer_s(kv, 0, 8) < inter


@pytest.mark.parametrize("spec, message", [
    ("a100:nodes=0", "Cluster.nodes must be an integer >= 1, got 0"),
    ("a100:tpp=2", "unknown key 'tpp' (did you mean tp?)"),
    ("a100:nodes=x", "nodes must be an integer, got 'x'"),
    ("a100:tp=3", "does not tile a node of 8 GPUs"),
    ("a100:nodes=1,tp=16", "needs 16 GPUs (tp=16) but the cluster has 8"),
    ("a100:model=llama2-70b", "does not fit on a100"),
    ("a100:util=1.5", "Cluster.util must be in (0, 1], got 1.5"),
    ("a100:net_gbps=-4", "Cluster.net_gbps must be a finite number > 0, got -4.0"),
    ("a100:nodes=2,nodes=3", "nodes is given twice"),
    ("a100:nodes", "'nodes' is not key=value"),
    ("tpu:nodes=1", "unknown GPU 'tpu'"),
    ("", "cluster spec must be a non-empty string"),
])
def test_bad_specs_name_the_field_and_value(spec, message):
    with pytest.raises(ValueError, match=None) as info:
        Cluster.from_spec(spec)
    assert message in str(info.value)


def test_a_negative_transfer_is_refused():
    c = Cluster.from_spec("a100:nodes=1")
    with pytest.raises(ValueError, match="num_bytes must be a finite number >= 0, got -1"):
        c.transfer_s(-1, 0, 1)
