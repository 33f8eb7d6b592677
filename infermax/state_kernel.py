"""``ServingState.apply``'s steps 2-5 compiled (numba; imported by :mod:`infermax.state_transitions` on first use).

:func:`apply_batch` is a line-for-line twin of :meth:`~infermax.state_transitions.Transitions.apply` for a batch of
two or more requests, every one admitted, no eviction and no work riding along, on a state with no KV held for
work elsewhere and no hand-off, timed by the linear cost model's sums (``LinearCostModel._time_of_work``, inline):
the same checks, the same integers, the same float operations in the same order (no fast-math). It checks every
rule before it commits anything, and on a broken one returns :data:`REFUSED` with the state untouched: the caller
then runs the Python steps, which name the rule. Module-level functions, so that numba's on-disk cache holds them;
the statuses arrive as arguments (nothing is compiled in).
"""
import numpy as np
from numba import njit

jit = njit(cache=True, nogil=True)

# sc: the state's integers in and out, the batch's numbers out
(S_J, S_KV, S_BLOCKS, S_RUN, S_DONE, S_VERSION, S_PF_LEFT, S_DEC_LEFT, S_C, S_P, S_M, S_NUM_BLOCKS, S_MAX_RUN, S_MASK,
 S_SHIFT, S_WAITING, S_RUNNING, S_DONE_CODE, S_NUM_TOKENS, S_NUM_PREFILL, S_NUM_DECODE, S_KV_REC, S_RUN_REC,
 S_CODE) = range(24)
NUM_SC = 24
APPLIED, REFUSED = 0, 1
# fs: start (in), duration (out); co: the cost model's coefficients but its lines
F_START, F_DURATION = range(2)
C_D_BIAS, C_D_KV, C_P_BIAS, C_P_ATTN, C_P_TOK, C_REQ = range(6)


# (each compiled module keeps its own copy of this timer: numba's cache is keyed per file, and a callee in another
# file would leave its callers' cached code stale when it changed; tests/test_fastloop.py checks every copy)
@jit
def _time(la, lb, co, n, tokens, num_decode, decode_kv, work2, prefill):
    """``LinearCostModel._time_of_work``."""
    n_tok = float(tokens)
    best = la[0] + lb[0] * n_tok
    for k in range(1, la.size):
        v = la[k] + lb[k] * n_tok
        if v > best:
            best = v
    t = best + co[C_REQ] * float(n)
    if num_decode == n or num_decode:
        t += co[C_D_BIAS] + co[C_D_KV] * float(decode_kv)
    if num_decode < n:
        t += co[C_P_BIAS] + co[C_P_ATTN] * (0.5 * float(work2))
        if co[C_P_TOK]:
            t += co[C_P_TOK] * float(prefill)
    return t


# complexity: apply's steps 2-5 inline, in order (a call per step costs per batch): checks, then the commit
@jit
def apply_batch(idx, tokens, m, inp, gen, status, output_lens, first_scheduled_s, first_token_s, completion_s,
                num_suspensions, last_batch, slot, la, lb, co, sc, fs):
    """Apply batch ``sc[S_J]`` (requests ``idx`` processing ``tokens``, starting at ``fs[F_START]``): returns
    :data:`APPLIED` (the state's arrays and ``sc``'s integers committed, ``fs[F_DURATION]`` and the batch's record
    in ``sc``) or :data:`REFUSED` (a rule is broken; nothing committed but the duplicate check's scratch)."""
    n = idx.size
    waiting, running_code, done_code = sc[S_WAITING], sc[S_RUNNING], sc[S_DONE_CODE]
    mask, shift = sc[S_MASK], sc[S_SHIFT]
    # 2. who may run, and how many tokens: arrived and unfinished, distinct, >= 1 token, decodes 1, chunks within
    num_new, num_tokens, num_decode = 0, 0, 0
    decode_kv, work2, prefill, new_blocks = 0, 0, 0, 0
    for k in range(n):
        x = idx[k]
        st = status[x]
        if st == waiting:
            num_new += 1
        elif st != running_code:
            return REFUSED
        slot[x] = k
    for k in range(n):
        if slot[idx[k]] != k or tokens[k] < 1:
            return REFUSED
    for k in range(n):
        x, c = idx[k], tokens[k]
        m0, inp0 = m[x], inp[x]
        num_tokens += c
        if m0 >= inp0:
            if c != 1:
                return REFUSED
            num_decode += 1
            decode_kv += m0 + 1
        else:
            if m0 + c > inp0:
                return REFUSED
            work2 += c * (2 * m0 + c + 1)
            prefill += c
        if mask:
            new_blocks += ((m0 + c + mask) >> shift) - ((m0 + mask) >> shift)
    # 3. per-batch limits
    num_prefill_tokens = num_tokens - num_decode
    kv, running = sc[S_KV] + num_tokens, sc[S_RUN] + num_new
    if num_tokens > sc[S_C] or num_prefill_tokens > sc[S_P] or kv > sc[S_M]:
        return REFUSED
    blocks = 0
    if mask:
        blocks = sc[S_BLOCKS] + new_blocks
        if blocks > sc[S_NUM_BLOCKS]:
            return REFUSED
    if running > sc[S_MAX_RUN]:
        return REFUSED
    # 4. time
    duration = _time(la, lb, co, n, num_tokens, num_decode, decode_kv, work2, prefill)
    start = fs[F_START]
    end = start + duration
    # 5. commit progress: new requests run, KV grows, tokens are generated, completions free their KV
    j = sc[S_J]
    version = sc[S_VERSION] + (1 if num_new else 0)
    generated, freed, freed_blocks, num_fin = 0, 0, 0, 0
    for k in range(n):
        x, c = idx[k], tokens[k]
        m0, inp0 = m[x], inp[x]
        if status[x] == waiting:
            status[x] = running_code
            if not first_scheduled_s[x] <= start:
                first_scheduled_s[x] = start
        m1 = m0 + c
        m[x] = m1
        if m0 < inp0 and m0 and last_batch[x] < j - 1:     # a (re)fill that skipped a batch was suspended
            num_suspensions[x] += 1
        if m1 >= inp0:
            g = gen[x] + 1
            gen[x] = g
            generated += 1
            if g == 1:
                first_token_s[x] = end
            if g == output_lens[x]:
                completion_s[x] = end
                freed += m1
                if mask:
                    freed_blocks += (m1 + mask) >> shift
                m[x] = 0
                status[x] = done_code
                num_fin += 1
        last_batch[x] = j
    if num_fin:
        version += 1
    sc[S_KV] = kv - freed
    sc[S_BLOCKS] = blocks - freed_blocks
    sc[S_RUN] = running - num_fin
    sc[S_DONE] += num_fin
    sc[S_VERSION] = version
    sc[S_PF_LEFT] -= num_prefill_tokens
    sc[S_DEC_LEFT] -= generated
    sc[S_NUM_TOKENS], sc[S_NUM_PREFILL], sc[S_NUM_DECODE], sc[S_KV_REC], sc[S_RUN_REC] = (
        num_tokens, num_prefill_tokens, num_decode, kv, running)
    fs[F_DURATION] = duration
    return APPLIED


def make_scalars() -> np.ndarray:
    """An ``sc`` array, zero."""
    return np.zeros(NUM_SC, dtype=np.int64)


__all__ = ["APPLIED", "REFUSED", "apply_batch", "make_scalars"]
