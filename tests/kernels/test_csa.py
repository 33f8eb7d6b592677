"""CSA multi-level sparse attention (csps.txt §3.2.4-3.2.5), reference only."""

import pytest

torch = pytest.importorskip("torch")

from infermax.kernels.csa import csa_attention_reference, csa_keep_mask, csa_keep_ratios, csa_levels  # noqa: E402


def test_keep_ratio_halves_per_level_beyond_two():
    assert csa_keep_ratios(0.2, 4) == pytest.approx([1.0, 0.8, 0.4, 0.2])
    p = 0.3
    ratios = csa_keep_ratios(p, 5)
    for n in range(1, 4):  # keep_(2+n) * 2^n == keep_2
        assert ratios[1 + n] * 2**n == pytest.approx(1 - p)
    with pytest.raises(ValueError, match="drop_ratio"):
        csa_keep_ratios(1.5, 2)


def test_levels_follow_the_segment_hierarchy():
    # 4 segments of 2 tokens (csps.txt Fig. 7): pairs of segments form level 2, all four level 3
    levels = csa_levels(8, segment_tokens=2, num_levels=3)
    assert levels[0].tolist() == [1, 1, 2, 2, 3, 3, 3, 3]
    assert levels[5].tolist() == [3, 3, 3, 3, 1, 1, 2, 2]
    assert torch.equal(levels, levels.T)
    # with only 2 levels every key beyond the own segment is level 2
    assert csa_levels(8, 2, 2)[0].tolist() == [1, 1, 2, 2, 2, 2, 2, 2]


def _problem(num_tokens=32, group=2, head_dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, 2 * group, head_dim, generator=gen)
    k = torch.randn(num_tokens, 2, head_dim, generator=gen)
    v = torch.randn(num_tokens, 2, head_dim, generator=gen)
    importance = torch.rand(2 * group, num_tokens, generator=gen)
    return q, k, v, importance


def test_keep_mask_keeps_the_most_important_fraction_of_each_ring():
    q, k, v, importance = _problem(num_tokens=32)
    seg, levels, p = 4, 4, 0.5
    keep = csa_keep_mask(importance, seg, levels, p)
    level = csa_levels(32, seg, levels)
    ratios = csa_keep_ratios(p, levels)
    query = 30  # last segment (28..31): rings at levels 2, 3, 4 lie before it
    for h in range(importance.shape[0]):
        row = keep[h, query]
        assert row[28:31].all() and not row[31:].any()  # level 1: causal, complete
        for lv in (2, 3, 4):
            ring = (level[query] == lv).nonzero().flatten()
            kept = ring[row[ring]]
            assert len(kept) == int(ratios[lv - 1] * len(ring) + 0.5)
            dropped = ring[~row[ring]]
            if len(kept) and len(dropped):
                assert importance[h, kept].min() >= importance[h, dropped].max()


@pytest.mark.parametrize("num_levels", [1, 2])
def test_no_drop_is_plain_causal_attention(num_levels, naive_attention):
    """p = 0 keeps everything at levels 1-2 (level 3 would still keep only (1-p)/2)."""
    q, k, v, importance = _problem(group=4)
    o, lse = csa_attention_reference(q, k, v, importance, segment_tokens=4, num_levels=num_levels, drop_ratio=0.0)
    o_ref, lse_ref = naive_attention(q, k, v)
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("drop_ratio", [0.3, 0.75])
@pytest.mark.parametrize("num_levels", [2, 3])
def test_level_merge_equals_masked_softmax(drop_ratio, num_levels):
    """Eq. (5): merging per-level outputs by their denominators = one softmax over the kept keys."""
    q, k, v, importance = _problem(num_tokens=29, seed=int(drop_ratio * 100) + num_levels)
    o, lse = csa_attention_reference(q, k, v, importance, 4, num_levels, drop_ratio)
    keep = csa_keep_mask(importance, 4, num_levels, drop_ratio)  # [H, N, N]
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("thd,jhd->htj", q.double(), k.double().repeat_interleave(group, 1)) / 4.0
    scores = scores.masked_fill(~keep, float("-inf"))
    o_ref = torch.einsum("htj,jhd->thd", torch.softmax(scores, -1), v.double().repeat_interleave(group, 1))
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1).T, atol=1e-5, rtol=1e-5)
    assert keep.sum() < torch.tril(torch.ones(29, 29)).sum() * q.shape[1]  # something was dropped
