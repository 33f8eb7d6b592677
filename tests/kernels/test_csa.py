"""CSA sparse attention (CSPS §3.2.4-3.2.5): reference, kept-key lists, Triton kernel, error vs dense."""

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from infermax.kernels import _triton  # noqa: E402
from infermax.kernels import csa as csa_module  # noqa: E402
from infermax.kernels.csa import (  # noqa: E402
    attention_importance,
    csa_attention,
    csa_attention_reference,
    csa_error_vs_dense,
    csa_keep_mask,
    csa_keep_ratios,
    csa_kept_keys,
    csa_levels,
)

needs_triton = pytest.mark.skipif(
    not _triton.HAS_TRITON,
    reason="triton is not installed (pip install triton): CSA kernel tests skipped, the reference tests still run",
)


def test_keep_ratio_halves_per_level_beyond_two():
    assert csa_keep_ratios(0.2, 4) == pytest.approx([1.0, 0.8, 0.4, 0.2])
    p = 0.3
    ratios = csa_keep_ratios(p, 5)
    for n in range(1, 4):  # keep_(2+n) * 2^n == keep_2
        assert ratios[1 + n] * 2**n == pytest.approx(1 - p)
    with pytest.raises(ValueError, match="drop_ratio"):
        csa_keep_ratios(1.5, 2)


def test_levels_follow_the_segment_hierarchy():
    # 4 segments of 2 tokens (CSPS Fig. 7): pairs of segments form level 2, all four level 3
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


# ---------------------------------------------------------------- kept-key lists (torch only)

def _mask_from_lists(keys, num_earlier, num_tokens, segment_tokens):
    """Bool [H, N, N] the kernel applies: a segment's listed earlier keys, then its own keys causally."""
    num_heads = keys.shape[0]
    mask = torch.zeros(num_heads, num_tokens, num_tokens, dtype=torch.bool)
    for s, start in enumerate(range(0, num_tokens, segment_tokens)):
        end = min(start + segment_tokens, num_tokens)
        for h in range(num_heads):
            r = int(num_earlier[h, s])
            mask[h, start:end, keys[h, s, :r].long()] = True
            assert keys[h, s, r:r + end - start].tolist() == list(range(start, end))
        mask[:, start:end, start:end] |= torch.tril(torch.ones(end - start, end - start, dtype=torch.bool))
    return mask


@pytest.mark.parametrize("num_tokens,segment_tokens,num_levels,drop_ratio", [
    (29, 4, 3, 0.5), (32, 4, 4, 0.2), (7, 2, 2, 0.0), (1, 4, 3, 0.5),
    (10, 16, 3, 0.5), (9, 1, 5, 0.3), (24, 4, 3, 1.0), (20, 4, 1, 0.5),
])
def test_kept_key_lists_equal_the_reference_mask(num_tokens, segment_tokens, num_levels, drop_ratio):
    """Two encodings of the keep rule (rings by interval vs levels by mask) agree key for key."""
    importance = torch.rand(3, num_tokens, generator=torch.Generator().manual_seed(num_tokens))
    importance[:, ::3] = 0.5  # ties: the earlier key wins in both
    keys, num_earlier = csa_kept_keys(importance, segment_tokens, num_levels, drop_ratio)
    expected = csa_keep_mask(importance, segment_tokens, num_levels, drop_ratio)
    level1_tokens = num_tokens if num_levels == 1 else segment_tokens  # one level: level 1 is the whole sequence
    assert torch.equal(_mask_from_lists(keys, num_earlier, num_tokens, level1_tokens), expected)


@pytest.mark.parametrize("num_tokens,segment_tokens,num_levels,drop_ratio", [
    (29, 4, 3, 0.5), (64, 8, 4, 0.0), (40, 5, 3, 0.9), (12, 16, 2, 0.5), (17, 1, 6, 0.25), (20, 4, 1, 0.5),
])
def test_cost_term_fractions_count_the_reference_mask(num_tokens, segment_tokens, num_levels, drop_ratio):
    """costmodel.csa_kv_fractions (1-token blocks) = CSA's share of the causal mask, and of the earlier keys moved."""
    from infermax.costmodel.communication import csa_kv_fractions

    importance = torch.rand(2, num_tokens, generator=torch.Generator().manual_seed(1))
    keep = csa_keep_mask(importance, segment_tokens, num_levels, drop_ratio)
    fractions = csa_kv_fractions(num_tokens, segment_tokens, num_levels, drop_ratio)
    causal = torch.tril(torch.ones(num_tokens, num_tokens, dtype=torch.bool))
    assert fractions.attended == pytest.approx(keep.sum().item() / (2 * causal.sum().item()), rel=1e-12)
    starts = range(0, num_tokens, segment_tokens)  # a segment's first query holds exactly its moved keys
    moved = sum(keep[:, a, :a].sum().item() for a in starts)
    dense = sum(2 * a for a in starts)
    assert fractions.moved == pytest.approx(moved / dense if dense else 1.0, rel=1e-12)


