"""Batch time under tensor, pipeline, sequence and KV-cache parallelism.

A :class:`ParallelConfig` turns a single-GPU linear model into the model of one
replica spread over tp·pp·sp·kvp GPUs. Every term below is linear in the batch
sums of :mod:`infermax.costmodel.linear` except ring attention's overlap, so
the result is again a :class:`LinearCostModel` (MILP-ready) plus, for ring SP
only, one extra ``max``. At degree 1 every term vanishes and the coefficients
are returned unchanged (bit-for-bit).

With N = Σc tokens, L layers, d hidden, b bytes per value (elements → bytes):

- TP (degree t): compute per GPU from the profile measured at TP t when there is
  one, else the TP-1 coefficients / t (weights, heads and FLOPs split t ways);
  plus 2 all-reduces of N·d·b bytes per layer (Megatron).
- PP (degree p): the latency of one batch is every stage in turn — the same
  compute — plus (p−1) send/recv of the N·d·b activations. (A pipeline admits a
  new micro-batch every compute/p + send/recv: :meth:`ParallelCostModel.stage_time`.)
- SP (degree s) splits the batch's tokens and attention work s ways, then adds
  per layer the communication of its kind; volumes (elements, whole group,
  communication.py) become time at the link's bandwidth, each GPU moving
  volume / s: ``ulysses`` two A2A, 4·N·d·(s−1)/s (+ 4·d²·(s−1) to gather the
  attention parameters when t > 1: csps App. A SP-NTP); ``megatron`` all-gather
  + reduce-scatter, 2·N·d·(s−1) (SP-TP; weights sharded, so the non-attention
  bias is also / s); ``ring`` rotates K and V, (s−1)·Σ_prefill(m+c)·2·h_kv·d_h,
  overlapped with the prefill attention it feeds: that term becomes
  max(attention / s, rotation).
- KVP (degree k, medha Eq. 5–6): only the attention slopes are divided by k (the
  linear layers, the per-batch attention launch and the TP all-reduces run whole
  on every KVP group: the query is replicated, not sharded). Every layer then
  merges the N queries' partial attention over the k groups (:func:`kvp_merge_s`):
  an all-gather of the log-sum-exps and an all-reduce of the rescaled partial
  outputs, N·h_q/t·d_h·b bytes. Those are tiny, so their *latency* is the cost:
  with tp·pp·sp filling a node, the k ranks sit on k nodes and each collective is
  a ring over the network, each step the measured inter-node send/recv (Vidur)
  times the measured collective-step overhead (:meth:`CommModel.placed_collective_s`).

Calibration against Medha (Llama-3 8B on H100, TP 8; the model ``scaled:h100/
llama3-8b``, Vidur's H100 Llama-2-7B fit moved to Llama-3 8B by the roofline ratio;
``roofline:`` uses unmeasured, bandwidth-bound communication and is a lower bound):

=====================================  =========  ===============  ==============  =========
quantity                               paper      before (scaled)  after (scaled)  roofline
=====================================  =========  ===============  ==============  =========
TPOT, KVP 1→4, 4M tokens (SPP 4)       1.7×       2.89×            1.70×           2.32×
TPOT, KVP 1→4, 10M tokens (SPP 4)      2.5×       3.43×            2.54×           3.07×
TPOT, KVP 1→2, 10M tokens              ≈1.67×     1.89×            1.78×           1.88×
TPOT at 10M, KVP 2                     ≈33 ms     34.8 ms          36.8 ms         26.6 ms
TTFT scaling efficiency, SPP 16, 1M    80 %+      87 %             87 %            84 %
TTFT scaling efficiency, SPP 16, 10M   80 %+      98 %             98 %            98 %
decode at 2M, SPP 1 → 16 (Fig. 10)     marginal   +1.9 %           +1.9 %          +1.4 %
=====================================  =========  ===============  ==============  =========

(``a100/llama3-8b``, the issue's 2.6×/3.3×, now gives 1.77× and 2.59×.) The cause of
the old optimism: the merge was one all-gather timed as if the k ranks shared a node
pair (10 µs analytic latency on H100, ≈ 0.3 ms a token over 32 layers) where the
paper's ranks sit on k nodes; three network ring steps for the all-gather and six
for the all-reduce, ≈ 220 µs a layer at k = 4, are ≈ 7 ms a token, comparable to
the 6 ms of attention over 1M tokens they save. KVP therefore *costs* TPOT below ≈
2M tokens (0.80× at 1M for k = 4), as the paper says ("we use KVP only for longer
context lengths"). SPP's TTFT (:func:`spp_prefill_ttft_s`, 4K chunks) did not change.

Collectives are timed by communication.CommModel: ``gather_like_s(S, n)`` is
an all-gather of a tensor of S bytes (each GPU receives (n−1)/n of it).
SP groups use NVLink when the replica fits in a node, else the network; KVP's merge
is placed by :func:`kvp_workers_per_node`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .communication import CommModel, comm_model
from .linear import LinearCoefficients, LinearCostModel
from .specs import GpuSpec, ModelSpec, get_gpu_spec, get_model_spec, kv_capacity_tokens

SpKind = Literal["ring", "ulysses", "megatron", "ntp", "tp"]
#: CSPS's SP architectures by the collective they use: SP-NTP (two all-to-alls; under TP it gathers the
#: attention parameters, App. A) is Ulysses, SP-TP (all-gather + reduce-scatter) is Megatron
SP_KIND_ALIASES = {"ntp": "ulysses", "tp": "megatron"}
LSE_BYTES = 4          # log-sum-exps travel in fp32


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class ParallelConfig:
    """Parallel degrees of one model replica; all 1 is a single GPU.

    ``sp_kind`` also takes CSPS's names (``"ntp"``, ``"tp"``, :data:`SP_KIND_ALIASES`); they are
    resolved in ``__init__``, before any field is set, so the field always holds the canonical name.
    """

    tp: int
    pp: int
    sp: int
    kvp: int
    sp_kind: SpKind

    def __init__(self, *, tp: int = 1, pp: int = 1, sp: int = 1, kvp: int = 1, sp_kind: str = "ring") -> None:
        for name, value in (("tp", tp), ("pp", pp), ("sp", sp), ("kvp", kvp)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"ParallelConfig.{name} must be an integer >= 1, got {value!r}")
        kind = SP_KIND_ALIASES.get(sp_kind, sp_kind) if isinstance(sp_kind, str) else sp_kind
        if kind not in ("ring", "ulysses", "megatron"):
            raise ValueError(f"ParallelConfig.sp_kind must be 'ring', 'ulysses' (or 'ntp'), 'megatron' (or 'tp'), "
                             f"got {sp_kind!r}")
        for name, value in (("tp", tp), ("pp", pp), ("sp", sp), ("kvp", kvp), ("sp_kind", kind)):
            object.__setattr__(self, name, value)     # what a frozen dataclass's generated __init__ does

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.sp * self.kvp

    @property
    def is_single_gpu(self) -> bool:
        return self.num_gpus == 1

    def to_text(self) -> str:
        """The inverse of :meth:`parse`, degrees above 1 only (``"tp=2,sp=4,sp_kind=ring"``)."""
        parts = [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "sp", "kvp") if getattr(self, k) > 1]
        return ",".join(parts + ([f"sp_kind={self.sp_kind}"] if self.sp > 1 else [])) or "tp=1"

    @classmethod
    def parse(cls, text: str) -> "ParallelConfig":
        """``"tp=2,pp=2"`` or ``"tp2,sp4,sp_kind=ulysses"``."""
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            if not sep:
                key, raw = key.rstrip("0123456789"), key[len(key.rstrip("0123456789")):]
            key = key.strip()
            if key not in ("tp", "pp", "sp", "kvp", "sp_kind"):
                raise ValueError(f"unknown parallel setting {part!r} (tp, pp, sp, kvp, sp_kind)")
            try:
                values[key] = raw.strip() if key == "sp_kind" else int(raw)
            except ValueError:
                raise ValueError(f"ParallelConfig.{key} must be an integer, got {raw!r}") from None
        return cls(**values)


def parallel_kv_capacity_tokens(model: "str | ModelSpec", gpu: "str | GpuSpec", parallel: ParallelConfig,
                                util: float = 0.9) -> int:
    """M of a replica: TP/PP shard weights and KV per GPU; SP and KVP shard the KV over their GPUs."""
    per_group = kv_capacity_tokens(model, gpu, util, tp=parallel.tp, pp=parallel.pp)
    return per_group * parallel.sp * parallel.kvp


def _shift_lines(lines: tuple[tuple[float, float], ...], bias: float, per_token: float,
                 scale_bias: float = 1.0, scale_token: float = 1.0) -> tuple[tuple[float, float], ...]:
    return tuple((a * scale_bias + bias, b * scale_token + per_token) for a, b in lines)


def parallel_coefficients(base: LinearCoefficients, parallel: ParallelConfig, model: ModelSpec, gpu: GpuSpec,
                          comm: CommModel, tp_measured: LinearCoefficients | None = None) -> LinearCoefficients:
    """The linear part of the parallel model (see the module docstring); ``base`` is TP 1."""
    if parallel.is_single_gpu:
        return base
    p, L, d, b = parallel, model.num_layers, model.hidden_size, model.dtype_bytes
    k = base
    intra = p.tp * p.sp * p.kvp <= gpu.gpus_per_node
    if p.tp > 1:
        if tp_measured is not None:
            k = tp_measured
        else:
            k = dataclasses.replace(k, nonattn_lines=_shift_lines(k.nonattn_lines, 0.0, 0.0, 1 / p.tp, 1 / p.tp),
                                    decode_kv_s=k.decode_kv_s / p.tp, prefill_attn_s=k.prefill_attn_s / p.tp,
                                    prefill_token_s=k.prefill_token_s / p.tp)
        tp_intra = p.tp <= gpu.gpus_per_node
        k = _add_linear_comm(k, lambda n: 2 * L * comm.all_reduce_s(n * d * b, p.tp, intra_node=tp_intra))
    if p.sp > 1:
        bias_scale = 1 / p.sp if p.sp_kind == "megatron" else 1.0
        k = dataclasses.replace(k, nonattn_lines=_shift_lines(k.nonattn_lines, 0.0, 0.0, bias_scale, 1 / p.sp),
                                decode_kv_s=k.decode_kv_s / p.sp, prefill_attn_s=k.prefill_attn_s / p.sp,
                                prefill_token_s=k.prefill_token_s / p.sp)
        if p.sp_kind == "ulysses":
            params = 4 * d * d if p.tp > 1 else 0.0       # gathered: each GPU receives (s−1)/s of them
            k = _add_linear_comm(k, lambda n: L * comm.gather_like_s((4 * n * d / p.sp + params) * b, p.sp, intra))
        elif p.sp_kind == "megatron":
            k = _add_linear_comm(k, lambda n: L * comm.gather_like_s(2 * n * d * b, p.sp, intra))
    if p.kvp > 1:
        k = dataclasses.replace(k, decode_kv_s=k.decode_kv_s / p.kvp, prefill_attn_s=k.prefill_attn_s / p.kvp,
                                prefill_token_s=k.prefill_token_s / p.kvp)
        k = _add_linear_comm(k, lambda n: L * kvp_merge_s(n, p, model, gpu, comm))
    if p.pp > 1:
        pp_intra = p.num_gpus <= gpu.gpus_per_node
        k = _add_linear_comm(k, lambda n: (p.pp - 1) * comm.send_recv_s(n * d * b, intra_node=pp_intra))
    return k


def kvp_workers_per_node(parallel: ParallelConfig, gpu: GpuSpec) -> int:
    """GPUs of one KVP merge group (the k ranks holding the same TP rank and stage) on one node:
    the k KVP groups of tp·pp·sp GPUs each are packed onto nodes in turn."""
    group = parallel.tp * parallel.pp * parallel.sp
    return max(1, min(parallel.kvp, gpu.gpus_per_node // group))


def kvp_merge_s(num_tokens: float, parallel: ParallelConfig, model: ModelSpec, gpu: GpuSpec, comm: CommModel) -> float:
    """One layer's KVP merge of the partial attention of ``num_tokens`` queries (medha §3.4, T_comm^kvp).

    Each of the k ranks holds, per query and per local head (h_q/t), a partial output (d_h values)
    and its log-sum-exp. The merge is two collectives over the k ranks, as KV-parallel decoders do it
    (vLLM's decode context parallelism: ``cp_lse_ag_out_rs``): all-gather the log-sum-exps (fp32),
    rescale locally, all-reduce the rescaled outputs. Small, so latency-bound: on a multi-node plan
    each collective crosses the network once per ring step (:meth:`CommModel.placed_collective_s`).
    """
    k = parallel.kvp
    if k <= 1:
        return 0.0
    heads = model.num_heads / parallel.tp
    per_node = kvp_workers_per_node(parallel, gpu)
    lse = comm.placed_collective_s("all_gather", k * num_tokens * heads * LSE_BYTES, k, per_node)
    out = comm.placed_collective_s("all_reduce", num_tokens * heads * model.head_dim * model.dtype_bytes, k, per_node)
    return lse + out


def _add_linear_comm(k: LinearCoefficients, time_of_tokens) -> LinearCoefficients:
    """Add a communication time that is affine in N (read off at N = 0 and N = 1024)."""
    at0, at1k = time_of_tokens(0.0), time_of_tokens(1024.0)
    return dataclasses.replace(k, nonattn_lines=_shift_lines(k.nonattn_lines, at0, (at1k - at0) / 1024.0))


class ParallelCostModel(LinearCostModel):
    """A linear model spread over ``parallel``; ring SP adds its overlap term in batch_time."""

    def __init__(self, base: LinearCoefficients, parallel: ParallelConfig, model: "str | ModelSpec",
                 gpu: "str | GpuSpec", comm: CommModel | None = None,
                 tp_measured: dict[int, LinearCoefficients] | None = None, name: str = "parallel") -> None:
        self.parallel, self.model, self.gpu = parallel, get_model_spec(model), get_gpu_spec(gpu)
        self.comm = comm if comm is not None else (comm_model(self.gpu.name) if not parallel.is_single_gpu
                                                   else CommModel(self.gpu))
        measured = (tp_measured or {}).get(parallel.tp)
        super().__init__(parallel_coefficients(base, parallel, self.model, self.gpu, self.comm, measured), name=name)
        m, p = self.model, parallel
        self._ring = p.sp > 1 and p.sp_kind == "ring"
        self.is_linear = not self._ring
        self._ring_bytes_per_kv = 2 * -(-m.num_kv_heads // p.tp) * m.head_dim * m.dtype_bytes
        self._ring_intra = p.num_gpus <= self.gpu.gpus_per_node

    def ring_rotation_s(self, prefill_kv_tokens: float) -> float:
        """Ring SP: per GPU, K,V shards of Σ_prefill(m + c) tokens arrive from the s−1 others, every layer."""
        per_layer = self.comm.gather_like_s(self._ring_bytes_per_kv * prefill_kv_tokens, self.parallel.sp,
                                            self._ring_intra)
        return self.model.num_layers * per_layer

    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        t = super().batch_time(tokens, kv_before, is_decode)
        if self._ring and not is_decode.all():
            pf = ~is_decode
            c, kv = tokens[pf], kv_before[pf] + tokens[pf]
            k = self.coefficients
            work = 0.5 * float(np.dot(c, 2 * kv_before[pf] + c + 1))       # causal pairs, as in LinearCostModel
            attention = k.prefill_attn_s * work + k.prefill_token_s * float(c.sum())
            t += max(0.0, self.ring_rotation_s(float(kv.sum())) - attention)
        return t

    def stage_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        """Seconds between micro-batches in a full pipeline: one stage's share plus one send/recv."""
        p = self.parallel
        if p.pp == 1:
            return self.batch_time(tokens, kv_before, is_decode)
        hop = self.comm.send_recv_s(float(tokens.sum()) * self.model.hidden_size * self.model.dtype_bytes,
                                    intra_node=p.num_gpus <= self.gpu.gpus_per_node)
        return (self.batch_time(tokens, kv_before, is_decode) - (p.pp - 1) * hop) / p.pp + hop

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["parallel"] = dataclasses.asdict(self.parallel)
        return out


def spp_prefill_time_s(prefill_time_s: float, num_tokens: int, chunk: int, spp: int, comm_per_chunk_s: float) -> float:
    """medha Eq. 4: T_p^spp(n, c) ≈ T_p(n, c)/p_spp + T_comm^pp(c)·n/c."""
    return prefill_time_s / spp + comm_per_chunk_s * num_tokens / chunk


def spp_prefill_ttft_s(cost: ParallelCostModel, prompt_tokens: int, chunk_tokens: int) -> float:
    """TTFT of one prompt prefilled alone in chunks through the pp stages (SPP, medha §3.3, Fig. 8):
    chunk j + 1 enters stage 1 as soon as chunk j leaves it. With s_j the stage time of chunk j
    (:meth:`ParallelCostModel.stage_time`: its compute / p plus one send/recv), the finish time of
    chunk j at stage q is C(j, q) = max(C(j − 1, q), C(j, q − 1)) + s_j; the TTFT is C(last, p).
    At p = 1 it is the sum of the chunks' batch times; for long prompts (s_j growing with the
    cached KV) it tends to Σ s_j + (p − 1)·s_last ≈ T_p / p (Eq. 4)."""
    if prompt_tokens < 1 or chunk_tokens < 1:
        raise ValueError(f"prompt_tokens and chunk_tokens must be >= 1, got {prompt_tokens!r}, {chunk_tokens!r}")
    starts = np.arange(0, prompt_tokens, chunk_tokens)
    sizes = np.minimum(chunk_tokens, prompt_tokens - starts)
    prefill = np.zeros(1, dtype=bool)
    stage = np.array([cost.stage_time(np.array([c]), np.array([m]), prefill) for c, m in zip(sizes, starts)])
    finish = np.zeros(len(stage))                     # C(·, q − 1); stage 0 is free from the start
    before = np.concatenate(([0.0], np.cumsum(stage)))
    for _ in range(cost.parallel.pp):
        # C(j, q) = S_j + max_{i ≤ j}(C(i, q − 1) − S_{i−1}), S the prefix sums of s
        finish = before[1:] + np.maximum.accumulate(finish - before[:-1])
    return float(finish[-1])


def kvp_decode_time_s(decode_time_s: float, attention_time_s: float, kvp: int, comm_s: float) -> float:
    """medha Eq. 5 (and Eq. 6 per prefill chunk): T_attn/p_kvp + (T − T_attn) + T_comm^kvp."""
    return attention_time_s / kvp + (decode_time_s - attention_time_s) + comm_s


def kv_migration_time_s(num_tokens: int, model: "str | ModelSpec", gpu: "str | GpuSpec", tp: int = 1,
                        intra_node: bool = False, comm: CommModel | None = None) -> float:
    """Seconds to move a request's KV cache (num_tokens) between replicas (PD disaggregation,
    pecsched §5.2): each of the tp GPUs sends its 1/tp of the KV over its own link, in parallel."""
    m = get_model_spec(model)
    c = comm if comm is not None else comm_model(get_gpu_spec(gpu).name)
    return c.send_recv_s(num_tokens * m.kv_bytes_per_token / tp, intra_node=intra_node)
