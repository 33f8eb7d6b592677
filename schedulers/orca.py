"""Orca as Vidur simulates it (microsoft/vidur ``orca_replica_scheduler``): iteration-level
scheduling with whole prompts and a worst-case KV reservation.

Each batch: every running request decodes (Orca prefills a prompt whole, so a running
request is always in decode phase); then waiting requests join, first come first served,
each with its whole prompt, while the batch has room and a KV *slot* is free. A slot is
``max_tokens`` of KV reserved at admission — the longest request the deployment accepts,
not the request's own length — and given back only when the request completes; so no
request is ever evicted, and at most ``M // max_tokens`` run at once (in blocks of
``Limits.block_size`` when it is > 1).

Where infermax's rules add to Vidur's: a batch holds at most C tokens and P prefill tokens
(Vidur's Orca has no token budget), so the first waiting request that does not fit stops
the admissions (first come, first served); and a request is admitted only while the
running requests number fewer than ``min(R_max, C)``, so that every running request
decodes in every batch (in Vidur the running requests never outnumber the batch cap, for
the same reason). ``max_tokens`` defaults to the largest peak KV (I + O - 1) of the
workload — Vidur's ``max_tokens`` is the request generator's bound.

The helpers here are shared with ``fastertransformer`` and ``lightllm``, Vidur's other
whole-prompt schedulers.
"""
from __future__ import annotations

import numpy as np

from infermax.state import RUNNING, WAITING, ServingState

from .base import Plan, Scheduler
from .registry import register_scheduler


def check_whole_prompts(state: ServingState, name: str, C: int, P: int) -> None:
    """Refuse (ValueError naming the request and the limit) a prompt no batch can hold whole."""
    cap = min(C, P)
    served = True if state.serves is None else state.serves
    too_long = np.flatnonzero((state.input_lens > cap) & served)
    if too_long.size:
        i = int(too_long[0])
        raise ValueError(f"scheduler {name!r} prefills whole prompts, but request {int(state.workload.ids[i])} "
                         f"has {int(state.input_lens[i])} prompt tokens > min(C = {C}, P = {P}); raise C/P or "
                         f"use a chunked scheduler")


def running_and_waiting(state: ServingState) -> tuple[np.ndarray, np.ndarray]:
    """The running and the waiting requests, each oldest arrival first (ties by index)."""
    act = state.active
    st = state.status[act]
    return act[st == RUNNING], act[st == WAITING]


def admit_fifo(state: ServingState, waiting: np.ndarray, num: int, C: int, P: int) -> np.ndarray:
    """The longest prefix of ``waiting`` of at most ``num`` requests whose whole prompts fit C and P."""
    if num <= 0 or not waiting.size:
        return waiting[:0]
    head = waiting[:num]
    k = int(np.searchsorted(np.cumsum(state.input_lens[head]), min(C, P), "right"))
    return head[:k]


def decode_plan(running: np.ndarray, prefill: np.ndarray, state: ServingState) -> Plan:
    """A batch of one decode token per ``running`` request and the whole prompts of ``prefill``."""
    idx = np.concatenate((running, prefill)) if prefill.size else running
    tokens = np.concatenate((np.ones(running.size, dtype=np.int64), state.input_lens[prefill]))
    return Plan(idx.astype(np.int64), tokens.astype(np.int64), np.zeros(0, dtype=np.int64))


class ReservingScheduler(Scheduler):
    """Whole prompts, ``max_tokens`` of KV reserved per admitted request (Orca, FasterTransformer)."""

    def __init__(self, *, R_max: int | None = None, max_tokens: int | None = None, name: str) -> None:
        for field, v in (("R_max", R_max), ("max_tokens", max_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name}.{field} must be an integer >= 1 or None, got {v!r}")
        self.R_max, self.max_tokens, self.name = R_max, max_tokens, name

    def reset(self, state: ServingState) -> None:
        lim = state.limits
        check_whole_prompts(state, self.name, lim.C, lim.P)
        served = np.ones(state.num_requests, dtype=bool) if state.serves is None else state.serves
        peak = state.peak_kv[served]
        reserve = int(peak.max(initial=1)) if self.max_tokens is None else self.max_tokens
        if peak.size and int(peak.max()) > reserve:
            i = int(np.flatnonzero(served)[int(np.argmax(peak))])
            raise ValueError(f"scheduler {self.name!r}: request {int(state.workload.ids[i])} needs "
                             f"{int(state.peak_kv[i])} KV tokens, more than max_tokens = {reserve}")
        blocks = -(-reserve // lim.block_size)
        if blocks > lim.num_blocks:
            raise ValueError(f"scheduler {self.name!r}: max_tokens = {reserve} needs {blocks} KV blocks, more "
                             f"than M = {lim.M} holds")
        self._reserve = reserve
        self._slots = lim.num_blocks // blocks          # requests that may hold a reservation at once
        self._R = min(self.R_max or lim.max_running, lim.max_running, lim.C)

    def describe(self) -> dict:
        return {"name": self.name, "R_max": self.R_max, "max_tokens": self.max_tokens}


class Orca(ReservingScheduler):
    """Orca (Vidur): all running requests decode, then whole prompts first come first served into free
    ``max_tokens`` KV slots; never evicts."""

    def __init__(self, *, R_max: int | None = None, max_tokens: int | None = None, name: str = "orca") -> None:
        super().__init__(R_max=R_max, max_tokens=max_tokens, name=name)

    def next_batch(self, state: ServingState) -> Plan:
        lim = state.limits
        running, waiting = running_and_waiting(state)     # (whole prompts: every running request decodes)
        running = running[:lim.C]                         # (received decodes of a cluster may outnumber C)
        room = min(self._R, self._slots) - running.size
        new = admit_fifo(state, waiting, room, lim.C - running.size, lim.P)
        return decode_plan(running, new, state)

    def decode_run(self, state: ServingState, plan: Plan) -> tuple[np.ndarray, int]:
        """With nobody waiting, every next batch decodes the running requests until the last completes
        (an arrival voids the promise: the engine)."""
        running, waiting = running_and_waiting(state)
        if waiting.size or not running.size:
            return running[:0], 0
        return running, int((state.output_lens[running] - state.gen[running]).max())


@register_scheduler("orca", "Orca (as Vidur simulates it): decodes + whole prompts FCFS, max_tokens KV "
                    "reserved per request, no eviction")
def orca(R_max: int | None = None, max_tokens: int | None = None) -> Orca:
    return Orca(R_max=R_max, max_tokens=max_tokens)
