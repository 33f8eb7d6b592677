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

from . import fastloop_layout as L
from . import status
from .status import DONE, RUNNING, WAITING

jit = njit(cache=True, nogil=True)


def _constants_key() -> int:
    """A checksum of every integer constant of the layout and the statuses (stable across processes)."""
    items = sorted((mod.__name__, k, v) for mod in (L, status) for k, v in vars(mod).items()
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

# (each compiled module keeps its own copy of this timer: numba's cache is keyed per file, and a callee in another
# file would leave its callers' cached code stale when it changed; tests/test_fastloop.py checks every copy)
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
    k, nq = sc[L.NEXT], sc[L.NQ]
    k0 = k
    while k < nq and admit_s[order[k]] <= clock:
        status[order[k]] = WAITING
        k += 1
    if k != k0:
        sc[L.NEXT] = k
        sc[L.VERSION] += 1

@jit
def rebuild(status, order, act, rl, wl, rpos, sc):
    """The active requests (arrival order), the running and the waiting ones among them: GetNextBatch._sets."""
    na, w = sc[L.NA], 0
    for q in range(na):
        i = act[q]
        if status[i] != DONE:
            act[w] = i
            w += 1
    for k in range(sc[L.UPTO], sc[L.NEXT]):
        i = order[k]
        if status[i] != DONE:
            act[w] = i
            w += 1
    sc[L.NA], sc[L.UPTO] = w, sc[L.NEXT]
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
    p_idx[bud[L.BPN]] = x
    p_tok[bud[L.BPN]] = c
    bud[L.BPN] += 1
    stamp[x] = j
    if bud[L.BPHASE] == L.NO_PHASE:
        bud[L.BPHASE] = phase

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
    bs, sh = cfg[L.BS], cfg[L.SHIFT]
    short = need - bud[L.BMEM]
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
            p_ev[bud[L.BNE]] = v
            bud[L.BNE] += 1
            stamp[v] = j
            count += 1
    if found < 0:
        p_ev[bud[L.BNE]] = x
        bud[L.BNE] += 1
        stamp[x] = j
        count += 1
        total += blk(max(m[x], inp[x]), bs, sh)
    bud[L.BMEM] += total
    bud[L.BRUN] += count
    return found >= 0

@jit
# complexity: _admit_fills and _admit_waiting's checks in order (C, P, KV less the watermark, R_max)
def admit_fills(m, inp, cfg, bud, cand, lo, hi, waiting):
    """GetNextBatch._admit_fills (and _admit_waiting): how many of cand[lo:hi] take whole (re)fills, and
    their tokens and blocks."""
    bs, wm, blocks = cfg[L.BS], cfg[L.WM], cfg[L.BLOCKS]
    sh = cfg[L.SHIFT]
    mem = bud[L.BMEM]
    x = cand[lo]
    head = inp[x] if waiting else inp[x] - m[x]
    cap = min(bud[L.BC], bud[L.BP])
    head_mem = blk(head, bs, sh) if waiting else 0
    room = mem - wm if mem < blocks else mem
    if head > cap or (waiting and (bud[L.BRUN] < 1 or head_mem > room)):
        return 0, 0, 0
    k, ctok, cmem = 1, head, head_mem
    for q in range(lo + 1, hi):
        x = cand[q]
        t = inp[x] if waiting else inp[x] - m[x]
        if ctok + t > cap:
            break
        if waiting:
            if k + 1 > bud[L.BRUN]:
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
    bs, sh = cfg[L.BS], cfg[L.SHIFT]
    if bs == 1:
        k = max(0, min(hi - lo, bud[L.BC], bud[L.BMEM]))
        return k, k
    end = lo + min(hi - lo, bud[L.BC])
    mem, used, k = bud[L.BMEM], 0, 0
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
    bs, wm, blocks = cfg[L.BS], cfg[L.WM], cfg[L.BLOCKS]
    sh = cfg[L.SHIFT]
    group_phase = L.DECODE if kind == L.DEC else L.PREFILL
    while lo < hi and bud[L.BC] > 0:
        if not cfg[L.HYBRID] and bud[L.BPHASE] != L.NO_PHASE and bud[L.BPHASE] != group_phase:
            return
        if kind == L.DEC:
            k, used = admit_decodes(m, cfg, bud, cand, lo, hi)
            for q in range(lo, lo + k):
                take(bud, p_idx, p_tok, stamp, j, cand[q], 1, L.DECODE)
            bud[L.BC] -= k
            bud[L.BMEM] -= used
        else:
            waiting = kind == L.WAIT
            k, ctok, cmem = admit_fills(m, inp, cfg, bud, cand, lo, hi, waiting)
            for q in range(lo, lo + k):
                x = cand[q]
                take(bud, p_idx, p_tok, stamp, j, x, inp[x] if waiting else inp[x] - m[x], L.PREFILL)
            bud[L.BC] -= ctok
            bud[L.BP] -= ctok
            if waiting:
                bud[L.BMEM] -= cmem
                bud[L.BRUN] -= k
        if lo + k == hi or bud[L.BC] == 0:
            return
        x = cand[lo + k]
        lo += k + 1
        # hook 4, GotoNextGroupOrEvict, for x
        if m[x] >= inp[x]:
            need = blk(m[x] + 1, bs, sh) - blk(m[x], bs, sh)
            if need > bud[L.BMEM]:
                kept = evict_for(m, inp, cfg, bud, stamp, j, x, need, rl, nr, rpos, p_ev)
                hi = compact(cand, lo, hi, stamp, j)
                if kept:
                    lo -= 1
                    cand[lo] = x
                continue
            return
        new = m[x] == 0
        need = blk(inp[x], bs, sh) if new else 0
        room = bud[L.BMEM] - wm if new and bud[L.BMEM] < blocks else bud[L.BMEM]
        if cfg[L.CHUNKED] and need <= room and int(new) <= bud[L.BRUN]:
            chunk = min(inp[x] - m[x], bud[L.BC], bud[L.BP])
            if chunk >= 1:
                take(bud, p_idx, p_tok, stamp, j, x, chunk, L.PREFILL)
                bud[L.BC] -= chunk
                bud[L.BP] -= chunk
                bud[L.BMEM] -= need
                bud[L.BRUN] -= int(new)
        return

@jit
# complexity: next_batch's group walk for both priorities, each group copied and filtered as the pure one
def plan(m, inp, cfg, bud, stamp, j, rl, nr, wl, nw, rpos, cand, p_idx, p_tok, p_ev):
    """GetNextBatch.next_batch: the batch's requests and tokens (p_idx, p_tok) and evictions (p_ev). Its
    groups are copied into ``cand`` (fill rewrites its candidates): the running requests at [0, nr), the
    waiting ones after them."""
    bs, sh = cfg[L.BS], cfg[L.SHIFT]
    reserved = 0
    for q in range(nr):
        reserved += blk(max(m[rl[q]], inp[rl[q]]), bs, sh)
    bud[L.BC], bud[L.BP], bud[L.BMEM], bud[L.BRUN] = cfg[L.C], cfg[L.P], cfg[L.BLOCKS] - reserved, cfg[L.R] - nr
    bud[L.BPHASE] = bud[L.BPN] = bud[L.BNE] = 0
    for q in range(nw):
        cand[nr + q] = wl[q]
    if cfg[L.PREFILL_FIRST]:     # the waiting requests, then the running ones (all decoding)
        if nw:
            fill(m, inp, cfg, bud, stamp, j, cand, nr, nr + nw, L.WAIT, rl, nr, rpos, p_idx, p_tok, p_ev)
        if bud[L.BC] == 0 or not nr:
            return
        for q in range(nr):
            cand[q] = rl[q]
        hi = compact(cand, 0, nr, stamp, j) if bud[L.BNE] else nr
        fill(m, inp, cfg, bud, stamp, j, cand, 0, hi, L.DEC, rl, nr, rpos, p_idx, p_tok, p_ev)
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
        fill(m, inp, cfg, bud, stamp, j, cand, 0, nd, L.DEC, rl, nr, rpos, p_idx, p_tok, p_ev)
    if bud[L.BC] == 0:
        return
    if nr > nd:
        hi = compact(cand, nd, nr, stamp, j) if bud[L.BNE] else nr
        fill(m, inp, cfg, bud, stamp, j, cand, nd, hi, L.PF, rl, nr, rpos, p_idx, p_tok, p_ev)
    if bud[L.BC] == 0 or not nw:
        return
    hi = compact(cand, nr, nr + nw, stamp, j) if bud[L.BNE] else nr + nw
    fill(m, inp, cfg, bud, stamp, j, cand, nr, hi, L.WAIT, rl, nr, rpos, p_idx, p_tok, p_ev)

@jit
# complexity: ServingState.apply's five steps inline, in one compiled function (its twin, step by step)
def apply(m, inp, gen, status, out_len, first_sched, first_tok, compl, n_ev, refill, n_susp, last_b,
          la, lb, co, cfg, sc, fs, bud, p_idx, p_tok, p_ev, rec):
    """ServingState.apply of the planned batch; its (start, duration), its record in rec. The code of a
    broken rule, or 0."""
    bs, sh = cfg[L.BS], cfg[L.SHIFT]
    j = sc[L.NB]
    start = max(fs[0], fs[1])
    ne, n = bud[L.BNE], bud[L.BPN]
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
        sc[L.KV] -= me
        sc[L.PF_LEFT] += me + int(dec)
        if bs > 1:
            sc[L.BLK_USED] -= blk(me, bs, sh)
        sc[L.NRUN] -= 1
    if ne:
        sc[L.VERSION] += 1
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
        sc[L.VERSION] += 1
    kv, running = sc[L.KV] + ntok, sc[L.NRUN] + num_new      # 3. limits
    blocks = sc[L.BLK_USED] + new_blocks if bs > 1 else 0
    if ntok > cfg[L.LIM_C]:
        return 0.0, 0.0, L.BROKE_C
    if ptok > cfg[L.LIM_P]:
        return 0.0, 0.0, L.BROKE_P
    if kv > cfg[L.LIM_M]:
        return 0.0, 0.0, L.BROKE_M
    if blocks > cfg[L.LIM_BLOCKS]:
        return 0.0, 0.0, L.BROKE_BLOCKS
    if running > cfg[L.LIM_RUN]:
        return 0.0, 0.0, L.BROKE_RUN
    duration = time_of(la, lb, co, n, ntok, ndec, dkv, work2, ptok)     # 4. time
    end = start + duration
    sc[L.KV], sc[L.BLK_USED], sc[L.NRUN] = kv, blocks, running          # 5. commit
    sc[L.PF_LEFT] -= ptok
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
            sc[L.DEC_LEFT] -= 1
            if g == out_len[i]:
                compl[i] = end
                sc[L.KV] -= m1
                if bs > 1:
                    sc[L.BLK_USED] -= blk(m1, bs, sh)
                m[i] = 0
                status[i] = DONE
                sc[L.NRUN] -= 1
                done += 1
        last_b[i] = j
    if done:
        sc[L.NDONE] += done
        sc[L.VERSION] += 1
    fs[0] = end
    sc[L.NB] = j + 1
    rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6] = n, ntok, ptok, ndec, kv, running, ne
    return start, duration, 0

