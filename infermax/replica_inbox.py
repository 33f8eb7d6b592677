"""How requests reach and leave one replica of a cluster: the part of ``ServingState`` only the cluster
engine (`infermax.cluster`) uses.

A state made with ``dispatched=True`` admits nothing by itself: the engine dispatches each request to it
(``dispatch``), or hands it over holding KV produced elsewhere (``receive``: a decode migrated after a
disaggregated prefill), and marks requests that leave after their first token (``hand_off``). The
single-replica simulator never calls these; :class:`~infermax.state.ServingState` inherits them.
"""
from __future__ import annotations

import numpy as np

from .status import FUTURE, RUNNING


class ReplicaInbox:
    """Dispatches, received KV and hand-offs of a :class:`~infermax.state.ServingState` (which owns every
    attribute these methods read and write: ``_admit_s``, ``_arrival_order``, ``_received``, ``_stop``, ...)."""

    def dispatch(self, i: int, time_s: float) -> None:
        """(``dispatched=True`` only) Request ``i`` reaches this replica at ``time_s``.

        Dispatches come in time order (the cluster engine's events); a request is
        dispatched once. It is admitted at once if the clock has reached ``time_s``.
        """
        self._queue(i, time_s)

    def receive(self, i: int, time_s: float, kv_tokens: int, generated: int) -> None:
        """(``dispatched=True`` only) Request ``i`` arrives at ``time_s`` holding ``kv_tokens`` of KV with
        ``generated`` tokens already produced elsewhere (a decode migrated after a disaggregated prefill).

        At admission it is RUNNING in decode phase if its KV fits (M, block M, R_max) next to what
        this replica holds; otherwise the KV is dropped on arrival and the request waits to recompute
        it like an evicted one (counted in ``num_evictions`` and ``refill_tokens``).
        """
        if not 1 <= generated < int(self.output_lens[i]) or kv_tokens != int(self.input_lens[i]) + generated - 1:
            raise ValueError(f"request {int(self.workload.ids[i])} received with {kv_tokens} KV tokens and "
                             f"{generated} generated: needs 1 <= generated < output_len = "
                             f"{int(self.output_lens[i])} and KV = input_len + generated - 1")
        self._received[int(i)] = (int(kv_tokens), int(generated))
        self._queue(i, time_s)

    def hand_off(self, i: int) -> None:
        """Request ``i`` leaves this replica after its first token (prefill here, decode elsewhere)."""
        if self._stop is None:
            self._stop = self.output_lens.copy()
        self._stop[i] = min(1, int(self.output_lens[i]))

    def _take_kv(self, i: int) -> None:
        got = self._received.pop(i, None)
        if got is None:
            return
        kv, gen = got
        lim = self.limits
        left = int(self.inp[i]) - int(self.m[i])    # (it holds no KV yet)
        self.decode_tokens_left -= gen - int(self.gen[i])
        self.gen[i] = gen
        fits = (self.kv_used + self.external_kv + kv <= lim.M and self.num_running < lim.max_running
                and (self._block == 1 or self.blocks_used + int(lim.kv_blocks(kv)) + self._external_blocks()
                     <= lim.num_blocks))
        if fits:
            self.m[i] = kv
            self.status[i] = RUNNING
            self.kv_used += kv
            if self._block > 1:
                self.blocks_used += int(lim.kv_blocks(kv))
            self.num_running += 1
        else:                        # no room: the KV is dropped, the request recomputes it (an eviction)
            self.inp[i] = kv + 1
            self.num_evictions[i] += 1
            self.refill_tokens[i] += kv
        self.prefill_tokens_left += max(int(self.inp[i]) - int(self.m[i]), 0) - left

    def _queue(self, i: int, time_s: float) -> None:
        if not self._dispatched:
            raise RuntimeError("dispatch() is for a ServingState made with dispatched=True")
        if self.status[i] != FUTURE or np.isfinite(self._admit_s[i]):
            raise ValueError(f"request {int(self.workload.ids[i])} is dispatched twice to the same replica")
        k = self._num_queued
        if k and time_s < self._admit_s[self._arrival_order[k - 1]]:
            raise ValueError(f"dispatch of request {int(self.workload.ids[i])} at {time_s!r} s is earlier than the "
                             f"previous dispatch ({float(self._admit_s[self._arrival_order[k - 1]])!r} s)")
        self._admit_s[i] = time_s
        self._arrival_order[k] = i
        self._num_queued = k + 1
        self.prefill_tokens_left += max(int(self.inp[i]) - int(self.m[i]), 0)
        self.decode_tokens_left += int(self.output_lens[i]) - int(self.gen[i])
        if time_s <= self.clock_s:
            self.admit_arrivals()

    @property
    def pending(self) -> np.ndarray:
        """Requests dispatched (or arriving) but not yet admitted, in admission order."""
        return self._arrival_order[self._next_arrival:self._num_queued]

    @property
    def has_work(self) -> bool:
        """Requests dispatched here and not finished (admitted or not yet)."""
        return self.num_done < self._num_queued
