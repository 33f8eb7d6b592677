"""Decode attention over a paged KV cache with split-KV (flash-decoding).

One query token per sequence, the last of its ``seq_len`` cached tokens (its own
key/value already written), so it sees every cached key. To keep a GPU busy when
the batch is small and sequences are long, the keys of each sequence are cut into
``num_splits`` contiguous ranges; each (sequence, kv head, split) program returns a
partial output with its log-sum-exp, and :func:`merge.merge_states_multi` combines
them (the same merge that KV-cache parallelism uses across GPUs, Medha §3.4).

Shapes and dtypes (layouts of :mod:`infermax.kernels.paged`):
    q            [num_seqs, num_q_heads, head_dim]  float32/float16/bfloat16
    k/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]
    block_table  int32 [num_seqs, max_blocks]
    seq_lens     int32 [num_seqs], >= 1, cached tokens including the new one
    partial o    float32 [num_seqs, num_splits, num_q_heads, head_dim]
    partial lse  float32 [num_seqs, num_splits, num_q_heads] (natural log; -inf = empty split)
    -> o         [num_seqs, num_q_heads, head_dim] in q's dtype
    -> lse       float32 [num_seqs, num_q_heads], natural log
Split s of a sequence of length n covers keys [s*w, min((s+1)*w, n)), w = ceil(n / num_splits).
"""

from __future__ import annotations

import torch

from ._triton import next_power_of_2, tile_dtype, tl, triton, use_triton
from .merge import merge_states_multi, merge_states_multi_reference
from .paged import gather_kv
from .prefill_attention import LOG2_E, _attend_paged_keys, _finish_softmax
from .reference import attention_with_lse, default_scale

# ---------------------------------------------------------------- reference


