"""Chunked-prefill attention over the paged cache: reference vs naive, Triton vs reference."""

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from infermax.kernels import _triton  # noqa: E402
from infermax.kernels import prefill_attention as prefill_module  # noqa: E402
from infermax.kernels.prefill_attention import prefill_attention, prefill_attention_reference  # noqa: E402

needs_triton = pytest.mark.skipif(not _triton.HAS_TRITON, reason="triton not installed")
ATOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def _check_against_naive(b, o, lse, naive_attention, atol=1e-5):
    for i in range(len(b.query_lens)):
        rows = slice(int(b.cu_seqlens[i]), int(b.cu_seqlens[i + 1]))
        if rows.stop == rows.start:
            continue
        o_ref, lse_ref = naive_attention(b.q[rows].cpu(), b.k_seqs[i], b.v_seqs[i])
        torch.testing.assert_close(o[rows].cpu().double(), o_ref, atol=atol, rtol=atol)
        torch.testing.assert_close(lse[rows].cpu().double(), lse_ref, atol=atol, rtol=atol)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("chunk", [1, 7, 64, 256])
def test_reference_matches_naive(group, head_dim, page_size, chunk, make_paged_batch, naive_attention):
    b = make_paged_batch([0, 37, 130], [chunk, chunk, max(1, chunk // 3)], num_q_heads=2 * group,
                         num_kv_heads=2, head_dim=head_dim, page_size=page_size, seed=chunk)
    o, lse = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens)
    _check_against_naive(b, o, lse, naive_attention)


TRITON_CASES = [  # (context_lens, query_lens, group, head_dim, page_size)
    ([0], [5], 1, 64, 16),
    ([19, 0, 3], [1, 33, 16], 4, 64, 16),
    ([40, 7], [17, 1], 8, 64, 32),
    ([5, 50], [9, 2], 4, 128, 32),
    ([0, 12, 31], [0, 3, 20], 1, 128, 16),  # a sequence with no new tokens
]


@needs_triton
@pytest.mark.parametrize("ctx,qlen,group,head_dim,page_size", TRITON_CASES)
def test_triton_matches_reference(ctx, qlen, group, head_dim, page_size, make_paged_batch, naive_attention, device):
    b = make_paged_batch(ctx, qlen, num_q_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                         page_size=page_size, device=device, seed=sum(qlen))
    args = (b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens)
    o, lse = prefill_attention(*args, return_lse=True, backend="triton")
    o_ref, lse_ref = prefill_attention_reference(*args)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=2e-5)
    _check_against_naive(b, o, lse, naive_attention, atol=2e-5)


@needs_triton
def test_triton_float16(make_paged_batch, device):
    b = make_paged_batch([21, 0], [11, 6], num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
                         dtype=torch.float16, device=device, seed=3)
    args = (b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens)
    o, lse = prefill_attention(*args, return_lse=True, backend="triton")
    o_ref, lse_ref = prefill_attention_reference(*args)
    assert o.dtype == torch.float16
    torch.testing.assert_close(o.float(), o_ref.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-3)


@needs_triton
@pytest.mark.parametrize("page_size", [16, 32])
def test_chunked_prefill_equals_one_shot(page_size, make_paged_batch, device):
    """Prefilling 45 tokens as chunks 13+1+31 gives the rows of one 45-token prefill."""
    b = make_paged_batch([0], [45], num_q_heads=4, num_kv_heads=1, head_dim=64, page_size=page_size, device=device)
    one_shot = prefill_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens,
                                 backend="triton")
    start = 0
    for chunk in (13, 1, 31):
        cu = torch.tensor([0, chunk], dtype=torch.int32, device=device)
        ctx = torch.tensor([start], dtype=torch.int32, device=device)
        o = prefill_attention(b.q[start:start + chunk], b.k_cache, b.v_cache, b.block_table, cu, ctx, backend="triton")
        torch.testing.assert_close(o, one_shot[start:start + chunk], atol=2e-5, rtol=2e-5)
        start += chunk


@needs_triton
@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=8, deadline=None)
@given(
    specs=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 24)), min_size=1, max_size=2),
    page_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 4, 8]),
    seed=st.integers(0, 2**16),
)
def test_triton_paged_equals_contiguous(specs, page_size, group, seed, make_paged_batch, naive_attention, device):
    b = make_paged_batch([m for m, _ in specs], [c for _, c in specs], num_q_heads=group,
                         num_kv_heads=1, head_dim=32, page_size=page_size, device=device, seed=seed)
    o, lse = prefill_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens,
                               return_lse=True, backend="triton")
    _check_against_naive(b, o, lse, naive_attention, atol=2e-5)


def test_torch_backend_never_launches_triton(monkeypatch, make_paged_batch):
    def fail(*args, **kwargs):
        raise AssertionError("triton launched")

    monkeypatch.setattr(prefill_module, "_launch", fail)
    b = make_paged_batch([3], [4], num_q_heads=2, num_kv_heads=1, head_dim=16, page_size=16)
    o = prefill_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens, backend="torch")
    assert o.shape == b.q.shape
    if _triton.HAS_TRITON and _triton.is_interpreting():
        with pytest.raises(AssertionError, match="triton launched"):
            prefill_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens)


def test_bad_head_ratio_is_rejected(make_paged_batch):
    b = make_paged_batch([0], [2], num_q_heads=3, num_kv_heads=3, head_dim=16, page_size=16)
    with pytest.raises(ValueError, match="num_q_heads"):
        prefill_attention(b.q[:, :2], b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens)


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("group,head_dim", [(1, 128), (8, 64)])
def test_triton_long_chunk(group, head_dim, make_paged_batch, naive_attention, device):
    b = make_paged_batch([100], [256], num_q_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                         page_size=16, device=device)
    o, lse = prefill_attention(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens,
                               return_lse=True, backend="triton")
    _check_against_naive(b, o, lse, naive_attention, atol=2e-5)
