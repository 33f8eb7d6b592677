"""CSPS on the cluster engine: SP plans, the per-request choice, CSA, pipelining, Q-shipping decode."""
from __future__ import annotations

import copy
import math

import pytest

from infermax.cluster import Cluster, replay_cluster, simulate_cluster
from infermax.cluster.csps import CspsVariant, csps_prefill, csps_workload, group_gpus
from infermax.cluster.judge import ClusterScheduleError
from infermax.cluster.schedule import ClusterSchedule
from infermax.cluster.sp_plans import (
    NetworkModel,
    choose_sp_kind,
    decode_layer_bytes,
    decode_layer_s,
    layer_volumes,
    pipeline_s,
    prefill_plan,
)
from infermax.costmodel.communication import sp_ntp_crossover_length, sp_ntp_volume, sp_tp_volume
from infermax.costmodel.parallel import ParallelConfig
from infermax.costmodel.specs import get_model_spec

GLM = Cluster.from_spec("a100:nodes=2,gpus_per_node=8,model=glm4-9b,net_gbps=400")
MHA = get_model_spec("llama2-7b")


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_the_per_request_choice_flips_at_the_app_a_crossover(n):
    x = sp_ntp_crossover_length(MHA.hidden_size, n)
    assert choose_sp_kind(math.floor(x) - 1, MHA, n) == "tp"
    assert choose_sp_kind(math.ceil(x) + 1, MHA, n) == "ntp"


def test_at_two_gpus_sp_tp_always_moves_less_contrary_to_app_a_text():
    assert all(choose_sp_kind(L, MHA, 2) == "tp" for L in (1_000, 100_000, 10_000_000))
    assert choose_sp_kind(100_000, MHA, 8, weights_sharded=False) == "ntp"      # no TP: nothing to gather


@pytest.mark.parametrize("kind,app_a", [("ntp", sp_ntp_volume), ("tp", sp_tp_volume)])
def test_volumes_per_gpu_times_n_are_app_a_volumes_for_mha(kind, app_a):
    v = layer_volumes(kind, 200_000, MHA, 8, weights_sharded=True)
    assert (v.comm_in + v.comm_out) * 8 == pytest.approx(app_a(200_000, MHA.hidden_size, 8))


def test_sp_tp_moves_more_than_sp_ntp_for_long_prompts_and_gqa_shrinks_ntp():
    glm = GLM.model
    ntp, tp = (layer_volumes(k, 500_000, glm, 8, True) for k in ("ntp", "tp"))
    assert ntp.comm_in + ntp.comm_out < tp.comm_in + tp.comm_out
    assert ntp.kv_in < layer_volumes("ntp", 500_000, MHA, 8, True).kv_in     # 2 KV heads, not 32


def test_q_shipping_decode_moves_fewer_bytes_than_gathering_kv_for_long_contexts():
    m = GLM.model
    for ctx in (100_000, 1_000_000):
        assert decode_layer_bytes(ctx, m, 8, "q") < decode_layer_bytes(ctx, m, 8, "kv") / 100
        assert decode_layer_s(GLM, ctx, 8, 8, "q") < decode_layer_s(GLM, ctx, 8, 8, "kv")


@pytest.mark.parametrize("cin,comp,cout,lat", [(2.0, 3.0, 1.0, 0.01), (5.0, 1.0, 4.0, 0.1), (0.5, 8.0, 0.5, 0.0)])
def test_three_phase_pipelining_is_never_below_max_of_link_and_compute(cin, comp, cout, lat):
    serial = pipeline_s(cin, comp, cout, lat, 1)
    assert serial == pytest.approx(cin + comp + cout)
    for m in (2, 4, 16):
        t = pipeline_s(cin, comp, cout, lat, m)
        assert t >= max(cin + cout, comp) - 1e-12
        if lat == 0:
            assert t < serial


def test_pipelining_lowers_the_prefill_time_and_csa_moves_and_attends_less():
    plain = prefill_plan(GLM, 1_000_000, 16, 8, "tp", pipeline=False)
    piped = prefill_plan(GLM, 1_000_000, 16, 8, "tp", pipeline=True)
    assert piped.micro > 1 and piped.time_s < plain.time_s
    assert piped.time_s >= piped.attention_s
    dense = prefill_plan(GLM, 500_000, 8, 8, "ntp", pipeline=False)
    csa = prefill_plan(GLM, 500_000, 8, 8, "ntp", pipeline=False, csa=(2, 0.25))
    assert csa.csa.moved < 1 and csa.csa.attended < 1
    assert csa.bytes_per_gpu < dense.bytes_per_gpu and csa.attention_s < dense.attention_s


def test_calibrated_latency_and_contention_raise_the_communication_share():
    calibrated = prefill_plan(GLM, 1_000_000, 16, 8, "tp", pipeline=False)
    bw_only = prefill_plan(GLM, 1_000_000, 16, 8, "tp", pipeline=False, network=NetworkModel.bandwidth_only(GLM))
    assert calibrated.comm_share > bw_only.comm_share > 0


def test_sp_kind_names_of_the_paper_map_to_the_old_ones():
    assert ParallelConfig.parse("sp=4,sp_kind=ntp").sp_kind == "ulysses"
    assert ParallelConfig(sp=2, sp_kind="tp").sp_kind == "megatron"
    assert Cluster.from_spec("a100:model=llama3-8b,sp=2,sp_kind=tp").plan.sp_kind == "megatron"


