"""The compiled loop's functions (numba; imported by :func:`infermax.fastloop.run` on first use): GetNextBatch's
groups, CanAllocate and GotoNextGroupOrEvict (:mod:`infermax.schedulers.framework`), ``ServingState.apply``
(:mod:`infermax.state_transitions`) and the linear cost model's batch time
(:meth:`~infermax.costmodel.LinearCostModel.work_timer`), each a line-for-line twin of the pure function it names,
over the state's arrays. Module-level functions, so that numba's on-disk cache holds them across processes.

numba's cache is keyed on this file alone, and the constants these functions read from
:mod:`infermax.fastloop_layout` and :mod:`infermax.status` are compiled in: :func:`layout_key` returns the
key of the constants it was compiled with, and :func:`infermax.fastloop.run` flushes the cache when it is not
:data:`LAYOUT_KEY`, the key of the constants imported now."""
import zlib

import numpy as np
from numba import njit

from . import fastloop_layout, status
from .fastloop_layout import (
    _BC,
    _BLK_USED,
    _BLOCKS,
    _BMEM,
    _BNE,
    _BP,
    _BPHASE,
    _BPN,
    _BRUN,
    _BS,
    _C,
    _CHUNKED,
    _CODE,
    _DEC,
    _DEC_LEFT,
    _DECODE,
    _ERR_BATCH,
    _HYBRID,
    _KV,
    _LIM_BLOCKS,
    _LIM_C,
    _LIM_M,
    _LIM_P,
    _LIM_RUN,
    _NA,
    _NB,
    _ND,
    _NDONE,
    _NEV,
    _NEXT,
    _NF,
    _NO_PHASE,
    _NQ,
    _NRUN,
    _NT,
    _P,
    _PF,
    _PF_LEFT,
    _PREFILL,
    _PREFILL_FIRST,
    _R,
    _SHIFT,
    _UPTO,
    _VERSION,
    _WAIT,
    _WM,
    BROKE_BLOCKS,
    BROKE_C,
    BROKE_M,
    BROKE_P,
    BROKE_RUN,
    EVICTED_NONE,
    FINISHED,
    FULL,
    STUCK,
)
from .status import DONE, RUNNING, WAITING

jit = njit(cache=True, nogil=True)


def _constants_key() -> int:
    """A checksum of every integer constant of the layout and the statuses (stable across processes)."""
    items = sorted((mod.__name__, k, v) for mod in (fastloop_layout, status) for k, v in vars(mod).items()
                   if type(v) is int)
    return zlib.crc32(repr(items).encode())


LAYOUT_KEY = _constants_key()


@jit
def layout_key():
    """:data:`LAYOUT_KEY` as it was when this module was compiled (numba compiles a global's value in)."""
    return LAYOUT_KEY


def dispatchers() -> dict:
    """The compiled functions of this module, by name."""
    from numba.core.registry import CPUDispatcher
    return {name: f for name, f in globals().items() if isinstance(f, CPUDispatcher)}


def flush_cache() -> None:
    """Drop numba's cached code of every function here: the next call compiles them again."""
    for f in dispatchers().values():
        f._cache.flush()      # (numba's FunctionCache: its index and its code files)


@jit
def blk(t, bs, sh):
    """ceil(t / bs) for t >= 0: the KV blocks t tokens take (t itself when bs is 1); a shift by ``sh`` when bs is
    2 ** sh > 1 (Limits.kv_blocks' numbers)."""
    if sh:
        return (t + bs - 1) >> sh
    if bs == 1:
        return t
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
    bs, sh = cfg[_BS], cfg[_SHIFT]
    short = need - bud[_BMEM]
    total, found, q = 0, -1, nr - 1
    while q > rpos[x]:
        v = rl[q]
        if stamp[v] != j:
            total += blk(max(m[v], inp[v]), bs, sh)
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
        total += blk(max(m[x], inp[x]), bs, sh)
    bud[_BMEM] += total
    bud[_BRUN] += count
    return found >= 0