# ---------------------------------------------------------------- Triton kernel vs reference

TRITON_CASES = [  # (num_tokens, segment_tokens, num_levels, drop_ratio, group, head_dim)
    (29, 4, 3, 0.5, 2, 16),    # last segment partial
    (1, 4, 2, 0.5, 1, 16),     # one token
    (12, 32, 3, 0.3, 4, 24),   # one segment longer than the sequence; head_dim not a power of 2
    (6, 1, 4, 0.2, 2, 16),     # one-token segments, four levels
    (40, 8, 4, 1.0, 1, 32),    # drop every earlier key: level 1 only
    (70, 24, 3, 0.25, 2, 16),  # two query tiles per segment; lists longer than one key tile
]


def _csa_problem(num_tokens, group, head_dim, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, 2 * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, 2, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, 2, head_dim, generator=gen).to(dtype)
    importance = torch.rand(2 * group, num_tokens, generator=gen)
    return [t.to(device) for t in (q, k, v, importance)]


@needs_triton
@pytest.mark.parametrize("num_tokens,segment_tokens,num_levels,drop_ratio,group,head_dim",
                         [c if k in (0, 2, 5) else pytest.param(*c, marks=pytest.mark.slow)    # the rest: slow run
                          for k, c in enumerate(TRITON_CASES)])
def test_triton_matches_reference(num_tokens, segment_tokens, num_levels, drop_ratio, group, head_dim, device):
    q, k, v, importance = _csa_problem(num_tokens, group, head_dim, device=device, seed=num_tokens)
    args = (q, k, v, importance, segment_tokens, num_levels, drop_ratio)
    o, lse = csa_attention(*args, return_lse=True, backend="triton")
    o_ref, lse_ref = csa_attention_reference(*args)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize("num_levels", [1, 2])
def test_triton_without_dropping_is_causal_attention(num_levels, naive_attention, device):
    q, k, v, importance = _csa_problem(21, 2, 16, device=device)
    o, lse = csa_attention(q, k, v, importance, 4, num_levels, 0.0, return_lse=True, backend="triton")
    o_ref, lse_ref = naive_attention(q.cpu(), k.cpu(), v.cpu())
    torch.testing.assert_close(o.cpu().double(), o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.cpu().double(), lse_ref, atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize("segment", [2, 3])
def test_triton_reads_only_the_kept_keys(segment, device):
    """Every key a segment drops holds NaN in k and v; that segment's rows still equal the reference."""
    q, k, v, importance = _csa_problem(16, 1, 16, device=device, seed=5)
    args = (importance, 4, 3, 0.5)
    o_ref, lse_ref = csa_attention_reference(q, k, v, *args)
    rows = slice(4 * segment, 4 * segment + 4)
    read = csa_keep_mask(*args)[:, rows].any(dim=(0, 1)).to(device)  # kept by some head of the segment
    assert not read[: rows.start].all()
    k_poisoned = k.masked_fill(~read[:, None, None], float("nan"))
    v_poisoned = v.masked_fill(~read[:, None, None], float("nan"))
    o, lse = csa_attention(q, k_poisoned, v_poisoned, *args, return_lse=True, backend="triton")
    torch.testing.assert_close(o[rows], o_ref[rows], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse[rows], lse_ref[rows], atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_triton_half_precision(dtype, atol, device):
    """Output rounded to the input's dtype; lse stays float32 (bf16 is loaded as float32 under the interpreter)."""
    q, k, v, importance = _csa_problem(27, 2, 32, dtype=dtype, device=device, seed=2)
    o, lse = csa_attention(q, k, v, importance, 8, 3, 0.4, return_lse=True, backend="triton")
    o_ref, lse_ref = csa_attention_reference(q, k, v, importance, 8, 3, 0.4)
    assert o.dtype == dtype
    torch.testing.assert_close(o.float(), o_ref, atol=atol, rtol=atol)
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-3)


@pytest.mark.slow
@needs_triton
@settings(max_examples=5, deadline=None)
@given(
    num_tokens=st.integers(1, 40), segment_tokens=st.integers(1, 12), num_levels=st.integers(1, 4),
    drop_ratio=st.floats(0.0, 1.0), group=st.sampled_from([1, 2]), seed=st.integers(0, 2**16),
)
def test_triton_equals_reference_anywhere(num_tokens, segment_tokens, num_levels, drop_ratio, group, seed, device):
    q, k, v, importance = _csa_problem(num_tokens, group, 16, device=device, seed=seed)
    args = (q, k, v, importance, segment_tokens, num_levels, drop_ratio)
    o, lse = csa_attention(*args, return_lse=True, backend="triton")
    o_ref, lse_ref = csa_attention_reference(*args)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=2e-5)


