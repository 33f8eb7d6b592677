"""Merging partial attention states with their log-sum-exp (online softmax).

Attention over a key set split into disjoint parts A and B can be computed part by
part and combined afterwards: with ``lse = ln(sum_j exp(s_j))`` (natural log) over
each part,

    lse   = ln(exp(lse_a) + exp(lse_b))
    o     = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

This is the combine step of flash-decoding (split-KV), of Medha's KV-cache
parallelism (Medha §3.4: partial outputs of KV shards merged by online
softmax) and of CSA's per-level outputs (CSPS eq. 5: weights z_i / sum_j z_j
with z_i = exp(lse_i)). FlashInfer's ``merge_state`` / ``merge_states`` are the
model; unlike FlashInfer's kernels (base 2) the lse here is **natural log**, as
``torch.logsumexp`` gives.

An empty part has ``lse = -inf`` and contributes nothing; merging only empty parts
gives ``o = 0`` and ``lse = -inf``.
"""

from __future__ import annotations

import torch

from ._triton import next_power_of_2, tl, triton, use_triton

# ---------------------------------------------------------------- reference


def merge_states_reference(o_a, lse_a, o_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-way merge in float32; shapes as in :func:`merge_states`."""
    return merge_states_multi_reference(torch.stack([o_a, o_b], dim=1), torch.stack([lse_a, lse_b], dim=1))


def merge_states_multi_reference(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-way merge in float32; shapes as in :func:`merge_states_multi`."""
    lse = lse.float()
    lse_max = lse.amax(dim=1, keepdim=True)  # [T, 1, H]
    lse_max = torch.where(torch.isinf(lse_max), torch.zeros_like(lse_max), lse_max)
    weights = torch.exp(lse - lse_max)  # [T, S, H]; 0 for empty states
    total = weights.sum(dim=1)  # [T, H]
    merged_o = (weights[..., None] * o.float()).sum(dim=1) / total.clamp_min(1e-38)[..., None]
    merged_lse = lse_max.squeeze(1) + torch.log(total)  # log(0) = -inf when all empty
    return merged_o.to(o.dtype), merged_lse


# ---------------------------------------------------------------- kernels


@triton.jit
def _merge_states_multi_kernel(
    o_ptr, lse_ptr, out_o_ptr, out_lse_ptr,
    num_states, num_heads, head_dim,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (token, head): weights exp(lse_s - max) over the states."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_states
    d_mask = offs_d < head_dim
    # lse [T, S, H] and o [T, S, H, D], both contiguous
    lse_rows = (token * num_states + offs_s) * num_heads + head
    lse = tl.load(lse_ptr + lse_rows, mask=s_mask, other=float("-inf")).to(tl.float32)
    o = tl.load(
        o_ptr + lse_rows[:, None] * head_dim + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :], other=0.0,
    ).to(tl.float32)
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp(lse - lse_max)
    total = tl.sum(weights, axis=0)
    merged = tl.sum(weights[:, None] * o, axis=0) / tl.maximum(total, 1e-38)
    out_row = token * num_heads + head
    tl.store(out_o_ptr + out_row * head_dim + offs_d, merged.to(out_o_ptr.dtype.element_ty), mask=d_mask)
    tl.store(out_lse_ptr + out_row, tl.where(total > 0, lse_max + tl.log(tl.maximum(total, 1e-38)), float("-inf")))


@triton.jit
def _merge_states_kernel(
    o_a_ptr, lse_a_ptr, o_b_ptr, lse_b_ptr, out_o_ptr, out_lse_ptr,
    num_heads, head_dim,
    BLOCK_D: tl.constexpr,
):
    """One program per (token, head): the two-state special case, no stacking."""
    row = tl.program_id(0) * num_heads + tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    lse_a = tl.load(lse_a_ptr + row).to(tl.float32)
    lse_b = tl.load(lse_b_ptr + row).to(tl.float32)
    o_a = tl.load(o_a_ptr + row * head_dim + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    o_b = tl.load(o_b_ptr + row * head_dim + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    lse_max = tl.maximum(lse_a, lse_b)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w_a = tl.exp(lse_a - lse_max)
    w_b = tl.exp(lse_b - lse_max)
    total = w_a + w_b
    merged = (w_a * o_a + w_b * o_b) / tl.maximum(total, 1e-38)
    tl.store(out_o_ptr + row * head_dim + offs_d, merged.to(out_o_ptr.dtype.element_ty), mask=d_mask)
    tl.store(out_lse_ptr + row, tl.where(total > 0, lse_max + tl.log(tl.maximum(total, 1e-38)), float("-inf")))


# ---------------------------------------------------------------- wrappers


def merge_states(o_a, lse_a, o_b, lse_b, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Combine the attention of the same queries over two disjoint key sets.

    Args:
        o_a, o_b: [num_tokens, num_heads, head_dim], float32/float16/bfloat16.
        lse_a, lse_b: float32 [num_tokens, num_heads], natural-log log-sum-exp of
            each part's scores (-inf = empty part).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1), "triton", "torch".

    Returns:
        o: [num_tokens, num_heads, head_dim] in o_a's dtype; lse: float32
        [num_tokens, num_heads], natural log, over the union of both key sets.
    """
    if o_a.shape != o_b.shape or lse_a.shape != lse_b.shape or lse_a.shape != o_a.shape[:2]:
        raise ValueError(f"shape mismatch: o {tuple(o_a.shape)}/{tuple(o_b.shape)}, "
                         f"lse {tuple(lse_a.shape)}/{tuple(lse_b.shape)}")
    if not use_triton(backend, o_a, lse_a, o_b, lse_b):
        return merge_states_reference(o_a, lse_a, o_b, lse_b)
    num_tokens, num_heads, head_dim = o_a.shape
    out_o = torch.empty(o_a.shape, dtype=o_a.dtype, device=o_a.device)
    out_lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=o_a.device)
    if num_tokens:
        _merge_states_kernel[(num_tokens, num_heads)](
            o_a.contiguous(), lse_a.float().contiguous(), o_b.contiguous(), lse_b.float().contiguous(),
            out_o, out_lse, num_heads, head_dim, BLOCK_D=next_power_of_2(head_dim),
        )
    return out_o, out_lse


def merge_states_multi(o: torch.Tensor, lse: torch.Tensor, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Combine any number of partial states of the same queries (disjoint key sets).

    Args:
        o: [num_tokens, num_states, num_heads, head_dim], float32/float16/bfloat16.
        lse: float32 [num_tokens, num_states, num_heads], natural log, -inf = empty.
        backend: as in :func:`merge_states`.

    Returns:
        o: [num_tokens, num_heads, head_dim] in o's dtype; lse: float32
        [num_tokens, num_heads], natural log.
    """
    if lse.shape != o.shape[:3]:
        raise ValueError(f"lse shape {tuple(lse.shape)} does not match o shape {tuple(o.shape)}")
    if not use_triton(backend, o, lse):
        return merge_states_multi_reference(o, lse)
    num_tokens, num_states, num_heads, head_dim = o.shape
    out_o = torch.empty(num_tokens, num_heads, head_dim, dtype=o.dtype, device=o.device)
    out_lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=o.device)
    if num_tokens:
        _merge_states_multi_kernel[(num_tokens, num_heads)](
            o.contiguous(), lse.float().contiguous(), out_o, out_lse, num_states, num_heads, head_dim,
            BLOCK_S=next_power_of_2(num_states), BLOCK_D=next_power_of_2(head_dim),
        )
    return out_o, out_lse
