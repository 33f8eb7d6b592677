"""One batch through the model: pack the inputs, run the forward pass, pick the next tokens.

A batch is a list of :class:`Chunk` (a request's new token ids, its cached KV
``m`` and whether it is in decode phase). :func:`pack` reserves the KV blocks
and builds every index the forward pass needs (the step vLLM calls "prepare
inputs"; it is not part of the timed forward). :func:`run` does the forward and
greedy sampling and returns one next-token id per chunk.

Attention backends:

- ``"sdpa"`` (the CPU default): the model's weights fused as an engine runs
  them (:class:`FusedLlama`); decode-phase requests attend in one batched
  ``scaled_dot_product_attention`` call over their KV gathered from the paged
  cache (padded to the longest, masked); each prefill-phase request attends in
  its own call. This is the structure the linear cost model assumes and the CPU
  profiler times (one decode call + one call per prefill).
- ``"triton"`` (the CUDA default) and ``"torch"``: the paged serving path
  :meth:`LlamaModel.forward` with the paged attention kernels of
  :mod:`infermax.kernels` (Triton kernels; on CPU they run under
  ``TRITON_INTERPRET=1``) or their PyTorch references.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infermax.costmodel.packed import Packed  # the layout the profiler times, owned by the lower layer

BACKENDS = ("auto", "sdpa", "triton", "torch")


@dataclass(frozen=True, slots=True)
class Chunk:
    """Request ``request_id`` processes ``token_ids`` at positions ``m .. m + len - 1``."""

    request_id: int
    token_ids: tuple[int, ...]
    m: int
    is_decode: bool


def resolve_backend(backend: str, device: str) -> str:
    """``auto`` is ``triton`` on CUDA and ``sdpa`` on CPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.startswith("cuda") else "sdpa"
    return backend


