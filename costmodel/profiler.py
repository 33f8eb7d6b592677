"""Measure a Llama-architecture model's operators with PyTorch and write a Vidur-format profile.

``profile_model("llama-tiny", device="cpu", out_dir=...)`` runs whole forward
passes of a model with *separate weights per layer* and a paged KV cache per
layer — the operators, order and memory traffic of the executor's ``sdpa`` path
(:mod:`infermax.execute.forward`) — and times every operator in place, as laps of
one clock: the time from the end of one operator to the end of the next, so the
laps of a pass add up to the whole pass (the Python glue between operators
included) and every layer's weights are as cold as they are in a real pass.
It writes ``<out>/<device>/<model>/``:

- ``mlp.csv`` vs ``num_tokens`` (one prefill chunk of that many tokens):
  ``emb`` (embedding + RoPE tables, per forward), per layer the two RMSNorms,
  QKV projection, RoPE, O projection, gated up projection, SiLU·mul, down
  projection and the two residual adds (``add``), and ``lm_head`` (per forward:
  final norm + LM head + greedy argmax on ``num_tokens`` logits rows — one row
  per *request* of a batch, so the fit reads it against the number of requests);
- ``attention.csv`` vs decode batch × KV size and prefill chunk × prefix: KV-cache
  write (``attn_kv_cache_save``), query selection (``attn_input_reshape``), the
  kernel with its gather of the paged KV blocks (``attn_decode`` /
  ``attn_prefill``) and the scatter of its output (``attn_output_reshape``).

Per-layer columns hold the mean over the layers of one pass; the statistics are
over ``repeats`` passes after ``warmup``, taken round-robin over the whole grid
so that each configuration's passes are spread over the whole measurement.
``min`` and ``median`` are an operator's time in the fastest and the median
pass (so the operators of a row add up to a pass that ran, as the fit adds
them), ``mean``, ``max``, ``std`` are per operator. On a shared CPU the fit reads
``min`` (other processes only ever add time), as the executor keeps the fastest
of its runs.
``measure_batch_s`` runs whole mixed batches through the same forward so that
fit → predict → measure closes on this machine. ``device="cuda"`` synchronises
at each lap.

torch is imported inside these functions only; nothing else in the package needs it.
"""
from __future__ import annotations

import csv
import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .packed import Packed as _Batch  # one packed-batch layout for executor and profiler
from .profiles import PER_MODEL_OPS
from .specs import ModelSpec, get_model_spec

log = logging.getLogger(__name__)
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
MLP_OPS = ("emb", *LAYER_OPS, "lm_head")
PER_FORWARD_OPS = PER_MODEL_OPS             # timed once per pass, not per layer
ATTENTION_OPS = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode", "attn_output_reshape")
STATS = ("min", "max", "mean", "median", "std")
DTYPES = ("float32", "float16", "bfloat16")
BLOCK_SIZE = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileGrid:
    """Configurations to measure; ``repeats`` timed forward passes (after ``warmup``) per configuration."""

    num_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_kv: tuple[int, ...] = (32, 128, 256, 512, 1024)
    prefill_chunk: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    prefill_kv: tuple[int, ...] = (0, 128, 256, 512, 1024)
    repeats: int = 7
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


