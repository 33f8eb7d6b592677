"""Parallel terms: degree 1 is the single-GPU model, and each term follows its paper formula."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.costmodel import LinearCoefficients, ParallelConfig, get_cost_model
from infermax.costmodel.communication import (
    CollectiveLine,
    CommModel,
    megatron_sp_attention_volume,
    ring_attention_volume,
    sp_ntp_crossover_length,
    sp_ntp_volume,
    sp_tp_volume,
    ulysses_sp_attention_volume,
)
from infermax.costmodel.parallel import (
    ParallelCostModel,
    kv_migration_time_s,
    kvp_decode_time_s,
    kvp_merge_s,
    kvp_workers_per_node,
    parallel_kv_capacity_tokens,
    spp_prefill_time_s,
    spp_prefill_ttft_s,
)
from infermax.costmodel.specs import GPUS, MODELS, kv_capacity_tokens

SPEC, GPU = MODELS["llama2-7b"], GPUS["a100"]
ANALYTIC = CommModel(GPU)      # bandwidth-bound collectives: exact formulas to test against


@pytest.mark.parametrize("kwargs,field", [({"tp": 0}, "tp"), ({"pp": 1.5}, "pp"), ({"sp": True}, "sp"),
                                          ({"kvp": -2}, "kvp"), ({"sp_kind": "zigzag"}, "sp_kind")])
def test_parallel_config_validates(kwargs, field):
    with pytest.raises(ValueError, match=f"ParallelConfig.{field}"):
        ParallelConfig(**kwargs)


def test_parallel_config_parse_round_trip():
    p = ParallelConfig.parse("tp=2, pp4, sp=2, sp_kind=ulysses")
    assert (p.tp, p.pp, p.sp, p.kvp, p.sp_kind) == (2, 4, 2, 1, "ulysses") and p.num_gpus == 16
    assert ParallelConfig.parse(p.to_text()) == p
    with pytest.raises(ValueError, match="unknown parallel setting"):
        ParallelConfig.parse("dp=2")


@pytest.mark.parametrize("kind", ["ring", "ulysses", "megatron"])
def test_degree_one_is_exactly_the_single_gpu_model(batches, kind):
    base = get_cost_model("a100/llama2-7b")
    one = ParallelCostModel(base.coefficients, ParallelConfig(sp_kind=kind), SPEC, GPU, comm=ANALYTIC)
    assert one.coefficients == base.coefficients
    for b in batches:
        assert one.batch_time(*b) == base.batch_time(*b)
    assert get_cost_model("a100/llama2-7b", parallel=ParallelConfig()) is not None
    assert get_cost_model("a100/llama2-7b@tp=1").batch_time(*batches[0]) == base.batch_time(*batches[0])


def _linear_model(parallel: ParallelConfig, k: LinearCoefficients | None = None) -> ParallelCostModel:
    return ParallelCostModel(k or LinearCoefficients(), parallel, SPEC, GPU, comm=ANALYTIC)


def test_tp_splits_compute_and_adds_two_all_reduces_per_layer(batches):
    k = LinearCoefficients()
    tp4 = _linear_model(ParallelConfig(tp=4), k)
    for tokens, kv, is_decode in batches[:40]:
        n = tokens.sum()
        single = LinearCoefficients(**{**dataclasses.asdict(k), "nonattn_lines": tuple((a / 4, b / 4)
                                                                                      for a, b in k.nonattn_lines),
                                       "decode_kv_s": k.decode_kv_s / 4, "prefill_attn_s": k.prefill_attn_s / 4})
        from infermax.costmodel.linear import LinearCostModel
        expected = LinearCostModel(single).batch_time(tokens, kv, is_decode)
        expected += 2 * SPEC.num_layers * ANALYTIC.all_reduce_s(n * SPEC.hidden_size * 2, 4)
        assert tp4.batch_time(tokens, kv, is_decode) == pytest.approx(expected, rel=1e-9)


def test_tp_uses_the_measured_profile_when_there_is_one(batches):
    fitted = get_cost_model("a100/llama2-7b")
    tp2 = fitted.with_parallel(ParallelConfig(tp=2))
    measured = fitted.tp_coefficients[2]
    assert tp2.coefficients.decode_kv_s == measured.decode_kv_s
    single = fitted.batch_time(*batches[0])
    assert 0.4 * single < tp2.batch_time(*batches[0]) < single


def test_pp_latency_adds_send_recv_and_stage_time_divides(batches):
    base, pp4 = _linear_model(ParallelConfig()), _linear_model(ParallelConfig(pp=4))
    for tokens, kv, is_decode in batches[:40]:
        hop = ANALYTIC.send_recv_s(tokens.sum() * SPEC.hidden_size * 2)
        single = base.batch_time(tokens, kv, is_decode)
        assert pp4.batch_time(tokens, kv, is_decode) == pytest.approx(single + 3 * hop, rel=1e-9)
        assert pp4.stage_time(tokens, kv, is_decode) == pytest.approx(single / 4 + hop, rel=1e-9)


def test_kvp_follows_medha_eq5():
    k = LinearCoefficients()
    kvp = _linear_model(ParallelConfig(kvp=4), k)
    tokens, kv, is_decode = np.ones(64, np.int64), np.full(64, 100_000), np.ones(64, bool)
    attention = k.decode_bias_s + k.decode_kv_s * float((kv + 1).sum())
    total = float(k.nonattention_s(64)) + attention
    heads = SPEC.num_heads
    # one node: all-gather of 64·heads fp32 log-sum-exps from 4 GPUs, all-reduce of the 64·heads·d_h outputs
    lse = 1e-5 + 3 / 4 * 4 * 64 * heads * 4 / GPU.nvlink_bandwidth
    out = 1e-5 + 2 * 3 / 4 * 64 * heads * SPEC.head_dim * 2 / GPU.nvlink_bandwidth
    comm = SPEC.num_layers * (lse + out)
    # Eq. 5: T_attn / p + (T - T_attn) + T_comm (the per-batch bias is launch overhead, not split)
    expected = kvp_decode_time_s(total, attention - k.decode_bias_s, 4, comm)
    assert kvp.batch_time(tokens, kv, is_decode) == pytest.approx(expected, rel=1e-9)


def test_spp_eq4_and_kv_migration():
    assert spp_prefill_time_s(8.0, 1_000_000, 4096, 4, 0.001) == pytest.approx(2.0 + 0.001 * 1_000_000 / 4096)
    t = kv_migration_time_s(10_000, "llama2-7b", "h200", intra_node=False,
                            comm=CommModel(GPUS["h200"]))
    assert t == pytest.approx(1e-5 + 10_000 * SPEC.kv_bytes_per_token / GPUS["h200"].network_bandwidth)
    assert kv_migration_time_s(10_000, "llama2-7b", "a100", tp=2) < kv_migration_time_s(10_000, "llama2-7b", "a100")


def test_sp_kinds_reduce_long_prefill_time():
    tokens, kv, is_decode = np.array([8192]), np.array([65536]), np.array([False])
    single = _linear_model(ParallelConfig()).batch_time(tokens, kv, is_decode)
    for kind in ("ring", "ulysses", "megatron"):
        t = _linear_model(ParallelConfig(sp=4, sp_kind=kind)).batch_time(tokens, kv, is_decode)
        assert single / 4 < t < single


def test_ring_rotation_is_hidden_behind_long_attention_only():
    ring = _linear_model(ParallelConfig(sp=4, sp_kind="ring"))
    assert not ring.is_linear and _linear_model(ParallelConfig(sp=4, sp_kind="ulysses")).is_linear
    k = ring.coefficients
    long_tokens, long_kv = np.array([8192]), np.array([65536])
    attention = k.prefill_attn_s * (8192 * 65536 + 8192 * 8193 / 2)         # causal pairs
    assert ring.ring_rotation_s(65536 + 8192) < attention
    short = (np.array([64]), np.array([65536]), np.array([False]))
    linear_part = super(ParallelCostModel, ring).batch_time(*short)
    exposed = ring.ring_rotation_s(65536 + 64) - k.prefill_attn_s * (64 * 65536 + 64 * 65 / 2)
    assert exposed > 0 and ring.batch_time(*short) == pytest.approx(linear_part + exposed, rel=1e-12)
    assert ring.batch_time(long_tokens, long_kv, np.array([False])) == pytest.approx(
        super(ParallelCostModel, ring).batch_time(long_tokens, long_kv, np.array([False])))


@given(seq=st.integers(1, 2_000_000), hidden=st.sampled_from([4096, 8192, 16384]), n=st.integers(2, 64))
@settings(max_examples=200, deadline=None)
def test_sp_ntp_vs_sp_tp_crossover(seq, hidden, n):
    """csps App. A: SP-NTP moves less data than SP-TP iff L_in > 2·d·N/(N−2) (never at N = 2)."""
    ntp, tp = sp_ntp_volume(seq, hidden, n), sp_tp_volume(seq, hidden, n)
    crossover = sp_ntp_crossover_length(hidden, n)
    if crossover == float("inf"):
        assert ntp > tp
    elif abs(seq - crossover) > 1e-6 * crossover:
        assert (ntp < tp) == (seq > crossover)


def test_crossover_values_from_the_paper():
    assert sp_ntp_crossover_length(16384, 3) == pytest.approx(2 * 16384 * 3)          # the paper's 96K example
    assert sp_ntp_crossover_length(4096, 8) == pytest.approx(2 * 4096 * 8 / 6)
    assert sp_ntp_crossover_length(4096, 2) == float("inf")


def test_pecsched_volumes():
    s, d = 1000, 4096
    assert megatron_sp_attention_volume(s, d, tp=4, gpus=8) == 2 * s * d * 3 * 8
    qkv = (32 + 8) * 128
    assert ulysses_sp_attention_volume(s, d, 32, 8, 128, tp=4, gpus=8) == pytest.approx(
        2 * s * qkv * 7 + (d * qkv + d * d) * 8 * 3 / 4)
    assert ulysses_sp_attention_volume(s, d, 32, 8, 128, tp=1, gpus=8) == 2 * s * qkv * 7   # no parameter transfer
    assert ring_attention_volume(8000, 8, 128, 4) == 3 * 8000 * 2 * 8 * 128


def test_measured_collectives_are_used_and_sane():
    fitted = get_cost_model("a100/llama2-7b@tp=8")
    line = fitted.comm.fitted[("all_reduce", 8, 8)]
    assert isinstance(line, CollectiveLine) and 1e-6 < line.latency_s < 1e-4
    assert 50e9 < 1 / line.per_byte_s < 600e9        # NVLink-class algorithm bandwidth


def test_parallel_kv_capacity():
    p = ParallelConfig(tp=2, sp=2, kvp=2)
    assert parallel_kv_capacity_tokens("llama2-7b", "a100", p) == 4 * kv_capacity_tokens("llama2-7b", "a100", tp=2)


def test_roofline_goes_parallel_too(batches):
    roof = get_cost_model("roofline:a100/llama2-70b@tp=4")
    fitted = get_cost_model("a100/llama2-70b@tp=4")
    for b in batches[:30]:
        assert 0 < roof.batch_time(*b) <= fitted.batch_time(*b)


@pytest.mark.parametrize("kind,tp", [("megatron", 1), ("ulysses", 1), ("ulysses", 2), ("ring", 1)])
def test_sp_communication_is_the_paper_volume_over_the_link(kind, tp):
    """Per layer, each of the s GPUs moves volume / s elements at the NVLink bandwidth."""
    s, b, L = 4, SPEC.dtype_bytes, SPEC.num_layers
    free = CommModel(dataclasses.replace(GPU, nvlink_bandwidth=1e30))     # same latency, no transfer time
    p = ParallelConfig(tp=tp, sp=s, sp_kind=kind)
    slow, fast = (ParallelCostModel(LinearCoefficients(), p, SPEC, GPU, comm=c) for c in (ANALYTIC, free))
    tokens, kv, is_decode = np.array([4096]), np.array([2048]), np.array([False])
    n = 4096
    if kind == "ring":
        volume = ring_attention_volume(kv[0] + n, -(-SPEC.num_kv_heads // tp), SPEC.head_dim, s)
        assert slow.ring_rotation_s(kv[0] + n) - fast.ring_rotation_s(kv[0] + n) == pytest.approx(
            L * volume * b / s / GPU.nvlink_bandwidth, rel=1e-9)
        return
    volume = sp_tp_volume(n, SPEC.hidden_size, s) if kind == "megatron" else (
        sp_ntp_volume(n, SPEC.hidden_size, s) if tp > 1 else 4 * n * SPEC.hidden_size * (s - 1) / s)
    difference = slow.batch_time(tokens, kv, is_decode) - fast.batch_time(tokens, kv, is_decode)
    # each TP group all-reduces the activations of its own N/s tokens
    tp_all_reduce = 2 * L * 2 * (tp - 1) / tp * (n / s) * SPEC.hidden_size * b / GPU.nvlink_bandwidth
    assert difference == pytest.approx(L * volume * b / s / GPU.nvlink_bandwidth + tp_all_reduce, rel=1e-6)


# --- Medha's KVP and SPP: the mechanisms behind Figs. 9–11 ---------------------------------------

H100, LLAMA3 = GPUS["h100"], MODELS["llama3-8b"]
DECODE = np.array([1]), np.array([True])


def _tpot(cost, context_tokens: int) -> float:
    return cost.batch_time(DECODE[0], np.array([context_tokens]), DECODE[1])


def _medha_3d(kvp: int):
    """Fig. 11's plan: Llama-3 8B, TP 8, SPP 4, KVP k on H100 (fitted H100 collectives)."""
    return get_cost_model("scaled:h100/llama3-8b@tp=8,pp=4" + (f",kvp={kvp}" if kvp > 1 else ""))


