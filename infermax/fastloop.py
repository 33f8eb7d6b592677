"""The simulator's compiled loop: GetNextBatch's vLLM and Sarathi batches and the state's transition, in numba.

For the schedulers of the Algorithm 1 family whose decisions it covers (:meth:`GetNextBatch.loop_spec
<infermax.schedulers.framework.GetNextBatch.loop_spec>`: a static first-come-first-served order, the lowest
priority evicted first, no look-ahead, no pinned requests — vLLM, Sarathi and their ``-real`` presets among
them) and a cost model with :meth:`~infermax.costmodel.LinearCostModel.work_coefficients`, :func:`run`
plays the simulator's loop — plan (GetNextBatch's groups, CanAllocate, GotoNextGroupOrEvict), execute (the
linear cost model), commit (``ServingState.apply``), idle until the next arrival — as one compiled function
over the state's own arrays, and hands back the batches and the trace records in flat arrays, a chunk at a
time. The schedule, the trace and the state it leaves are the pure path's, bit for bit: the same integers,
the same float operations in the same order (no fast-math). The pure path (``next_batch`` and ``apply``,
selected by ``simulate(..., compiled=False)`` or ``INFERMAX_PURE=1``) is the reference that
``tests/test_fastloop.py`` compares it with.

numba is imported, and the loop compiled (then cached on disk), on first use only.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import fastloop_layout as L
from .compiled import timer_arrays, wanted
from .fastloop_layout import EVICTED_NONE, FINISHED, STUCK, LoopSpec
from .schedule import Batch

#: a run smaller than this (Σ output tokens) stays on the pure path, which costs less than loading the loop
MIN_OUTPUT_TOKENS = 100_000
# complexity: one condition per case the loop does not cover, each a plain early return
def spec_for(state: Any, sched: Any, compiled: bool | None) -> LoopSpec | None:
    """The loop's spec when it may run this simulation (``compiled`` and the environment as
    :func:`infermax.compiled.wanted` reads them, by the run's output tokens), else None: then the simulator runs
    the pure path."""
    loop_spec = getattr(sched, "loop_spec", None)
    if loop_spec is None or timer_arrays(state.cost) is None:
        return None
    if (state._dispatched or state.external_kv or state.hands_off or state.serves is not None
            or state.horizon_s is not None or state.num_batches or state._received):
        return None
    lim = state.limits
    if lim.C * (2 * lim.M + lim.C + 1) >= 1 << 62:
        return None     # a batch's Σ c (2m + c + 1) might not fit the loop's int64 (the pure path's are exact)
    if not wanted(compiled, int(state.output_lens.sum()), MIN_OUTPUT_TOKENS):
        return None
    return loop_spec(state)


# --- the Python side: one chunk at a time ------------------------------------------------------------------
class _Buffers:
    """The loop's scratch and output arrays, sized for the workload, the batch budget and a chunk."""

    def __init__(self, n: int, spec: LoopSpec, chunk_batches: int) -> None:
        self.act, self.rl, self.wl = (np.zeros(n, dtype=np.int64) for _ in range(3))
        self.rpos = np.zeros(n, dtype=np.int64)
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.cand = np.zeros(n, dtype=np.int64)
        self.p_idx = np.zeros(n, dtype=np.int64)
        self.p_tok = np.zeros(n, dtype=np.int64)
        self.p_ev = np.zeros(n, dtype=np.int64)
        self.b_off, self.b_n, self.b_evoff, self.b_nev, self.b_rep = (np.zeros(chunk_batches, dtype=np.int64)
                                                                       for _ in range(5))
        self.b_nb = np.zeros(chunk_batches)
        # room for a chunk's distinct batches' requests: a chunk stops before a batch that might not fit
        flat = 4 * n + (1 << 20)
        self.f_idx, self.f_tok = np.zeros(flat, dtype=np.int64), np.zeros(flat, dtype=np.int64)
        self.f_ev = np.zeros(2 * n + (1 << 16), dtype=np.int64)
        self.t_start, self.t_dur = np.zeros(chunk_batches), np.zeros(chunk_batches)
        self.t_rec = np.zeros((chunk_batches, 7), dtype=np.int64)


