"""Medha's batch rule compiled (numba; imported by :func:`infermax.schedulers.medha_compiled.batcher` on first use).

:func:`medha_batch` is a line-for-line twin of :meth:`Medha.next_batch <infermax.schedulers.medha.Medha.next_batch>`
on its sums path (:class:`~infermax.schedulers.longctx.SumsDraft`, :meth:`Medha._slack_of_sums`, the ILRS order),
with the linear cost model's timer (:meth:`~infermax.costmodel.LinearCostModel.work_timer`) and solved chunk bound
(:meth:`~infermax.costmodel.LinearCostModel.chunk_bound`) inline: the same integers, the same float operations in
the same order (no fast-math, so no fused multiply-adds), over the state's arrays. Module-level functions, so that
numba's on-disk cache holds them across processes; the statuses arrive as arguments (nothing is compiled in).
"""
import math

import numpy as np
from numba import njit

jit = njit(cache=True, nogil=True)

# icfg: the scheduler's and the limits' integers; fcfg: its floats and the clock (set per batch)
(I_R, I_BLOCKS, I_C, I_P, I_FCFS, I_MIN_CHUNK, I_NO_TPOT, I_WAITING, I_RUNNING) = range(9)
(F_TARGET, F_SHARE, F_CLOCK, F_D_BIAS, F_D_KV, F_P_BIAS, F_P_ATTN, F_P_TOK, F_REQ) = range(9)
# the rows of the per-request arrays (few arguments: numba's dispatch costs per argument, per batch)
PEAK, PRED_M, PRED_INP, CAND, OUT_IDX, OUT_TOK = range(6)
TPOT, DEADLINE, TTFT, ARRIVAL, PRED_S, SLACK = range(6)


# (each compiled module keeps its own copy of this timer: numba's cache is keyed per file, and a callee in another
# file would leave its callers' cached code stale when it changed; tests/test_fastloop.py checks every copy)
@jit
def _time(la, lb, fc, n, tokens, num_decode, decode_kv, work2, prefill):
    """``LinearCostModel._time_of_work``."""
    n_tok = float(tokens)
    best = la[0] + lb[0] * n_tok
    for k in range(1, la.size):
        v = la[k] + lb[k] * n_tok
        if v > best:
            best = v
    t = best + fc[F_REQ] * float(n)
    if num_decode == n or num_decode:
        t += fc[F_D_BIAS] + fc[F_D_KV] * float(decode_kv)
    if num_decode < n:
        t += fc[F_P_BIAS] + fc[F_P_ATTN] * (0.5 * float(work2))
        if fc[F_P_TOK]:
            t += fc[F_P_TOK] * float(prefill)
    return t


@jit
def _bound(la, lb, fc, n, tokens, num_decode, decode_kv, work2, prefill, m, target):
    """``LinearCostModel.chunk_bound`` (the caller checked that no slope is negative and p_attn > 0)."""
    d = fc[F_D_BIAS] + fc[F_D_KV] * float(decode_kv) if num_decode else 0.0
    rest = fc[F_REQ] * float(n + 1) + d + fc[F_P_BIAS] + fc[F_P_ATTN] * 0.5 * float(work2) \
        + fc[F_P_TOK] * float(prefill) - target
    qa = 0.5 * fc[F_P_ATTN]
    lin = 0.5 * fc[F_P_ATTN] * float(2 * m + 1) + fc[F_P_TOK]
    best = math.inf
    for k in range(la.size):
        qb = lin + lb[k]
        qc = rest + la[k] + lb[k] * float(tokens)
        disc = qb * qb - 4.0 * qa * qc
        root = (-qb + math.sqrt(disc)) / (2.0 * qa) if disc >= 0 else -math.inf
        if root < best:
            best = root
    return best


@jit
def _largest_chunk(la, lb, fc, s, m, limit, target, min_chunk):
    """``BatchDraft.largest_chunk`` on the draft's sums ``s`` for a request with ``m`` cached."""
    if limit <= 0:
        return 0
    if target == math.inf:
        return limit
    n, tokens, nd, dkv, w2, pf = s[0] + 1, s[1], s[2], s[3], s[4], s[5]
    guess = _bound(la, lb, fc, s[0], tokens, nd, dkv, w2, pf, m, target)
    lo, hi = 0, limit
    if 1 <= guess and guess < 4e18 and int(guess) + 1 < limit:
        e = int(guess)
        if _time(la, lb, fc, n, tokens + e, nd, dkv, w2 + e * (2 * m + e + 1), pf + e) > target:
            hi = e
            if e > 1:
                c = e - 1
                if _time(la, lb, fc, n, tokens + c, nd, dkv, w2 + c * (2 * m + c + 1), pf + c) <= target:
                    lo = e - 1
                else:
                    hi = e - 1
        else:
            c = e + 1
            if _time(la, lb, fc, n, tokens + c, nd, dkv, w2 + c * (2 * m + c + 1), pf + c) > target:
                lo, hi = e, e + 1
            elif _time(la, lb, fc, n, tokens + limit, nd, dkv, w2 + limit * (2 * m + limit + 1),
                       pf + limit) <= target:
                return limit
            else:
                lo = e + 1
    elif _time(la, lb, fc, n, tokens + limit, nd, dkv, w2 + limit * (2 * m + limit + 1), pf + limit) <= target:
        return limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _time(la, lb, fc, n, tokens + mid, nd, dkv, w2 + mid * (2 * m + mid + 1), pf + mid) <= target:
            lo = mid
        else:
            hi = mid
    return min(limit, max(lo, min_chunk))