def test_kvp_merge_crosses_the_network_once_groups_fill_nodes():
    comm = CommModel(H100)
    assert kvp_workers_per_node(ParallelConfig(tp=8, pp=4, kvp=4), H100) == 1
    assert kvp_workers_per_node(ParallelConfig(tp=2, kvp=4), H100) == 4
    assert kvp_workers_per_node(ParallelConfig(tp=4, kvp=4), H100) == 2
    spread = kvp_merge_s(1, ParallelConfig(tp=8, pp=4, kvp=4), LLAMA3, H100, comm)
    packed = kvp_merge_s(1, ParallelConfig(tp=2, kvp=4), LLAMA3, H100, comm)
    # latency-bound: 3 ring steps (all-gather) + 6 (all-reduce), each at least one network send/recv
    assert spread >= 9 * comm.send_recv_s(0.0, intra_node=False) and spread > packed
    assert kvp_merge_s(1, ParallelConfig(tp=8, kvp=1), LLAMA3, H100, comm) == 0.0


def test_placed_collective_uses_a_measured_shape_and_else_rings_the_measured_send_recv():
    comm = get_cost_model("a100/llama2-7b@tp=8").comm
    line = comm.fitted[("all_reduce", 2, 1)]
    assert comm.placed_collective_s("all_reduce", 1e6, 2, 1) == pytest.approx(line.time_s(1e6))
    step = comm.network_step_factor * comm.send_recv_s(1e6 / 4, intra_node=False)
    assert comm.network_step_factor > 1                                  # a collective step > a bare transfer
    assert comm.placed_collective_s("all_reduce", 1e6, 4, 1) == pytest.approx(6 * step)
    assert comm.placed_collective_s("all_gather", 1e6, 4, 1) == pytest.approx(3 * step)
    with pytest.raises(ValueError, match="collective"):
        comm.placed_collective_s("broadcast", 1.0, 2, 1)


