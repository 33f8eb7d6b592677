"""Chunked-prefill attention over a paged KV cache (causal, grouped-query).

Sequence i brings a chunk of ``c_i`` new query tokens on top of ``m_i`` cached
tokens. Its new keys/values are written into the cache first (``paged.write_kv``),
so the cache holds ``m_i + c_i`` tokens and query t (absolute position ``m_i + t``)
attends keys ``0 .. m_i + t``. A decode step is the special case ``c_i = 1``.

Shapes and dtypes (layouts of :mod:`infermax.kernels.paged`):
    q            [num_tokens, num_q_heads, head_dim]  float32/float16/bfloat16, packed
    k/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]
    block_table  int32 [num_seqs, max_blocks]
    cu_seqlens   int32 [num_seqs + 1]   new tokens of seq i = rows cu[i]:cu[i+1]
    context_lens int32 [num_seqs]       m_i, tokens cached before this chunk
    -> o         [num_tokens, num_q_heads, head_dim] in q's dtype
    -> lse       float32 [num_tokens, num_q_heads], NATURAL log of the softmax
                 denominator (so a KV-sharded run can be merged with merge_states)
GQA: num_q_heads = group_size * num_kv_heads; q head h reads kv head h // group_size.
"""

from __future__ import annotations

import torch

from ._triton import next_power_of_2, tile_dtype, tl, triton, use_triton
from .paged import gather_kv
from .reference import attention_with_lse, causal_mask, default_scale

LOG2_E = 1.4426950408889634  # kernels keep scores in base 2 (exp2); lse is stored as natural log

# ---------------------------------------------------------------- reference


