"""A small Llama-architecture model that runs on the paged KV cache (random weights).

Llama blocks: RMSNorm -> attention with rotary position embeddings (RoPE, rotate-half
form) and grouped-query heads -> residual -> RMSNorm -> SwiGLU MLP -> residual.
Weights are drawn from ``config.seed`` (no download), scaled 1/sqrt(fan_in) so
activations and logits stay O(1) and greedy choices are not near-ties.

Two forward paths that share only the weights:

- :meth:`LlamaModel.forward` - the serving path. A batch holds, per sequence, its
  new tokens (a prefill chunk, a refill after eviction, or one decode token) and
  ``m``, the tokens already cached; it writes the new KV into a
  :class:`~infermax.kernels.paged.PagedKVCache` and attends through
  ``prefill_attention`` (or ``decode_attention`` when every sequence brings one
  token). It returns the logits of each sequence's last new token.
- :meth:`LlamaModel.forward_dense` - the reference: the whole sequence at once,
  no cache, plain causal softmax. :meth:`generate_greedy` decodes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .decode_attention import decode_attention
from .paged import PagedKVCache, token_positions, write_kv
from .prefill_attention import prefill_attention
from .reference import attention_with_lse, causal_mask


@dataclass(frozen=True, kw_only=True, slots=True)
class LlamaConfig:
    num_layers: int = 2
    hidden_size: int = 256
    num_q_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    vocab_size: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_q_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of num_q_heads={self.num_q_heads}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads={self.num_q_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if (self.hidden_size // self.num_q_heads) % 2:
            raise ValueError(f"head_dim={self.hidden_size // self.num_q_heads} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_q_heads


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] by its absolute positions (int [num_tokens])."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [N, half]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)   # float32 math, x's dtype out


class LlamaLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.wq = nn.Linear(d, cfg.num_q_heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.num_q_heads * hd, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.w_gate = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.w_up = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.w_down = nn.Linear(cfg.intermediate_size, d, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """q [N, Hq, hd], k and v [N, Hkv, hd] of tokens at absolute positions (RoPE on q, k)."""
        h = self.attn_norm(x)
        cfg, n = self.cfg, x.shape[0]
        q = self.wq(h).view(n, cfg.num_q_heads, cfg.head_dim)
        k = self.wk(h).view(n, cfg.num_kv_heads, cfg.head_dim)
        v = self.wv(h).view(n, cfg.num_kv_heads, cfg.head_dim)
        return apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection + residual, then the SwiGLU MLP + residual."""
        x = x + self.wo(attn.reshape(x.shape[0], -1))
        h = self.mlp_norm(x)
        return x + self.w_down(nn.functional.silu(self.w_gate(h)) * self.w_up(h))


class LlamaModel(nn.Module):
    """``device``: where the weights are allocated and drawn (by that device's generator, seeded with
    ``cfg.seed``: a CUDA model's weights are a different draw than a CPU model's, and an 8B model is
    built in seconds instead of minutes of CPU sampling); ``dtype``: the weights' dtype (default float32)."""

    def __init__(self, cfg: LlamaConfig | None = None, *, device: "str | torch.device | None" = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or LlamaConfig()
        device = torch.device(device or "cpu")
        with torch.device(device):
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(LlamaLayer(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        gen = torch.Generator(device=device).manual_seed(cfg.seed)
        with torch.no_grad():
            for param in self.parameters():
                if param.dim() == 2:
                    fan_in = 1 if param is self.embed.weight else param.shape[1]
                    param.copy_(torch.randn(param.shape, generator=gen, device=device) / fan_in ** 0.5)
        if dtype is not None:
            self.to(dtype)
        self.requires_grad_(False)

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """An empty paged cache shaped for this model, on its device and dtype."""
        w = self.embed.weight
        return PagedKVCache(num_layers=self.cfg.num_layers, num_blocks=num_blocks, block_size=block_size,
                            num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim, dtype=w.dtype,
                            device=w.device)

    def forward(self, input_ids, cu_seqlens, context_lens, block_table, kv_cache: PagedKVCache, backend="auto"):
        """One serving step.

        Args:
            input_ids: int64 [num_tokens], the new tokens of every sequence, packed.
            cu_seqlens: int32 [num_seqs + 1]; sequence i's tokens are rows cu[i]:cu[i+1] (>= 1 each).
            context_lens: int32 [num_seqs], m_i tokens already cached; new token t sits at m_i + t.
            block_table: int32 [num_seqs, max_blocks] with room for m_i + c_i tokens.
            kv_cache: written in place at the new tokens' slots.
            backend: attention backend, "auto" | "triton" | "torch".
        Returns:
            float32 [num_seqs, vocab_size], logits of each sequence's last new token.
        """
        query_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).cpu()
        _, positions = token_positions(cu_seqlens, context_lens)
        is_decode = bool((query_lens == 1).all())
        x = self.embed(input_ids)
        for layer_idx, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x, positions)
            k_cache, v_cache = kv_cache.k[layer_idx], kv_cache.v[layer_idx]
            write_kv(k_cache, v_cache, block_table, cu_seqlens, context_lens, k, v)
            if is_decode:
                attn = decode_attention(q, k_cache, v_cache, block_table, context_lens + 1, backend=backend)
            else:
                attn = prefill_attention(q, k_cache, v_cache, block_table, cu_seqlens, context_lens,
                                         backend=backend, max_query_len=int(query_lens.max()))
            x = layer.finish(x, attn)
        return self.lm_head(self.norm(x[cu_seqlens[1:].long() - 1]))

    def step(self, kv_cache: PagedKVCache, batch: list[tuple[object, list[int], int]], backend="auto"):
        """Convenience around :meth:`forward`: ``batch`` lists (seq_id, new token ids, m).

        Reserves the blocks each sequence needs in ``kv_cache``, packs the batch and
        returns the logits [len(batch), vocab_size] of each last new token.
        """
        for seq_id, ids, m in batch:
            kv_cache.reserve(seq_id, m + len(ids))
        device = self.embed.weight.device
        lens = torch.tensor([len(ids) for _, ids, _ in batch])
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32).to(device)
        context_lens = torch.tensor([m for _, _, m in batch], dtype=torch.int32, device=device)
        input_ids = torch.tensor([t for _, ids, _ in batch for t in ids], dtype=torch.long, device=device)
        block_table = kv_cache.block_table([seq_id for seq_id, _, _ in batch])
        return self.forward(input_ids, cu_seqlens, context_lens, block_table, kv_cache, backend)

    def forward_dense(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Reference: logits float32 [T, vocab_size] of a whole sequence (int64 [T]), no cache."""
        positions = torch.arange(len(token_ids), device=token_ids.device)
        x = self.embed(token_ids)
        mask = causal_mask(len(token_ids), len(token_ids), 0, token_ids.device)
        for layer in self.layers:
            q, k, v = layer.qkv(x, positions)
            attn, _ = attention_with_lse(q, k, v, mask)     # float32
            x = layer.finish(x, attn.to(x.dtype))
        return self.lm_head(self.norm(x))

    def generate_greedy(self, prompt_ids: list[int], num_new_tokens: int) -> list[int]:
        """Reference greedy decoding: recompute the whole sequence densely for every new token."""
        tokens = list(prompt_ids)
        device = self.embed.weight.device
        for _ in range(num_new_tokens):
            logits = self.forward_dense(torch.tensor(tokens, dtype=torch.long, device=device))
            tokens.append(int(logits[-1].argmax()))
        return tokens[len(prompt_ids):]
