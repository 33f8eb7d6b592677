"""The one state transition every schedule obeys: ``apply`` moves a :class:`~infermax.state.ServingState`
across one batch, the only place (with its closed-form runs, :mod:`infermax.state_runs`) where request
progress changes.

A batch's steps, in order: 1. its evictions; 2. who may run, and how many tokens (rules checked by
:mod:`infermax.state_rules`); 3. the per-batch limits; 4. its time (the cost model); 5. the commit of
progress — tokens generated, first tokens, suspensions, completions freeing KV. :class:`Transitions` is a
mixin of ``ServingState``, which owns every attribute these methods read and write.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .state_rules import ScheduleError, _count_nonzero, _max, _sum
from .status import DONE, FUTURE, RUNNING, WAITING

# the is_decode of a batch of one request, read-only (Transitions._apply_one)
_ONE_DECODE, _ONE_PREFILL = np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
_ONE_DECODE.setflags(write=False)
_ONE_PREFILL.setflags(write=False)
#: a batch with up to this many (re)fills among its decodes is settled in Python ints (more: array operations)
_FEW_FILLS = 4


class BatchRecord(NamedTuple):
    """What one batch did, as :meth:`ServingState.apply` returns it (the trace's batch columns after
    start and duration, :data:`infermax.trace.BATCH_FIELDS`)."""

    num_requests: int
    num_tokens: int
    num_prefill_tokens: int
    num_decode: int
    kv_tokens: int
    num_running: int
    num_evicted: int


class Transitions:
    """``apply`` and the steps it takes, on a :class:`~infermax.state.ServingState`."""

    # complexity: the judge's five steps inline, in order, on the simulator's hot path (a call per step costs per batch)
    def apply(self, idx: np.ndarray, tokens: np.ndarray, evict: np.ndarray,
              not_before_s: float = 0.0, extra: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None
              ) -> tuple[float, float, BatchRecord]:
        """Run one batch: evict ``evict``, then process ``tokens[k]`` for request ``idx[k]``.

        ``extra`` = (tokens, cached, is_decode) of work riding in the same batch that this state
        does not track (a colocated long decode's share, infermax.cluster): it is timed with the
        batch and nothing else.

        Returns (start_s, duration_s, :class:`BatchRecord`). Raises ScheduleError on any rule violation.
        """
        j = self.num_batches
        n = int(idx.size)
        start = max(self.clock_s, not_before_s)
        st = self.status[idx] if n else None
        # a batch waits for its requests' admission; only a request not yet admitted (FUTURE) can be admitted
        # after the clock (a status other than FUTURE is set at an admission at or before the clock)
        if n and not self._offline and FUTURE in st.tobytes():
            start = max(start, float(_max(self._admit_s[idx])))
        if start > self.clock_s:
            self.advance_clock(start)
            st = self.status[idx] if n else None     # (arrivals admitted)
        # 1. evictions
        num_ev = int(evict.size)
        if num_ev:
            self._evict(j, evict)
            st = self.status[idx] if n else None
        if n == 0:
            raise ScheduleError(j, "empty", "a batch must process at least one token")
        if n == 1 and extra is None:
            return self._apply_one(j, idx, tokens, int(st[0]), start, num_ev)
        if self._kernel is not None and extra is None and not num_ev and self._stop is None and not self.external_kv:
            done = self._apply_compiled(j, idx, tokens, start)
            if done is not None:
                return done
        # 2. who may run, and how many tokens
        num_new = self._check_requests(j, idx, tokens, st)
        m0 = self.m[idx]
        inp0 = self.inp[idx]
        is_decode = m0 >= inp0
        m1 = m0 + tokens
        flags = is_decode.tobytes()      # (a byte each: counted and searched without a NumPy call)
        num_decode = flags.count(1)
        one = flags.index(0) if num_decode == n - 1 else -1    # the one (re)fill among decodes
        # decodes and at most one (re)fill, in integer tokens: sums in Python ints settle steps 2-4
        sums = one >= -(num_decode == n) and tokens.dtype.kind == "i"
        c_one = int(tokens[one]) if sums and one >= 0 else 0     # the (re)fill's tokens
        # or a few (re)fills among decodes: their positions and (c, m, inp), in Python ints, settle steps 2-4 too
        fills = (self._fills(flags, tokens, m0, inp0) if not sums and n - num_decode <= _FEW_FILLS
                 and tokens.dtype.kind == "i" else None)
        if fills is not None:
            c_one = sum(fills[1])       # (their tokens)
        if (sums or fills is not None) and (tokens == 1).tobytes() == flags:
            num_tokens = num_decode + c_one    # (a 1 for each decode alone)
        else:
            num_tokens = int(_sum(tokens))
        # the chunks' rule (_check_chunks, which names the offender) settled from the sums when they can: the decodes'
        # tokens (each >= 1) are all 1 exactly when they add up to their count, and each (re)fill fits its input
        m = int(m0[one]) if sums and one >= 0 else 0     # (the one (re)fill's KV)
        if sums:
            chunks_ok = num_tokens - c_one == num_decode and (one < 0 or m + c_one <= int(inp0[one]))
        else:
            chunks_ok = fills is not None and num_tokens - c_one == num_decode and all(
                m + c <= i for c, m, i in zip(fills[1], fills[2], fills[3]))
        if not chunks_ok:
            self._check_chunks(j, idx, tokens, m0, inp0, m1, is_decode, num_tokens, num_decode, one)
        # 3. per-batch limits
        num_prefill_tokens = num_tokens - num_decode
        kv, running = self.kv_used + num_tokens, self.num_running + num_new
        # (decodes: 1 token each, checked)
        new_blocks = None
        if self._mask:
            if sums:
                new_blocks = self._new_blocks(m0, num_decode == n, one, c_one)
            elif fills is not None:
                new_blocks = self._new_blocks_of_fills(m0, fills)
        blocks = self._check_limits(j, num_tokens, num_prefill_tokens, kv, running, m0, tokens, new_blocks)
        # 4. time
        if extra is not None:
            duration = self.cost.batch_time(np.concatenate((tokens, extra[0])), np.concatenate((m0, extra[1])),
                                            np.concatenate((is_decode, extra[2])))
        elif self._timer is not None and (sums or fills is not None):
            # Σ (m + c), less the (re)fills' below; Σ m is kv_used when every running request is in the batch
            # (the others in it wait, holding no KV)
            kv_read = num_tokens + (self.kv_used if n - num_new == self.num_running else int(_sum(m0)))
            if fills is not None:
                work2 = sum([c * (2 * m + c + 1) for c, m in zip(fills[1], fills[2])])
                duration = self._timer(n, num_tokens, num_decode, kv_read - c_one - sum(fills[2]), work2, c_one)
            else:
                duration = self._timer(n, num_tokens, num_decode, kv_read - c_one - m, c_one * (2 * m + c_one + 1),
                                       c_one)
        else:
            duration = self.cost.batch_time(tokens, m0, is_decode)
        end = start + duration
        # 5. commit progress
        if num_new == 1:    # (mostly: its index alone, found in the statuses' bytes, in Python ints, as _apply_one)
            self._start_running(int(idx[st.tobytes().index(WAITING)]), start)
        elif num_new:
            new_idx = idx[st == WAITING]
            self.status[new_idx] = RUNNING
            # the first time: NaN until now (fmin ignores NaN; an earlier time is never later than start)
            self.first_scheduled_s[new_idx] = np.fmin(self.first_scheduled_s[new_idx], start)
            self.version += 1
        self.m[idx] = m1
        self.kv_used, self.blocks_used, self.num_running = kv, blocks, running
        self.prefill_tokens_left -= num_prefill_tokens
        self._generate(j, idx, m0, inp0, m1, is_decode, num_decode, one, end, fills)
        self._last_batch[idx] = j
        self.clock_s = end
        self.num_batches = j + 1
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return start, duration, BatchRecord(n, num_tokens, num_prefill_tokens, num_decode, kv, running, num_ev)

    def _apply_compiled(self, j: int, idx: np.ndarray, tokens: np.ndarray, start: float
                        ) -> "tuple[float, float, BatchRecord] | None":
        """``apply``, steps 2-5, compiled (:func:`infermax.state_kernel.apply_batch`), for a batch of two or more
        requests, no eviction, nothing riding along; None when the batch breaks a rule (nothing committed: the
        Python steps then name it) or is not the kernel's kind (other dtypes)."""
        if idx.dtype != np.int64 or tokens.dtype != np.int64:
            return None
        steps = self._kernel
        sc, fs = steps.sc, steps.fs
        sc[:8] = (j, self.kv_used, self.blocks_used, self.num_running, self.num_done, self.version,
                  self.prefill_tokens_left, self.decode_tokens_left)
        fs[0] = start
        if steps.kernel(idx, tokens, self.m, self.inp, self.gen, self.status, self.output_lens, self.first_scheduled_s,
                        self.first_token_s, self.completion_s, self.num_suspensions, self._last_batch, self._slot,
                        steps.la, steps.lb, steps.co, sc, fs):
            return None
        (_, self.kv_used, self.blocks_used, self.num_running, self.num_done, self.version, self.prefill_tokens_left,
         self.decode_tokens_left, *_, num_tokens, num_prefill_tokens, num_decode, kv, running, _) = sc.tolist()
        duration = float(fs[1])
        end = start + duration
        self.clock_s = end
        self.num_batches = j + 1
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return start, duration, BatchRecord(int(idx.size), num_tokens, num_prefill_tokens, num_decode, kv, running, 0)

    # complexity: apply's steps 2-5 for one request inline, in Python ints, on the hot path (a call per step costs)
    def _apply_one(self, j: int, idx: np.ndarray, tokens: np.ndarray, status: int, start: float,
                   num_ev: int) -> tuple[float, float, BatchRecord]:
        """``apply``, steps 2-5, for a batch of one request ``idx[0]`` (status ``status``) starting at
        ``start``: most batches of a prefill-first scheduler admit one new request. The same checks in
        the same order, the same errors and the same commits as for any batch, on Python ints rather
        than one-element arrays (each NumPy call costs more than the arithmetic it does here)."""
        i, c = int(idx[0]), int(tokens[0])
        m0, inp0 = int(self.m[i]), int(self.inp[i])
        decode = m0 >= inp0
        m1 = m0 + c
        if (status != WAITING and status != RUNNING) or c < 1 or m1 > max(inp0, m0 + 1):
            self._refuse_one(j, i, c, status, m0, inp0)     # (raises: the first rule broken)
        new = status == WAITING
        num_prefill_tokens = 0 if decode else c
        kv, running = self.kv_used + c, self.num_running + new
        m0_arr = self.m[idx]
        new_blocks = ((m1 + self._mask) >> self._shift) - ((m0 + self._mask) >> self._shift) if self._mask else None
        blocks = self._check_limits(j, c, num_prefill_tokens, kv, running, m0_arr, tokens, new_blocks)
        if self._timer is not None and tokens.dtype.kind == "i":
            duration = self._timer(1, c, 1, m1, 0, 0) if decode else self._timer(1, c, 0, 0, c * (2 * m0 + c + 1), c)
        else:
            duration = self.cost.batch_time(tokens, m0_arr, _ONE_DECODE if decode else _ONE_PREFILL)
        end = start + duration
        if new:
            self._start_running(i, start)
        self.m[i] = m1
        self.kv_used, self.blocks_used, self.num_running = kv, blocks, running
        self.prefill_tokens_left -= num_prefill_tokens
        if not decode and m0 and self._last_batch[i] < j - 1:   # a (re)fill resumed after a pause
            self.num_suspensions[i] += 1
        if m1 >= inp0:      # a token: a decode, or a (re)fill that reaches its input
            g = int(self.gen[i]) + 1
            self.gen[i] = g
            if g == 1 and not decode:
                self.first_token_s[i] = end
            self.decode_tokens_left -= 1
            if g == int(self.output_lens[i] if self._stop is None else self._stop[i]):
                self._finish_one(i, idx, g, end)
        self._last_batch[i] = j
        self.clock_s = end
        self.num_batches = j + 1
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return start, duration, BatchRecord(1, c, num_prefill_tokens, int(decode), kv, running, num_ev)

    def _finish_one(self, i: int, idx: np.ndarray, g: int, end: float) -> None:
        """Request ``i`` (``idx``: it alone) got its last token here, its ``g``-th, in the batch ending at
        ``end``: it completes, or leaves this replica (``hand_off``) with the rest of its output left elsewhere."""
        if self._stop is not None:
            if g < int(self.output_lens[i]):
                self.handoffs.append(i)
            self.decode_tokens_left -= int(self.output_lens[i]) - g     # left elsewhere
        self._complete(idx, end)

    def _start_running(self, i: int, start: float) -> None:
        """Waiting request ``i`` runs from a batch starting at ``start`` (its first time: NaN until now;
        an earlier first time is kept, as ``np.fmin`` does for several)."""
        self.status[i] = RUNNING
        if not self.first_scheduled_s[i] <= start:
            self.first_scheduled_s[i] = start
        self.version += 1

    def _evict(self, j: int, evict: np.ndarray) -> None:
        """Batch ``j``'s evictions (``apply``, step 1): drop the KV of the running requests ``evict``."""
        self._check_evictions(j, evict)
        status, m, inp = self.status, self.m, self.inp
        num_ev = int(evict.size)
        m_ev = m[evict]
        dec = m_ev >= inp[evict]
        inp[evict[dec]] = m_ev[dec] + 1
        m[evict] = 0
        status[evict] = WAITING
        self.num_evictions[evict] += 1
        self.refill_tokens[evict] += m_ev
        freed = int(_sum(m_ev))
        self.kv_used -= freed
        self.prefill_tokens_left += freed + int(np.count_nonzero(dec))   # all of it again (+1: a refill)
        if self._block > 1:
            self.blocks_used -= int(_sum(self.limits.kv_blocks(m_ev)))
        self.num_running -= num_ev
        self.version += 1

    def _new_blocks(self, m0: np.ndarray, all_decode: bool, one: int, c: int) -> int:
        """The KV blocks a batch of decodes (one token each) and, unless ``all_decode``, one (re)fill at
        position ``one`` processing ``c`` tokens adds, for a power-of-two block size (``_mask``): a decode
        takes a new block exactly when its KV fills whole blocks (m mod b = 0), the (re)fill
        ceil((m + c) / b) - ceil(m / b). The same count as Σ kv_blocks(m0 + tokens) - kv_blocks(m0)."""
        mask = self._mask
        full = _count_nonzero((m0 & mask) == 0)
        if all_decode:
            return full
        m = int(m0[one])
        return full - (not m & mask) + ((m + c + mask) >> self._shift) - ((m + mask) >> self._shift)

    def _fills(self, flags: bytes, tokens: np.ndarray, m0: np.ndarray, inp0: np.ndarray
               ) -> tuple[list[int], list[int], list[int], list[int]]:
        """A batch's (re)fills (the 0 bytes of its decode ``flags``): their positions, tokens, cached KV and
        inputs, in Python ints."""
        pos, k = [], flags.find(0)
        while k >= 0:
            pos.append(k)
            k = flags.find(0, k + 1)
        return (pos, [int(tokens[k]) for k in pos], [int(m0[k]) for k in pos], [int(inp0[k]) for k in pos])

    def _new_blocks_of_fills(self, m0: np.ndarray, fills: tuple[list[int], list[int], list[int], list[int]]) -> int:
        """:meth:`_new_blocks` of a batch of decodes and a few (re)fills (``fills``, :meth:`_fills`): each decode
        whose KV fills whole blocks takes one, each (re)fill ceil((m + c) / b) - ceil(m / b)."""
        mask, shift = self._mask, self._shift
        new = _count_nonzero((m0 & mask) == 0)
        for c, m in zip(fills[1], fills[2]):
            new += ((m + c + mask) >> shift) - ((m + mask) >> shift) - (not m & mask)
        return new

    # complexity: a branch per batch shape (all decodes, a few (re)fills among decodes, any), each in its cheapest form
    def _generate(self, j: int, idx: np.ndarray, m0: np.ndarray, inp0: np.ndarray, m1: np.ndarray,
                  is_decode: np.ndarray, num_decode: int, one: int, end: float,
                  fills: "tuple[list[int], list[int], list[int], list[int]] | None" = None) -> None:
        """Batch ``j`` (ending at ``end``) moved requests ``idx`` (``num_decode`` of them decoding; ``one``: the
        position of the only one that does not, else -1; ``fills``: a few (re)fills, :meth:`_fills`) from ``m0``
        to ``m1`` KV tokens: count the tokens generated, suspensions and first tokens, and free the KV of the
        requests it completes."""
        gen = self.gen
        if num_decode == idx.size:   # each generates a token, none its first (a decode follows one)
            g_idx = idx
            g = gen[g_idx] + 1
            gen[g_idx] = g
        elif fills is not None:      # a few (re)fills among decodes: they alone in Python ints
            last, reach = self._last_batch, []
            for k, c, m, i in zip(*fills):
                x = int(idx[k])
                if m and last[x] < j - 1:       # a (re)fill that skipped a batch was suspended
                    self.num_suspensions[x] += 1
                if m + c >= i:
                    reach.append(x)
            g_idx = idx if len(reach) == len(fills[0]) else idx[m1 >= inp0]
            g = gen[g_idx] + 1
            gen[g_idx] = g
            for x in reach:                      # (a decode never generates its first token)
                if gen[x] == 1:
                    self.first_token_s[x] = end
        elif one >= 0:   # one (re)fill among decodes (a hybrid batch): it alone in Python ints
            i = int(idx[one])
            if m0[one] and self._last_batch[i] < j - 1:     # a (re)fill that skipped a batch was suspended
                self.num_suspensions[i] += 1
            g_idx = idx if m1[one] >= inp0[one] else idx[is_decode]   # (the decodes generate, and it if it ends)
            g = gen[g_idx] + 1
            gen[g_idx] = g
            if g_idx is idx and gen[i] == 1:      # (a decode never generates its first token)
                self.first_token_s[i] = end
        else:
            pf = ~is_decode
            if np.count_nonzero(m0[pf]):   # a (re)fill that skipped at least one batch was suspended (preempted)
                r_idx = idx[pf & (m0 > 0)]
                self.num_suspensions[r_idx] += self._last_batch[r_idx] < j - 1
            g_idx = idx[m1 >= inp0]     # decodes (m1 > inp0) and (re)fills that reach their input
            g = gen[g_idx] + 1
            gen[g_idx] = g
            first = g_idx[g == 1]
            if first.size:
                self.first_token_s[first] = end
        self.decode_tokens_left -= int(g_idx.size)
        if self._stop is None:
            done = g == self.output_lens[g_idx]
            if 1 in done.tobytes():     # (mostly none completes: looked for without a NumPy call)
                self._complete(g_idx[done], end)
            return
        fin = g_idx[g == self._stop[g_idx]]
        if fin.size:
            self.handoffs.extend(fin[g[g == self._stop[g_idx]] < self.output_lens[fin]].tolist())
            self.decode_tokens_left -= int(_sum(self.output_lens[fin] - gen[fin]))   # left elsewhere
            self._complete(fin, end)

    def _complete(self, fin: np.ndarray, end_s: float) -> int:
        """Requests ``fin`` (running) got their last token in the batch ending at ``end_s``: free their KV
        (returned, in tokens)."""
        m = self.m
        self.completion_s[fin] = end_s
        held = m[fin].tolist()
        freed = sum(held)     # (a few: Python ints cost less than a reduction)
        self.kv_used -= freed
        if self._mask:        # (their blocks, ceil(m / b), by shifts)
            mask, shift = self._mask, self._shift
            self.blocks_used -= sum([(x + mask) >> shift for x in held])
        elif self._block > 1:
            self.blocks_used -= int(self.limits.kv_blocks(m[fin]).sum())
        m[fin] = 0
        self.status[fin] = DONE
        self.num_running -= int(fin.size)
        self.num_done += int(fin.size)
        self.version += 1
        return freed
