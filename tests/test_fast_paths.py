"""Closed forms on the simulator's hot path (issue 41), each against the formula it replaces.

KV blocks by shifts and masks (a power-of-two block size), the most decode steps whose new blocks fit
(closed form against the binary search), the blocks a batch of decodes and one (re)fill adds, and the
blocks after a decode run: the same numbers as the sums over ``ceil(m / block_size)`` they stand for.
"""
import numpy as np
from factories import make_workload
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits
from infermax.costmodel import LinearCostModel
from infermax.schedulers import get_scheduler
from infermax.state import ServingState

_BLOCKS = st.sampled_from([1, 2, 3, 8, 16, 32, 48])
_KV = st.lists(st.integers(1, 5000), min_size=1, max_size=60)


def _ceil_blocks(tokens, b):
    return -(-np.asarray(tokens, dtype=np.int64) // b)


@settings(max_examples=200, deadline=None)
@given(b=_BLOCKS, tokens=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=40))
def test_kv_blocks_is_the_ceiling_for_every_integer(b, tokens):
    lim = Limits(M=10**6, C=4096, block_size=b)
    arr = np.array(tokens, dtype=np.int64)
    assert np.array_equal(lim.kv_blocks(arr), _ceil_blocks(arr, b))
    assert [lim.kv_blocks(t) for t in tokens] == [-(-t // b) for t in tokens]
    assert lim.kv_blocks(2.5) == -(-2.5 // b)      # (a float: the division, as ever)


def _scheduler(b: int):
    s = get_scheduler("vllm")       # (its policy leaves the block size to the Limits)
    s.reset(ServingState(make_workload([(10, 10)] * 4), Limits(M=100_000, C=4096, block_size=b), LinearCostModel()))
    return s


@settings(max_examples=300, deadline=None)
@given(b=_BLOCKS, m=_KV, free=st.integers(-5, 3000))
def test_the_most_decode_steps_in_closed_form_are_the_binary_searchs(b, m, free):
    s = _scheduler(b)
    m = np.array(m, dtype=np.int64)
    assert s._decode_steps(m, free) == s._decode_steps_search(m, free)


def _state(b: int, n: int) -> ServingState:
    return ServingState(make_workload([(5, 5)] * n), Limits(M=10**6, C=4096, block_size=b), LinearCostModel())


@settings(max_examples=300, deadline=None)
@given(b=st.sampled_from([2, 8, 16, 32]), m=_KV, refill=st.booleans(), data=st.data())
def test_the_blocks_a_batch_adds_are_the_sum_of_ceilings(b, m, refill, data):
    state = _state(b, len(m))
    m0 = np.array(m, dtype=np.int64)
    tokens = np.ones(m0.size, dtype=np.int64)
    one = -1
    if refill:
        one = data.draw(st.integers(0, m0.size - 1))
        m0[one] = data.draw(st.integers(0, 3000))
        tokens[one] = data.draw(st.integers(1, 600))
    want = int((_ceil_blocks(m0 + tokens, b) - _ceil_blocks(m0, b)).sum())
    assert state._new_blocks(m0, not refill, one, int(tokens[one]) if refill else 0) == want


@settings(max_examples=300, deadline=None)
@given(b=st.sampled_from([2, 8, 16, 32]), m=_KV, steps=st.integers(1, 400), used=st.integers(0, 50))
def test_the_blocks_after_a_decode_run_are_the_sum_of_ceilings(b, m, steps, used):
    state = _state(b, len(m))
    m0 = np.array(m, dtype=np.int64)
    state.blocks_used = int(_ceil_blocks(m0, b).sum()) + used
    want = state.blocks_used + int((_ceil_blocks(m0 + steps, b) - _ceil_blocks(m0, b)).sum())
    last, bad = state._blocks_after_decodes(m0, steps)
    assert last == want
    assert (bad is None) == (want <= state.limits.num_blocks)