@jit
def _before(s1, a1, s2, a2):
    """(s1, a1) sorts before (s2, a2) in ``np.lexsort((arrival, slack))``'s order (NaN slacks last)."""
    if s1 < s2 or (s2 != s2 and s1 == s1):
        return True
    if s2 < s1 or (s1 != s1 and s2 == s2):
        return False
    return a1 < a2


@jit
def ilrs_order(cand, slack, arrivals, num):
    """Sort ``cand[:num]`` and their ``slack`` in place into ``np.lexsort((arrivals[cand], slack))``'s order:
    least slack first, ties by arrival, then by position (an insertion sort: stable; a few candidates)."""
    for j in range(1, num):
        x, v = cand[j], slack[j]
        i = j - 1
        while i >= 0 and _before(v, arrivals[x], slack[i], arrivals[cand[i]]):
            cand[i + 1], slack[i + 1] = cand[i], slack[i]
            i -= 1
        cand[i + 1], slack[i + 1] = x, v


# complexity: Medha.next_batch in order, inline (a call per step costs per batch): phases, decodes, slack and its
# order, shares, chunk sizes
@jit
def medha_batch(act, status, m, inp, ints, floats, lines, icfg, fc):
    """The next batch: its requests in ``ints[OUT_IDX, :k]`` and their tokens in ``ints[OUT_TOK, :k]``; returns
    ``k``. Per request, ``ints`` holds (rows ``PEAK`` ... ``OUT_TOK``) its peak KV blocks, the cached isolated
    prefill's m and inp, and scratch (candidates, the plan); ``floats`` its TPOT SLO, deadline, TTFT, arrival, the
    cached isolated prefill time and scratch (slacks); ``lines`` the cost model's non-attention lines (a, b)."""
    peak, pred_m, pred_inp, cand, out_idx, out_tok = ints[PEAK], ints[PRED_M], ints[PRED_INP], ints[CAND], \
        ints[OUT_IDX], ints[OUT_TOK]
    tpot, deadline, ttft, arrivals, pred_s, slack = floats[TPOT], floats[DEADLINE], floats[TTFT], floats[ARRIVAL], \
        floats[PRED_S], floats[SLACK]
    la, lb = lines[0], lines[1]
    waiting, running_code = icfg[I_WAITING], icfg[I_RUNNING]
    # phases: the running requests' peaks, the decodes (into the batch while C lasts) and the candidates
    C, P = icfg[I_C], icfg[I_P]
    mem, run = icfg[I_BLOCKS], icfg[I_R]
    k, num_cand, num_dec = 0, 0, 0
    dkv = 0
    min_tpot = math.inf
    for j in range(act.size):
        x = act[j]
        st = status[x]
        if st == running_code:
            mem -= peak[x]
            run -= 1
            if m[x] >= inp[x]:
                num_dec += 1
                if tpot[x] < min_tpot or tpot[x] != tpot[x]:
                    min_tpot = tpot[x]
                if k < C:
                    out_idx[k] = x
                    out_tok[k] = 1
                    dkv += m[x]
                    k += 1
                continue
        elif st != waiting:
            continue
        cand[num_cand] = x
        num_cand += 1
    C -= k
    s = np.zeros(6, dtype=np.int64)
    s[0], s[1], s[2], s[3] = k, k, k, dkv + k
    target = math.inf
    if num_dec:
        target = fc[F_TARGET]
        if not icfg[I_NO_TPOT] and min_tpot < target:
            target = min_tpot
    if num_cand == 0 or C <= 0:
        return k
    share = 0.0
    if not icfg[I_FCFS]:
        clock = fc[F_CLOCK]
        for j in range(num_cand):       # the slack, each isolated prefill time cached
            x = cand[j]
            mx, ix = m[x], inp[x]
            if pred_m[x] != mx or pred_inp[x] != ix:
                left = ix - mx
                pred_s[x] = _time(la, lb, fc, 1, left, 0, 0, left * (2 * mx + left + 1), left)
                pred_m[x], pred_inp[x] = mx, ix
            slack[j] = (deadline[x] - clock - pred_s[x]) / ttft[x]
        ilrs_order(cand, slack, arrivals, num_cand)
        if num_cand > 1:
            v = 1.0 - slack[1]
            c = 0.0 if v < 0.0 else 1.0 if v > 1.0 else v
            share = c if c < fc[F_SHARE] else fc[F_SHARE]
    min_chunk = icfg[I_MIN_CHUNK]
    for j in range(num_cand):
        x = cand[j]
        is_waiting = status[x] == waiting
        room = 0
        if not (is_waiting and (peak[x] > mem or run < 1)):
            room = max(0, min(inp[x] - m[x], C, P))
        if room <= 0:
            if C <= 0 or P <= 0:
                break
            continue
        mx = m[x]
        if k and target != math.inf and _time(la, lb, fc, s[0] + 1, s[1] + 1, s[2], s[3], s[4] + 2 * mx + 2,
                                               s[5] + 1) > target:
            break
        chunk = _largest_chunk(la, lb, fc, s, mx, room, target, min_chunk if j == 0 else 1)
        if j == 0 and share > 0 and chunk > min_chunk:
            chunk = max(min_chunk, int(chunk * (1.0 - share)))
        if chunk <= 0:
            break
        if is_waiting:
            mem -= peak[x]
            run -= 1
        out_idx[k] = x
        out_tok[k] = chunk
        k += 1
        C -= chunk
        P -= chunk
        s[0] += 1
        s[1] += chunk
        s[4] += chunk * (2 * mx + chunk + 1)
        s[5] += chunk
        if C <= 0 or P <= 0:
            break
    return k
