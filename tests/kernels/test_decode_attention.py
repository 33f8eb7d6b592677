"""Split-KV decode attention: references vs naive, Triton partials and merge vs references."""

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from infermax.kernels import _triton  # noqa: E402
from infermax.kernels.decode_attention import (  # noqa: E402
    decode_attention,
    decode_attention_reference,
    decode_attention_split_reference,
    decode_partials,
    decode_partials_reference,
    split_bounds,
)
from infermax.kernels.prefill_attention import prefill_attention  # noqa: E402

needs_triton = pytest.mark.skipif(not _triton.HAS_TRITON, reason="triton not installed")


def _decode_batch(make_paged_batch, seq_lens, group, head_dim, page_size, **kw):
    """Sequences whose last token is the one being decoded: m = n - 1, c = 1."""
    return make_paged_batch([n - 1 for n in seq_lens], [1] * len(seq_lens), num_q_heads=2 * group,
                            num_kv_heads=2, head_dim=head_dim, page_size=page_size, **kw)


def _check_against_naive(b, o, lse, naive_attention, atol):
    for i in range(len(b.query_lens)):
        o_ref, lse_ref = naive_attention(b.q[i : i + 1].cpu(), b.k_seqs[i], b.v_seqs[i])
        torch.testing.assert_close(o[i : i + 1].cpu().double(), o_ref, atol=atol, rtol=atol)
        torch.testing.assert_close(lse[i : i + 1].cpu().double(), lse_ref, atol=atol, rtol=atol)


def test_split_bounds_cover_every_key_once():
    assert split_bounds(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert split_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    for n in (1, 7, 64, 65):
        for s in (1, 2, 5, 16):
            keys = [j for lo, hi in split_bounds(n, s) for j in range(lo, hi)]
            assert keys == list(range(n))


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page_size", [16, 32])
def test_references_match_naive(group, head_dim, page_size, make_paged_batch, naive_attention):
    b = _decode_batch(make_paged_batch, [1, 33, 200], group, head_dim, page_size, seed=group)
    args = (b.q, b.k_cache, b.v_cache, b.block_table, b.seq_lens)
    o, lse = decode_attention_reference(*args)
    _check_against_naive(b, o, lse, naive_attention, atol=1e-5)
    for num_splits in (1, 3, 7, 300):
        o_split, lse_split = decode_attention_split_reference(*args, num_splits)
        _check_against_naive(b, o_split, lse_split, naive_attention, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("group,head_dim,page_size,num_splits", [
    (1, 64, 16, 1), (4, 64, 32, 3), (8, 128, 16, 4), (4, 128, 32, 8),
])
def test_triton_partials_match_reference(group, head_dim, page_size, num_splits, make_paged_batch, device):
    b = _decode_batch(make_paged_batch, [2, 45, 70], group, head_dim, page_size, device=device, seed=num_splits)
    args = (b.q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, num_splits)
    o_part, lse_part = decode_partials(*args)
    o_ref, lse_ref = decode_partials_reference(*args)
    assert torch.equal(torch.isinf(lse_part), torch.isinf(lse_ref))  # the same splits are empty
    torch.testing.assert_close(o_part, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse_part, lse_ref, atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_decode_matches_reference(dtype, make_paged_batch, naive_attention, device):
    b = _decode_batch(make_paged_batch, [1, 17, 64, 99], 4, 64, 16, dtype=dtype, device=device, seed=5)
    args = (b.q, b.k_cache, b.v_cache, b.block_table, b.seq_lens)
    o, lse = decode_attention(*args, num_splits=3, return_lse=True, backend="triton")
    o_ref, lse_ref = decode_attention_reference(*args)
    assert o.dtype == dtype and lse.dtype == torch.float32
    tol = 2e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(o.float(), o_ref.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(lse, lse_ref, atol=tol, rtol=tol)
    _check_against_naive(b, o, lse, naive_attention, atol=tol)


@needs_triton
def test_decode_equals_prefill_of_one_token(make_paged_batch, device):
    b = _decode_batch(make_paged_batch, [5, 40], 4, 64, 32, device=device, seed=11)
    o_dec = decode_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, num_splits=2, backend="triton")
    o_pre = prefill_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens, backend="triton")
    torch.testing.assert_close(o_dec, o_pre, atol=2e-5, rtol=2e-5)


@needs_triton
@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=8, deadline=None)
@given(
    seq_lens=st.lists(st.integers(1, 80), min_size=1, max_size=3),
    num_splits=st.integers(1, 6),
    page_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 4, 8]),
    seed=st.integers(0, 2**16),
)
def test_triton_split_then_merge_equals_unsplit(seq_lens, num_splits, page_size, group, seed,
                                                make_paged_batch, naive_attention, device):
    b = _decode_batch(make_paged_batch, seq_lens, group, 32, page_size, device=device, seed=seed)
    o, lse = decode_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                              num_splits=num_splits, return_lse=True, backend="triton")
    _check_against_naive(b, o, lse, naive_attention, atol=2e-5)


def test_bad_num_splits_is_rejected(make_paged_batch):
    b = _decode_batch(make_paged_batch, [3], 1, 16, 16)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, num_splits=0)
