"""Causal prefill attention (issue 19 §1): a one-shot prefill is never dearer than the same prompt in chunks.

For every registered cost model (and parallel variants, whose ring SP adds a non-linear term): the
attention part of a one-shot prefill of L tokens is at most the chunked total, and the non-attention
part differs only by per-batch constants.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infermax.costmodel import available_cost_models, get_cost_model
from infermax.costmodel.linear import LinearCoefficients, LinearCostModel, prefill_attention_work


def _registered() -> list[str]:
    """Every registered name (the roofline and scaled prefixes at GPU/model pairs) plus parallel variants."""
    names = [n for n in available_cost_models() if n not in ("roofline", "scaled")]
    names += ["roofline:a100/llama2-7b", "roofline:h100/llama3-8b", "scaled:a100/mistral-7b-v0.3",
              "scaled:a100/yi-34b@tp=4"]
    assert {"roofline", "scaled"} <= set(available_cost_models()) and len(names) >= 9
    return names + ["a100/llama2-7b@tp=2,pp=2", "a100/llama2-7b@sp=4,sp_kind=ring", "a100/llama2-7b@kvp=2",
                    "roofline:a100/llama2-7b@sp=2,sp_kind=ring"]


MODELS = {name: get_cost_model(name) for name in _registered()}


def _per_batch_parts(model, c: int) -> tuple[float, float]:
    """(non-attention s, its per-batch constant bound s) of a one-request batch of c tokens."""
    if isinstance(model, LinearCostModel):
        k = model.coefficients
        return float(k.nonattention_s(c)) + k.request_s, max(a for a, _ in k.nonattn_lines) + k.request_s
    t = model.terms
    return float(t.nonattention_s(c)), max(a for a, _ in t.nonattn_lines)


def _prefill(model, chunks: list[int]) -> tuple[float, float, float]:
    """(attention s, non-attention s, per-batch constant bound s) summed over the chunks of one prompt."""
    attn = nonattn = const = 0.0
    done = 0
    for c in chunks:
        t = model.batch_time(np.array([c]), np.array([done]), np.array([False]))
        na, bias = _per_batch_parts(model, c)
        attn, nonattn, const = attn + t - na, nonattn + na, const + bias
        done += c
    return attn, nonattn, const


@st.composite
def chunkings(draw) -> tuple[int, list[int]]:
    length = draw(st.integers(1, 200_000))
    cuts = draw(st.lists(st.integers(1, max(1, length - 1)), max_size=40, unique=True)) if length > 1 else []
    edges = [0, *sorted(cuts), length]
    return length, [b - a for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("name", list(MODELS))
@settings(max_examples=10)
@given(chunkings())
@example((4096, [512] * 8)).via("issue 19: 4K in 8 x 512")
@example((16384, [512] * 32)).via("issue 19: 16K in 32 x 512")
@example((100_000, [4096] * 24 + [1696])).via("issue 19: 100K in 25 x 4096")
def test_one_shot_prefill_is_never_dearer_than_chunks(name, case):
    model = MODELS[name]
    length, chunks = case
    attn_one, na_one, _ = _prefill(model, [length])
    attn_chunked, na_chunked, const = _prefill(model, chunks)
    tol = 1e-9 * (attn_chunked + na_chunked)
    assert attn_one <= attn_chunked + tol
    assert na_one <= na_chunked + tol                          # convex lines with biases >= 0
    assert na_chunked - na_one <= const + tol                  # ... differing by per-batch constants only
    if getattr(model, "is_linear", False):                      # exactly L(L+1)/2 pairs: only the biases differ
        bias = model.coefficients.prefill_bias_s
        assert attn_chunked - attn_one == pytest.approx((len(chunks) - 1) * bias, rel=1e-6, abs=1e-9 * attn_one)


def test_causal_work_is_chunking_invariant_and_halves_the_square():
    c = np.array([1, 7, 512, 4096])
    m = np.array([0, 3, 1024, 0])
    assert prefill_attention_work(c, m).tolist() == [1.0, 49.0, 655_616.0, 8_390_656.0]   # c·m + c(c+1)/2
    assert float(prefill_attention_work(np.full(8, 512), np.arange(8) * 512).sum()) == 4096 * 4097 / 2
    k = LinearCoefficients(nonattn_lines=((0.0, 0.0),), decode_bias_s=0.0, decode_kv_s=0.0, prefill_bias_s=0.0,
                           prefill_attn_s=1.0)
    assert LinearCostModel(k).batch_time(c, m, np.zeros(4, bool)) == float(prefill_attention_work(c, m).sum())