@jit
# complexity: _admit_fills and _admit_waiting's checks in order (C, P, KV less the watermark, R_max)
def admit_fills(m, inp, cfg, bud, cand, lo, hi, waiting):
    """GetNextBatch._admit_fills (and _admit_waiting): how many of cand[lo:hi] take whole (re)fills, and
    their tokens and blocks."""
    bs, wm, blocks = cfg[_BS], cfg[_WM], cfg[_BLOCKS]
    sh = cfg[_SHIFT]
    mem = bud[_BMEM]
    x = cand[lo]
    head = inp[x] if waiting else inp[x] - m[x]
    cap = min(bud[_BC], bud[_BP])
    head_mem = blk(head, bs, sh) if waiting else 0
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
            own = blk(t, bs, sh)
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
    bs, sh = cfg[_BS], cfg[_SHIFT]
    if bs == 1:
        k = max(0, min(hi - lo, bud[_BC], bud[_BMEM]))
        return k, k
    end = lo + min(hi - lo, bud[_BC])
    mem, used, k = bud[_BMEM], 0, 0
    for q in range(lo, end):
        x = cand[q]
        new = blk(m[x] + 1, bs, sh) - blk(m[x], bs, sh)
        if used + new > mem:
            break
        used += new
        k += 1
    return k, used

@jit
# complexity: GetNextBatch._fill with its hooks 2-4 inline (_admit_*, _goto_next_or_evict), as the pure one
def fill(m, inp, cfg, bud, stamp, j, cand, lo, hi, kind, rl, nr, rpos, p_idx, p_tok, p_ev):
    """GetNextBatch._fill over the group cand[lo:hi] of kind ``kind``: hooks 2-4."""
    bs, wm, blocks = cfg[_BS], cfg[_WM], cfg[_BLOCKS]
    sh = cfg[_SHIFT]
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
            need = blk(m[x] + 1, bs, sh) - blk(m[x], bs, sh)
            if need > bud[_BMEM]:
                kept = evict_for(m, inp, cfg, bud, stamp, j, x, need, rl, nr, rpos, p_ev)
                hi = compact(cand, lo, hi, stamp, j)
                if kept:
                    lo -= 1
                    cand[lo] = x
                continue
            return
        new = m[x] == 0
        need = blk(inp[x], bs, sh) if new else 0
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
# complexity: next_batch's group walk for both priorities, each group copied and filtered as the pure one
def plan(m, inp, cfg, bud, stamp, j, rl, nr, wl, nw, rpos, cand, p_idx, p_tok, p_ev):
    """GetNextBatch.next_batch: the batch's requests and tokens (p_idx, p_tok) and evictions (p_ev). Its
    groups are copied into ``cand`` (fill rewrites its candidates): the running requests at [0, nr), the
    waiting ones after them."""
    bs, sh = cfg[_BS], cfg[_SHIFT]
    reserved = 0
    for q in range(nr):
        reserved += blk(max(m[rl[q]], inp[rl[q]]), bs, sh)
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
# complexity: ServingState.apply's five steps inline, in one compiled function (its twin, step by step)
def apply(m, inp, gen, status, out_len, first_sched, first_tok, compl, n_ev, refill, n_susp, last_b,
          la, lb, co, cfg, sc, fs, bud, p_idx, p_tok, p_ev, rec):
    """ServingState.apply of the planned batch; its (start, duration), its record in rec. The code of a
    broken rule, or 0."""
    bs, sh = cfg[_BS], cfg[_SHIFT]
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
            sc[_BLK_USED] -= blk(me, bs, sh)
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
            new_blocks += blk(m0 + c, bs, sh) - blk(m0, bs, sh)
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
                    sc[_BLK_USED] -= blk(m1, bs, sh)
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
# complexity: engine._run's loop with the output chunk's bookkeeping (a repeat or a new batch) inline
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

