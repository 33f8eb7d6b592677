"""Parallel terms: degree 1 is the single-GPU model, and each term follows its paper formula."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.costmodel import LinearCoefficients, ParallelConfig, get_cost_model
from infermax.costmodel.communication import (CollectiveLine, CommModel, megatron_sp_attention_volume,
                                              ring_attention_volume, sp_ntp_crossover_length, sp_ntp_volume,
                                              sp_tp_volume, ulysses_sp_attention_volume)
from infermax.costmodel.parallel import (ParallelCostModel, kv_migration_time_s, kvp_decode_time_s,
                                         parallel_kv_capacity_tokens, spp_prefill_time_s)
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
    q_bytes = SPEC.num_heads * (SPEC.head_dim + 1) * 2
    comm = SPEC.num_layers * (1e-5 + 3 * 64 * q_bytes / GPU.nvlink_bandwidth)   # each GPU receives 3 partials
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
