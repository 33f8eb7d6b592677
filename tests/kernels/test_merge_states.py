"""merge_states / merge_states_multi: online-softmax combination of partial attention."""

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from infermax.kernels import _triton  # noqa: E402
from infermax.kernels.merge import merge_states, merge_states_multi  # noqa: E402
from infermax.kernels.reference import attention_with_lse, causal_mask  # noqa: E402

needs_triton = pytest.mark.skipif(not _triton.HAS_TRITON, reason="triton not installed")
BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]


def _qkv(num_q, num_k, num_q_heads, num_kv_heads, head_dim, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_q, num_q_heads, head_dim, generator=gen)
    k = torch.randn(num_k, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_k, num_kv_heads, head_dim, generator=gen)
    return q.to(device), k.to(device), v.to(device)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_with_lse_matches_naive_softmax(group, head_dim, naive_attention):
    q, k, v = _qkv(9, 23, 2 * group, 2, head_dim, seed=group)
    o, lse = attention_with_lse(q, k, v, causal_mask(9, 23, offset=14))
    o_ref, lse_ref = naive_attention(q, k, v)
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-5, rtol=1e-5)


def test_attention_with_lse_empty_rows_are_zero_and_minus_inf():
    q, k, v = _qkv(3, 5, 2, 1, 16, seed=1)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    o, lse = attention_with_lse(q, k, v, mask)
    assert torch.all(o[1] == 0) and torch.all(lse[1] == float("-inf"))
    assert torch.isfinite(o).all() and torch.isfinite(lse[[0, 2]]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group,head_dim", [(1, 64), (4, 128), (8, 64)])
def test_two_way_merge_equals_unsplit(backend, group, head_dim, naive_attention, device):
    q, k, v = _qkv(6, 40, 2 * group, 2, head_dim, seed=head_dim + group, device=device)
    o_a, lse_a = attention_with_lse(q, k[:17], v[:17])
    o_b, lse_b = attention_with_lse(q, k[17:], v[17:])
    o, lse = merge_states(o_a, lse_a, o_b, lse_b, backend=backend)
    o_ref, lse_ref = naive_attention(q, k, v, causal=False)
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_states_contribute_nothing(backend, device):
    o_a = torch.randn(4, 2, 64, device=device)
    lse_a = torch.randn(4, 2, device=device)
    empty_o, empty_lse = torch.zeros_like(o_a), torch.full_like(lse_a, float("-inf"))
    o, lse = merge_states(o_a, lse_a, empty_o, empty_lse, backend=backend)
    torch.testing.assert_close(o, o_a)
    torch.testing.assert_close(lse, lse_a)
    o, lse = merge_states_multi(torch.stack([empty_o] * 3, 1), torch.stack([empty_lse] * 3, 1), backend=backend)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_handles_large_lse_without_overflow(backend, device):
    gen = torch.Generator().manual_seed(0)
    o_a, o_b = torch.randn(2, 2, 1, 16, generator=gen).to(device)
    lse_a = torch.tensor([[1000.0], [-1000.0]], device=device)
    lse_b = lse_a + torch.log(torch.tensor(3.0))  # b weighs 3x a (up to float32 rounding at |lse| = 1000)
    o, lse = merge_states(o_a, lse_a, o_b, lse_b, backend=backend)
    torch.testing.assert_close(o, 0.25 * o_a + 0.75 * o_b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, lse_a + torch.log(torch.tensor(4.0)), atol=1e-3, rtol=1e-6)


@needs_triton
@pytest.mark.parametrize("num_states", [1, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_multi_merge_matches_reference(num_states, dtype, device):
    gen = torch.Generator().manual_seed(num_states)
    o = torch.randn(5, num_states, 4, 128, generator=gen).to(dtype).to(device)
    lse = (3 * torch.randn(5, num_states, 4, generator=gen)).to(device)
    lse[0, 0] = float("-inf")
    o_t, lse_t = merge_states_multi(o, lse, backend="triton")
    o_r, lse_r = merge_states_multi(o, lse, backend="torch")
    assert o_t.dtype == dtype and lse_t.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(o_t.float(), o_r.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(lse_t, lse_r, atol=1e-5, rtol=1e-5)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="shape"):
        merge_states(torch.zeros(2, 1, 8), torch.zeros(2, 1), torch.zeros(3, 1, 8), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="backend"):
        merge_states(torch.zeros(2, 1, 8), torch.zeros(2, 1), torch.zeros(2, 1, 8), torch.zeros(2, 1), backend="cuda")


@st.composite
def _split_problem(draw):
    num_k = draw(st.integers(1, 48))
    cuts = sorted(draw(st.lists(st.integers(0, num_k), min_size=0, max_size=4)))  # repeats = empty parts
    return dict(
        num_q=draw(st.integers(1, 6)), num_k=num_k, cuts=[0, *cuts, num_k],
        group=draw(st.sampled_from([1, 4, 8])), head_dim=draw(st.sampled_from([16, 64])),
        causal=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
        backend=draw(st.sampled_from(["torch", "triton"] if _triton.HAS_TRITON else ["torch"])),
    )


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@settings(max_examples=6, deadline=None)
@given(problem=_split_problem())
def test_split_kv_at_random_points_then_merge_equals_unsplit(problem, device):
    """Cutting the keys anywhere, attending each part and merging gives full attention."""
    p = problem
    q, k, v = _qkv(p["num_q"], p["num_k"], 2 * p["group"], 2, p["head_dim"], p["seed"], device)
    # with causal=True the queries are the last num_q positions (some parts then empty for some rows)
    offset = p["num_k"] - p["num_q"]
    mask = causal_mask(p["num_q"], p["num_k"], offset, device) if p["causal"] else None
    o_full, lse_full = attention_with_lse(q, k, v, mask)
    parts = []
    for lo, hi in zip(p["cuts"][:-1], p["cuts"][1:]):
        part_mask = None if mask is None else mask[:, lo:hi]
        parts.append(attention_with_lse(q, k[lo:hi], v[lo:hi], part_mask))
    o, lse = merge_states_multi(torch.stack([a for a, _ in parts], 1), torch.stack([b for _, b in parts], 1),
                                backend=p["backend"])
    torch.testing.assert_close(o, o_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_full, atol=1e-5, rtol=1e-5)
    # folding two at a time (in any grouping) gives the same result
    o_fold, lse_fold = parts[0]
    for o_b, lse_b in parts[1:]:
        o_fold, lse_fold = merge_states(o_fold, lse_fold, o_b, lse_b, backend=p["backend"])
    torch.testing.assert_close(o_fold, o_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_fold, lse_full, atol=1e-5, rtol=1e-5)