def test_kvp_divides_only_attention_and_pays_the_merge_every_step():
    """Eq. 5 term by term: T(k) = T(1) − attention·(1 − 1/k) + L·merge(k)."""
    one, four = _medha_3d(1), _medha_3d(4)
    k1, k4 = one.coefficients, four.coefficients
    assert k4.decode_kv_s == pytest.approx(k1.decode_kv_s / 4) and k4.decode_bias_s == k1.decode_bias_s
    n = 4_000_000
    attention = k1.decode_kv_s * (n + 1)
    merge = LLAMA3.num_layers * kvp_merge_s(1, four.parallel, LLAMA3, H100, four.comm)
    assert merge > 0
    assert _tpot(four, n) == pytest.approx(_tpot(one, n) - attention * 3 / 4 + merge, rel=1e-6)


def test_kvp_speedup_is_below_its_degree_and_grows_with_context():
    """Amdahl (medha §3.5): the linear layers, TP all-reduces and the merge do not shrink with k."""
    one, two, four = _medha_3d(1), _medha_3d(2), _medha_3d(4)
    speedups = []
    for n in (1_000_000, 2_000_000, 4_000_000, 10_000_000):
        s2, s4 = _tpot(one, n) / _tpot(two, n), _tpot(one, n) / _tpot(four, n)
        assert s2 < 2 and s4 < 4
        speedups.append(s4)
    assert speedups == sorted(speedups)
    assert speedups[0] < 1 < speedups[-1]        # short contexts: the merge costs more than it saves


