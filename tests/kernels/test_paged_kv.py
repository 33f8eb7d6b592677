"""Paged KV cache: layout, writes, gathers, block ownership; paged attention equals contiguous."""

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from infermax.kernels.paged import (  # noqa: E402
    OutOfBlocksError,
    PagedKVCache,
    gather_kv,
    slot_mapping,
    token_positions,
    write_kv,
)
from infermax.kernels.prefill_attention import prefill_attention_reference  # noqa: E402


def test_token_positions_follow_context_lens():
    cu = torch.tensor([0, 3, 3, 4], dtype=torch.int32)
    ctx = torch.tensor([5, 9, 0], dtype=torch.int32)
    seq_idx, pos = token_positions(cu, ctx)
    assert seq_idx.tolist() == [0, 0, 0, 2]
    assert pos.tolist() == [5, 6, 7, 0]


def test_slot_mapping_uses_block_table():
    table = torch.tensor([[7, 2], [4, 0]], dtype=torch.int32)
    slots = slot_mapping(table, torch.tensor([0, 0, 1]), torch.tensor([3, 17, 15]), block_size=16)
    assert slots.tolist() == [7 * 16 + 3, 2 * 16 + 1, 4 * 16 + 15]


@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("lengths", [[1], [33, 7], [16, 31, 64]])
def test_write_then_gather_round_trips(page_size, lengths, make_paged_batch):
    b = make_paged_batch([0] * len(lengths), lengths, num_q_heads=4, num_kv_heads=2, head_dim=64, page_size=page_size)
    for i, n in enumerate(lengths):
        k, v = gather_kv(b.k_cache, b.v_cache, b.block_table[i], n)
        assert torch.equal(k, b.k_seqs[i]) and torch.equal(v, b.v_seqs[i])


def test_chunked_writes_equal_one_shot_write():
    cache = PagedKVCache(num_layers=1, num_blocks=8, block_size=16, num_kv_heads=2, head_dim=8)
    cache.reserve("s", 45)
    table = cache.block_table(["s"])
    k, v = torch.randn(45, 2, 8), torch.randn(45, 2, 8)
    start = 0
    for chunk in (13, 1, 30, 1):
        cu = torch.tensor([0, chunk], dtype=torch.int32)
        write_kv(cache.k[0], cache.v[0], table, cu, torch.tensor([start], dtype=torch.int32),
                 k[start:start + chunk], v[start:start + chunk])
        start += chunk
    k_back, v_back = gather_kv(cache.k[0], cache.v[0], table[0], 45)
    assert torch.equal(k_back, k) and torch.equal(v_back, v)


def test_block_allocator_reserves_frees_and_reuses():
    cache = PagedKVCache(num_layers=2, num_blocks=5, block_size=4, num_kv_heads=1, head_dim=8)
    cache.reserve("a", 9)  # 3 blocks
    cache.reserve("a", 12)  # still 3
    cache.reserve("b", 1)
    assert cache.num_free_blocks == 1 and len(cache.blocks_of("a")) == 3
    with pytest.raises(OutOfBlocksError):
        cache.reserve("b", 9)
    table = cache.block_table(["b", "a"])
    assert table.dtype == torch.int32 and table.shape == (2, 3)
    assert table[0, 1:].tolist() == [0, 0] and table[1].tolist() == cache.blocks_of("a")
    freed = cache.blocks_of("a")
    cache.free("a")
    assert cache.num_free_blocks == 4 and cache.blocks_of("a") == []
    cache.reserve("c", 16)
    assert set(freed) <= set(cache.blocks_of("c"))


def test_cache_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(num_layers=1, num_blocks=4, block_size=0, num_kv_heads=1, head_dim=8)


@settings(max_examples=30, deadline=None)
@given(
    specs=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 20)), min_size=1, max_size=4),
    page_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 4, 8]),
    seed=st.integers(0, 2**16),
)
def test_paged_attention_equals_contiguous_attention(specs, page_size, group, seed, make_paged_batch, naive_attention):
    """Shuffled blocks and odd lengths: the paged reference sees exactly the contiguous KV."""
    ctx, qlen = [m for m, _ in specs], [c for _, c in specs]
    b = make_paged_batch(ctx, qlen, num_q_heads=2 * group, num_kv_heads=2, head_dim=16, page_size=page_size, seed=seed)
    o, lse = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens, b.context_lens)
    for i in range(len(specs)):
        rows = slice(int(b.cu_seqlens[i]), int(b.cu_seqlens[i + 1]))
        o_ref, lse_ref = naive_attention(b.q[rows], b.k_seqs[i], b.v_seqs[i])
        torch.testing.assert_close(o[rows].double(), o_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[rows].double(), lse_ref, atol=1e-5, rtol=1e-5)