@pytest.mark.parametrize("call,field", [
    (lambda: CspsVariant(kind="ring"), "kind"),
    (lambda: CspsVariant(csa=(0, 0.1)), "csa"),
    (lambda: CspsVariant(spt_tokens=0), "spt_tokens"),
    (lambda: prefill_plan(GLM, 0, 2, 2, "ntp"), "seq_len"),
    (lambda: prefill_plan(GLM, 10, 2, 2, "ring"), "'ring'"),
    (lambda: pipeline_s(1, 1, 1, 0, 0), "micro"),
    (lambda: csps_workload("wiki"), "dataset"),
    (lambda: decode_layer_bytes(10, MHA, 2, "v"), "'v'"),
    (lambda: ParallelConfig(sp=2, sp_kind="ntp2"), "sp_kind"),
])
def test_bad_inputs_name_field_and_value(call, field):
    with pytest.raises(ValueError, match=field):
        call()


@pytest.fixture(scope="module")
def run():
    w = csps_workload("bookcorpus", n=8, rate_per_s=0.5, seed=3)
    return w, simulate_cluster(w, GLM, "csps", "sarathi:P=256")


def test_long_requests_get_one_gpu_per_spt_and_the_judge_accepts_the_run(run):
    w, r = run
    assert r.gangs
    for g in r.gangs:
        assert len(g.members) == group_gpus(g.input_len, CspsVariant())
        assert g.plan is not None and g.prefill_s == csps_prefill(GLM, g.input_len, g.members, CspsVariant()).time_s
        decodes = [s for s in g.steps if s["phase"] == "decode"]
        assert all(s["q_ship"][0] == s["start_s"] < s["q_ship"][1] for s in decodes)
    replay_cluster(r.cluster_schedule(), w)


def _doctored(r, change):
    doc = copy.deepcopy(r.cluster_schedule().to_dict())
    g = next(g for g in doc["gangs"] if len(g["members"]) > 1)
    step = next(s for s in g["steps"] if s["phase"] == "decode")
    change(step, g)
    return ClusterSchedule.from_dict(doc)


def test_the_judge_rejects_attention_before_the_q_arrives(run):
    w, r = run

    def early(step, g):       # Q "arrives" in no time: the members would attend before it could reach them
        step["q_ship"][1] = step["q_ship"][0]
    with pytest.raises(ClusterScheduleError, match=r"\[q-ship\]"):
        replay_cluster(_doctored(r, early), w)

    def missing(step, g):
        del step["q_ship"]
    with pytest.raises(ClusterScheduleError, match="q_ship"):
        replay_cluster(_doctored(r, missing), w)


def test_the_judge_rejects_an_underpriced_csps_prefill(run):
    w, r = run

    def cheap(step, g):
        g["prefill_s"] *= 0.5
    with pytest.raises(ClusterScheduleError, match=r"\[gang-price\]"):
        replay_cluster(_doctored(r, cheap), w)


def test_sarathi_serve_baseline_serves_long_tagged_prompts_on_one_replica_each():
    # sp_replicas = 1: no gangs; a long-tagged request's times come from its replica, as an untagged one's
    w = csps_workload("bookcorpus", n=6, rate_per_s=1.0, seed=1)
    c = Cluster.from_spec("a100:nodes=2,gpus_per_node=8,model=glm4-9b,tp=8")
    tagged = simulate_cluster(w, c, "fifo", "sarathi:P=256", sp_replicas=1)
    untagged = simulate_cluster(w, c, "fifo", "sarathi:P=256", long_tag="none")
    assert any(r.tag == "long" for r in w.requests) and not tagged.gangs
    for key in ("first_token_s", "completion_s"):
        assert (tagged.trace.requests[key] == untagged.trace.requests[key]).all()


def test_the_judge_rejects_a_csps_gang_whose_recorded_plan_is_not_its_policys(run):
    w, r = run

    def other_kind(step, g):
        g["plan"]["kind"] = "tp" if g["plan"]["kind"] == "ntp" else "ntp"
    with pytest.raises(ClusterScheduleError, match=r"\[gang-price\].*plan kind"):
        replay_cluster(_doctored(r, other_kind), w)

    def free_transfers(step, g):
        g["plan"]["comm_in_s"] = 0.0
    with pytest.raises(ClusterScheduleError, match=r"\[gang-price\].*comm_in_s"):
        replay_cluster(_doctored(r, free_transfers), w)


def test_a_one_gpu_plan_costs_what_the_replica_cost_model_says():
    import numpy as np
    for L in (1_000, 70_000):
        one = prefill_plan(GLM, L, 1, 1, "ntp")
        alone = GLM.cost_model().batch_time(np.array([L]), np.array([0]), np.array([False]))
        assert one.time_s == pytest.approx(alone, rel=1e-12) and one.comm_s == 0


def test_gathering_the_kv_instead_of_shipping_q_slows_the_decode_and_is_judged():
    w = csps_workload("needlebench", n=4, rate_per_s=0.2, seed=2)
    runs = {p: simulate_cluster(w, GLM, p, "sarathi:P=256") for p in ("csps", "csps-kvdecode")}
    steps = {p: [s for g in r.gangs if len(g.members) > 1 for s in g.steps if s["phase"] == "decode"]
             for p, r in runs.items()}
    assert steps["csps"] and steps["csps-kvdecode"]
    assert all("kv_gather" in s and s["attend"][0] == sum(s["shares"]) for s in steps["csps-kvdecode"])
    mean = {p: sum(s["end_s"] - s["start_s"] for s in v) / len(v) for p, v in steps.items()}
    assert mean["csps-kvdecode"] > mean["csps"]
    replay_cluster(runs["csps-kvdecode"].cluster_schedule(), w)