class _Laps:
    """Seconds between consecutive ``mark`` calls, summed per operator name."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock, self.totals = clock, defaultdict(float)
        self.last = clock()

    def mark(self, op: str) -> None:
        now = self.clock()
        self.totals[op] += now - self.last
        self.last = now


class _Net:
    """A Llama model laid out as the executor runs it: fused QKV and gate-up weights, separate per layer.

    Weights are random (``seed``), in the spec's dtype; the KV cache holds
    ``num_blocks`` blocks of ``BLOCK_SIZE`` slots per layer.
    """

    def __init__(self, spec: ModelSpec, device: str, seed: int, num_blocks: int, max_positions: int,
                 dtype: str | None = None) -> None:
        import torch
        self.torch, self.spec, self.device = torch, spec, device
        self.dtype = getattr(torch, _dtype_name(spec, dtype))
        self.rng = np.random.default_rng(seed)
        gen = torch.Generator(device=device).manual_seed(seed)      # drawn where they live (an 8B model in seconds)
        d, hd, f = spec.hidden_size, spec.head_dim, spec.ffn_size
        self.q_out, self.kv_out = spec.num_heads * hd, spec.num_kv_heads * hd

        def weight(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen, device=device) / shape[-1] ** 0.5).to(dtype=self.dtype)

        def ones() -> Any:
            return torch.ones(d, device=device, dtype=self.dtype)
        self.emb = weight(spec.vocab_size, d)
        self.layers = [(ones(), weight(self.q_out + 2 * self.kv_out, d), weight(d, self.q_out), ones(),
                        weight(2 * f, d), weight(d, f)) for _ in range(spec.num_layers)]
        self.norm, self.lm_head = ones(), weight(spec.vocab_size, d)
        shape = (num_blocks, BLOCK_SIZE, spec.num_kv_heads, hd)
        self.k_cache = [torch.zeros(shape, device=device, dtype=self.dtype) for _ in range(spec.num_layers)]
        self.v_cache = [torch.zeros(shape, device=device, dtype=self.dtype) for _ in range(spec.num_layers)]
        half = hd // 2
        inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32, device=device) / half)
        angles = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
        self.cos, self.sin = angles.cos()[:, None, :].to(self.dtype), angles.sin()[:, None, :].to(self.dtype)

    def batch(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray,
              logits_rows: int | None = None) -> _Batch:
        """Pack requests (c, m, decode?) onto shuffled cache blocks; ``logits_rows``: LM-head rows (default 1 each)."""
        torch, bs = self.torch, BLOCK_SIZE
        tokens, kv_before = np.asarray(tokens, np.int64), np.asarray(kv_before, np.int64)
        nb = -(-(kv_before + tokens) // bs)
        blocks = np.split(self.rng.permutation(int(nb.sum())), np.cumsum(nb)[:-1])
        rows = np.r_[0, np.cumsum(tokens)]
        positions = np.concatenate([np.arange(m, m + c) for c, m in zip(tokens, kv_before)])
        slots = np.concatenate([b[p // bs] * bs + p % bs for b, p in zip(blocks, np.split(positions, rows[1:-1]))])
        dec = np.flatnonzero(is_decode)
        width = int(nb[dec].max()) if dec.size else 0
        dec_blocks = np.zeros((dec.size, width), np.int64)
        for i, r in enumerate(dec):
            dec_blocks[i, :nb[r]] = blocks[r]
        dec_mask = torch.arange(width * bs)[None, :] < torch.as_tensor(kv_before[dec] + 1)[:, None]
        prefills = []
        for r in np.flatnonzero(~np.asarray(is_decode)):
            mask = torch.arange(int(nb[r]) * bs)[None, :] <= (int(kv_before[r]) + torch.arange(int(tokens[r])))[:, None]
            prefills.append((int(rows[r]), int(rows[r + 1]), self._long(blocks[r]), mask.to(self.device)))
        last = np.arange(logits_rows) if logits_rows is not None else rows[1:] - 1
        ids = self.rng.integers(0, self.spec.vocab_size, int(rows[-1]))
        return _Batch(input_ids=self._long(ids), positions=self._long(positions), write_slots=self._long(slots),
                      last_rows=self._long(last), decode_rows=self._long(rows[:-1][dec]),
                      decode_blocks=self._long(dec_blocks.reshape(-1)),
                      decode_mask=dec_mask[:, None, None, :].to(self.device), prefills=tuple(prefills),
                      cu_seqlens=None, context_lens=None, block_table=None)   # the gather path, not the paged one

    def _long(self, values: np.ndarray) -> Any:
        return self.torch.as_tensor(np.asarray(values, np.int64), device=self.device)

    def rms_norm(self, x: Any, weight: Any) -> Any:
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight

    def attention(self, b: _Batch, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, laps: _Laps) -> Any:
        """Write the new K, V into the paged cache; one decode call over all decode rows, one call per prefill."""
        torch, spec, sdpa = self.torch, self.spec, self.torch.nn.functional.scaled_dot_product_attention
        hq, hkv, hd, num_dec = spec.num_heads, spec.num_kv_heads, spec.head_dim, b.decode_rows.numel()
        gqa = hq != hkv
        k_cache.view(-1, hkv, hd)[b.write_slots] = k
        v_cache.view(-1, hkv, hd)[b.write_slots] = v
        laps.mark("attn_kv_cache_save")
        attn = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if num_dec:
            q_dec = q[b.decode_rows].unsqueeze(2)
            laps.mark("attn_input_reshape")
            k_dec = k_cache.index_select(0, b.decode_blocks).view(num_dec, -1, hkv, hd).transpose(1, 2)
            v_dec = v_cache.index_select(0, b.decode_blocks).view(num_dec, -1, hkv, hd).transpose(1, 2)
            out = sdpa(q_dec, k_dec, v_dec, attn_mask=b.decode_mask, enable_gqa=gqa)
            laps.mark("attn_decode")
            attn[b.decode_rows] = out.squeeze(2)
            laps.mark("attn_output_reshape")
        for start, end, blocks, mask in b.prefills:
            q_pf = q[start:end].transpose(0, 1).unsqueeze(0)
            laps.mark("attn_input_reshape")
            k_pf = k_cache.index_select(0, blocks).view(-1, hkv, hd).transpose(0, 1).unsqueeze(0)
            v_pf = v_cache.index_select(0, blocks).view(-1, hkv, hd).transpose(0, 1).unsqueeze(0)
            out = sdpa(q_pf, k_pf, v_pf, attn_mask=mask, enable_gqa=gqa)
            laps.mark("attn_prefill")
            attn[start:end] = out[0].transpose(0, 1)
            laps.mark("attn_output_reshape")
        return attn

    def forward(self, b: _Batch, laps: _Laps) -> list[int]:
        """Logits and greedy next tokens of a batch, every operator's time added to ``laps``."""
        torch, spec = self.torch, self.spec
        embedding, linear, silu = torch.nn.functional.embedding, torch.nn.functional.linear, torch.nn.functional.silu
        hq, hkv, hd, f = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.ffn_size
        n, half = b.input_ids.numel(), spec.head_dim // 2
        laps.mark("idle")
        cos, sin = self.cos[b.positions], self.sin[b.positions]
        x = embedding(b.input_ids, self.emb)
        laps.mark("emb")
        for k_cache, v_cache, (attn_norm, w_qkv, w_o, mlp_norm, w_gate_up, w_down) in zip(
                self.k_cache, self.v_cache, self.layers):
            h = self.rms_norm(x, attn_norm)
            laps.mark("input_layernorm")
            qkv = linear(h, w_qkv).view(n, hq + 2 * hkv, hd)
            laps.mark("attn_pre_proj")
            x1, x2 = qkv[:, :hq + hkv, :half], qkv[:, :hq + hkv, half:]
            qk = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
            q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv:]
            laps.mark("attn_rope")
            attn = self.attention(b, q, k, v, k_cache, v_cache, laps)
            o = linear(attn.view(n, -1), w_o)
            laps.mark("attn_post_proj")
            x = x + o
            laps.mark("add")
            h = self.rms_norm(x, mlp_norm)
            laps.mark("post_attention_layernorm")
            gate_up = linear(h, w_gate_up)
            laps.mark("mlp_up_proj")
            act = silu(gate_up[:, :f]) * gate_up[:, f:]
            laps.mark("mlp_act")
            down = linear(act, w_down)
            laps.mark("mlp_down_proj")
            x = x + down
            laps.mark("add")
        next_tokens = linear(self.rms_norm(x[b.last_rows], self.norm), self.lm_head).argmax(-1).tolist()
        laps.mark("lm_head")
        return next_tokens


