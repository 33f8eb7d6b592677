"""Communication-efficient sparse attention (CSA, CSPS §3.2.4-3.2.5): reference and Triton kernel.

CSA cuts a sequence into level-1 segments of ``segment_tokens`` tokens (one SPT per
GPU); a level-v segment joins 2^(v-1) neighbouring level-1 segments (CSPS
Fig. 6/7), and the top level ``num_levels`` spans the whole sequence. For a query,
the keys of its own level-1 segment are level 1; a key first shared at level v
(same level-v segment, different level-(v-1) segment) is level v. So the levels
of one query partition its keys into rings of growing distance.

Level 1 keeps every key (causally). A ring at level v >= 2 keeps its most important
fraction ``keep_v`` of the keys, importance being a score per (head, key), in the
paper the previous layer's attention score. With p the level-2 drop ratio,

    keep_2 = 1 - p,   keep_(2+n) = (1 - p) / 2^n.

CSPS writes the rule as ``1 - p = (1 - p')/2^n``; read literally that raises
the kept fraction with distance (above 1 for p < 1/2), contradicting "a higher
level ... drops more unimportant tokens" and "tokens attended within a region
roughly inversely proportional to the distance". We implement the halving keep
ratio the prose describes; so even p = 0 keeps only half of the level-3 ring
(the paper reports that a zero accuracy-loss budget still drops 22% of tokens). A ring keeps
round(keep_v * ring size) keys, ties broken towards the earlier key. The rule lives in ``costmodel.communication``
(:func:`csa_keep_ratios`, :func:`csa_rings`), which also prices it: the share of
dense KV moved and attended is :func:`~infermax.costmodel.communication.csa_kv_fractions`.

Each level's attention is computed separately and the levels are combined by
their softmax denominators, CSPS eq. (5) O = sum_i z_i / (sum_j z_j) O_i,
which is :func:`merge.merge_states_multi` with lse_i = ln z_i (natural log).
This also is the §3.2.5 pipeline: a level can be attended as soon as its keys
arrive, the merge waits only for the small (o, lse) pairs.

The Triton kernel reads only the kept keys. Every query of a segment keeps the
same earlier keys (its rings depend on the segment alone), so the host lists them
once per (q head, segment) -- the rings from far to near, then the segment's own
keys -- and one program per (segment, q head, tile of queries) runs the online
softmax of the paged prefill kernel over that list, the list standing in for a
block table of one-token pages. One online softmax over every level equals the
per-level merge of eq. (5) (the softmax is the same; only the summation order
differs), which the tests check against the reference.

Shapes and dtypes (one sequence, causal self-attention):
    q            [num_tokens, num_q_heads, head_dim]  float32/float16/bfloat16
    k, v         [num_tokens, num_kv_heads, head_dim]  (GQA: q head h reads kv head h // group)
    importance   [num_q_heads, num_tokens]  higher = kept first
    -> o         [num_tokens, num_q_heads, head_dim] (reference: float32; wrapper: q's dtype)
    -> lse       float32 [num_tokens, num_q_heads], natural log, over the kept keys

Accuracy caveat. Whether dropping keys costs answer quality depends on trained
weights; the executor's random-weight Llama cannot measure it, so we report the
attention-output error against dense causal attention instead
(:func:`csa_error_vs_dense`). Measured by
``benchmarks/csa_error_bench.py`` (2048 tokens, 8 segments of 256, q/k/v
Gaussian, 4 q heads, 2 kv heads, head_dim 64; "flat": score std 1, "sharp": q
times 3; keys ranked by the attention they receive ("oracle", this layer's own
scores) or at random; the kernel gives the same numbers, it equals the reference):

    levels  p     attended  rel L2 flat,oracle  flat,random  sharp,oracle  max abs sharp
    2       0.00  1.000     0.000               0.000        0.000         0.000
    2       0.25  0.781     0.266               0.288        0.162         1.796
    2       0.50  0.563     0.476               0.483        0.392         2.695
    2       0.75  0.344     0.760               0.737        0.725         3.108
    3       0.00  0.625     0.363               0.377        0.325         2.335
    3       0.50  0.375     0.674               0.658        0.642         3.434
    4       0.00  0.500     0.468               0.475        0.486         3.108
    4       0.50  0.313     0.779               0.760        0.753         4.053
    any     1.00  0.125     2.069               2.069        1.366         4.600

Read it as an upper end: random q and k spread attention over every key, and a
per-head ranking shared by all queries (CSA's) barely beats a random one there.
Trained models concentrate attention on few, shared keys (sinks, local windows),
where the paper measures no accuracy loss at 22 % dropped; nothing here can confirm
that. "attended" is ``csa_kv_fractions(...).attended``: with the halving keep
rule even p = 0 attends 62.5 % of the pairs at 3 levels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infermax.costmodel.communication import csa_keep_ratios, csa_kv_fractions, csa_num_kept, csa_rings

from ._triton import next_power_of_2, tile_dtype, tl, triton, use_triton
from .merge import merge_states_multi_reference
from .prefill_attention import LOG2_E, _attend_paged_keys, _finish_softmax
from .reference import attention_with_lse, causal_mask, default_scale

# ---------------------------------------------------------------- reference


def csa_levels(num_tokens: int, segment_tokens: int, num_levels: int, device=None) -> torch.Tensor:
    """int64 [num_tokens, num_tokens]: CSA level (1..num_levels) of key j for query i."""
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
    pos = torch.arange(num_tokens, device=device)
    level = torch.full((num_tokens, num_tokens), num_levels, dtype=torch.long, device=device)
    for v in range(num_levels - 1, 0, -1):  # smallest shared segment wins
        seg = pos // (segment_tokens * 2 ** (v - 1))
        level = torch.where(seg[:, None] == seg[None, :], v, level)
    return level


def csa_keep_mask(importance: torch.Tensor, segment_tokens: int, num_levels: int, drop_ratio: float) -> torch.Tensor:
    """Bool [num_heads, num_tokens, num_tokens]: causal keys that CSA keeps for each query.

    Args:
        importance: [num_heads, num_tokens] score of every key per head (higher = kept first).
    """
    num_heads, num_tokens = importance.shape
    device = importance.device
    level = csa_levels(num_tokens, segment_tokens, num_levels, device)
    keep = causal_mask(num_tokens, num_tokens, 0, device) & (level == 1)
    keep = keep[None].repeat(num_heads, 1, 1)
    ratios = csa_keep_ratios(drop_ratio, num_levels)
    # rank of each key inside a ring: sort keys by importance (desc), earlier key first on ties
    order = torch.argsort(-importance.float(), dim=1, stable=True)  # [H, N]
    for seg_start in range(0, num_tokens, segment_tokens):
        queries = slice(seg_start, min(seg_start + segment_tokens, num_tokens))
        for v in range(2, num_levels + 1):
            ring = (level[seg_start] == v) & (torch.arange(num_tokens, device=device) < seg_start)  # earlier keys only
            size = int(ring.sum())
            num_kept = csa_num_kept(size, ratios[v - 1])
            if num_kept == 0:
                continue
            for h in range(num_heads):
                ranked = order[h][ring[order[h]]][:num_kept]
                keep[h, queries, ranked] = True
    return keep


def csa_attention_reference(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale=None):
    """Causal CSA self-attention of one sequence, level by level, merged with eq. (5).

    Args:
        q: [num_tokens, num_q_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim].
        importance: [num_q_heads, num_tokens] key importance per query head.
    Returns:
        o float32 [num_tokens, num_q_heads, head_dim], lse float32 [num_tokens,
        num_q_heads] (natural log) over the kept keys.
    """
    num_tokens = q.shape[0]
    keep = csa_keep_mask(importance, segment_tokens, num_levels, drop_ratio)
    level = csa_levels(num_tokens, segment_tokens, num_levels, q.device)
    partials = [attention_with_lse(q, k, v, keep & (level == lv), scale) for lv in range(1, num_levels + 1)]
    o = torch.stack([p[0] for p in partials], dim=1)  # [N, levels, H, D]
    lse = torch.stack([p[1] for p in partials], dim=1)  # [N, levels, H]
    return merge_states_multi_reference(o, lse)


# ---------------------------------------------------------------- kept-key lists


def _level1_tokens(num_tokens: int, segment_tokens: int, num_levels: int) -> int:
    """Width of a level-1 segment: with one level, level 1 is the top level and spans the sequence."""
    return max(num_tokens, 1) if num_levels == 1 else segment_tokens


def csa_kept_keys(importance: torch.Tensor, segment_tokens: int, num_levels: int, drop_ratio: float):
    """Keys each (q head, segment) reads: its kept earlier keys, far rings first, then its own keys.

    Args:
        importance: [num_heads, num_tokens] score of every key per head.
    Returns:
        keys: int32 [num_heads, num_segments, max_len] key positions (padding 0, never read);
        num_earlier: int32 [num_heads, num_segments] entries before the segment's own keys.
    The segment's own keys follow in order, so list entry n (n >= num_earlier) is key
    segment_start + n - num_earlier and the causal rule is n <= num_earlier + (query - segment_start).
    """
    num_heads, num_tokens = importance.shape
    ratios = csa_keep_ratios(drop_ratio, num_levels)
    segment_tokens = _level1_tokens(num_tokens, segment_tokens, num_levels)
    by_rank = -importance.float()
    lists, counts = [], []
    for start in range(0, num_tokens, segment_tokens):
        parts = []
        for level, lo, hi in reversed(csa_rings(start, segment_tokens, num_levels)):
            num_kept = csa_num_kept(hi - lo, ratios[level - 1])
            if num_kept:  # most important first; stable sort breaks ties towards the earlier key
                parts.append(lo + torch.argsort(by_rank[:, lo:hi], dim=1, stable=True)[:, :num_kept])
        counts.append(sum(p.shape[1] for p in parts))
        own = torch.arange(start, min(start + segment_tokens, num_tokens), device=importance.device)
        lists.append(torch.cat(parts + [own.expand(num_heads, -1)], dim=1))
    max_len = max(x.shape[1] for x in lists)
    keys = torch.zeros(num_heads, len(lists), max_len, dtype=torch.int32, device=importance.device)
    for s, row in enumerate(lists):
        keys[:, s, : row.shape[1]] = row
    num_earlier = torch.tensor(counts, dtype=torch.int32, device=importance.device).expand(num_heads, -1).contiguous()
    return keys, num_earlier


# ---------------------------------------------------------------- kernel


@triton.jit
def _csa_attention_kernel(
    q_ptr, k_ptr, v_ptr, keys_ptr, num_earlier_ptr, o_ptr, lse_ptr,
    scale_log2, head_dim, num_tokens, num_q_heads, segment_tokens, num_segments, max_len,
    stride_qt, stride_qh, stride_kt, stride_kh,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    TILE_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Grid (num_segments, num_q_heads, cdiv(segment_tokens, BLOCK_M)): BLOCK_M queries of one segment and head."""
    seg = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    seg_start = seg * segment_tokens
    q_len = tl.minimum(segment_tokens, num_tokens - seg_start)
    if tile * BLOCK_M < q_len:
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        row_mask = (offs_m < q_len)[:, None] & (offs_d < head_dim)[None, :]
        q_rows = (seg_start + offs_m).to(tl.int64) * stride_qt + head * stride_qh
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask, other=0.0).to(TILE_DTYPE)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        # -- the list: kept earlier keys (all visible), then own keys (causal); read up to this tile's last query
        list_row = head.to(tl.int64) * num_segments + seg
        num_earlier = tl.load(num_earlier_ptr + list_row)
        kv_hi = num_earlier + tl.minimum(q_len, (tile + 1) * BLOCK_M)
        acc, m_i, l_i = _attend_paged_keys(
            acc, m_i, l_i, q, num_earlier + offs_m, 0, kv_hi,
            k_ptr, v_ptr, keys_ptr + list_row * max_len, head // GROUP_SIZE,
            stride_kt, 0, stride_kh, scale_log2, head_dim,
            1, BLOCK_N, BLOCK_D, TILE_DTYPE, DOT_PRECISION,
        )
        o, lse = _finish_softmax(acc, m_i, l_i)
        tl.store(o_ptr + q_rows[:, None] + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=row_mask)
        lse_rows = (seg_start + offs_m).to(tl.int64) * num_q_heads + head
        tl.store(lse_ptr + lse_rows, lse, mask=offs_m < q_len)


