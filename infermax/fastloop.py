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

import importlib.util
import os
from typing import Any, Callable, NamedTuple

import numpy as np

from .schedule import Batch
from .status import DONE, RUNNING, WAITING

#: a run smaller than this (Σ output tokens) stays on the pure path, which costs less than loading the loop
MIN_OUTPUT_TOKENS = 100_000
# the groups' kinds (GetNextBatch's DECODE_GROUP, PREFILL_GROUP, WAITING_GROUP) and the batch phases
_DEC, _PF, _WAIT = 0, 1, 2
_NO_PHASE, _PREFILL, _DECODE = 0, 1, 2
# cfg: the scheduler's and the limits' numbers
(_PREFILL_FIRST, _HYBRID, _CHUNKED, _C, _P, _R, _BLOCKS, _WM, _BS, _LIM_C, _LIM_P, _LIM_M, _LIM_RUN,
 _LIM_BLOCKS) = range(14)
# sc: the state's integers (in and out) and the chunk's counters (out)
(_KV, _BLK_USED, _NRUN, _NDONE, _NB, _NEXT, _NQ, _PF_LEFT, _DEC_LEFT, _VERSION, _NA, _UPTO, _CODE, _ND, _NT,
 _NF, _NEV, _ERR_BATCH) = range(18)
_NUM_SC = 18
# what a chunk ended with (sc[_CODE])
FINISHED, FULL, STUCK, EVICTED_NONE, BROKE_C, BROKE_P, BROKE_M, BROKE_BLOCKS, BROKE_RUN = range(9)
_BROKEN = {BROKE_C: "C", BROKE_P: "P", BROKE_M: "M", BROKE_BLOCKS: "M-blocks", BROKE_RUN: "R_max"}
# the budgets of the batch under construction (bud)
_BC, _BP, _BMEM, _BRUN, _BPHASE, _BPN, _BNE = range(7)


class LoopSpec(NamedTuple):
    """What the compiled loop needs of a scheduler (:meth:`GetNextBatch.loop_spec`): its groups' order
    (prefills first, as vLLM, or decodes, as Sarathi), hybrid batches, chunked prefill, its C, P and
    running budgets, its KV budget in blocks and the admission watermark (blocks), and the block size."""

    prefill_first: bool
    hybrid: bool
    chunked: bool
    C: int
    P: int
    R: int
    blocks: int
    watermark: int
    block_size: int


def spec_for(state: Any, sched: Any, compiled: bool | None) -> LoopSpec | None:
    """The loop's spec when it may run this simulation (``compiled``: None decides by the run's size, or takes
    ``INFERMAX_COMPILED=1`` from the environment as True; True runs it whenever it can; False never), else None:
    then the simulator runs the pure path."""
    if compiled is False or os.environ.get("INFERMAX_PURE") == "1":
        return None
    if compiled is None and os.environ.get("INFERMAX_COMPILED") == "1":
        compiled = True       # (every run it covers, whatever its size: the identity check runs so)
    loop_spec = getattr(sched, "loop_spec", None)
    coef = getattr(state.cost, "work_coefficients", None)
    if loop_spec is None or coef is None or coef() is None or not coef()[0]:
        return None
    if (state._dispatched or state.external_kv or state.hands_off or state.serves is not None
            or state.horizon_s is not None or state.num_batches or state._received):
        return None
    if compiled is None and int(state.output_lens.sum()) < MIN_OUTPUT_TOKENS:
        return None
    if importlib.util.find_spec("numba") is None:
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
                    spec.watermark, spec.block_size, lim.C, lim.P, lim.M, lim.max_running, lim.num_blocks],
                   dtype=np.int64)
    lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = state.cost.work_coefficients()
    la = np.array([float(a) for a, _ in lines])
    lb = np.array([float(b) for _, b in lines])
    co = np.array([d_bias, d_kv, p_bias, p_attn, p_tok, req], dtype=np.float64)
    sc = np.zeros(_NUM_SC, dtype=np.int64)
    sc[[_KV, _BLK_USED, _NRUN, _NDONE, _NB, _NEXT, _NQ, _PF_LEFT, _DEC_LEFT, _VERSION]] = (
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
                progress(int(sc[_NDONE]), n)
            code = int(sc[_CODE])
            if code != FULL:
                break
    finally:
        _write_back(state, sc, fs)
    if code in _BROKEN:     # (a bug of the loop: the pure path never plans such a batch)
        raise RuntimeError(f"the compiled loop planned batch {int(sc[_ERR_BATCH])} breaking rule "
                           f"{_BROKEN[code]}; simulate(..., compiled=False) runs the reference path")
    return code


def _emit(buf: _Buffers, sc: np.ndarray, ids: np.ndarray, out: Any, recorder: Any) -> None:
    """A chunk's batches to ``out`` and its records to ``recorder``."""
    nd, nt, nf, nev = (int(x) for x in sc[[_ND, _NT, _NF, _NEV]])
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
        int(x) for x in sc[[_KV, _BLK_USED, _NRUN, _NDONE, _NB]])
    state._next_arrival = int(sc[_NEXT])
    state.prefill_tokens_left, state.decode_tokens_left = int(sc[_PF_LEFT]), int(sc[_DEC_LEFT])
    state.version = int(sc[_VERSION]) + 1
    state.clock_s = float(fs[0])
    state._note_head()


