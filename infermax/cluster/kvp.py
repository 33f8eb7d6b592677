"""Where a replica's KV lives under KV-cache parallelism: shards of each request on KVP groups (Medha §3.4).

A replica with ``kvp = k`` is k groups of tp·stages GPUs. Each request's KV is a list of
*shards*, each a run of consecutive token positions on one group. Two ways to place them:

- ``dynamic`` (Medha's worker onboarding, Fig. 12): a request starts on the group with the
  most free KV; its new tokens go to its last shard until that shard holds
  ``group_tokens`` (Medha's per-worker token limit) or the group is full, then the next
  group is *onboarded*: the one the request does not use yet with the most free KV (any
  group with room when it uses them all). Short requests stay on one group and pay no
  merge; a long one spreads as it grows.
- ``static``: every request is striped over all k groups from its first token (position
  t on group t mod k) — the setting of Fig. 11, where every decode reads k equal shards.

A group never holds more than ``capacity`` tokens (its GPUs' memory after weights); a chunk
that finds no room raises ``ValueError`` naming the group. :meth:`KVLayout.place` returns
each group's attention work for the chunk it placed: per group, the KV a decode reads, or
the causal (query, key) pairs a prefill chunk computes there — the cached keys on that
group for every query, plus, for the new keys written there (positions u..u+len of the
chunk), len(len + 1)/2 + len·(c − u − len) — which sum over the groups to the
single-GPU model's c·m + c(c + 1)/2.
"""
from __future__ import annotations

import numpy as np

ONBOARDING = ("dynamic", "static")


class KVLayout:
    """The shards of every request on ``num_groups`` groups of ``capacity`` tokens each."""

    def __init__(self, num_groups: int, capacity: int, group_tokens: int, onboarding: str = "dynamic") -> None:
        if onboarding not in ONBOARDING:
            raise ValueError(f"kvp onboarding must be one of {ONBOARDING}, got {onboarding!r}")
        for name, v in (("num_groups", num_groups), ("capacity", capacity), ("group_tokens", group_tokens)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"KVLayout.{name} must be an integer >= 1, got {v!r}")
        self.k, self.capacity, self.group_tokens = int(num_groups), int(capacity), int(group_tokens)
        self.onboarding = onboarding
        self.kv = np.zeros(self.k, dtype=np.int64)          # tokens held per group
        self.shards: dict[int, list[list[int]]] = {}        # request -> [[group, tokens], ...] in position order
        self.onboarded: list[tuple[int, int, int]] = []     # (request, group, first position) of every new shard
        self.static_m: dict[int, int] = {}                   # static: request -> tokens striped so far
        self.vec: dict[int, np.ndarray] = {}                 # dynamic: request -> its tokens per group
        self._none = np.zeros(self.k)
        self._none.setflags(write=False)

    # --- queries -------------------------------------------------------------------------------------
    def tokens_of(self, i: int) -> np.ndarray:
        """Request i's tokens per group."""
        out = np.zeros(self.k, dtype=np.int64)
        if self.onboarding == "static":
            m = self.static_m.get(i, 0)
            out += m // self.k
            out[: m % self.k] += 1
            return out
        v = self.vec.get(i)
        return out if v is None else v.copy()

    def span(self, i: int) -> int:
        """How many groups hold request i's KV (those that merge its partial attention)."""
        if self.onboarding == "dynamic":
            v = self.vec.get(i)
            return 0 if v is None else int(np.count_nonzero(v))
        return min(self.k, self.static_m.get(i, 0))

    # --- changes -------------------------------------------------------------------------------------
    def free(self, i: int) -> None:
        """Request i's KV is gone (finished or evicted)."""
        self.kv -= self.tokens_of(i)
        self.shards.pop(i, None)
        self.vec.pop(i, None)
        if self.onboarding == "static":
            self.static_m.pop(i, None)

    def place(self, i: int, c: int, is_decode: bool) -> tuple[np.ndarray, np.ndarray]:
        """Write request i's next ``c`` tokens; returns (KV each group reads for it, if a decode, else 0s;
        causal prefill pairs each group computes for it, if a prefill chunk, else 0s). The arrays are
        read-only views for the caller."""
        if is_decode and c == 1 and self.onboarding == "dynamic":      # the common case: one more token
            shards = self.shards.get(i)
            if shards:
                last = shards[-1]
                g = last[0]
                if last[1] < self.group_tokens and self.kv[g] < self.capacity:
                    last[1] += 1
                    self.kv[g] += 1
                    v = self.vec[i]
                    v[g] += 1
                    return v, self._none
        before = self.tokens_of(i)
        work = c * before.astype(np.float64)
        if self.onboarding == "static":
            m = self.static_m.get(i, 0)
            per = np.full(self.k, c // self.k, dtype=np.int64)
            per[(m + np.arange(c % self.k)) % self.k] += 1       # positions m..m+c-1 on groups (m + j) mod k
            self.static_m[i] = m + c
            self.kv += per
            work += per * (c + 1) / 2                            # striped keys: their share of c(c+1)/2
        else:
            for g, u, n in self._place_dynamic(i, c):
                work[g] += n * (n + 1) / 2 + n * (c - u - n)
        over = np.flatnonzero(self.kv > self.capacity)
        if over.size:
            g = int(over[0])
            raise ValueError(f"KVP group {g} would hold {int(self.kv[g])} KV tokens > its capacity "
                             f"{self.capacity} (request index {i}; kvp_group_tokens = {self.group_tokens})")
        if is_decode:
            return self.tokens_of(i), self._none
        return self._none, work

    def _place_dynamic(self, i: int, c: int) -> list[tuple[int, int, int]]:
        shards = self.shards.setdefault(i, [])
        segments, u = [], 0
        m = sum(n for _, n in shards)
        while u < c:
            last = shards[-1] if shards else None
            if last is None or last[1] >= self.group_tokens or self.kv[last[0]] >= self.capacity:
                last = [self._onboard(i, shards), 0]
                shards.append(last)
                self.onboarded.append((i, last[0], m + u))
            g = last[0]
            n = int(min(c - u, self.group_tokens - last[1], self.capacity - self.kv[g]))
            last[1] += n
            self.kv[g] += n
            self.vec.setdefault(i, np.zeros(self.k, dtype=np.int64))[g] += n
            segments.append((g, u, n))
            u += n
        return segments

    def _onboard(self, i: int, shards: list[list[int]]) -> int:
        room = self.capacity - self.kv
        used = np.zeros(self.k, dtype=bool)
        used[[g for g, _ in shards]] = True
        fresh = np.where(~used & (room > 0), room, -1)
        if fresh.max() > 0:
            return int(np.argmax(fresh))
        if room.max() > 0:
            return int(np.argmax(room))
        raise ValueError(f"no KVP group has room for request index {i}: all {self.k} groups hold their "
                         f"capacity of {self.capacity} KV tokens")
