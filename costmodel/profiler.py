"""Measure a Llama-architecture model's operators with PyTorch and write a Vidur-format profile.

``profile_model("llama-tiny", device="cpu", out_dir=...)`` times, one layer's
weights at a time, the same operators Vidur profiles — embedding, two RMSNorms,
QKV projection, RoPE, O projection, gated up projection, SiLU·mul, down
projection, residual add (``mlp.csv``, vs tokens) and attention with its
reshape and KV-cache write (``attention.csv``, vs decode batch × KV size and
prefill chunk × prefix) — and writes them to ``<out>/<device>/<model>/`` in the
CSV format :mod:`.profiles` reads. ``measure_batch_s`` runs whole batches
through the same operators so that fit → predict → measure closes on this
machine. ``device="cuda"`` times with CUDA events instead of the wall clock.

torch is imported inside these functions only; nothing else in the package needs it.
"""
from __future__ import annotations

import csv
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .specs import ModelSpec, get_model_spec

log = logging.getLogger(__name__)
MLP_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
ATTENTION_OPS = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode", "attn_output_reshape")
STATS = ("min", "max", "mean", "median", "std")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileGrid:
    """Configurations to measure; ``repeats`` timed runs (after ``warmup``) per configuration."""

    num_tokens: tuple[int, ...] = (1, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_kv: tuple[int, ...] = (32, 128, 256, 512, 1024)
    prefill_chunk: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    prefill_kv: tuple[int, ...] = (0, 128, 256, 512, 1024)
    repeats: int = 5
    warmup: int = 1

    def __post_init__(self) -> None:
        for name in ("num_tokens", "decode_batch", "decode_kv", "prefill_chunk", "prefill_kv"):
            values = getattr(self, name)
            minimum = 0 if name == "prefill_kv" else 1
            if not values or any(int(v) != v or v < minimum for v in values):
                raise ValueError(f"ProfileGrid.{name} must be non-empty integers >= {minimum}, got {values!r}")
        for name in ("repeats", "warmup"):
            if getattr(self, name) < (1 if name == "repeats" else 0):
                raise ValueError(f"ProfileGrid.{name} is too small, got {getattr(self, name)!r}")

    @classmethod
    def tiny(cls) -> "ProfileGrid":
        """A grid that runs in a few seconds (tests)."""
        return cls(num_tokens=(1, 16, 64, 128, 256), decode_batch=(1, 4, 16), decode_kv=(32, 256),
                   prefill_chunk=(32, 128), prefill_kv=(0, 256), repeats=3, warmup=1)


class _Layer:
    """One Llama decoder layer's weights and its operators as callables on torch tensors."""

    def __init__(self, spec: ModelSpec, device: str, seed: int) -> None:
        import torch
        self.torch, self.spec, self.device = torch, spec, device
        self.dtype = {4: torch.float32, 2: torch.float16}[spec.dtype_bytes]
        gen = torch.Generator().manual_seed(seed)
        d, hd = spec.hidden_size, spec.head_dim
        self.q_out, self.kv_out = spec.num_heads * hd, spec.num_kv_heads * hd

        def weight(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(device=device, dtype=self.dtype)
        self.emb = weight(spec.vocab_size, d)
        self.norm = torch.ones(d, device=device, dtype=self.dtype)
        self.w_qkv, self.w_o = weight(self.q_out + 2 * self.kv_out, d), weight(d, self.q_out)
        self.w_up, self.w_down = weight(2 * spec.ffn_size, d), weight(d, spec.ffn_size)
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))

    def rmsnorm(self, x: Any) -> Any:
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm

    def rope(self, x: Any, positions: Any) -> Any:
        """Rotary embedding of x (tokens, heads, head_dim) at integer positions."""
        angles = positions[:, None].float() * self.inv_freq[None, :]
        cos, sin = angles.cos().to(x.dtype)[:, None, :], angles.sin().to(x.dtype)[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return self.torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def attention(self, q: Any, k: Any, v: Any, mask: Any | None) -> Any:
        """q (B, h_q, n, d_h); k, v (B, h_kv, kv, d_h); grouped-query heads share their K, V."""
        gqa = self.spec.num_heads != self.spec.num_kv_heads
        return self.torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def mlp_ops(self, n: int) -> dict[str, Callable[[], Any]]:
        torch, d, f = self.torch, self.spec.hidden_size, self.spec.ffn_size
        ids = torch.randint(0, self.spec.vocab_size, (n,), device=self.device)
        x = torch.randn(n, d, device=self.device, dtype=self.dtype)
        qkv = torch.randn(n, self.q_out + 2 * self.kv_out, device=self.device, dtype=self.dtype)
        q = qkv[:, : self.q_out].reshape(n, self.spec.num_heads, -1)
        pos = torch.arange(n, device=self.device)
        attn_out = torch.randn(n, self.q_out, device=self.device, dtype=self.dtype)
        up = torch.randn(n, 2 * f, device=self.device, dtype=self.dtype)
        act = torch.randn(n, f, device=self.device, dtype=self.dtype)
        linear = torch.nn.functional.linear
        return {
            "emb": lambda: torch.nn.functional.embedding(ids, self.emb),
            "input_layernorm": lambda: self.rmsnorm(x),
            "attn_pre_proj": lambda: linear(x, self.w_qkv),
            "attn_rope": lambda: self.rope(q, pos),
            "attn_post_proj": lambda: linear(attn_out, self.w_o),
            "post_attention_layernorm": lambda: self.rmsnorm(x),
            "mlp_up_proj": lambda: linear(x, self.w_up),
            "mlp_act": lambda: torch.nn.functional.silu(up[:, :f]) * up[:, f:],
            "mlp_down_proj": lambda: linear(act, self.w_down),
            "add": lambda: x + x,
        }

    def attention_inputs(self, batch: int, queries: int, cached: int) -> tuple[Any, ...]:
        """q, k, v, mask for ``batch`` requests of ``queries`` new tokens after ``cached`` ones."""
        torch, hd = self.torch, self.spec.head_dim
        total = cached + queries
        q = torch.randn(batch, self.spec.num_heads, queries, hd, device=self.device, dtype=self.dtype)
        k = torch.randn(batch, self.spec.num_kv_heads, total, hd, device=self.device, dtype=self.dtype)
        v = torch.randn_like(k)
        mask = None
        if queries > 1:       # causal with the cached prefix visible: query i sees keys <= cached + i
            query_pos = cached + torch.arange(queries, device=self.device)
            mask = torch.arange(total, device=self.device)[None, :] <= query_pos[:, None]
        return q, k, v, mask


def _timer(device: str) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call takes: wall clock on CPU, CUDA events on a GPU."""
    import torch
    if device.startswith("cuda"):
        def cuda_time(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1e-3
        return cuda_time

    def cpu_time(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return cpu_time


def _stats_ms(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in samples_s]
    return {"min": min(ms), "max": max(ms), "mean": statistics.fmean(ms), "median": statistics.median(ms),
            "std": statistics.pstdev(ms)}


def _measure_sequence(timer: Callable, ops: dict[str, Callable[[], Any]], grid: ProfileGrid
                      ) -> dict[str, dict[str, float]]:
    """Time each op *inside* repeated passes over all of them in order, as in a forward pass.

    Timing an op alone in a tight loop flatters it on a CPU (its buffers stay
    hot and the allocator recycles one block); inside the sequence it pays what
    it pays in a real layer.
    """
    samples: dict[str, list[float]] = {op: [] for op in ops}
    for rep in range(grid.warmup + grid.repeats):
        for op, fn in ops.items():
            elapsed = timer(fn)
            if rep >= grid.warmup:
                samples[op].append(elapsed)
    return {op: _stats_ms(values) for op, values in samples.items()}


def _stat_columns(ops: tuple[str, ...]) -> list[str]:
    return [f"time_stats.{op}.{s}" for op in ops for s in STATS]


def _stat_cells(ops: tuple[str, ...], measured: dict[str, dict[str, float]]) -> list[Any]:
    return [measured[op][s] if op in measured else "" for op in ops for s in STATS]


def _check_device(device: str) -> None:
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")


def profile_model(model: "str | ModelSpec" = "llama-tiny", device: str = "cpu", out_dir: str | Path = "profiles",
                  grid: ProfileGrid | None = None, seed: int = 0, threads: int | None = 1) -> Path:
    """Measure every operator on ``grid`` and write mlp.csv and attention.csv; returns the profile directory."""
    import torch
    _check_device(device)
    spec, grid = get_model_spec(model), grid or ProfileGrid()
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    layer, timer = _Layer(spec, device, seed), _timer(device)
    folder = Path(out_dir) / device.split(":")[0] / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    shape = [spec.num_heads, spec.num_kv_heads, spec.hidden_size, spec.ffn_size, spec.vocab_size, spec.gated_mlp]
    with torch.inference_mode(), open(folder / "mlp.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(_stat_columns(MLP_OPS) + ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                                               "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"])
        for n in grid.num_tokens:
            measured = _measure_sequence(timer, layer.mlp_ops(n), grid)
            out.writerow(_stat_cells(MLP_OPS, measured) + shape + [n, 1])
    with torch.inference_mode(), open(folder / "attention.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(_stat_columns(ATTENTION_OPS) + [
            "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "max_model_len",
            "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", "attention_backend"])
        max_len = max(max(grid.prefill_kv) + max(grid.prefill_chunk), max(grid.decode_kv) + 1)
        configs = [(b, 1, kv, False) for kv in grid.decode_kv for b in grid.decode_batch]
        configs += [(1, c, kv, True) for c in grid.prefill_chunk for kv in grid.prefill_kv]
        for batch, queries, cached, is_prefill in configs:
            measured = _attention_measurements(layer, timer, grid, batch, queries, cached, is_prefill)
            out.writerow(_stat_cells(ATTENTION_OPS, measured) + [
                spec.hidden_size, spec.num_heads, spec.num_kv_heads, 16, 1, max_len,
                batch, queries if is_prefill else 0, cached, is_prefill, f"torch.sdpa.{device.split(':')[0]}"])
    log.info("wrote profile %s", folder)
    return folder


def _attention_measurements(layer: _Layer, timer: Callable, grid: ProfileGrid, batch: int, queries: int,
                            cached: int, is_prefill: bool) -> dict[str, dict[str, float]]:
    q, k, v, mask = layer.attention_inputs(batch, queries, cached)
    new_k = k[:, :, cached:].clone()
    out = layer.attention(q, k, v, mask)
    kernel = "attn_prefill" if is_prefill else "attn_decode"
    measured = _measure_sequence(timer, {
        "attn_kv_cache_save": lambda: (k[:, :, cached:].copy_(new_k), v[:, :, cached:].copy_(new_k)),
        kernel: lambda: layer.attention(q, k, v, mask),
        "attn_output_reshape": lambda: out.transpose(1, 2).reshape(batch * queries, -1),
    }, grid)
    measured["attn_input_reshape"] = {s: 0.0 for s in STATS}
    return measured


def measure_batch_s(batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]], model: "str | ModelSpec" = "llama-tiny",
                    device: str = "cpu", repeats: int = 3, seed: int = 0, threads: int | None = 1,
                    stat: str = "median") -> np.ndarray:
    """Seconds (``stat`` over ``repeats`` runs) of a whole forward pass of each (tokens, kv_before, is_decode) batch.

    The pass runs the profiled operators over all layers: non-attention on all
    Σc tokens, one batched decode-attention call over the decode requests
    (padded to the longest KV, masked) and one prefill-attention call per
    prefill request — the structure the linear model assumes.
    """
    import torch
    _check_device(device)
    spec = get_model_spec(model)
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    layer, timer = _Layer(spec, device, seed), _timer(device)
    grid = ProfileGrid(repeats=repeats, warmup=1)
    times = []
    with torch.inference_mode():
        for tokens, kv_before, is_decode in batches:
            ops = layer.mlp_ops(int(np.sum(tokens)))
            layer_ops = [fn for op, fn in ops.items() if op != "emb"]
            attention = _batch_attention_calls(layer, tokens, kv_before, is_decode)

            def forward() -> None:
                ops["emb"]()
                for _ in range(spec.num_layers):
                    for fn in layer_ops:
                        fn()
                    for fn in attention:
                        fn()
            for _ in range(grid.warmup):
                forward()
            times.append(_stats_ms([timer(forward) for _ in range(grid.repeats)])[stat] * 1e-3)
    return np.array(times)


def _batch_attention_calls(layer: _Layer, tokens: np.ndarray, kv_before: np.ndarray,
                           is_decode: np.ndarray) -> list[Callable[[], Any]]:
    torch = layer.torch
    calls = []
    if np.any(is_decode):
        kv = kv_before[is_decode]
        q, k, v, _ = layer.attention_inputs(int(kv.size), 1, int(kv.max()))
        visible = torch.arange(int(kv.max()) + 1)[None, :] <= torch.as_tensor(kv)[:, None]
        mask = visible[:, None, None, :].to(layer.device)
        calls.append(lambda: layer.attention(q, k, v, mask))
    for c, m in zip(tokens[~is_decode].tolist(), kv_before[~is_decode].tolist()):
        q, k, v, mask = layer.attention_inputs(1, int(c), int(m))
        calls.append(lambda q=q, k=k, v=v, mask=mask: layer.attention(q, k, v, mask))
    return calls