# --- the compiled side ---------------------------------------------------------------------------------------
_LOOP = None


def _kernel():
    """The compiled loop (numba imported and the functions compiled, or loaded from numba's cache, once)."""
    global _LOOP
    if _LOOP is None:
        _LOOP = _compile()
    return _LOOP


def _compile():
    from numba import njit

    jit = njit(cache=True, nogil=True)

    @jit
    def blk(t, bs):
        """ceil(t / bs) for t >= 0: the KV blocks t tokens take (t itself when bs is 1)."""
        return (t + bs - 1) // bs

    @jit
    def time_of(la, lb, co, n, ntok, ndec, dkv, work2, ptok):
        """LinearCostModel._time_of_work: the same float operations in the same order."""
        x = float(ntok)
        best = la[0] + lb[0] * x
        for q in range(1, la.size):
            v = la[q] + lb[q] * x
            if v > best:        # (Python's max keeps the first of equals)
                best = v
        t = best + co[5] * float(n)
        if ndec == n or ndec:
            t += co[0] + co[1] * float(dkv)
        if ndec < n:
            t += co[2] + co[3] * (0.5 * float(work2))
            if co[4] != 0.0:
                t += co[4] * float(ptok)
        return t

    @jit
    def admit(status, admit_s, order, sc, clock):
        """ServingState.admit_arrivals."""
        k, nq = sc[_NEXT], sc[_NQ]
        k0 = k
        while k < nq and admit_s[order[k]] <= clock:
            status[order[k]] = WAITING
            k += 1
        if k != k0:
            sc[_NEXT] = k
            sc[_VERSION] += 1

    @jit
    def rebuild(status, order, act, rl, wl, rpos, sc):
        """The active requests (arrival order), the running and the waiting ones among them: GetNextBatch._sets."""
        na, w = sc[_NA], 0
        for q in range(na):
            i = act[q]
            if status[i] != DONE:
                act[w] = i
                w += 1
        for k in range(sc[_UPTO], sc[_NEXT]):
            i = order[k]
            if status[i] != DONE:
                act[w] = i
                w += 1
        sc[_NA], sc[_UPTO] = w, sc[_NEXT]
        nr = nw = 0
        for q in range(w):
            i = act[q]
            if status[i] == RUNNING:
                rpos[i] = nr
                rl[nr] = i
                nr += 1
            else:
                wl[nw] = i
                nw += 1
        return nr, nw

    @jit
    def take(bud, p_idx, p_tok, stamp, j, x, c, phase):
        p_idx[bud[_BPN]] = x
        p_tok[bud[_BPN]] = c
        bud[_BPN] += 1
        stamp[x] = j
        if bud[_BPHASE] == _NO_PHASE:
            bud[_BPHASE] = phase

    @jit
    def compact(cand, lo, hi, stamp, j):
        """cand[lo:hi] without the requests stamped by batch j (in order); its new end."""
        w = lo
        for q in range(lo, hi):
            if stamp[cand[q]] != j:
                cand[w] = cand[q]
                w += 1
        return w

    @jit
    def evict_for(m, inp, cfg, bud, stamp, j, x, need, rl, nr, rpos, p_ev):
        """GetNextBatch._evict_for: evict the lowest-priority running requests after ``x`` (not in the batch)
        until its ``need`` blocks fit (True), else them and ``x`` (False)."""
        bs = cfg[_BS]
        short = need - bud[_BMEM]
        total, found, q = 0, -1, nr - 1
        while q > rpos[x]:
            v = rl[q]
            if stamp[v] != j:
                total += blk(max(m[v], inp[v]), bs)
                if total >= short:
                    found = q
                    break
            q -= 1
        lo = found if found >= 0 else rpos[x] + 1
        count = 0
        for q in range(nr - 1, lo - 1, -1):
            v = rl[q]
            if stamp[v] != j:
                p_ev[bud[_BNE]] = v
                bud[_BNE] += 1
                stamp[v] = j
                count += 1
        if found < 0:
            p_ev[bud[_BNE]] = x
            bud[_BNE] += 1
            stamp[x] = j
            count += 1
            total += blk(max(m[x], inp[x]), bs)
        bud[_BMEM] += total
        bud[_BRUN] += count
        return found >= 0

    @jit
    def admit_fills(m, inp, cfg, bud, cand, lo, hi, waiting):
        """GetNextBatch._admit_fills (and _admit_waiting): how many of cand[lo:hi] take whole (re)fills, and
        their tokens and blocks."""
        bs, wm, blocks = cfg[_BS], cfg[_WM], cfg[_BLOCKS]
        mem = bud[_BMEM]
        x = cand[lo]
        head = inp[x] if waiting else inp[x] - m[x]
        cap = min(bud[_BC], bud[_BP])
        head_mem = blk(head, bs) if waiting else 0
        room = mem - wm if mem < blocks else mem
        if head > cap or (waiting and (bud[_BRUN] < 1 or head_mem > room)):
            return 0, 0, 0
        k, ctok, cmem = 1, head, head_mem
        for q in range(lo + 1, hi):
            x = cand[q]
            t = inp[x] if waiting else inp[x] - m[x]
            if ctok + t > cap:
                break
            if waiting:
                if k + 1 > bud[_BRUN]:
                    break
                own = blk(t, bs)
                cm = cmem + own
                gate = wm if wm and blocks - mem + cm - own > 0 else 0
                if cm > mem - gate:
                    break
                cmem = cm
            ctok += t
            k += 1
        return k, ctok, cmem

    @jit
    def admit_decodes(m, cfg, bud, cand, lo, hi):
        """GetNextBatch._admit_decodes: how many of the decodes cand[lo:hi] fit (C, a new block each that fills
        its last one), and the blocks they take."""
        bs = cfg[_BS]
        if bs == 1:
            k = max(0, min(hi - lo, bud[_BC], bud[_BMEM]))
            return k, k
        end = lo + min(hi - lo, bud[_BC])
        mem, used, k = bud[_BMEM], 0, 0
        for q in range(lo, end):
            x = cand[q]
            new = blk(m[x] + 1, bs) - blk(m[x], bs)
            if used + new > mem:
                break
            used += new
            k += 1
        return k, used

    @jit
    def fill(m, inp, cfg, bud, stamp, j, cand, lo, hi, kind, rl, nr, rpos, p_idx, p_tok, p_ev):
        """GetNextBatch._fill over the group cand[lo:hi] of kind ``kind``: hooks 2-4."""
        bs, wm, blocks = cfg[_BS], cfg[_WM], cfg[_BLOCKS]
        group_phase = _DECODE if kind == _DEC else _PREFILL
        while lo < hi and bud[_BC] > 0:
            if not cfg[_HYBRID] and bud[_BPHASE] != _NO_PHASE and bud[_BPHASE] != group_phase:
                return
            if kind == _DEC:
                k, used = admit_decodes(m, cfg, bud, cand, lo, hi)
                for q in range(lo, lo + k):
                    take(bud, p_idx, p_tok, stamp, j, cand[q], 1, _DECODE)
                bud[_BC] -= k
                bud[_BMEM] -= used
            else:
                waiting = kind == _WAIT
                k, ctok, cmem = admit_fills(m, inp, cfg, bud, cand, lo, hi, waiting)
                for q in range(lo, lo + k):
                    x = cand[q]
                    take(bud, p_idx, p_tok, stamp, j, x, inp[x] if waiting else inp[x] - m[x], _PREFILL)
                bud[_BC] -= ctok
                bud[_BP] -= ctok
                if waiting:
                    bud[_BMEM] -= cmem
                    bud[_BRUN] -= k
            if lo + k == hi or bud[_BC] == 0:
                return
            x = cand[lo + k]
            lo += k + 1
            # hook 4, GotoNextGroupOrEvict, for x
            if m[x] >= inp[x]:
                need = blk(m[x] + 1, bs) - blk(m[x], bs)
                if need > bud[_BMEM]:
                    kept = evict_for(m, inp, cfg, bud, stamp, j, x, need, rl, nr, rpos, p_ev)
                    hi = compact(cand, lo, hi, stamp, j)
                    if kept:
                        lo -= 1
                        cand[lo] = x
                    continue
                return
            new = m[x] == 0
            need = blk(inp[x], bs) if new else 0
            room = bud[_BMEM] - wm if new and bud[_BMEM] < blocks else bud[_BMEM]
            if cfg[_CHUNKED] and need <= room and int(new) <= bud[_BRUN]:
                chunk = min(inp[x] - m[x], bud[_BC], bud[_BP])
                if chunk >= 1:
                    take(bud, p_idx, p_tok, stamp, j, x, chunk, _PREFILL)
                    bud[_BC] -= chunk
                    bud[_BP] -= chunk
                    bud[_BMEM] -= need
                    bud[_BRUN] -= int(new)
            return

    @jit
    def plan(m, inp, cfg, bud, stamp, j, rl, nr, wl, nw, rpos, cand, p_idx, p_tok, p_ev):
        """GetNextBatch.next_batch: the batch's requests and tokens (p_idx, p_tok) and evictions (p_ev). Its
        groups are copied into ``cand`` (fill rewrites its candidates): the running requests at [0, nr), the
        waiting ones after them."""
        bs = cfg[_BS]
        reserved = 0
        for q in range(nr):
            reserved += blk(max(m[rl[q]], inp[rl[q]]), bs)
        bud[_BC], bud[_BP], bud[_BMEM], bud[_BRUN] = cfg[_C], cfg[_P], cfg[_BLOCKS] - reserved, cfg[_R] - nr
        bud[_BPHASE] = bud[_BPN] = bud[_BNE] = 0
        for q in range(nw):
            cand[nr + q] = wl[q]
        if cfg[_PREFILL_FIRST]:     # the waiting requests, then the running ones (all decoding)
            if nw:
                fill(m, inp, cfg, bud, stamp, j, cand, nr, nr + nw, _WAIT, rl, nr, rpos, p_idx, p_tok, p_ev)
            if bud[_BC] == 0 or not nr:
                return
            for q in range(nr):
                cand[q] = rl[q]
            hi = compact(cand, 0, nr, stamp, j) if bud[_BNE] else nr
            fill(m, inp, cfg, bud, stamp, j, cand, 0, hi, _DEC, rl, nr, rpos, p_idx, p_tok, p_ev)
            return
        # the running decodes, the running (re)fills, the waiting requests
        nd = 0
        for q in range(nr):
            if m[rl[q]] >= inp[rl[q]]:
                cand[nd] = rl[q]
                nd += 1
        npf = nd
        for q in range(nr):
            if m[rl[q]] < inp[rl[q]]:
                cand[npf] = rl[q]
                npf += 1
        if nd:
            fill(m, inp, cfg, bud, stamp, j, cand, 0, nd, _DEC, rl, nr, rpos, p_idx, p_tok, p_ev)
        if bud[_BC] == 0:
            return
        if nr > nd:
            hi = compact(cand, nd, nr, stamp, j) if bud[_BNE] else nr
            fill(m, inp, cfg, bud, stamp, j, cand, nd, hi, _PF, rl, nr, rpos, p_idx, p_tok, p_ev)
        if bud[_BC] == 0 or not nw:
            return
        hi = compact(cand, nr, nr + nw, stamp, j) if bud[_BNE] else nr + nw
        fill(m, inp, cfg, bud, stamp, j, cand, nr, hi, _WAIT, rl, nr, rpos, p_idx, p_tok, p_ev)

    @jit
    def apply(m, inp, gen, status, out_len, first_sched, first_tok, compl, n_ev, refill, n_susp, last_b,
              la, lb, co, cfg, sc, fs, bud, p_idx, p_tok, p_ev, rec):
        """ServingState.apply of the planned batch; its (start, duration), its record in rec. The code of a
        broken rule, or 0."""
        bs = cfg[_BS]
        j = sc[_NB]
        start = max(fs[0], fs[1])
        ne, n = bud[_BNE], bud[_BPN]
        for q in range(ne):      # 1. evictions
            e = p_ev[q]
            me = m[e]
            dec = me >= inp[e]
            if dec:
                inp[e] = me + 1
            m[e] = 0
            status[e] = WAITING
            n_ev[e] += 1
            refill[e] += me
            sc[_KV] -= me
            sc[_PF_LEFT] += me + int(dec)
            if bs > 1:
                sc[_BLK_USED] -= blk(me, bs)
            sc[_NRUN] -= 1
        if ne:
            sc[_VERSION] += 1
        ntok = ndec = dkv = work2 = ptok = new_blocks = num_new = 0
        for q in range(n):       # 2. who runs, and how many tokens
            i, c = p_idx[q], p_tok[q]
            m0 = m[i]
            if status[i] == WAITING:
                status[i] = RUNNING
                if not first_sched[i] <= start:
                    first_sched[i] = start
                num_new += 1
            ntok += c
            if m0 >= inp[i]:
                ndec += 1
                dkv += m0 + c
            else:
                work2 += c * (2 * m0 + c + 1)
                ptok += c
            if bs > 1:
                new_blocks += blk(m0 + c, bs) - blk(m0, bs)
        if num_new:
            sc[_VERSION] += 1
        kv, running = sc[_KV] + ntok, sc[_NRUN] + num_new      # 3. limits
        blocks = sc[_BLK_USED] + new_blocks if bs > 1 else 0
        if ntok > cfg[_LIM_C]:
            return 0.0, 0.0, BROKE_C
        if ptok > cfg[_LIM_P]:
            return 0.0, 0.0, BROKE_P
        if kv > cfg[_LIM_M]:
            return 0.0, 0.0, BROKE_M
        if blocks > cfg[_LIM_BLOCKS]:
            return 0.0, 0.0, BROKE_BLOCKS
        if running > cfg[_LIM_RUN]:
            return 0.0, 0.0, BROKE_RUN
        duration = time_of(la, lb, co, n, ntok, ndec, dkv, work2, ptok)     # 4. time
        end = start + duration
        sc[_KV], sc[_BLK_USED], sc[_NRUN] = kv, blocks, running          # 5. commit
        sc[_PF_LEFT] -= ptok
        done = 0
        for q in range(n):
            i, c = p_idx[q], p_tok[q]
            m0, inp0 = m[i], inp[i]
            m1 = m0 + c
            m[i] = m1
            if m0 < inp0 and m0 and last_b[i] < j - 1:      # a (re)fill resumed after a pause
                n_susp[i] += 1
            if m1 >= inp0:
                g = gen[i] + 1
                gen[i] = g
                if g == 1:
                    first_tok[i] = end
                sc[_DEC_LEFT] -= 1
                if g == out_len[i]:
                    compl[i] = end
                    sc[_KV] -= m1
                    if bs > 1:
                        sc[_BLK_USED] -= blk(m1, bs)
                    m[i] = 0
                    status[i] = DONE
                    sc[_NRUN] -= 1
                    done += 1
            last_b[i] = j
        if done:
            sc[_NDONE] += done
            sc[_VERSION] += 1
        fs[0] = end
        sc[_NB] = j + 1
        rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6] = n, ntok, ptok, ndec, kv, running, ne
        return start, duration, 0

    @jit
    def loop(m, inp, gen, status, out_len, admit_s, order, first_sched, first_tok, compl, n_ev, refill, n_susp,
             last_b, act, rl, wl, rpos, stamp, cand, p_idx, p_tok, p_ev, la, lb, co, cfg, sc, fs,
             b_off, b_n, b_evoff, b_nev, b_rep, b_nb, f_idx, f_tok, f_ev, t_start, t_dur, t_rec):
        """The simulator's loop (engine._run) for a chunk of batches: until every request is done (FINISHED),
        the chunk's arrays are full (FULL), or no batch can run (STUCK, EVICTED_NONE)."""
        n_all = m.size
        bud = np.zeros(7, dtype=np.int64)
        nd = nt = nf = nev = 0
        version = -1
        nr = nw = 0
        pure_prev = False        # the last distinct batch is a decode batch (may repeat)
        code = FULL
        while True:
            if sc[_NDONE] == n_all:
                code = FINISHED
                break
            if nt == t_start.size or nd == b_off.size or nf + n_all > f_idx.size or nev + n_all > f_ev.size:
                break
            if sc[_VERSION] != version:
                nr, nw = rebuild(status, order, act, rl, wl, rpos, sc)
                version = sc[_VERSION]
            j = sc[_NB]
            plan(m, inp, cfg, bud, stamp, j, rl, nr, wl, nw, rpos, cand, p_idx, p_tok, p_ev)
            if bud[_BPN] == 0:
                if bud[_BNE]:
                    code = EVICTED_NONE
                    break
                if sc[_NEXT] >= sc[_NQ]:
                    code = STUCK
                    break
                nxt = admit_s[order[sc[_NEXT]]]      # idle until the next arrival
                fs[0] = max(fs[0], nxt)
                admit(status, admit_s, order, sc, fs[0])
                fs[1] = nxt
                continue
            n, ne = bud[_BPN], bud[_BNE]
            rec = t_rec[nt]
            start, duration, broke = apply(m, inp, gen, status, out_len, first_sched, first_tok, compl, n_ev,
                                           refill, n_susp, last_b, la, lb, co, cfg, sc, fs, bud, p_idx, p_tok,
                                           p_ev, rec)
            if broke:
                sc[_ERR_BATCH] = j
                code = broke
                break
            t_start[nt], t_dur[nt] = start, duration
            nt += 1
            # the batch: a repeat of the last distinct one (the same decodes), or a new one
            pure = rec[3] == n and ne == 0 and fs[1] == 0.0
            same = False
            if pure and pure_prev and b_n[nd - 1] == n:
                same = True
                o = b_off[nd - 1]
                for q in range(n):
                    if f_idx[o + q] != p_idx[q]:
                        same = False
                        break
            if same:
                b_rep[nd - 1] += 1
            else:
                b_off[nd], b_n[nd], b_evoff[nd], b_nev[nd], b_rep[nd], b_nb[nd] = nf, n, nev, ne, 1, fs[1]
                for q in range(n):
                    f_idx[nf + q] = p_idx[q]
                    f_tok[nf + q] = p_tok[q]
                for q in range(ne):
                    f_ev[nev + q] = p_ev[q]
                nf += n
                nev += ne
                nd += 1
                pure_prev = pure
            fs[1] = 0.0
            if sc[_NEXT] < sc[_NQ]:
                admit(status, admit_s, order, sc, fs[0])
        sc[_CODE], sc[_ND], sc[_NT], sc[_NF], sc[_NEV] = code, nd, nt, nf, nev
        return code

    return loop


__all__ = ["EVICTED_NONE", "FINISHED", "LoopSpec", "MIN_OUTPUT_TOKENS", "STUCK", "run", "spec_for"]
