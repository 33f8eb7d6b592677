"""Local queue lengths, kept per replica as replicas change, and the index that finds the shortest one.

PecSched §6.2 ("Scheduling") sends a request to the eligible replica with the
shortest local queue, measured in tokens (Splitwise's measure): for the requests
dispatched to the replica, the prefill tokens left plus — unless the replica hands
its requests off after their first token — their decode tokens left; plus the
replica's share of its gang's long request; plus the decodes migrating to it.

Summing that over every replica's requests at every decision costs O(replicas ·
requests). Here a replica's length is read from its state's counters
(``ServingState.prefill_tokens_left``, ``decode_tokens_left``) and from two
per-replica arrays (``inflight``, ``gang_tokens``), and only for the replicas that
changed since the last refresh (:meth:`Loads.touch`). A decision refreshes once, at
its start, and then sees its own placements only (:meth:`Loads.take`): the lengths
are a snapshot taken at the start of the decision, as they always were.

:class:`ShortestQueues` answers "the replica with the fewest queued tokens in these
buckets, the lowest index on ties" in O(log R): one heap per bucket keyed
``(tokens, replica)``; an update voids the replica's previous entry (lazy deletion),
and a heap is rebuilt when its void entries outnumber its live ones.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable, Sequence

import numpy as np

# a replica's tier for short requests (PecSched Fig. 6): in no gang, or in a gang in this phase
FREE, GANG_WAIT, GANG_PREFILL, GANG_DECODE = 0, 1, 2, 3
NUM_TIERS = 4


class ShortestQueues:
    """Replicas filed in buckets; the least ``(tokens, replica)`` over a set of buckets in O(log R)."""

    def __init__(self, num_replicas: int, num_buckets: int) -> None:
        self._heaps: list[list[tuple[int, int, int]]] = [[] for _ in range(num_buckets)]
        self._live = [0] * num_buckets
        self._stamp = [0] * num_replicas            # an entry (tokens, r, stamp) is live iff stamp is r's
        self._bucket: list[int | None] = [None] * num_replicas

    def file(self, r: int, tokens: int, bucket: int | None) -> None:
        """Replica r now has ``tokens`` queued and belongs to ``bucket`` (None: to none)."""
        old = self._bucket[r]
        if old is not None:
            self._live[old] -= 1
        self._stamp[r] += 1
        self._bucket[r] = bucket
        if bucket is None:
            return
        heap = self._heaps[bucket]
        heapq.heappush(heap, (tokens, r, self._stamp[r]))
        self._live[bucket] += 1
        if len(heap) > 2 * self._live[bucket] + 64:
            stamp = self._stamp
            heap[:] = [e for e in heap if e[2] == stamp[e[1]]]
            heapq.heapify(heap)

    def shortest(self, buckets: Iterable[int]) -> int | None:
        """The replica with the fewest tokens over ``buckets`` (lowest index on ties), or None."""
        stamp, best = self._stamp, None
        for b in buckets:
            heap = self._heaps[b]
            while heap and heap[0][2] != stamp[heap[0][1]]:
                heapq.heappop(heap)
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return None if best is None else best[1]


class Loads:
    """Per replica: queued tokens, whether it accepts work, its tier; and the shortest-queue indexes.

    ``classes[r]``: replica r's eligibility class (an int in ``[0, num_classes)``, or -1 for a replica
    that requests are never dispatched to); ``decode_pool``: the replicas that receive migrated
    decodes (chosen among all of them, accepting or not).
    """

    def __init__(self, classes: np.ndarray, num_classes: int, decode_pool: np.ndarray) -> None:
        R = int(classes.size)
        self.tokens = np.zeros(R, dtype=np.int64)       # as of the last refresh, plus placements since
        self.accepting = np.ones(R, dtype=bool)         # no request waits to start there
        self.tier = np.full(R, FREE, dtype=np.int8)
        self.inflight = np.zeros(R, dtype=np.int64)     # decode tokens migrating to each replica
        self.gang_tokens = np.zeros(R, dtype=np.int64)  # each member's share of its gang's long request
        self._class = classes.tolist()
        self._is_decode = decode_pool.tolist()
        self._dirty: set[int] = set()
        self._placing = ShortestQueues(R, num_classes * NUM_TIERS)
        self._decode = ShortestQueues(R, 1)
        for r in range(R):
            self._file(r)

    def touch(self, r: int) -> None:
        """Replica r's work changed: its length is read again at the next refresh."""
        self._dirty.add(r)

    def refresh(self, read: Callable[[int], tuple[int, bool]]) -> None:
        """Read again the replicas touched since the last refresh; ``read(r)`` gives (tokens queued in
        r's own state, whether it accepts work)."""
        dirty = self._dirty
        while dirty:
            r = dirty.pop()
            own, accepting = read(r)
            self.tokens[r] = own + int(self.inflight[r]) + int(self.gang_tokens[r])
            self.accepting[r] = accepting
            self._file(r)

    def take(self, r: int, tokens: int) -> None:
        """A decision placed work of ``tokens`` on replica r: it accepts nothing more until read again."""
        self.tokens[r] += tokens
        self.accepting[r] = False
        self._file(r)
        self._dirty.add(r)

    def set_tier(self, r: int, tier: int) -> None:
        self.tier[r] = tier
        self._file(r)

    def shortest(self, tiers: Sequence[Sequence[int]]) -> int | None:
        """The accepting replica with the shortest queue in the first bucket list of ``tiers`` that has one."""
        for buckets in tiers:
            r = self._placing.shortest(buckets)
            if r is not None:
                return r
        return None

    def shortest_decode(self) -> int:
        """The decode replica with the shortest queue (any: decode replicas take migrations whenever)."""
        return self._decode.shortest((0,))

    @staticmethod
    def bucket(cls: int, tier: int) -> int:
        return cls * NUM_TIERS + tier

    def _file(self, r: int) -> None:
        cls = self._class[r]
        tokens = int(self.tokens[r])
        if cls >= 0:
            self._placing.file(r, tokens, cls * NUM_TIERS + int(self.tier[r]) if self.accepting[r] else None)
        if self._is_decode[r]:
            self._decode.file(r, tokens, 0)
