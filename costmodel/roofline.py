"""Roofline batch times from specs alone (LLM-Viewer style).

Every operator takes max(FLOPs / peak FLOP/s, bytes / HBM bandwidth) — the
fastest it could possibly run. Operators and their volumes, per GPU of a
tensor-parallel group of degree ``tp`` (heads and weight matrices split tp
ways), for a batch of n tokens, hidden d, head dim h_d, h_q / h_kv heads, FFN f,
b bytes per value:

    non-attention, per layer: RMSNorm x2, QKV projection, RoPE, O projection,
        gated up projection, SiLU·mul, down projection, residual add;
        a projection W (in x out) costs 2·n·in·out FLOPs and (in·out + n·in + n·out)·b
        bytes; an elementwise op costs only its bytes. Plus the embedding lookup.
        (The LM head and sampling are excluded, as in Vidur's profiles.)
    decode attention:  FLOPs 4·h_q·h_d·L·Σ(m+c), bytes = KV bytes per token · Σ(m+c)
    prefill attention: FLOPs 4·h_q·h_d·L·W with W = Σ c·m + c(c + 1)/2 the causal
                       (query, key) pairs (QKᵀ and PV, 2 FLOPs per multiply-add;
                       medha Eq. 1 at m = 0), bytes = KV bytes per token · Σ(m + c)

Decode and prefill attention are separate kernels: each is one max(·) over its
whole batch. Since every term is a lower bound on the work, the roofline is a
lower bound on any real batch time; the fitted models are checked against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import CostModel
from .linear import LinearCoefficients, LinearCostModel
from .specs import GpuSpec, ModelSpec, get_gpu_spec, get_model_spec


@dataclass(frozen=True)
class _Op:
    """One operator: time(n) = count·max(flops_per_token·n / peak, (bytes_fixed + bytes_per_token·n) / bw)."""

    name: str
    count: int
    flops_per_token: float
    bytes_fixed: float
    bytes_per_token: float


def nonattention_ops(model: ModelSpec, tp: int = 1) -> list[_Op]:
    """The non-attention operators of one forward pass on one GPU of a TP group."""
    d, hd, b, L = model.hidden_size, model.head_dim, model.dtype_bytes, model.num_layers
    q, kv = model.num_heads * hd / tp, math.ceil(model.num_kv_heads / tp) * hd
    f = model.ffn_size / tp
    up_out = 2 * f if model.gated_mlp else f

    def proj(name: str, din: float, dout: float) -> _Op:
        return _Op(name, L, 2 * din * dout, din * dout * b, (din + dout) * b)

    def elementwise(name: str, bytes_per_token: float) -> _Op:
        return _Op(name, L, 0.0, 0.0, bytes_per_token)

    return [
        _Op("emb", 1, 0.0, 0.0, 2 * d * b),
        elementwise("input_layernorm", 2 * d * b),
        proj("attn_pre_proj", d, q + 2 * kv),
        elementwise("attn_rope", 2 * (q + kv) * b),
        proj("attn_post_proj", q, d),
        elementwise("post_attention_layernorm", 2 * d * b),
        proj("mlp_up_proj", d, up_out),
        elementwise("mlp_act", (up_out + f) * b),
        proj("mlp_down_proj", f, d),
        elementwise("add", 3 * d * b),
    ]


def _segment_lines(ops: list[_Op], peak: float, bw: float) -> tuple[tuple[float, float], ...]:
    """Σ_ops max(compute line, memory line) as a max of lines (exact: the sum is convex)."""
    breaks = []
    for op in ops:
        gap = op.flops_per_token / peak - op.bytes_per_token / bw
        if gap > 0 and op.bytes_fixed > 0:
            breaks.append(op.bytes_fixed / bw / gap)
    points = sorted(set(breaks))
    probes = [0.5 * points[0]] if points else [1.0]
    probes += [0.5 * (a + b) for a, b in zip(points, points[1:])] + ([2 * points[-1]] if points else [])
    lines = set()
    for n in probes:
        bias = slope = 0.0
        for op in ops:
            compute = op.flops_per_token / peak
            mem_bias, mem_slope = op.bytes_fixed / bw, op.bytes_per_token / bw
            if compute * n >= mem_bias + mem_slope * n:
                slope += op.count * compute
            else:
                bias, slope = bias + op.count * mem_bias, slope + op.count * mem_slope
        lines.add((bias, slope))
    return tuple(sorted(lines, key=lambda line: line[1]))


@dataclass(frozen=True)
class RooflineTerms:
    """Per-unit roofline costs of one model on one GPU (seconds)."""

    nonattn_lines: tuple[tuple[float, float], ...]
    decode_flops_s: float      # per KV token read, compute bound
    decode_bytes_s: float      # per KV token read, bandwidth bound
    prefill_flops_s: float     # per causal (query, key) pair: per unit of c·m + c(c + 1)/2
    prefill_bytes_s: float     # per token of m + c

    def nonattention_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        n = np.asarray(num_tokens, dtype=np.float64)
        return np.max([a + b * n for a, b in self.nonattn_lines], axis=0)

    def decode_s(self, kv_read: np.ndarray | float) -> np.ndarray:
        return np.asarray(kv_read, dtype=np.float64) * max(self.decode_flops_s, self.decode_bytes_s)

    def prefill_s(self, causal_work: np.ndarray | float, kv_read: np.ndarray | float) -> np.ndarray:
        return np.maximum(self.prefill_flops_s * np.asarray(causal_work, dtype=np.float64),
                          self.prefill_bytes_s * np.asarray(kv_read, dtype=np.float64))


def roofline_terms(model: "str | ModelSpec", gpu: "str | GpuSpec", tp: int = 1) -> RooflineTerms:
    m, g = get_model_spec(model), get_gpu_spec(gpu)
    heads_q = m.num_heads / tp
    kv_bytes = 2 * m.num_layers * math.ceil(m.num_kv_heads / tp) * m.head_dim * m.dtype_bytes
    return RooflineTerms(
        nonattn_lines=_segment_lines(nonattention_ops(m, tp), g.peak_flops, g.hbm_bandwidth),
        decode_flops_s=4 * heads_q * m.head_dim * m.num_layers / g.peak_flops,
        decode_bytes_s=kv_bytes / g.hbm_bandwidth,
        prefill_flops_s=4 * heads_q * m.head_dim * m.num_layers / g.peak_flops,
        prefill_bytes_s=kv_bytes / g.hbm_bandwidth,
    )


class RooflineCostModel(CostModel):
    """Lower-bound batch time: Σ over operators of max(FLOPs/peak, bytes/bandwidth)."""

    def __init__(self, model: "str | ModelSpec", gpu: "str | GpuSpec", tp: int = 1, name: str | None = None) -> None:
        self.model, self.gpu, self.tp = get_model_spec(model), get_gpu_spec(gpu), tp
        self.terms = roofline_terms(self.model, self.gpu, tp)
        self.name = name or f"roofline:{self.gpu.name}/{self.model.name}"
        t = self.terms
        self._k = (t.nonattn_lines, max(t.decode_flops_s, t.decode_bytes_s), t.prefill_flops_s, t.prefill_bytes_s)

    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        lines, dec_s, pf_flops_s, pf_bytes_s = self._k
        n = float(tokens.sum())
        t = max(a + b * n for a, b in lines)
        kv = kv_before + tokens
        if is_decode.any():
            t += dec_s * float(kv[is_decode].sum())
        if not is_decode.all():
            pf = ~is_decode
            c = tokens[pf]
            pairs = 0.5 * float(np.dot(c, 2 * kv_before[pf] + c + 1))
            t += max(pf_flops_s * pairs, pf_bytes_s * float(kv[pf].sum()))
        return float(t)

    def to_linear(self) -> LinearCostModel:
        """The roofline in the linear model's form, for the MILP: exact for non-attention and
        decode; prefill keeps only its compute bound (the same causal pairs W as the linear
        model, so exact there), so the result is still a lower bound (≤ this roofline)."""
        t = self.terms
        coefficients = LinearCoefficients(
            nonattn_lines=t.nonattn_lines, decode_bias_s=0.0, decode_kv_s=max(t.decode_flops_s, t.decode_bytes_s),
            prefill_bias_s=0.0, prefill_attn_s=t.prefill_flops_s)
        return LinearCostModel(coefficients, name=f"{self.name}(linear)")

    def with_parallel(self, parallel: Any) -> CostModel:
        """The roofline of a parallel replica: per-GPU rooflines at its TP degree, and
        bandwidth-bound (unmeasured) communication; see parallel.py."""
        if parallel.is_single_gpu:
            return self
        from .communication import CommModel
        from .parallel import ParallelCostModel
        at_tp = RooflineCostModel(self.model, self.gpu, parallel.tp).to_linear().coefficients
        return ParallelCostModel(self.to_linear().coefficients, parallel, self.model, self.gpu,
                                 comm=CommModel(self.gpu), tp_measured={parallel.tp: at_tp},
                                 name=f"{self.name}@{parallel.to_text()}")

    def describe(self) -> dict[str, Any]:
        t = self.terms
        return {"name": self.name, "kind": "roofline", "gpu": self.gpu.name, "model": self.model.name, "tp": self.tp,
                "nonattn_lines": [list(line) for line in t.nonattn_lines],
                "decode_kv_s": max(t.decode_flops_s, t.decode_bytes_s),
                "prefill_flops_s": t.prefill_flops_s, "prefill_bytes_s": t.prefill_bytes_s}