def test_spp_ttft_speedup_is_below_stages_and_tends_to_stages_for_long_prompts():
    base = "roofline:h100/llama3-8b@tp=8"
    efficiency = {}
    for n in (131_072, 1_048_576):
        single = spp_prefill_ttft_s(get_cost_model(base), n, 4096)
        for p in (2, 8):
            speedup = single / spp_prefill_ttft_s(get_cost_model(f"{base},pp={p}"), n, 4096)
            assert 1 < speedup < p
            efficiency[n, p] = speedup / p
    assert efficiency[1_048_576, 8] > efficiency[131_072, 8] and efficiency[1_048_576, 8] > 0.8


def test_spp_ttft_is_the_chunk_sum_at_one_stage_and_one_pass_for_one_chunk():
    one = _linear_model(ParallelConfig())
    pf = np.array([False])
    chunks = sum(one.batch_time(np.array([c]), np.array([m]), pf) for m, c in ((0, 4096), (4096, 4096), (8192, 1808)))
    assert spp_prefill_ttft_s(one, 10_000, 4096) == pytest.approx(chunks, rel=1e-12)
    pp4 = _linear_model(ParallelConfig(pp=4))
    assert spp_prefill_ttft_s(pp4, 100, 4096) == pytest.approx(4 * pp4.stage_time(np.array([100]), np.array([0]), pf))
    with pytest.raises(ValueError, match="chunk_tokens"):
        spp_prefill_ttft_s(pp4, 100, 0)


def test_spp_decode_pays_one_hop_per_stage_only():
    """Fig. 10: decode passes every stage once; only the (p − 1) send/recvs are added."""
    one = get_cost_model("scaled:h100/llama3-8b@tp=8")
    sixteen = get_cost_model("scaled:h100/llama3-8b@tp=8,pp=16")
    base, piped = _tpot(one, 2_000_000), _tpot(sixteen, 2_000_000)
    hop = sixteen.comm.send_recv_s(LLAMA3.hidden_size * LLAMA3.dtype_bytes, intra_node=False)
    assert piped == pytest.approx(base + 15 * hop, rel=1e-6) and piped < 1.05 * base


@pytest.mark.slow
def test_medha_fig11_kvp_ratios_within_the_effect_tolerance():
    """Fig. 11 (Llama-3 8B, TP 8, SPP 4, H100): KVP 1→4 cuts TPOT 1.7× at 4M, 2.5× at 10M (±25 % of the effect)."""
    one, four = _medha_3d(1), _medha_3d(4)
    for n, paper in ((4_000_000, 1.7), (10_000_000, 2.5)):
        ours = _tpot(one, n) / _tpot(four, n)
        assert abs((ours - 1) - (paper - 1)) <= 0.25 * (paper - 1), (n, ours)