# ---------------------------------------------------------------- wrapper


def _check_inputs(q, k, v, importance, segment_tokens, num_levels, drop_ratio):
    """Raise ValueError naming the field and its value for anything the kernel cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be [num_tokens, num_heads, head_dim], got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on num_tokens and head_dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"num_q_heads={q.shape[1]} is not a multiple of num_kv_heads={k.shape[1]}")
    if tuple(importance.shape) != (q.shape[1], q.shape[0]):
        raise ValueError(f"importance must be [num_q_heads, num_tokens] = {(q.shape[1], q.shape[0])}, "
                         f"got {tuple(importance.shape)}")
    for name, value in (("segment_tokens", segment_tokens), ("num_levels", num_levels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    csa_keep_ratios(drop_ratio, num_levels)  # raises on drop_ratio outside [0, 1]


def csa_attention(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale=None,
                  return_lse=False, backend="auto", block_m=16, block_n=32):
    """Causal CSA self-attention of one sequence (shapes in the module docstring).

    ``backend``: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else the
    reference), "triton", "torch". Returns o in q's dtype, or (o, lse) when ``return_lse``.
    """
    _check_inputs(q, k, v, importance, segment_tokens, num_levels, drop_ratio)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    if use_triton(backend, q, k, v, importance):
        o, lse = _launch(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale, block_m, block_n)
    else:
        o, lse = csa_attention_reference(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale)
        o = o.to(q.dtype)
    return (o, lse) if return_lse else o


def _launch(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale, block_m, block_n):
    """List the kept keys, allocate o/lse, launch one program per (segment, q head, query tile)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    num_tokens, num_q_heads, head_dim = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if num_tokens == 0:
        return o, lse
    keys, num_earlier = csa_kept_keys(importance, segment_tokens, num_levels, drop_ratio)
    segment_tokens = _level1_tokens(num_tokens, segment_tokens, num_levels)
    seg_len = min(segment_tokens, num_tokens)
    grid = (keys.shape[1], num_q_heads, triton.cdiv(seg_len, block_m))
    tile, precision = tile_dtype(q)
    _csa_attention_kernel[grid](
        q, k, v, keys, num_earlier, o, lse,
        scale * LOG2_E, head_dim, num_tokens, num_q_heads, segment_tokens, keys.shape[1], keys.shape[2],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        GROUP_SIZE=num_q_heads // k.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, next_power_of_2(head_dim)), TILE_DTYPE=tile, DOT_PRECISION=precision,
    )
    return o, lse


