"""PecSched at replica level (PecSched §3.2, §5.1-5.2), and its two baselines.

Requests are short or long (the workload's ``long`` tags, else prompt >=
``long_threshold`` tokens). Every batch runs every decode first: decodes are
never preempted. Then prefills, by policy:

- ``pecsched``: short prefills preempt a running long prefill at chunk
  granularity — the long request keeps its KV and resumes in a later batch; short
  prefills are capped at ``colocate_tokens`` while a long request decodes (so the
  long decode is not slowed), and the long prefill keeps at least
  ``long_min_chunk`` tokens per batch. At replica level this stands for the
  paper's long prefill running sequence-parallel across replicas while short
  prefills preempt only part of them; it bounds how long a long request can be
  held back (no starvation).
- ``pecsched-fifo``: first come, first served chunked prefill (vLLM's FIFO): a
  long prefill at the head of the queue blocks the short ones behind it. That is
  a :class:`~infermax.policy.Policy` value of the GetNextBatch family (decode
  priority, hybrid, chunked, eviction-free: ``sarathi-pc-ef``'s policy), not a
  PecSched.
- ``pecsched-priority``: short requests strictly first; a long prefill runs only
  in batches with no short request to serve — so a steady stream of short
  requests starves the long ones (§3.2, Table 2).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from infermax.policy import Policy
from infermax.state import ServingState

from .base import Plan, Scheduler
from .framework import GetNextBatch
from .longctx import BatchDraft, long_mask, phases
from .registry import register_scheduler

POLICIES = ("pecsched", "priority")
#: FCFS chunked prefill, decodes first, each request's peak KV reserved at admission
FIFO = Policy(priority="decode", hybrid=True, chunked_prefill=True, allow_eviction=False)


class PecSched(Scheduler):
    """Short-prefill preemption of long prefills, with long decodes co-batched.

    Not a GetNextBatch policy: what it decides is how many tokens each class of request gets
    (short prefills capped at ``colocate_tokens`` beside a long decode, at least
    ``long_min_chunk`` for a started long prefill; ``priority``: long work only in a batch
    with no short work), not an order of requests or a choice of victims.
    """

    def __init__(self, *, policy: str = "pecsched", long_threshold: int | None = None,
                 colocate_tokens: int = 2048, long_min_chunk: int = 512, R_max: int | None = None,
                 name: str | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"PecSched.policy must be one of {POLICIES}, got {policy!r}")
        for field, v in (("colocate_tokens", colocate_tokens), ("long_min_chunk", long_min_chunk)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"PecSched.{field} must be an integer >= 0, got {v!r}")
        self.policy, self.long_threshold = policy, long_threshold
        self.colocate_tokens, self.long_min_chunk, self.R_max = colocate_tokens, long_min_chunk, R_max
        self.name = name or ("pecsched" if policy == "pecsched" else f"pecsched-{policy}")

    def reset(self, state: ServingState) -> None:
        self._long = long_mask(state, self.long_threshold)
        self._R = min(self.R_max or state.limits.max_running, state.limits.max_running)

    def next_batch(self, state: ServingState) -> Plan:
        running, dec, cand = phases(state)
        draft = BatchDraft(state, self._R, running)
        is_long = self._long[cand]
        shorts, longs = cand[~is_long], cand[is_long]
        if self.policy == "priority":
            short_dec, long_dec = dec[~self._long[dec]], dec[self._long[dec]]
            draft.add_decodes(short_dec)
            self._fill(draft, shorts)
            if not draft.idx:   # long work only when no short request needs the GPU
                draft.add_decodes(long_dec)
                self._fill(draft, longs)
        else:
            draft.add_decodes(dec)
            keep = self.long_min_chunk if longs.size and state.m[longs[0]] > 0 else 0
            cap = draft.C - min(keep, draft.C)
            if self._long[dec].any():
                cap = min(cap, self.colocate_tokens)
            self._fill(draft, shorts, budget=cap)
            self._fill(draft, longs)
        return draft.plan()

    @staticmethod
    def _fill(draft: BatchDraft, cand: np.ndarray, budget: int | None = None) -> None:
        """Prefill chunks of ``cand`` in order (``budget`` tokens in all), up to the first that cannot run."""
        used = 0
        for x in cand.tolist():
            room = draft.room(x)
            if budget is not None:
                room = min(room, budget - used)
            if room <= 0:
                return
            draft.add_prefill(x, room)
            used += room
            if draft.C <= 0 or draft.P <= 0:
                return

    def describe(self) -> dict:
        return {"name": self.name, "policy": self.policy, "colocate_tokens": self.colocate_tokens,
                "long_min_chunk": self.long_min_chunk}


@register_scheduler("pecsched", "PecSched: short prefills preempt long prefills; long decodes co-batched")
def pecsched(**options) -> PecSched:
    return PecSched(**options)


@register_scheduler("pecsched-fifo", "PecSched's FIFO baseline: FCFS chunked prefill (head-of-line blocking)")
def pecsched_fifo(R_max: int | None = None) -> GetNextBatch:
    return GetNextBatch(replace(FIFO, R_max=R_max), name="pecsched-fifo")


@register_scheduler("pecsched-priority", "PecSched's priority baseline: short requests strictly first")
def pecsched_priority(**options) -> PecSched:
    return PecSched(policy="priority", **options)