def prefill_attention_reference(q, k_cache, v_cache, block_table, cu_seqlens, context_lens, scale=None):
    """Per sequence: gather the cache contiguously, then dense causal attention. Returns (o, lse)."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for i in range(len(context_lens)):
        start, end, m = int(cu_seqlens[i]), int(cu_seqlens[i + 1]), int(context_lens[i])
        if end == start:
            continue
        k, v = gather_kv(k_cache, v_cache, block_table[i], m + end - start)
        mask = causal_mask(end - start, m + end - start, offset=m, device=q.device)
        o_i, lse_i = attention_with_lse(q[start:end], k, v, mask, scale)
        o[start:end], lse[start:end] = o_i.to(q.dtype), lse_i
    return o, lse


# ---------------------------------------------------------------- inner loop


@triton.jit
def _attend_paged_keys(
    acc, m_i, l_i, q, q_pos, kv_lo, kv_hi,
    k_cache_ptr, v_cache_ptr, block_table_row_ptr, kv_head,
    stride_cb, stride_cs, stride_ch, scale_log2, head_dim,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TILE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Online softmax of query rows q [BLOCK_M, BLOCK_D] over cached keys kv_lo..kv_hi-1.

    Row r sees key j iff j <= q_pos[r]. State per row: m_i running max and l_i
    running denominator, both in base-2 units (scores multiplied by log2 e), and
    acc [BLOCK_M, BLOCK_D] the unnormalised output. Each key tile looks up its
    blocks through the block table, so a tile may span several pages. Tiles are
    loaded as TILE_DTYPE (q must be too); products accumulate in float32.
    """
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    for start in range(kv_lo, kv_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        in_range = offs_n < kv_hi
        block = tl.load(block_table_row_ptr + offs_n // PAGE_SIZE, mask=in_range, other=0).to(tl.int64)
        slot = block * stride_cb + (offs_n % PAGE_SIZE) * stride_cs + kv_head * stride_ch
        kv_mask = in_range[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(TILE_DTYPE)
        v = tl.load(v_cache_ptr + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(TILE_DTYPE)
        # -- scores in base 2, causal + range mask
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = in_range[None, :] & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        # -- online softmax update (rows that saw nothing yet keep max -inf)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(TILE_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _finish_softmax(acc, m_i, l_i):
    """Normalised output and natural-log lse (base-2 lse times ln 2); rows that saw no key give (0, -inf)."""
    seen = l_i > 0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    return o, lse


# ---------------------------------------------------------------- kernel


@triton.jit
def _prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, cu_seqlens_ptr, context_lens_ptr, o_ptr, lse_ptr,
    scale_log2, head_dim, num_q_heads,
    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP_SIZE: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, TILE_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid (num_seqs, num_q_heads, cdiv(max_chunk, BLOCK_M)): one tile of BLOCK_M queries of one head."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        m_ctx = tl.load(context_lens_ptr + seq)
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        row_mask = (offs_m < q_len)[:, None] & (offs_d < head_dim)[None, :]
        q_rows = (q_start + offs_m).to(tl.int64) * stride_qt + head * stride_qh
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask, other=0.0).to(TILE_DTYPE)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        # causal: the tile's last query sees keys up to m + its index
        kv_hi = m_ctx + tl.minimum(q_len, (tile + 1) * BLOCK_M)
        acc, m_i, l_i = _attend_paged_keys(
            acc, m_i, l_i, q, m_ctx + offs_m, 0, kv_hi,
            k_cache_ptr, v_cache_ptr, block_table_ptr + seq.to(tl.int64) * stride_bt, head // GROUP_SIZE,
            stride_cb, stride_cs, stride_ch, scale_log2, head_dim,
            PAGE_SIZE, BLOCK_N, BLOCK_D, TILE_DTYPE, DOT_PRECISION,
        )
        o, lse = _finish_softmax(acc, m_i, l_i)
        tl.store(o_ptr + q_rows[:, None] + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_mask)
        lse_rows = (q_start + offs_m).to(tl.int64) * num_q_heads + head
        tl.store(lse_ptr + lse_rows, lse, mask=offs_m < q_len)


# ---------------------------------------------------------------- wrapper


def prefill_attention(q, k_cache, v_cache, block_table, cu_seqlens, context_lens, scale=None,
                      return_lse=False, backend="auto", max_query_len=None, block_m=16, block_n=32):
    """Causal chunked-prefill attention over the paged cache (shapes in the module docstring).

    The chunk's own keys/values must already be in the cache. ``backend``: "auto"
    (Triton on CUDA or under TRITON_INTERPRET=1, else the reference), "triton",
    "torch". ``max_query_len`` (largest c_i) spares a device sync if given.
    Returns o, or (o, lse) when ``return_lse``.
    """
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    if num_q_heads % k_cache.shape[2]:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={k_cache.shape[2]}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share one layout with contiguous head_dim")
    scale = default_scale(head_dim) if scale is None else scale
    if use_triton(backend, q, k_cache, v_cache, block_table):
        o, lse = _launch(q, k_cache, v_cache, block_table, cu_seqlens, context_lens, scale, max_query_len, block_m,
                         block_n)
    else:
        o, lse = prefill_attention_reference(q, k_cache, v_cache, block_table, cu_seqlens, context_lens, scale)
    return (o, lse) if return_lse else o


def _launch(q, k_cache, v_cache, block_table, cu_seqlens, context_lens, scale, max_query_len, block_m, block_n):
    """Allocate o/lse and launch one program per (sequence, q head, tile of block_m queries)."""
    q, block_table = q.contiguous(), block_table.contiguous()
    cu_seqlens, context_lens = cu_seqlens.contiguous(), context_lens.contiguous()
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if max_query_len is None:
        max_query_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if len(context_lens) else 0
    if max_query_len == 0:
        return o, lse
    num_seqs, (num_q_heads, head_dim) = len(context_lens), q.shape[1:]
    grid = (num_seqs, num_q_heads, triton.cdiv(max_query_len, block_m))
    tile, precision = tile_dtype(q)
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, block_table, cu_seqlens, context_lens, o, lse,
        scale * LOG2_E, head_dim, num_q_heads,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        GROUP_SIZE=num_q_heads // k_cache.shape[2], PAGE_SIZE=k_cache.shape[1],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, next_power_of_2(head_dim)),
        TILE_DTYPE=tile, DOT_PRECISION=precision,
    )
    return o, lse
