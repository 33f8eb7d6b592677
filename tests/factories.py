"""Factories shared by the tests (imported as `from factories import ...`)."""
from __future__ import annotations

import os

from hypothesis import strategies as st

from infermax import Limits, Workload
from infermax.schedulers import available, get_scheduler

#: every registered scheduler that runs on the instance it is given; the ``*-real`` presets apply
#: their own KV block size (16 tokens, more than the tiny instances' caches hold) and are tested on
#: block instances (test_blocks.py, test_schedulers_finish.py)
ALL_SCHEDULERS = [n for n in available() if get_scheduler(n).block_size is None]


def use_triton_interpreter_without_cuda() -> bool:
    """Without a CUDA device, run Triton kernels in its CPU interpreter (set before the first ``import triton``).

    Returns whether a CUDA device is present."""
    try:
        import torch
    except ImportError:
        cuda = False
    else:
        cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return cuda


def make_workload(lengths, arrivals=None, name="test") -> Workload:
    """Workload from [(I, O), ...] pairs."""
    ins, outs = zip(*lengths)
    return Workload.from_lengths(ins, outs, arrivals, name=name)


@st.composite
def small_instances(draw, max_requests: int = 12, max_len: int = 40, online: bool = True, small_P: bool = False):
    """A random (workload, limits) pair where every request fits in M (tiny M forces evictions)."""
    n = draw(st.integers(1, max_requests))
    ins = draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n))
    peak = max(i + o - 1 for i, o in zip(ins, outs))
    M = draw(st.integers(peak, peak + 4 * max_len))
    C = draw(st.integers(max(ins) + max(outs), 4 * max_len + 8))  # non-chunked refills must fit in C
    # P below a prompt would stall the non-chunked schedulers (an input error tested elsewhere)
    P = draw(st.one_of(st.none(), st.integers(1 if small_P else max(ins) + max(outs), C)))
    R_max = draw(st.one_of(st.none(), st.integers(1, n + 1)))
    arrivals = None
    if online and draw(st.booleans()):
        arrivals = sorted(draw(st.lists(st.floats(0, 0.5, allow_nan=False), min_size=n, max_size=n)))
    return Workload.from_lengths(ins, outs, arrivals, name="random"), Limits(M=M, C=C, P=P, R_max=R_max)