# ---------------------------------------------------------------- error vs dense


@dataclass(frozen=True, kw_only=True, slots=True)
class CsaError:
    """CSA output vs dense causal attention over the same q, k, v (all heads and tokens).

    rel_l2: ||o_csa - o_dense||_2 / ||o_dense||_2; max_abs: max |o_csa - o_dense|;
    attended: kept share of the causal (query, key) pairs (1 = dense).
    """

    rel_l2: float
    max_abs: float
    attended: float


def attention_importance(q, k, scale=None) -> torch.Tensor:
    """float32 [num_q_heads, num_tokens]: causal attention probability each key receives, summed over queries.

    The H2O-style score CSA ranks keys by (CSPS uses the previous layer's);
    computed here from this layer's own q and k, so it is an oracle ranking.
    """
    num_tokens = q.shape[0]
    group = q.shape[1] // k.shape[1]
    scale = default_scale(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(group, dim=1)) * scale
    scores = scores.masked_fill(~causal_mask(num_tokens, num_tokens, 0, q.device), float("-inf"))
    return torch.softmax(scores, dim=-1).sum(dim=1)


def csa_error_vs_dense(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale=None,
                       backend="auto") -> CsaError:
    """Attention-output error of CSA against dense causal attention (the accuracy stand-in)."""
    num_tokens = q.shape[0]
    o = csa_attention(q, k, v, importance, segment_tokens, num_levels, drop_ratio, scale, backend=backend).float()
    o_dense, _ = attention_with_lse(q, k, v, causal_mask(num_tokens, num_tokens, 0, q.device), scale)
    diff = o - o_dense
    return CsaError(rel_l2=float(diff.norm() / o_dense.norm().clamp_min(1e-30)),
                    max_abs=float(diff.abs().max()) if diff.numel() else 0.0,
                    attended=csa_kv_fractions(num_tokens, segment_tokens, num_levels, drop_ratio).attended)
