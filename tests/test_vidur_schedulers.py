"""Vidur's whole-prompt replica schedulers (schedulers/orca.py, fastertransformer.py, lightllm.py): the
behaviour each one is defined by, beyond the invariants every registered scheduler is held to
(tests/test_schedulers_finish.py runs them on the tight instances)."""
import itertools

import numpy as np
import pytest
from factories import make_workload, small_instances
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload, replay, simulate
from infermax.schedulers import get_scheduler
from infermax.schedulers.lightllm import future_peak

NAMES = ["orca", "fastertransformer", "lightllm"]


def _phases(result, w):
    """Per batch: (ids, tokens, which of them were prefill chunks) walked from the schedule."""
    m = np.zeros(len(w), dtype=np.int64)
    out = []
    for b in result.schedule:
        idx = w.indices_of(b.ids)
        pre = m[idx] < w.input_lens[idx]
        out.append((idx, np.asarray(b.tokens), pre))
        m[idx] += b.tokens
    return out


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(inst=small_instances(max_requests=8, max_len=20))
def test_whole_prompts_no_eviction_and_the_judge_agrees(name, inst):
    w, lim = inst
    res = simulate(w, name, lim)
    assert replay(res.schedule, w, lim) == res.trace
    assert res.metrics["num_evictions"] == 0
    for idx, tok, pre in _phases(res, w):
        assert np.array_equal(tok[pre], w.input_lens[idx[pre]])     # a prompt is prefilled whole
        assert (tok[~pre] == 1).all()


def test_orca_holds_at_most_M_over_max_tokens_requests():
    w = make_workload([(8, 30)] * 6)
    lim = Limits(M=3 * 50, C=64)
    res = simulate(w, "orca:max_tokens=50", lim)        # 3 slots of 50 KV tokens, though a request peaks at 37
    running = [len(idx) for idx, _, _ in _phases(res, w)]
    assert max(running) == 3
    assert simulate(w, "orca", lim).schedule != res.schedule      # its own peak (37) gives 4 slots


def test_orca_batches_are_hybrid_and_fcfs():
    w = make_workload([(10, 5), (10, 5), (10, 5)], arrivals=[0.0, 0.001, 0.002])
    res = simulate(w, "orca", Limits(M=1000, C=64))
    phases = _phases(res, w)
    assert any(pre.any() and (~pre).any() for _, _, pre in phases)   # decodes beside a whole prompt
    first = res.trace.requests["first_scheduled_s"]
    assert np.all(np.diff(first) >= 0)


def test_orca_refuses_a_prompt_over_C_and_a_too_small_max_tokens():
    w = make_workload([(100, 4), (10, 4)])
    with pytest.raises(ValueError, match=r"request 0 has 100 prompt tokens > min\(C = 64"):
        simulate(w, "orca", Limits(M=1000, C=64))
    with pytest.raises(ValueError, match="max_tokens = 50"):
        simulate(w, "orca:max_tokens=50", Limits(M=1000, C=256))
    with pytest.raises(ValueError, match="max_tokens = 2000 needs 2000 KV blocks, more than M = 1000"):
        simulate(w, "orca:max_tokens=2000", Limits(M=1000, C=256))


def test_fastertransformer_admits_only_when_the_cohort_is_done():
    w = make_workload([(5, 3), (5, 9), (5, 2), (5, 4)], arrivals=[0.0, 0.0, 0.0001, 0.0002])
    res = simulate(w, "fastertransformer", Limits(M=1000, C=64))
    req = res.trace.requests
    first, done = req["first_scheduled_s"], req["completion_s"]
    cohorts = {}
    for i in range(len(w)):
        cohorts.setdefault(first[i], []).append(i)
    starts = sorted(cohorts)
    assert len(starts) == 2 and cohorts[starts[0]] == [0, 1]       # 2 and 3 arrived while 0, 1 ran
    assert starts[1] >= max(done[i] for i in cohorts[starts[0]])    # ... and waited for the slower one


def test_lightllm_never_mixes_phases_and_tries_a_prefill_every_k_decodes():
    w = make_workload([(4, 40)] + [(4, 3)] * 3, arrivals=[0.0, 0.0005, 0.0006, 0.0007])
    res = simulate(w, "lightllm:max_waiting_iters=5", Limits(M=1000, C=64))
    phases = _phases(res, w)
    assert all(pre.all() or not pre.any() for _, _, pre in phases)
    kinds = "".join("p" if pre.any() else "d" for _, _, pre in phases)
    first_decode_run = kinds[1:].split("p")[0]
    assert len(first_decode_run) == 5, kinds                       # request 1 waited 5 decode batches


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=6),
       st.sampled_from([1, 3, 16]))
def test_future_peak_is_the_most_kv_in_use_when_decoding_in_lockstep(reqs, block):
    held = np.array([h for h, _ in reqs])
    left = np.array([g for _, g in reqs])
    brute = 0
    for t in range(int(left.max()) + 1):          # after t steps, those with left >= t still hold held + t
        alive = left >= t
        brute = max(brute, int((-(-(held[alive] + t) // block)).sum()))
    assert future_peak(held, left, block) == brute


def test_lightllm_admits_only_while_the_future_peak_fits():
    # request 1 (I = 4, O = 20) arrives beside request 0 (the same) and is tried after 10 decodes: request 0
    # then holds 14 tokens and grows 9 more, so the peak is max(4 + 19, 14 + 4 + 2 * 9) = 36
    w = make_workload([(4, 20), (4, 20)], arrivals=[0.0, 1e-4])
    kinds = {}
    for M in (36, 35):
        res = simulate(w, "lightllm", Limits(M=M, C=64))
        kinds[M] = "".join("p" if pre.any() else "d" for _, _, pre in _phases(res, w))
    assert kinds[36].startswith("p" + "d" * 10 + "p")
    assert kinds[35].startswith("p" + "d" * 19 + "p")        # refused until request 0 completed


@pytest.mark.parametrize("name", NAMES)
def test_options_are_checked(name):
    with pytest.raises(ValueError, match="R_max"):
        get_scheduler(f"{name}:R_max=0")


@pytest.mark.parametrize("name, block", itertools.product(NAMES, [4, 16]))
def test_in_blocks(name, block):
    w = Workload.from_spec("fixed:I=30,O=20,B=12")
    lim = Limits(M=block * 40, C=512, block_size=block)
    res = simulate(w, name, lim)
    assert replay(res.schedule, w, lim) == res.trace