def split_bounds(seq_len: int, num_splits: int) -> list[tuple[int, int]]:
    """Key range [lo, hi) of every split; trailing splits may be empty."""
    width = -(-seq_len // num_splits)
    return [(min(s * width, seq_len), min((s + 1) * width, seq_len)) for s in range(num_splits)]


def decode_attention_reference(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    """Dense attention of each sequence's query over all its cached keys. Returns (o, lse)."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for i in range(q.shape[0]):
        k, v = gather_kv(k_cache, v_cache, block_table[i], int(seq_lens[i]))
        o_i, lse_i = attention_with_lse(q[i : i + 1], k, v, None, scale)
        o[i], lse[i] = o_i[0].to(q.dtype), lse_i[0]
    return o, lse


def decode_partials_reference(q, k_cache, v_cache, block_table, seq_lens, num_splits, scale=None):
    """Per-split partial states with the kernel's split bounds: (o [S, splits, H, D], lse [S, splits, H])."""
    num_seqs, num_q_heads, head_dim = q.shape
    o = torch.zeros(num_seqs, num_splits, num_q_heads, head_dim, device=q.device)
    lse = torch.full((num_seqs, num_splits, num_q_heads), float("-inf"), device=q.device)
    for i in range(num_seqs):
        k, v = gather_kv(k_cache, v_cache, block_table[i], int(seq_lens[i]))
        for s, (lo, hi) in enumerate(split_bounds(int(seq_lens[i]), num_splits)):
            if hi > lo:
                o_s, lse_s = attention_with_lse(q[i : i + 1], k[lo:hi], v[lo:hi], None, scale)
                o[i, s], lse[i, s] = o_s[0], lse_s[0]
    return o, lse


def decode_attention_split_reference(q, k_cache, v_cache, block_table, seq_lens, num_splits, scale=None):
    """Flash-decoding in plain PyTorch: partial states per split, then the multi-way merge."""
    partials = decode_partials_reference(q, k_cache, v_cache, block_table, seq_lens, num_splits, scale)
    o, lse = merge_states_multi_reference(*partials)
    return o.to(q.dtype), lse


# ---------------------------------------------------------------- kernel
# (the inner loop is prefill_attention._attend_paged_keys, with the query rows
#  being the group_size query heads that share one kv head)


@triton.jit
def _decode_partials_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, o_part_ptr, lse_part_ptr,
    scale_log2, head_dim, num_q_heads, num_splits,
    stride_qs, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP_SIZE: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TILE_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid (num_seqs, num_kv_heads, num_splits): the GROUP_SIZE query heads of one kv head over one split."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    width = tl.cdiv(seq_len, num_splits)
    kv_lo = tl.minimum(split * width, seq_len)
    kv_hi = tl.minimum(kv_lo + width, seq_len)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP_SIZE + offs_g
    row_mask = (offs_g < GROUP_SIZE)[:, None] & (offs_d < head_dim)[None, :]
    q_rows = seq.to(tl.int64) * stride_qs + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask, other=0.0).to(TILE_DTYPE)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    q_pos = tl.zeros([BLOCK_G], dtype=tl.int32) + seq_len - 1  # the new token sees every key
    acc, m_i, l_i = _attend_paged_keys(
        acc, m_i, l_i, q, q_pos, kv_lo, kv_hi,
        k_cache_ptr, v_cache_ptr, block_table_ptr + seq.to(tl.int64) * stride_bt, kv_head,
        stride_cb, stride_cs, stride_ch, scale_log2, head_dim,
        PAGE_SIZE, BLOCK_N, BLOCK_D, TILE_DTYPE, DOT_PRECISION,
    )
    o, lse = _finish_softmax(acc, m_i, l_i)
    part_rows = (seq.to(tl.int64) * num_splits + split) * num_q_heads + heads  # [S, splits, H] row index
    tl.store(o_part_ptr + part_rows[:, None] * head_dim + offs_d[None, :], o, mask=row_mask)
    tl.store(lse_part_ptr + part_rows, lse, mask=offs_g < GROUP_SIZE)


# ---------------------------------------------------------------- wrapper


def default_num_splits(block_table: torch.Tensor, block_size: int, keys_per_split: int = 512) -> int:
    """Splits from the longest possible sequence (max_blocks * block_size), 1..16, without a device sync."""
    return max(1, min(16, -(-block_table.shape[1] * block_size // keys_per_split)))


def decode_partials(q, k_cache, v_cache, block_table, seq_lens, num_splits, scale=None, block_n=32):
    """Triton stage 1: partial (o, lse) per split, shapes in the module docstring."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    q, block_table, seq_lens = q.contiguous(), block_table.contiguous(), seq_lens.contiguous()
    o_part = torch.empty(num_seqs, num_splits, num_q_heads, head_dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(num_seqs, num_splits, num_q_heads, dtype=torch.float32, device=q.device)
    if num_seqs == 0:
        return o_part, lse_part
    group_size = num_q_heads // num_kv_heads
    tile, precision = tile_dtype(q)
    _decode_partials_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_table, seq_lens, o_part, lse_part,
        (default_scale(head_dim) if scale is None else scale) * LOG2_E, head_dim, num_q_heads, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        GROUP_SIZE=group_size, PAGE_SIZE=k_cache.shape[1],
        BLOCK_G=max(16, next_power_of_2(group_size)), BLOCK_N=block_n,
        BLOCK_D=max(16, next_power_of_2(head_dim)), TILE_DTYPE=tile, DOT_PRECISION=precision,
    )
    return o_part, lse_part


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale=None, num_splits=None,
                     return_lse=False, backend="auto"):
    """Attention of one new query per sequence over its paged cache (shapes in the module docstring).

    ``num_splits`` None picks :func:`default_num_splits`. ``backend``: "auto" (Triton
    on CUDA or under TRITON_INTERPRET=1, else the reference), "triton", "torch".
    Returns o, or (o, lse) when ``return_lse``.
    """
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share one layout with contiguous head_dim")
    num_splits = default_num_splits(block_table, k_cache.shape[1]) if num_splits is None else num_splits
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if use_triton(backend, q, k_cache, v_cache, block_table):
        o_part, lse_part = decode_partials(q, k_cache, v_cache, block_table, seq_lens, num_splits, scale)
        o, lse = merge_states_multi(o_part, lse_part, backend="triton")
        o = o.to(q.dtype)
    else:
        o, lse = decode_attention_reference(q, k_cache, v_cache, block_table, seq_lens, scale)
    return (o, lse) if return_lse else o
