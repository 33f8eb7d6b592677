"""Communication-efficient sparse attention (CSA, csps.txt §3.2.4-3.2.5): reference only.

CSA cuts a sequence into level-1 segments of ``segment_tokens`` tokens (one SPT per
GPU); a level-v segment joins 2^(v-1) neighbouring level-1 segments (csps.txt
Fig. 6/7), and the top level ``num_levels`` spans the whole sequence. For a query,
the keys of its own level-1 segment are level 1; a key first shared at level v
(same level-v segment, different level-(v-1) segment) is level v. So the levels
of one query partition its keys into rings of growing distance.

Level 1 keeps every key (causally). A ring at level v >= 2 keeps its most important
fraction ``keep_v`` of the keys, importance being a score per (head, key), in the
paper the previous layer's attention score. With p the level-2 drop ratio,

    keep_2 = 1 - p,   keep_(2+n) = (1 - p) / 2^n.

csps.txt writes the rule as ``1 - p = (1 - p')/2^n``; read literally that raises
the kept fraction with distance (above 1 for p < 1/2), contradicting "a higher
level ... drops more unimportant tokens" and "tokens attended within a region
roughly inversely proportional to the distance". We implement the halving keep
ratio the prose describes; so even p = 0 keeps only half of the level-3 ring
(the paper reports that a zero accuracy-loss budget still drops 22% of tokens). A ring keeps round(keep_v * ring size) keys, ties
broken towards the earlier key.

Each level's attention is computed separately and the levels are combined by
their softmax denominators, csps.txt eq. (5) O = sum_i z_i / (sum_j z_j) O_i,
which is :func:`merge.merge_states_multi` with lse_i = ln z_i (natural log).
This also is the §3.2.5 pipeline: a level can be attended as soon as its keys
arrive, the merge waits only for the small (o, lse) pairs.
"""

from __future__ import annotations

import torch

from .merge import merge_states_multi_reference
from .reference import attention_with_lse, causal_mask


def csa_keep_ratios(drop_ratio: float, num_levels: int) -> list[float]:
    """Kept fraction of keys at levels 1..num_levels for level-2 drop ratio ``drop_ratio``."""
    if not 0.0 <= drop_ratio <= 1.0:
        raise ValueError(f"drop_ratio must be in [0, 1], got {drop_ratio}")
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1, got {num_levels}")
    return [1.0] + [(1.0 - drop_ratio) / 2 ** n for n in range(num_levels - 1)]


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
            num_kept = int(ratios[v - 1] * size + 0.5)
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