def _clock(device: str) -> Callable[[], float]:
    """Wall-clock seconds; on a GPU, after the queued kernels have finished."""
    if device.startswith("cuda"):
        import torch

        def synced() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()
        return synced
    return time.perf_counter


def _time_passes(net: _Net, batches: list[_Batch], repeats: int, warmup: int, clock: Callable[[], float],
                 progress: Callable[[int, int], None] | None = None) -> list[dict[str, list[float]]]:
    """Seconds per operator of each batch in each of ``repeats`` rounds over all the batches.

    Per layer (mean over the layers of a pass), except ``emb``/``lm_head`` and
    ``total`` (per pass). Round-robin, not one batch at a time: each batch's
    samples are spread over the whole measurement, so a burst of load from
    other processes inflates one sample of many batches, not all samples of one.
    ``progress(done, total)`` is called after every pass (outside the timed laps).
    """
    samples: list[dict[str, list[float]]] = [defaultdict(list) for _ in batches]
    total = (warmup + repeats) * len(batches)
    for rep in range(warmup + repeats):
        for k, (batch, out) in enumerate(zip(batches, samples)):
            laps = _Laps(clock)
            net.forward(batch, laps)
            if progress is not None:
                progress(rep * len(batches) + k + 1, total)
            if rep < warmup:
                continue
            laps.totals.pop("idle", None)
            for op, seconds in laps.totals.items():
                out[op].append(seconds if op in PER_FORWARD_OPS else seconds / net.spec.num_layers)
            out["total"].append(sum(laps.totals.values()))
    return samples


