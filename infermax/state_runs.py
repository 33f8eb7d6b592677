"""The simulator's fast path through a :class:`~infermax.state.ServingState`: runs of identical batches
applied in closed form.

``apply_decode_run`` applies decode batches of the same requests (one token each) until the next arrival
or completion, ``apply_hybrid_run`` batches of decodes beside one (re)fill chunk; each is equivalent, batch
for batch and bit for bit, to calling ``apply`` (:mod:`infermax.state_transitions`) that many times, and
returns the batches as segments the trace records whole. :class:`DecodeRuns` is a mixin of
``ServingState``, which owns every attribute these methods read and write; the runs' rules are checked by
:mod:`infermax.state_rules`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .costmodel import CostModel
from .state_rules import _count_nonzero, _sum


class DecodeSegment(NamedTuple):
    """``num_batches`` identical decode batches of requests ``idx`` (one token each), as
    :meth:`ServingState.apply_decode_run` applied them: per batch its start and duration (s)
    and the KV tokens held during it; ``num_running`` requests held KV during each."""

    idx: np.ndarray
    num_batches: int
    starts_s: list[float]
    durations_s: list[float]
    kv_tokens: range
    num_running: int


class HybridSegment(NamedTuple):
    """``num_batches`` identical hybrid batches, as :meth:`ServingState.apply_hybrid_run` applied them: the
    decodes ``idx[:-1]`` (a token each) and the (re)fill ``idx[-1]`` (``tokens[-1]`` tokens a batch); per
    batch its start and duration (s) and the KV tokens held during it; ``num_running`` requests held KV."""

    idx: np.ndarray
    tokens: np.ndarray
    num_batches: int
    starts_s: list[float]
    durations_s: list[float]
    kv_tokens: range
    num_running: int


class DecodeRuns:
    """Decode runs and hybrid runs of a :class:`~infermax.state.ServingState`, in closed form."""

    def apply_decode_run(self, idx: np.ndarray, num_steps: int) -> list[DecodeSegment]:
        """Run up to ``num_steps`` decode batches of the requests ``idx`` (the simulator's fast path).

        Equivalent, batch for batch and bit for bit, to calling :meth:`apply` with
        ``tokens = 1`` for the requests of ``idx`` not yet finished, that many times: a
        request leaves the batches after the one that completes it. Stops early at the
        first batch that would start at or after the next arrival, and when every request
        of ``idx`` is done. Returns the batches as segments of identical ones (a new
        segment starts after each batch that completes a request).
        """
        m0 = self.m[idx]
        self._check_decode_run(idx, m0)
        run = idx
        left = self.output_lens[run] - self.gen[run]      # batches until each request completes (>= 1)
        ends = sorted(left.tolist())    # the same, in order: the next completion read off in Python ints
        nxt = self.next_arrival_s
        # Σ m of the run's requests, then kept in Python ints: kv_used when they are every running request
        kv_sum = self.kv_used if idx.size == self.num_running else int(_sum(m0))
        done, e = 0, 0                  # batches applied; ends[e], the first completion after them
        segments: list[DecodeSegment] = []
        while num_steps > 0:
            first_done = ends[e] - done
            steps = min(num_steps, first_done)            # the last of these may complete requests
            segment = self._decode_segment(idx, m0, kv_sum, steps, nxt)
            if segment is None:
                break
            segments.append(segment)
            if segment.num_batches < steps or steps < first_done:   # an arrival, or the run's end
                break
            num_steps -= steps
            done += steps
            kv_sum += idx.size * steps - self._complete(run[left == done], self.clock_s)
            idx = run[left > done]      # (in the run's order)
            if not idx.size:
                break
            while ends[e] <= done:
                e += 1
            m0 = self.m[idx]
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return segments

    def apply_hybrid_run(self, idx: np.ndarray, chunk: int, num_steps: int) -> HybridSegment | None:
        """Run up to ``num_steps`` batches of the decodes ``idx[:-1]`` (a token each) and the (re)fill ``idx[-1]``
        (``chunk`` tokens each batch) — a prefill chunk advancing alongside decodes, in closed form (the
        simulator's fast path, as :meth:`apply_decode_run` is for decodes alone).

        Equivalent, batch for batch and bit for bit, to calling :meth:`apply` with these requests and tokens
        that many times, stopping before the first batch that would start at or after the next arrival. Only
        its last batch may complete requests, and none may end the (re)fill (``ScheduleError`` "hybrid-run"
        otherwise). None,
        with nothing applied, when the batches are not timed from their sums (a cost model with its own
        ``batch_time``) or one of them would break a rule: then apply them one by one (which names it).
        """
        j, n = self.num_batches, int(idx.size) - 1
        m0, inp0 = self.m[idx], self.inp[idx]
        mx, ix = int(m0[n]), int(inp0[n])
        left, first_done = self._check_hybrid_run(j, idx, chunk, num_steps, m0, inp0, mx, ix)
        blocks = self._hybrid_fits(idx, chunk, num_steps, m0, mx)
        if blocks is None:
            return None
        dec, timer, width, kv0 = idx[:n], self._timer, n + chunk, self.kv_used
        nxt = self.next_arrival_s
        stop = math.inf if nxt is None else nxt
        s_dec = int(_sum(m0[:n]))
        t, starts, durations = self.clock_s, [], []
        for k in range(num_steps):
            if t >= stop:
                break
            # apply's timer arguments: n + 1 requests, n + chunk tokens, n decodes reading Σ (m + 1), the chunk's
            # twice causal work and its tokens
            d = timer(n + 1, width, n, n + s_dec + k * n, chunk * (2 * (mx + k * chunk) + chunk + 1), chunk)
            starts.append(t)
            durations.append(d)
            t = t + d        # (apply's end = start + duration)
        k = len(durations)
        tokens = np.ones(n + 1, dtype=np.int64)
        tokens[n] = chunk
        tokens.setflags(write=False)
        if not k:
            return HybridSegment(idx, tokens, 0, starts, durations, range(0), self.num_running)
        x = int(idx[n])
        if mx and self._last_batch[x] < j - 1:     # a (re)fill resumed after a pause (apply's first batch)
            self.num_suspensions[x] += 1
        if self._block > 1:
            self.blocks_used = blocks if k == num_steps else self._hybrid_blocks(m0, mx, chunk, k)
        self.m[dec] = m0[:n] + k
        self.m[x] = mx + k * chunk
        self.gen[dec] += k
        self.decode_tokens_left -= n * k
        self.prefill_tokens_left -= chunk * k
        self._last_batch[idx] = j + k - 1
        kv = range(kv0 + width, kv0 + width * k + 1, width)     # held during each batch
        self.kv_used = kv[-1]
        running = self.num_running
        if k == first_done:     # the last batch completes decodes (apply's _generate, at its end)
            self._complete(dec[left == k], t)
        self.clock_s = t
        self.num_batches = j + k
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return HybridSegment(idx, tokens, k, starts, durations, kv, running)

    def _hybrid_fits(self, idx: np.ndarray, chunk: int, num_steps: int, m0: np.ndarray, mx: int) -> int | None:
        """The blocks in use after the ``num_steps`` hybrid batches of ``idx`` (0 when block_size is 1), or None when
        the closed form does not apply: the batches are not timed from their sums, or one would break a limit (C,
        P, R_max, M, M-blocks, a repeated request), which ``apply``, batch by batch, names."""
        lim, width = self.limits, int(idx.size) - 1 + chunk
        if (self._timer is None or width > lim.C or chunk > lim.P or self.num_running > lim.max_running
                or self.kv_used + num_steps * width + self.external_kv > lim.M or self._repeats(idx)):
            return None
        if self._block == 1:
            return 0
        blocks = self._hybrid_blocks(m0, mx, chunk, num_steps)
        if blocks + self._external_blocks() > self._num_blocks:
            return None        # (the blocks only grow along the run: the last batch holds the most)
        return blocks

    def _hybrid_blocks(self, m0: np.ndarray, mx: int, chunk: int, num_steps: int) -> int:
        """Blocks in use after ``num_steps`` batches of the decodes holding ``m0[:-1]`` and a (re)fill of ``chunk``
        tokens a batch from ``mx`` (``m0[-1]``): the decodes' as :meth:`_blocks_after_decodes` counts them, the
        (re)fill's ceil((mx + steps · chunk) / b) - ceil(mx / b) more."""
        kv_blocks = self.limits.kv_blocks
        dec_blocks = self._blocks_after_decodes(m0[:-1], num_steps)[0]
        return dec_blocks + kv_blocks(mx + num_steps * chunk) - kv_blocks(mx)

    def _decode_segment(self, idx: np.ndarray, m0: np.ndarray, kv_sum: int, num_steps: int,
                        next_arrival_s: float | None) -> DecodeSegment | None:
        """Up to ``num_steps`` identical decode batches of ``idx`` (holding ``m0``, ``kv_sum`` in all) completing
        no request before the last, stopping before the first that would start at or after ``next_arrival_s``."""
        j = self.num_batches
        n = int(idx.size)
        if self._run_timer is not None:
            durations, starts = self._run_timer(n, kv_sum, num_steps, self.clock_s, next_arrival_s)
        else:
            durations, starts = self._run_starts(m0, num_steps, next_arrival_s)
        num_steps = len(durations)
        if num_steps <= 0:
            return None
        kv = range(self.kv_used + n, self.kv_used + n * num_steps + 1, n)   # held during each batch
        blocks, bad_step = self._blocks_after_decodes(m0, num_steps) if self._block > 1 else (0, None)
        if kv[-1] + self.external_kv > self.limits.M or bad_step is not None or n > self.limits.C:
            self._refuse_decode_segment(j, n, m0, kv, bad_step)     # (raises: M, M-blocks or C)
        if self._block > 1:
            self.blocks_used = blocks
        self.m[idx] = m0 + num_steps
        self.gen[idx] += num_steps
        self.decode_tokens_left -= n * num_steps
        # (``_last_batch`` is not kept here: it is read only for a (re)fill, and a decoding request starts
        # one only after an eviction, from m = 0, its first batch setting it before any read)
        self.kv_used = kv[-1]
        self.clock_s = starts.pop()      # (the end of the last batch; the rest are their starts)
        self.num_batches = j + num_steps
        return DecodeSegment(idx, num_steps, starts, durations, kv, self.num_running)

    def _run_starts(self, m0: np.ndarray, num_steps: int, next_arrival_s: float | None
                    ) -> tuple[list[float], list[float]]:
        """The durations of up to ``num_steps`` decode batches of requests holding ``m0`` from the clock on,
        stopping before the first that would start at or after ``next_arrival_s``, and their starts followed
        by the end of the last: the cost model's ``decode_run_starts`` (:class:`CostModel`'s, for a cost
        object that only has ``decode_run_times``)."""
        starts_of = getattr(self.cost, "decode_run_starts", None)
        if starts_of is None:
            return CostModel.decode_run_starts(self.cost, m0, num_steps, self.clock_s, next_arrival_s)
        return starts_of(m0, num_steps, self.clock_s, next_arrival_s)

    def _blocks_after_decodes(self, m0: np.ndarray, num_steps: int) -> tuple[int, int | None]:
        """(blocks in use after ``num_steps`` decodes of requests holding ``m0``, the first step, from 0,
        whose blocks, with those of the external KV, exceed M // block_size, or None): the count only grows
        with the steps."""
        room = self._num_blocks - (self._external_blocks() if self.external_kv else 0)
        if self._mask:
            # a request with r = (-m) mod b free slots in its last block takes q new blocks in s = q b + t steps
            # (0 <= t < b), and one more if r < t: Σ kv_blocks(m0 + s) - Σ kv_blocks(m0) without the two sums
            q, t = divmod(num_steps, self._block)
            last = self.blocks_used + m0.size * q
            if t:
                last += int(_count_nonzero((-m0 & self._mask) < t))
            if last <= room:
                return last, None
        lim = self.limits
        base = self.blocks_used - int(lim.kv_blocks(m0).sum())

        def blocks(s: int) -> int:
            return base + int(lim.kv_blocks(m0 + s).sum())
        last = blocks(num_steps)
        if last <= room:
            return last, None
        lo, hi = 0, num_steps            # blocks(lo) fits, blocks(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if blocks(mid) <= room else (lo, mid)
        return last, hi - 1