def test_torch_backend_never_launches_triton(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("triton launched")

    monkeypatch.setattr(csa_module, "_launch", fail)
    q, k, v, importance = _csa_problem(9, 1, 16)
    o = csa_attention(q, k, v, importance, 4, 2, 0.5, backend="torch")
    assert o.shape == q.shape and o.dtype == q.dtype
    if _triton.HAS_TRITON and _triton.is_interpreting():
        with pytest.raises(AssertionError, match="triton launched"):
            csa_attention(q, k, v, importance, 4, 2, 0.5)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("change,match", [
    ({"segment_tokens": 0}, "segment_tokens must be an int >= 1, got 0"),
    ({"segment_tokens": 2.5}, "segment_tokens must be an int >= 1, got 2.5"),
    ({"num_levels": 0}, "num_levels must be an int >= 1, got 0"),
    ({"drop_ratio": 1.5}, r"drop_ratio must be in \[0, 1\], got 1.5"),
    ({"drop_ratio": -0.1}, r"drop_ratio must be in \[0, 1\], got -0.1"),
    ({"importance": "transposed"}, r"importance must be \[num_q_heads, num_tokens\] = \(2, 9\), got \(9, 2\)"),
    ({"q": "flat"}, r"q must be \[num_tokens, num_heads, head_dim\], got shape \(9, 32\)"),
    ({"v": "short"}, r"k and v must have one shape, got k \(9, 2, 16\) and v \(8, 2, 16\)"),
    ({"k": "wide"}, r"num_q_heads=2 is not a multiple of num_kv_heads=3"),
    ({"q": "short"}, r"q \(8, 2, 16\) and k \(9, 2, 16\) must agree on num_tokens and head_dim"),
])
def test_bad_inputs_name_the_field_and_value(backend, change, match):
    q, k, v, importance = _csa_problem(9, 1, 16)
    bad = {"q": q, "k": k, "v": v, "importance": importance, "segment_tokens": 4, "num_levels": 3, "drop_ratio": 0.5}
    rewrite = {"transposed": lambda t: t.T, "flat": lambda t: t.reshape(9, -1), "short": lambda t: t[:8],
               "wide": lambda t: t[:, :1].repeat(1, 3, 1)}
    for name, value in change.items():
        bad[name] = rewrite[value](bad[name]) if isinstance(value, str) else value
    if "wide" in change.values():
        bad["v"] = rewrite["wide"](v)
    with pytest.raises(ValueError, match=match):
        csa_attention(**bad, backend=backend)


def test_unknown_backend_is_rejected():
    q, k, v, importance = _csa_problem(4, 1, 16)
    with pytest.raises(ValueError, match="backend must be one of .*got 'cuda'"):
        csa_attention(q, k, v, importance, 4, 2, 0.5, backend="cuda")


# ---------------------------------------------------------------- error vs dense (the accuracy stand-in)


def test_error_vs_dense_is_zero_without_dropping_and_grows_with_it():
    q, k, v, _ = _csa_problem(48, 2, 16, seed=3)
    importance = attention_importance(q, k)
    none = csa_error_vs_dense(q, k, v, importance, 8, 2, 0.0, backend="torch")
    assert none.rel_l2 < 1e-6 and none.max_abs < 1e-5 and none.attended == 1.0
    some = csa_error_vs_dense(q, k, v, importance, 8, 3, 0.5, backend="torch")
    most = csa_error_vs_dense(q, k, v, importance, 8, 3, 1.0, backend="torch")
    assert 0 < some.rel_l2 < most.rel_l2 and 1.0 > some.attended > most.attended
    assert most.max_abs >= some.max_abs > 0


def test_importance_ranking_beats_its_reverse():
    """Keeping the keys that draw the most attention errs less than keeping those that draw the least."""
    q, k, v, _ = _csa_problem(64, 2, 16, seed=4)
    importance = attention_importance(q, k)
    best = csa_error_vs_dense(q, k, v, importance, 8, 3, 0.5, backend="torch")
    worst = csa_error_vs_dense(q, k, v, -importance, 8, 3, 0.5, backend="torch")
    assert best.attended == worst.attended and best.rel_l2 < worst.rel_l2


def test_attention_importance_sums_to_the_number_of_queries():
    q, k, _, _ = _csa_problem(10, 2, 16)
    importance = attention_importance(q, k)
    assert importance.shape == (4, 10)
    torch.testing.assert_close(importance.sum(dim=1), torch.full((4,), 10.0))
    assert torch.all(importance[:, -1] < 1.0 + 1e-6)  # the last key is seen by the last query only


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("group,head_dim", [(1, 128), (4, 64)])
def test_triton_long_sequence(group, head_dim, device):
    q, k, v, importance = _csa_problem(256, group, head_dim, device=device)
    args = (q, k, v, importance, 32, 4, 0.3)
    o, lse = csa_attention(*args, return_lse=True, backend="triton")
    o_ref, lse_ref = csa_attention_reference(*args)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=2e-5)