def _stats_ms(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in samples_s]
    return {"min": min(ms), "max": max(ms), "mean": statistics.fmean(ms), "median": statistics.median(ms),
            "std": statistics.pstdev(ms)}


def _stat_columns(ops: tuple[str, ...]) -> list[str]:
    return [f"time_stats.{op}.{s}" for op in ops for s in STATS]


def _stat_cells(ops: tuple[str, ...], samples: dict[str, list[float]]) -> list[Any]:
    """Each op's statistics (ms); ``min`` and ``median`` are its time in the fastest and the median *pass*.

    A fit adds operators up, and a sum of per-operator minima is faster than any
    pass that ran (each operator at its luckiest moment, never all at once); the
    operators of one pass add up to that pass. ``mean`` adds up either way; ``max``
    and ``std`` are per operator.
    """
    order = np.argsort(samples["total"], kind="stable")
    fastest, middle = int(order[0]), int(order[(len(order) - 1) // 2])
    cells = []
    for op in ops:
        stats = _stats_ms(samples[op]) if op in samples else {}
        if stats:
            stats["min"], stats["median"] = samples[op][fastest] * 1e3, samples[op][middle] * 1e3
        cells += [stats.get(s, "") for s in STATS]
    return cells


def _check_device(device: str) -> None:
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")


def _dtype_name(spec: ModelSpec, dtype: str | None) -> str:
    """The weights' dtype: ``dtype`` if given, else the spec's (4 bytes float32, 2 bytes float16)."""
    if dtype is None:
        return {4: "float32", 2: "float16"}[spec.dtype_bytes]
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def _blocks(tokens: int, cached: int) -> int:
    return -(-(tokens + cached) // BLOCK_SIZE)


def profile_model(model: "str | ModelSpec" = "llama-tiny", device: str = "cpu", out_dir: str | Path = "profiles",
                  grid: ProfileGrid | None = None, seed: int = 0, threads: int | None = 1,
                  progress: Callable[[int, int], None] | None = None, dtype: str | None = None) -> Path:
    """Measure every operator on ``grid`` and write mlp.csv and attention.csv; returns the profile directory.

    ``progress(done, total)`` is called after each timed forward pass (the CLI draws a bar).
    ``dtype``: the weights' and KV cache's dtype (one of ``DTYPES``; default the spec's).
    """
    import torch
    _check_device(device)
    spec, grid = get_model_spec(model), grid or ProfileGrid()
    _dtype_name(spec, dtype)                      # a bad dtype fails before any folder is made
    folder = Path(out_dir) / device.split(":")[0] / spec.name
    try:
        folder.mkdir(parents=True, exist_ok=True)     # before measuring: an unwritable out fails now
    except OSError as exc:
        raise ValueError(f"profile out {str(out_dir)!r}: cannot create {str(folder)!r}: {exc.strerror or exc}") \
            from None
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    # (batch size, new tokens per request, cached tokens per request, is prefill) of every attention row
    configs = ([(b, 1, kv, False) for kv in grid.decode_kv for b in grid.decode_batch]
               + [(1, c, kv, True) for c in grid.prefill_chunk for kv in grid.prefill_kv])
    num_blocks = max([_blocks(n, 0) for n in grid.num_tokens] + [b * _blocks(q, kv) for b, q, kv, _ in configs])
    max_len = max(max(grid.num_tokens), max(grid.decode_kv) + 1, max(grid.prefill_kv) + max(grid.prefill_chunk))
    net = _Net(spec, device, seed, num_blocks, max_len, dtype)
    # non-attention rows: one prefill chunk of n tokens, the LM head on n rows
    batches = [net.batch(np.array([n]), np.array([0]), np.array([False]), logits_rows=n) for n in grid.num_tokens]
    batches += [net.batch(np.full(b, q), np.full(b, kv), np.full(b, not prefill)) for b, q, kv, prefill in configs]
    with torch.inference_mode():
        samples = _time_passes(net, batches, grid.repeats, grid.warmup, _clock(device), progress)
    num_mlp = len(grid.num_tokens)
    _write_mlp(folder / "mlp.csv", spec, grid.num_tokens, samples[:num_mlp])
    _write_attention(folder / "attention.csv", spec, configs, samples[num_mlp:], max_len, device)
    log.info("wrote profile %s", folder)
    return folder


def _write_mlp(path: Path, spec: ModelSpec, num_tokens: tuple[int, ...], samples: list[dict[str, list[float]]]
               ) -> None:
    shape = [spec.num_heads, spec.num_kv_heads, spec.hidden_size, spec.ffn_size, spec.vocab_size, spec.gated_mlp]
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(_stat_columns(MLP_OPS) + ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                                               "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"])
        for n, measured in zip(num_tokens, samples):
            out.writerow(_stat_cells(MLP_OPS, measured) + shape + [n, 1])


def _write_attention(path: Path, spec: ModelSpec, configs: list[tuple[int, int, int, bool]],
                     samples: list[dict[str, list[float]]], max_len: int, device: str) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(_stat_columns(ATTENTION_OPS) + [
            "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers", "max_model_len",
            "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", "attention_backend"])
        for (batch_size, queries, cached, is_prefill), measured in zip(configs, samples):
            out.writerow(_stat_cells(ATTENTION_OPS, measured) + [
                spec.hidden_size, spec.num_heads, spec.num_kv_heads, BLOCK_SIZE, 1, max_len, batch_size,
                queries if is_prefill else 0, cached, is_prefill, f"torch.sdpa.paged.{device.split(':')[0]}"])


def measure_batch_s(batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]], model: "str | ModelSpec" = "llama-tiny",
                    device: str = "cpu", repeats: int = 3, seed: int = 0, threads: int | None = 1,
                    stat: str = "median", dtype: str | None = None) -> np.ndarray:
    """Seconds (``stat`` over ``repeats`` passes) of a whole forward pass of each (tokens, kv_before, is_decode) batch.

    The pass is the profiler's: every layer's own weights, one batched
    decode-attention call over the decode requests (padded to the longest KV,
    masked), one prefill-attention call per prefill request, the LM head on one
    row per request — the structure the executor runs and the linear model assumes.
    """
    import torch
    _check_device(device)
    if stat not in STATS:
        raise ValueError(f"stat must be one of {', '.join(STATS)}, got {stat!r}")
    spec = get_model_spec(model)
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    num_blocks = max(int(sum(_blocks(int(c), int(m)) for c, m in zip(t, kv))) for t, kv, _ in batches)
    max_len = max(int(np.max(kv + t)) for t, kv, _ in batches)
    net, clock = _Net(spec, device, seed, num_blocks, max_len, dtype), _clock(device)
    with torch.inference_mode():
        samples = _time_passes(net, [net.batch(*b) for b in batches], repeats, 1, clock)
    return np.array([_stats_ms(s["total"])[stat] * 1e-3 for s in samples])
