"""Dense softmax attention with its log-sum-exp: the ground truth of every kernel.

Conventions shared by every module of ``infermax.kernels``:

- Token-major layouts: ``q`` is [num_q_tokens, num_q_heads, head_dim] and ``k``/``v``
  are [num_kv_tokens, num_kv_heads, head_dim].
- Grouped-query attention (GQA): ``num_q_heads = group_size * num_kv_heads`` and
  query head ``h`` reads kv head ``h // group_size``.
- Scores ``s_ij = scale * <q_i, k_j>`` with ``scale = 1/sqrt(head_dim)`` by default.
- **lse is the natural logarithm**: ``lse_i = ln(sum_j exp(s_ij))``, float32. A row
  that sees no key has ``lse = -inf`` and output 0; merging treats it as empty.
- References compute in float32 whatever the input dtype.
"""

from __future__ import annotations

import math

import torch


def default_scale(head_dim: int) -> float:
    """Softmax temperature 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


def causal_mask(num_q: int, num_k: int, offset: int, device=None) -> torch.Tensor:
    """Bool [num_q, num_k]: query t (absolute position offset + t) sees keys 0..offset+t."""
    q_pos = offset + torch.arange(num_q, device=device)[:, None]
    return torch.arange(num_k, device=device)[None, :] <= q_pos


def attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of every query over the keys the mask allows.

    Args:
        q: [num_q, num_q_heads, head_dim], any float dtype.
        k, v: [num_k, num_kv_heads, head_dim]; num_q_heads % num_kv_heads == 0.
        mask: bool, [num_q, num_k] or per head [num_q_heads, num_q, num_k];
            True = the query sees the key. None = every key is seen.
        scale: score multiplier, default 1/sqrt(head_dim).

    Returns:
        o: float32 [num_q, num_q_heads, head_dim] (0 for rows that see no key).
        lse: float32 [num_q, num_q_heads], natural log of the softmax denominator
            (-inf for rows that see no key).
    """
    num_q_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    scale = default_scale(q.shape[-1]) if scale is None else scale
    group = num_q_heads // num_kv_heads
    k32 = k.float().repeat_interleave(group, dim=1)
    v32 = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k32) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask.to(torch.bool), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [heads, num_q]
    finite_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - finite_lse[..., None])  # empty rows: exp(-inf) = 0
    o = torch.einsum("hqk,khd->qhd", probs, v32).contiguous()
    return o, lse.transpose(0, 1).contiguous()
