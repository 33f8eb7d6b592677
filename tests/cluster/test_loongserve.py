"""LoongServe on the cluster engine: elastic prefill gangs, scale-down to the decode pool, the judge."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from infermax import Request, Workload
from infermax.cluster import Cluster, ClusterSchedule, ClusterScheduleError, replay_cluster, simulate_cluster
from infermax.cluster.elastic import choose_elastic, gang_targets
from infermax.cluster.fastsp import fast_sp_prefill

# the paper's LoongServe: Llama-3 8B, 8 instances of TP 2 on 16 A100s; by default the last one per node decode
LOONG = Cluster.from_spec("a100:nodes=2,model=llama3-8b,tp=2")
DECODE_POOL = {6, 7}


def _workload(*reqs: tuple[int, int, float]) -> Workload:
    return Workload(requests=tuple(Request(id=k, input_len=i, output_len=o, arrival_s=t, tag="long" if i > 8192
                                           else "short") for k, (i, o, t) in enumerate(reqs)))


@pytest.fixture(scope="module")
def mixed():
    """Two long prompts of different lengths and short ones around them, on an idle cluster."""
    w = _workload((2000, 20, 0.0), (60_000, 30, 0.5), (1500, 10, 1.0), (300_000, 25, 200.0), (800, 12, 201.0),
                  (3000, 8, 400.0))
    return w, simulate_cluster(w, LOONG, "loongserve", "sarathi-pc")


def test_gang_size_grows_with_the_prompt_length(mixed):
    w, r = mixed
    assert gang_targets(np.array([8000, 30_000, 60_000, 128_000, 1_000_000]), cap=6).tolist() == [1, 2, 3, 6, 6]
    sizes = {g.input_len: len(g.members) for g in r.gangs}
    assert sizes == {60_000: 3, 300_000: 6}                 # short prompts run on one instance, no gang
    assert all(not set(g.members) & DECODE_POOL for g in r.gangs)
    assert {g.sp_plan for g in r.gangs} == {"ring-striped/megatron"}   # striped ring attention (no fast SP)
    assert all(len({LOONG.replicas[m].node for m in g.members}) == 2 for g in r.gangs if len(g.members) == 6)
    g = r.gangs[-1]                           # striping balances the causal work: cheaper than the plain ring
    plain = fast_sp_prefill(LOONG, g.input_len, g.members, ring_only=True)
    assert g.prefill_s == fast_sp_prefill(LOONG, g.input_len, g.members, ring_only=True, striped=True).time_s
    assert g.prefill_s < 0.75 * plain.time_s


def test_gang_size_grows_with_the_free_instances():
    q = np.zeros(LOONG.num_replicas, dtype=np.int64)
    free = np.array([1, 1, 1, 1, 1, 1, 0, 0], dtype=bool)
    assert choose_elastic(LOONG, 3, 6, q, free) == (0, 1, 2, 3, 4, 5)
    assert choose_elastic(LOONG, 3, 4, q, free) == (0, 1, 2, 3)        # one node when it can
    free[[1, 2]] = False
    assert choose_elastic(LOONG, 3, 6, q, free) == (0, 3, 4, 5)        # fewer free: a smaller gang
    free[[4, 5]] = False
    assert choose_elastic(LOONG, 3, 6, q, free) is None             # below what the prompt needs: it waits
    with pytest.raises(ValueError, match="k_min <= k_max"):
        choose_elastic(LOONG, 4, 3, q, free)


def test_decodes_run_on_the_decode_pool_after_the_kv_moved(mixed):
    w, r = mixed
    done = r.trace.requests["completion_s"]
    for g in r.gangs:
        i = g.request
        assert np.isnan(g.completion_s) and not any(s["phase"] == "decode" for s in g.steps)
        dst = int(r.decode_replica_of[i])
        assert dst in DECODE_POOL
        m = next(m for m in r.migrations if m["request"] == i)
        assert m["src"] in g.members and m["sent_s"] == g.first_token_s
        kv = LOONG.kv_bytes(g.input_len)
        assert m["arrive_s"] >= g.first_scheduled_s + LOONG.transfer_s(kv, m["src"], dst)
        assert done[i] > m["arrive_s"]
        assert r.trace.requests["first_token_s"][i] == g.first_token_s
    short = [i for i in range(len(w)) if i not in {g.request for g in r.gangs}]
    assert set(r.decode_replica_of[short].tolist()) <= DECODE_POOL    # short requests are disaggregated too
    assert np.isfinite(done).all()


def test_the_judge_accepts_loongserve_and_rejects_doctored_schedules(mixed):
    w, r = mixed
    doc = r.cluster_schedule().to_dict()
    rep = replay_cluster(ClusterSchedule.from_dict(json.loads(json.dumps(doc))), w)
    np.testing.assert_allclose(rep.requests["completion_s"], r.trace.requests["completion_s"], rtol=1e-9)
    np.testing.assert_allclose(rep.requests["first_token_s"], r.trace.requests["first_token_s"], rtol=1e-9)
    long_i = int(w.ids[r.gangs[-1].request])

    def doctored(edit) -> ClusterSchedule:
        d = json.loads(json.dumps(doc))
        edit(d)
        return ClusterSchedule.from_dict(d)

    def faster(d):          # the 300K-token KV arrives as soon as it is sent
        m = next(m for m in d["migrations"] if m["request"] == long_i)
        m["arrive_s"] = m["sent_s"] + 1e-6

    def stranger(d):        # sent from an instance outside the gang
        m = next(m for m in d["migrations"] if m["request"] == long_i)
        m["src"] = next(x for x in range(8) if x not in r.gangs[-1].members and x != m["dst"])

    def decodes_on_gang(d):
        g = next(g for g in d["gangs"] if g["request"] == long_i)
        end = g["steps"][-1]["end_s"]
        g["steps"].append({"phase": "decode", "start_s": end, "end_s": end + 0.01, "gen": 1,
                           "shares": [0] * len(g["members"]), "colocated": []})

    for edit, rule in ((faster, "kv-arrival"), (stranger, "kv-arrival"), (decodes_on_gang, "once")):
        with pytest.raises(ClusterScheduleError) as exc:
            replay_cluster(doctored(edit), w)
        assert exc.value.rule == rule


def test_a_short_only_workload_uses_no_gang_and_decodes_disaggregated():
    w = Workload.from_spec("medha:B=16,long_frac=0,rate=2,seed=3")
    r = simulate_cluster(w, LOONG, "loongserve", "sarathi-pc")
    assert not r.gangs and len(r.migrations) == sum(int(o) > 1 for o in w.output_lens)
    assert set(r.decode_replica_of[w.output_lens > 1].tolist()) <= DECODE_POOL
    replay_cluster(r.cluster_schedule(), w)


def test_bad_inputs_name_the_field_and_value():
    w = _workload((2000, 20, 0.0), (60_000, 30, 0.5))
    with pytest.raises(ValueError, match=r"sp_replicas must be an integer in \[1, 6\].*got 0"):
        simulate_cluster(w, LOONG, "loongserve", "sarathi-pc", sp_replicas=0)
    with pytest.raises(ValueError, match=r"decode_replicas must be an integer in \[1, 7\].*got 8"):
        simulate_cluster(w, LOONG, "loongserve", "sarathi-pc", decode_replicas=8)
    huge = _workload((1_200_000, 2, 0.0))
    with pytest.raises(ValueError, match=r"request 0 .*needs 1200001 KV tokens.*M = 1057115"):
        simulate_cluster(huge, LOONG, "loongserve", "sarathi-pc")
    with pytest.raises(ValueError, match="min_shard_tokens must be an integer >= 1, got 0"):
        gang_targets(np.array([10]), cap=4, min_shard_tokens=0)
    with pytest.raises(ValueError, match="unknown cluster policy 'loongserv'.*did you mean loongserve"):
        simulate_cluster(w, LOONG, "loongserv", "sarathi-pc")


def test_sweep_system_cells_run_loongserve_and_sarathi_tp8_pp2():
    import infermax
    from infermax.sweep.config import SweepConfig

    systems = [{"name": "loongserve", "cluster": LOONG.to_spec(), "policy": "loongserve", "scheduler": "sarathi-pc"},
               {"name": "sarathi", "cluster": "a100:nodes=2,model=llama3-8b,tp=8,pp=2", "scheduler": "sarathi"}]
    df = infermax.sweep({"workloads": ["medha:B=12,long_frac=0.2,lo=20000,hi=40000,rate=1,seed=1"],
                         "systems": systems}, executor="serial")
    assert df["error"].isna().all() and df["policy"].tolist() == ["loongserve", "sarathi"]
    assert (df["num_replicas"].tolist() == [8, 1]) and np.isfinite(df["ttft_p50_s_long"]).all()
    for bad, msg in (({**systems[0], "colour": 1}, r"unknown key\(s\) \['colour'\]"),
                     ({**systems[0], "limits": "M=5,C=100"}, "limits must be a spec string without M"),
                     ({k: v for k, v in systems[0].items() if k != "cluster"}, "needs cluster")):
        with pytest.raises(ValueError, match=msg):
            SweepConfig.from_dict({"workloads": ["fixed:I=8,O=2,B=2"], "systems": [bad]})
    assert dataclasses.is_dataclass(SweepConfig)


def test_a_window_past_the_end_gives_the_full_run_and_a_short_one_censors(mixed):
    from infermax.cluster import ClusterEngine

    w, r = mixed
    whole = ClusterEngine(w, LOONG, "loongserve", "sarathi-pc").run(until_s=1e9)
    np.testing.assert_array_equal(whole.first_token_s, r.trace.requests["first_token_s"])
    np.testing.assert_array_equal(whole.completion_s, r.trace.requests["completion_s"])
    assert whole.metrics["ttft_p50_s"] == pytest.approx(r.metrics["ttft_p50_s"])
    assert whole.metrics["served_fraction"] == 1
    cut = ClusterEngine(w, LOONG, "loongserve", "sarathi-pc").run(until_s=205.0)   # the 300K prefill is running
    assert cut.metrics["num_arrived"] == 5 and cut.metrics["num_first_token"] == 3
    assert np.isnan(cut.first_token_s[3]) and cut.by_tag["long"]["ttft_p99_s"] == float("inf")
    # first come, first served without preemption: the short request behind the 300K prompt waits for it
    # (every prefill instance is in its gang): the head-of-line blocking of Medha Fig. 1
    assert np.isnan(cut.first_token_s[4]) and r.trace.requests["first_token_s"][4] > r.gangs[-1].first_token_s


def test_the_reserve_ablation_keeps_two_instances_for_short_requests(mixed):
    w, _ = mixed
    r = simulate_cluster(w, LOONG, "loongserve-reserve", "sarathi-pc")
    reserved = {0, 4}                        # the first prefill instance of each node
    assert all(not set(g.members) & (reserved | DECODE_POOL) for g in r.gangs)
    assert {len(g.members) for g in r.gangs} == {3, 4}                   # at most the 4 others
    short = [i for i in range(len(w)) if i not in {g.request for g in r.gangs}]
    assert set(r.replica_of[short].tolist()) <= reserved
    replay_cluster(r.cluster_schedule(), w)
    # the short request behind the 300K prompt no longer waits for it
    assert r.trace.requests["first_token_s"][4] < r.gangs[-1].first_token_s


def test_a_kv_without_room_on_the_decode_pool_waits_on_its_gang():
    # one decode instance (M = 1,057,115 tokens); the 950K request decodes 600 tokens there while the 200K
    # one finishes its prefill: both do not fit, so the second KV stays on its gang until the first is done
    w = _workload((950_000, 600, 0.0), (200_000, 20, 1.0))
    r = simulate_cluster(w, LOONG, "loongserve", "sarathi-pc", decode_replicas=1)
    first, second = sorted(r.gangs, key=lambda g: g.request)
    m = {x["request"]: x for x in r.migrations}
    done = r.trace.requests["completion_s"]
    assert m[1]["sent_s"] > second.first_token_s and m[1]["sent_s"] >= done[0]
    assert m[1]["arrive_s"] >= m[1]["sent_s"] + LOONG.transfer_s(LOONG.kv_bytes(200_000), m[1]["src"], 7)
    assert r.trace.requests["first_token_s"][1] == second.first_token_s     # its TTFT is its prefill's
    doc = r.cluster_schedule().to_dict()
    replay_cluster(ClusterSchedule.from_dict(doc), w)
    late = next(x for x in doc["migrations"] if x["request"] == 1)    # not sent during the prefill: whole KV
    late["arrive_s"] = late["sent_s"] + 2 * LOONG.transfer_s(LOONG.kv_bytes(200_000) / 32, late["src"], 7)
    with pytest.raises(ClusterScheduleError, match="whole KV"):
        replay_cluster(ClusterSchedule.from_dict(doc), w)
