"""The small Llama model on the paged cache: chunked prefill, decode, eviction + recompute."""

import pytest

torch = pytest.importorskip("torch")

from infermax.kernels import _triton  # noqa: E402
from infermax.kernels.llama import LlamaConfig, LlamaModel  # noqa: E402

needs_triton = pytest.mark.skipif(not _triton.HAS_TRITON, reason="triton not installed")
BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]
PROMPT = [(7 * i + 3) % 512 for i in range(29)]  # odd length, spans two 16-token blocks


@pytest.fixture(scope="module")
def model(device):
    return LlamaModel(LlamaConfig(seed=1)).to(device)


def _prefill(model, cache, seq_id, tokens, chunks, backend):
    """Run ``tokens`` through the paged model in chunks; return the last logits."""
    assert sum(chunks) == len(tokens)
    start = 0
    for chunk in chunks:
        logits = model.step(cache, [(seq_id, tokens[start:start + chunk], start)], backend=backend)
        start += chunk
    return logits[0]


def _decode(model, cache, seq_id, first_token, start, num_tokens, backend):
    """Greedy decoding on the paged cache, ``first_token`` sitting at position ``start``."""
    out = [first_token]
    for i in range(num_tokens - 1):
        logits = model.step(cache, [(seq_id, [out[-1]], start + i)], backend=backend)
        out.append(int(logits[0].argmax()))
    return out


def test_config_validates_fields():
    with pytest.raises(ValueError, match="num_kv_heads"):
        LlamaConfig(num_q_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="hidden_size"):
        LlamaConfig(hidden_size=250)
    assert LlamaConfig().head_dim == 64


def test_same_seed_same_weights_other_seed_differs():
    a, b, c = LlamaModel(LlamaConfig(seed=3)), LlamaModel(LlamaConfig(seed=3)), LlamaModel(LlamaConfig(seed=4))
    assert torch.equal(a.layers[0].wq.weight, b.layers[0].wq.weight)
    assert not torch.equal(a.layers[0].wq.weight, c.layers[0].wq.weight)


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_logits_equal_dense_logits(backend, model):
    cache = model.new_kv_cache(num_blocks=8, block_size=16)
    logits = _prefill(model, cache, "s", PROMPT, [len(PROMPT)], backend)
    dense = model.forward_dense(torch.tensor(PROMPT, device=logits.device))[-1]
    torch.testing.assert_close(logits, dense, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [16, pytest.param(32, marks=pytest.mark.slow)])   # 32: -m slow
def test_chunked_prefill_then_decode_equals_greedy_reference(backend, block_size, model):
    num_new = 8
    expected = model.generate_greedy(PROMPT, num_new)
    cache = model.new_kv_cache(num_blocks=12, block_size=block_size)
    cache.reserve("other", 20)  # the sequence does not start at block 0
    logits = _prefill(model, cache, "s", PROMPT, [11, 5, 13], backend)
    generated = _decode(model, cache, "s", int(logits.argmax()), len(PROMPT), num_new, backend)
    assert generated == expected


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=[needs_triton, pytest.mark.slow])])
def test_evict_then_recompute_continues_identically(backend, model):
    """Decode 5 tokens, evict (free every block), recompute prompt + generated, decode on."""
    expected = model.generate_greedy(PROMPT, 10)
    cache = model.new_kv_cache(num_blocks=10, block_size=16)
    logits = _prefill(model, cache, "s", PROMPT, [16, 13], backend)
    first = _decode(model, cache, "s", int(logits.argmax()), len(PROMPT), 5, backend)
    old_blocks = cache.blocks_of("s")
    cache.reserve("filler", cache.num_free_blocks * 16)  # so the next owner must take the freed blocks
    cache.free("s")
    # another sequence overwrites the freed blocks; the refill lands elsewhere
    _prefill(model, cache, "intruder", PROMPT[::-1][:20], [20], backend)
    assert set(cache.blocks_of("intruder")) <= set(old_blocks)
    cache.free("filler")
    refill = PROMPT + first[:-1]  # the last generated token has no KV yet: it is the next input
    _prefill(model, cache, "s", refill, [20, len(refill) - 20], backend)
    rest = _decode(model, cache, "s", first[-1], len(refill), 6, backend)
    assert first + rest[1:] == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_batch_equals_sequences_run_alone(backend, model):
    """One prefill chunk and one decode token in the same batch give the logits of separate runs."""
    cache = model.new_kv_cache(num_blocks=12, block_size=16)
    _prefill(model, cache, "a", PROMPT[:10], [10], backend)
    _prefill(model, cache, "b", PROMPT[5:25], [20], backend)
    batch = [("a", PROMPT[10:17], 10), ("b", [PROMPT[25]], 20)]
    together = model.step(cache, batch, backend=backend)
    for i, (_, _ids, _m) in enumerate(batch):
        seq = PROMPT[:17] if i == 0 else PROMPT[5:26]
        dense = model.forward_dense(torch.tensor(seq, device=together.device))[-1]
        torch.testing.assert_close(together[i], dense, atol=1e-4, rtol=1e-4)
