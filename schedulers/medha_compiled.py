"""Medha's batch rule compiled (numba), where it covers the run: the Python side of :mod:`.medha_kernel`.

:func:`batcher` returns, at :meth:`Medha.reset <infermax.schedulers.medha.Medha.reset>`, the function that plans
each batch through :func:`.medha_kernel.medha_batch` — the plan :meth:`Medha.next_batch` makes on its sums path,
bit for bit — or None: then Medha plans in Python. It covers a :class:`~infermax.costmodel.LinearCostModel` whose
timer and chunk bound are the class's own, with positive attention and non-negative token slopes (the solved bound
then always exists and is finite), and runs of at least :data:`MIN_TOKENS` prompt and output tokens (a smaller one
costs less in Python than loading numba); ``INFERMAX_COMPILED=1`` in the environment: every run it covers,
``INFERMAX_PURE=1``: none (the reference). tests/test_medha_speed.py compares the three.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from infermax.compiled import wanted

from .base import Plan

#: a run with fewer prompt + output tokens than this plans in Python (numba's import and cache load cost more)
MIN_TOKENS = 500_000

_NO_IDX = np.zeros(0, dtype=np.int64)
_NO_IDX.setflags(write=False)


def _covered(cost: Any) -> bool:
    """The kernel's timer and bound are this cost model's: the class's own, its slopes as the kernel assumes."""
    from infermax.costmodel import LinearCostModel
    if not isinstance(cost, LinearCostModel) or cost.work_timer() is None:
        return False
    if (getattr(cost._time_of_work, "__func__", None) is not LinearCostModel._time_of_work
            or getattr(cost.chunk_bound, "__func__", None) is not LinearCostModel.chunk_bound):
        return False
    lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = cost._k
    nums = [d_bias, d_kv, p_bias, p_attn, p_tok, req] + [x for line in lines for x in line]
    return (len(lines) > 0 and all(math.isfinite(x) for x in nums) and p_attn > 0 and p_tok >= 0
            and all(b >= 0 for _, b in lines))


def batcher(sched: Any, state: Any) -> "Callable[[Any], Plan] | None":
    """Medha's compiled planner for this run (``sched`` just reset on ``state``), or None (plan in Python)."""
    if sched._timer is None or not _covered(state.cost):
        return None
    size = int(state.input_lens.sum()) + int(state.output_lens.sum())
    if not wanted(getattr(state, "compiled", None), size, MIN_TOKENS):
        return None
    from infermax.state import RUNNING, WAITING

    from . import medha_kernel as K
    lim, n = state.limits, int(state.m.size)
    lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = state.cost._k
    icfg = np.zeros(9, dtype=np.int64)
    icfg[[K.I_R, K.I_BLOCKS, K.I_C, K.I_P, K.I_FCFS, K.I_MIN_CHUNK, K.I_NO_TPOT, K.I_WAITING, K.I_RUNNING]] = (
        sched._R, lim.num_blocks, lim.C, lim.P, sched.fcfs, sched.min_chunk, sched._no_tpot, WAITING, RUNNING)
    fc = np.zeros(9)
    fc[[K.F_TARGET, K.F_SHARE, K.F_D_BIAS, K.F_D_KV, K.F_P_BIAS, K.F_P_ATTN, K.F_P_TOK, K.F_REQ]] = (
        sched.target_batch_s, sched.max_share, d_bias, d_kv, p_bias, p_attn, p_tok, req)
    ints = np.zeros((6, n), dtype=np.int64)
    ints[K.PEAK] = state.peak_kv_blocks
    ints[[K.PRED_M, K.PRED_INP]] = -1
    floats = np.zeros((6, n))
    floats[K.TPOT], floats[K.TTFT], floats[K.ARRIVAL] = sched._tpot, sched._ttft, state.arrivals_s
    floats[K.DEADLINE] = state.arrivals_s + sched._ttft       # (the slack's deadline: the same sum, elementwise)
    sched._pred_m, sched._pred_inp, sched._pred_s = ints[K.PRED_M], ints[K.PRED_INP], floats[K.PRED_S]  # (one cache)
    lines2 = np.array([[float(a) for a, _ in lines], [float(b) for _, b in lines]])
    out_idx, out_tok = ints[K.OUT_IDX], ints[K.OUT_TOK]
    kernel = K.medha_batch

    def plan(st: Any) -> Plan:
        fc[K.F_CLOCK] = st.clock_s
        k = kernel(st.active, st.status, st.m, st.inp, ints, floats, lines2, icfg, fc)
        return Plan(out_idx[:k].copy(), out_tok[:k].copy(), _NO_IDX)

    return plan