@jit
# complexity: engine._run's loop with the output chunk's bookkeeping (a repeat or a new batch) inline
def loop(m, inp, gen, status, out_len, admit_s, order, first_sched, first_tok, compl, n_ev, refill, n_susp,
         last_b, act, rl, wl, rpos, stamp, cand, p_idx, p_tok, p_ev, la, lb, co, cfg, sc, fs,
         b_off, b_n, b_evoff, b_nev, b_rep, b_nb, f_idx, f_tok, f_ev, t_start, t_dur, t_rec):
    """The simulator's loop (engine._run) for a chunk of batches: until every request is done (L.FINISHED),
    the chunk's arrays are full (L.FULL), or no batch can run (L.STUCK, L.EVICTED_NONE)."""
    n_all = m.size
    bud = np.zeros(7, dtype=np.int64)
    nd = nt = nf = nev = 0
    version = -1
    nr = nw = 0
    pure_prev = False        # the last distinct batch is a decode batch (may repeat)
    code = L.FULL
    while True:
        if sc[L.NDONE] == n_all:
            code = L.FINISHED
            break
        if nt == t_start.size or nd == b_off.size or nf + n_all > f_idx.size or nev + n_all > f_ev.size:
            break
        if sc[L.VERSION] != version:
            nr, nw = rebuild(status, order, act, rl, wl, rpos, sc)
            version = sc[L.VERSION]
        j = sc[L.NB]
        plan(m, inp, cfg, bud, stamp, j, rl, nr, wl, nw, rpos, cand, p_idx, p_tok, p_ev)
        if bud[L.BPN] == 0:
            if bud[L.BNE]:
                code = L.EVICTED_NONE
                break
            if sc[L.NEXT] >= sc[L.NQ]:
                code = L.STUCK
                break
            nxt = admit_s[order[sc[L.NEXT]]]      # idle until the next arrival
            fs[0] = max(fs[0], nxt)
            admit(status, admit_s, order, sc, fs[0])
            fs[1] = nxt
            continue
        n, ne = bud[L.BPN], bud[L.BNE]
        rec = t_rec[nt]
        start, duration, broke = apply(m, inp, gen, status, out_len, first_sched, first_tok, compl, n_ev,
                                       refill, n_susp, last_b, la, lb, co, cfg, sc, fs, bud, p_idx, p_tok,
                                       p_ev, rec)
        if broke:
            sc[L.ERR_BATCH] = j
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
        if sc[L.NEXT] < sc[L.NQ]:
            admit(status, admit_s, order, sc, fs[0])
    sc[L.CODE], sc[L.ND], sc[L.NT], sc[L.NF], sc[L.NEV] = code, nd, nt, nf, nev
    return code