def run(state: Any, spec: LoopSpec, out: Any, recorder: Any, ids: np.ndarray,
        progress: Callable[[int, int], None] | None = None, chunk_batches: int = 1 << 16) -> int:
    """Run the simulation from a fresh ``state`` to its end (or until no batch can run): the batches go to
    ``out`` (``add(batch, repeat)``), their records to ``recorder`` (``add_columns``), and the state is left
    as the pure path leaves it. Returns :data:`FINISHED`, :data:`STUCK` (nothing runs and nothing arrives)
    or :data:`EVICTED_NONE` (a batch evicted requests and scheduled none), for the simulator to report."""
    loop = _kernel()
    w, lim = state.workload, state.limits
    n = len(w)
    buf = _Buffers(n, spec, chunk_batches)
    cfg = np.array([spec.prefill_first, spec.hybrid, spec.chunked, spec.C, spec.P, spec.R, spec.blocks,
                    spec.watermark, spec.block_size, lim.C, lim.P, lim.M, lim.max_running, lim.num_blocks,
                    state._shift if state._mask else 0],
                   dtype=np.int64)
    la, lb, co = timer_arrays(state.cost)
    sc = np.zeros(L.NUM_SC, dtype=np.int64)
    sc[[L.KV, L.BLK_USED, L.NRUN, L.NDONE, L.NB, L.NEXT, L.NQ, L.PF_LEFT, L.DEC_LEFT, L.VERSION]] = (
        state.kv_used, state.blocks_used, state.num_running, state.num_done, state.num_batches,
        state._next_arrival, state._num_queued, state.prefill_tokens_left, state.decode_tokens_left, state.version)
    fs = np.array([state.clock_s, 0.0])
    admit_s = np.ascontiguousarray(state._admit_s, dtype=np.float64)
    try:
        while True:
            loop(state.m, state.inp, state.gen, state.status, state.output_lens, admit_s, state._arrival_order,
                 state.first_scheduled_s, state.first_token_s, state.completion_s, state.num_evictions,
                 state.refill_tokens, state.num_suspensions, state._last_batch,
                 buf.act, buf.rl, buf.wl, buf.rpos, buf.stamp, buf.cand, buf.p_idx, buf.p_tok, buf.p_ev,
                 la, lb, co, cfg, sc, fs, buf.b_off, buf.b_n, buf.b_evoff, buf.b_nev, buf.b_rep, buf.b_nb,
                 buf.f_idx, buf.f_tok, buf.f_ev, buf.t_start, buf.t_dur, buf.t_rec)
            _emit(buf, sc, ids, out, recorder)
            if progress is not None:
                progress(int(sc[L.NDONE]), n)
            code = int(sc[L.CODE])
            if code != L.FULL:
                break
    finally:
        _write_back(state, sc, fs)
    if code in L.BROKEN:     # (a bug of the loop: the pure path never plans such a batch)
        raise RuntimeError(f"the compiled loop planned batch {int(sc[L.ERR_BATCH])} breaking rule "
                           f"{L.BROKEN[code]}; simulate(..., compiled=False) runs the reference path")
    return code


def _emit(buf: _Buffers, sc: np.ndarray, ids: np.ndarray, out: Any, recorder: Any) -> None:
    """A chunk's batches to ``out`` and its records to ``recorder``."""
    nd, nt, nf, nev = (int(x) for x in sc[[L.ND, L.NT, L.NF, L.NEV]])
    if nt:
        recorder.add_columns(buf.t_start[:nt].copy(), buf.t_dur[:nt].copy(), buf.t_rec[:nt].copy())
    if not nd:
        return
    req_ids = ids[buf.f_idx[:nf]]
    tokens = buf.f_tok[:nf].copy()
    ev_ids = ids[buf.f_ev[:nev]]
    no_ids = ids[:0]
    off, cnt, evoff, nevs, reps, nbs = (a[:nd].tolist() for a in (buf.b_off, buf.b_n, buf.b_evoff, buf.b_nev,
                                                                      buf.b_rep, buf.b_nb))
    add, trusted = out.add, Batch.trusted
    for q in range(nd):
        a, b = off[q], off[q] + cnt[q]
        ev = ev_ids[evoff[q]:evoff[q] + nevs[q]] if nevs[q] else no_ids
        add(trusted(req_ids[a:b], tokens[a:b], ev, nbs[q]), reps[q])


def _write_back(state: Any, sc: np.ndarray, fs: np.ndarray) -> None:
    """The state's scalars as the loop left them (its arrays were updated in place); every cache keyed on
    ``version`` is stale."""
    state.kv_used, state.blocks_used, state.num_running, state.num_done, state.num_batches = (
        int(x) for x in sc[[L.KV, L.BLK_USED, L.NRUN, L.NDONE, L.NB]])
    state._next_arrival = int(sc[L.NEXT])
    state.prefill_tokens_left, state.decode_tokens_left = int(sc[L.PF_LEFT]), int(sc[L.DEC_LEFT])
    state.version = int(sc[L.VERSION]) + 1
    state.clock_s = float(fs[0])
    state._note_head()


# --- the compiled side ---------------------------------------------------------------------------------------
def _kernel():
    """The compiled loop: numba imported and the functions compiled, or loaded from numba's cache, on first use
    (compiled again when the cached code holds other layout constants than the ones imported now)."""
    from . import fastloop_kernel as k
    if k.layout_key() != k.LAYOUT_KEY:
        k.flush_cache()
    return k.loop


__all__ = ["EVICTED_NONE", "FINISHED", "LoopSpec", "MIN_OUTPUT_TOKENS", "STUCK", "run", "spec_for"]