# complexity: one pass per index tensor of the batch, built inline as comprehensions over its chunks
def pack(chunks: list[Chunk], cache: Any, device: Any) -> Packed:
    """Reserve each chunk's KV blocks in ``cache`` and build the batch's index tensors."""
    import torch

    bs = cache.block_size
    for ch in chunks:
        cache.reserve(ch.request_id, ch.m + len(ch.token_ids))
    table = cache.block_table([ch.request_id for ch in chunks]).to("cpu").long()
    lens = [len(ch.token_ids) for ch in chunks]
    rows = torch.tensor([0] + lens).cumsum(0)
    positions = torch.cat([torch.arange(ch.m, ch.m + n) for ch, n in zip(chunks, lens)])
    write = torch.cat([table[i, positions[rows[i]:rows[i + 1]] // bs] * bs + positions[rows[i]:rows[i + 1]] % bs
                       for i in range(len(chunks))])
    dec = [i for i, ch in enumerate(chunks) if ch.is_decode]
    num_dec_blocks = max((-(-(chunks[i].m + 1) // bs) for i in dec), default=0)
    dec_blocks = table[dec, :num_dec_blocks] if dec else torch.zeros(0, 0, dtype=torch.long)
    dec_lens = torch.tensor([chunks[i].m + 1 for i in dec], dtype=torch.long)
    dec_mask = (torch.arange(num_dec_blocks * bs)[None, :] < dec_lens[:, None])[:, None, None, :]
    prefills = []
    for i, ch in enumerate(chunks):
        if not ch.is_decode:
            total = ch.m + lens[i]
            nb = -(-total // bs)
            mask = torch.arange(nb * bs)[None, :] <= (ch.m + torch.arange(lens[i]))[:, None]
            prefills.append((int(rows[i]), int(rows[i + 1]), table[i, :nb].to(device), mask.to(device)))
    to = lambda t: t.to(device)
    return Packed(input_ids=to(torch.tensor([t for ch in chunks for t in ch.token_ids], dtype=torch.long)),
                  positions=to(positions), write_slots=to(write), last_rows=to(rows[1:] - 1),
                  decode_rows=to(rows[:-1][dec]), decode_blocks=to(dec_blocks.reshape(-1)),
                  decode_mask=to(dec_mask), prefills=tuple(prefills), cu_seqlens=to(rows.to(torch.int32)),
                  context_lens=to(torch.tensor([ch.m for ch in chunks], dtype=torch.int32)),
                  block_table=to(table.to(torch.int32)))


class FusedLlama:
    """A LlamaModel's weights laid out as a serving engine runs them (the ``sdpa`` path).

    One QKV matmul and one gate-up matmul per layer (vLLM's QKVParallelLinear and
    MergedColumnParallelLinear; the operators Vidur and the CPU profiler time:
    ``attn_pre_proj``, ``mlp_up_proj``), and RoPE cos/sin tabulated once for every
    position up to ``max_positions`` with the model's own formula. Same
    arithmetic as :meth:`LlamaModel.forward`, fewer operator launches.
    """

    def __init__(self, model: Any, max_positions: int) -> None:
        import torch

        cfg = self.cfg = model.cfg
        self.embed, self.norm, self.lm_head = model.embed, model.norm, model.lm_head
        self.layers = [(layer.attn_norm.weight, torch.cat([layer.wq.weight, layer.wk.weight, layer.wv.weight]),
                        layer.wo.weight, layer.mlp_norm.weight,
                        torch.cat([layer.w_gate.weight, layer.w_up.weight]), layer.w_down.weight)
                       for layer in model.layers]
        half = cfg.head_dim // 2
        device = model.embed.weight.device
        inv_freq = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float32, device=device) / half)
        angles = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
        self.cos, self.sin = angles.cos()[:, None, :], angles.sin()[:, None, :]     # [P, 1, half]

    def rms_norm(self, x: Any, weight: Any) -> Any:
        import torch

        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps) * weight

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        """Rotate-half RoPE of x [N, heads, head_dim] (as ``kernels.llama.apply_rope``)."""
        import torch

        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)   # float32 math


def run(model: Any, cache: Any, batch: Packed, backend: str, fused: "FusedLlama | None" = None) -> Any:
    """Forward pass + greedy choice: int64 [num_chunks] next-token ids (on the model's device).

    ``sdpa`` runs ``fused`` (built from ``model`` if not given); the other
    backends run ``model.forward`` on the paged kernels.
    """
    if backend == "sdpa":
        logits = _sdpa_forward(fused or FusedLlama(model, int(batch.positions.max()) + 1), cache, batch)
    else:
        logits = model.forward(batch.input_ids, batch.cu_seqlens, batch.context_lens, batch.block_table, cache,
                               backend=backend)
    return logits.argmax(-1)


def _sdpa_forward(net: FusedLlama, cache: Any, batch: Packed) -> Any:
    """Logits [num_chunks, vocab] with one batched decode-attention call and one call per prefill."""
    import torch
    from torch.nn.functional import linear, silu
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    cfg = net.cfg
    hq, hkv, hd, ffn = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    gqa = hq != hkv
    num_tokens, num_dec = batch.input_ids.numel(), batch.decode_rows.numel()
    cos, sin = net.cos[batch.positions], net.sin[batch.positions]
    x = net.embed(batch.input_ids)
    for layer_idx, (attn_norm, w_qkv, w_o, mlp_norm, w_gate_up, w_down) in enumerate(net.layers):
        qkv = linear(net.rms_norm(x, attn_norm), w_qkv).view(num_tokens, hq + 2 * hkv, hd)
        qk = net.rope(qkv[:, :hq + hkv], cos, sin)                     # q and k heads rotated at once
        q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv:]
        k_cache, v_cache = cache.k[layer_idx], cache.v[layer_idx]       # [blocks, block_size, Hkv, D]
        k_cache.view(-1, hkv, hd)[batch.write_slots] = k.to(k_cache.dtype)
        v_cache.view(-1, hkv, hd)[batch.write_slots] = v.to(v_cache.dtype)
        attn = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if num_dec:
            k_dec = k_cache.index_select(0, batch.decode_blocks).view(num_dec, -1, hkv, hd).transpose(1, 2)
            v_dec = v_cache.index_select(0, batch.decode_blocks).view(num_dec, -1, hkv, hd).transpose(1, 2)
            q_dec = q[batch.decode_rows].unsqueeze(2)                  # [B, Hq, 1, D]
            attn[batch.decode_rows] = sdpa(q_dec, k_dec, v_dec, attn_mask=batch.decode_mask,
                                           enable_gqa=gqa).squeeze(2)
        for start, end, blocks, mask in batch.prefills:
            q_pf = q[start:end].transpose(0, 1).unsqueeze(0)          # [1, Hq, c, D]
            k_pf = k_cache.index_select(0, blocks).view(-1, hkv, hd).transpose(0, 1).unsqueeze(0)
            v_pf = v_cache.index_select(0, blocks).view(-1, hkv, hd).transpose(0, 1).unsqueeze(0)
            attn[start:end] = sdpa(q_pf, k_pf, v_pf, attn_mask=mask, enable_gqa=gqa)[0].transpose(0, 1)
        x = x + linear(attn.view(num_tokens, -1), w_o)
        gate_up = linear(net.rms_norm(x, mlp_norm), w_gate_up)
        x = x + linear(silu(gate_up[:, :ffn]) * gate_up[:, ffn:], w_down)
    return net.lm_head(net.norm(x[batch.last_rows]))
