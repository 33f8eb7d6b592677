"""vllm-v1: the scheduler of vLLM's V1 engine (vllm 0.32, ``vllm/v1/core/sched/scheduler.py``), step for step.

vLLM V1 has no prefill or decode phase: each step gives every request the tokens it lacks (its
prompt, or its prompt plus its outputs after a preemption, or one token when decoding), under one
token budget ``C`` (``max_num_batched_tokens``) that decodes count against, cutting a prompt to a
chunk where the budget ends. With the engine's defaults (FCFS, prefix caching off, no speculative
decoding, no long-prefill threshold, synchronous scheduling):

1. **Running requests first**, in the order they were admitted (the ``running`` list; a request
   admitted again after a preemption goes to its end). Each gets ``min(tokens it lacks, budget
   left)``. KV is allocated in blocks for the tokens computed after the step,
   ``ceil((m + c) / block_size)``; when a request cannot get its new blocks, the *last* running
   request (the latest admitted) is preempted — its blocks freed, its KV recomputed later — until
   the blocks fit, or the request preempts itself, which ends the pass.
2. **Waiting requests next, only if nothing was preempted in this step**, in queue order (arrival
   order; a preempted request goes back to the *front*), while the budget lasts and fewer than
   ``R_max`` (``max_num_seqs``) requests run. A request is admitted only if the blocks of its whole
   current input (``scheduler_reserve_full_isl``, on by default), plus the watermark when some
   request runs, are free; it then gets ``min(input, budget left)`` tokens. The first one that does
   not fit stops the pass (strict FCFS).

KV blocks are ``Limits.block_size`` tokens (vLLM's default is 16; the CPU build wants 32); the
cache has ``M // block_size`` usable blocks (``num_gpu_blocks`` less vLLM's null block, see
:mod:`infermax.engines.vllm_config`). ``watermark`` is vLLM's ``scheduler_config.watermark``, a
fraction of ``M // block_size + 1`` blocks (the engine's block count), 0 by default. ``P < C``, which
vLLM cannot express, caps the prefill tokens of a step as a second budget (a request whose chunk
it leaves at 0 tokens is passed over, as vLLM passes over one with no tokens to schedule).

The scheduler keeps vLLM's two queues between batches (the running order and the waiting queue
cannot be read off the serving state), so one instance serves one run at a time (``reset``).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from infermax.state import DONE, ServingState

from .base import Plan, Scheduler
from .registry import register_scheduler

_NONE = np.zeros(0, dtype=np.int64)


class VllmV1(Scheduler):
    """vLLM V1's scheduler (see the module docstring)."""

    def __init__(self, R_max: int | None = None, watermark: float = 0.0) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"vllm-v1 watermark must be in [0, 1), got {watermark!r}")
        self.name = "vllm-v1"
        self.R_max, self.watermark = R_max, watermark

    def describe(self) -> dict:
        out = {"name": self.name, "priority": "running-first", "hybrid": True, "chunked": True,
               "eviction_free": False, "P": None, "R_max": self.R_max}
        if self.watermark:
            out["watermark"] = self.watermark
        return out

    def reset(self, state: ServingState) -> None:
        lim = state.limits
        self._bs = lim.block_size
        self._blocks = lim.num_blocks
        self._wm = int(self.watermark * (lim.num_blocks + 1))
        self._R = min(self.R_max, lim.max_running) if self.R_max is not None else lim.max_running
        self._running: list[int] = []          # admission order
        self._waiting: deque[int] = deque()    # queue order: preempted ones in front, then arrivals
        self._seen = 0                         # arrivals (in arrival order) already queued

    def _blk(self, tokens: int) -> int:
        return -(-tokens // self._bs)

    def _sync(self, state: ServingState) -> None:
        """Drop the requests that completed since the last batch; queue the ones that arrived."""
        if self._running and DONE in state.status[self._running].tobytes():
            self._running = [i for i in self._running if state.status[i] != DONE]
        order = state.arrival_order
        arrived = state.num_requests - state.num_pending
        while self._seen < arrived:
            self._waiting.append(int(order[self._seen]))
            self._seen += 1

    # complexity: vLLM v1's scheduling loop as it reads: running first (with preemption), then waiting
    def next_batch(self, state: ServingState) -> Plan:
        self._sync(state)
        m, inp = state.m, state.inp
        budget, p_budget = state.limits.C, state.limits.P
        free = self._blocks - sum(self._blk(int(m[i])) for i in self._running)
        ids: list[int] = []
        toks: list[int] = []
        evicted: list[int] = []
        k = 0
        while k < len(self._running) and budget > 0:
            i = self._running[k]
            mi, need = int(m[i]), max(int(inp[i]) - int(m[i]), 1)
            c = min(need, budget) if mi >= int(inp[i]) else min(need, budget, p_budget)
            if c == 0:                   # no prefill budget left for it: passed over
                k += 1
                continue
            extra = self._blk(mi + c) - self._blk(mi)
            while extra > free:
                victim = self._running.pop()
                free += self._blk(int(m[victim]))
                evicted.append(victim)
                self._waiting.appendleft(victim)
                if victim == i:
                    break
            if evicted and evicted[-1] == i:
                break
            free -= extra
            ids.append(i)
            toks.append(c)
            budget -= c
            if mi < int(inp[i]):
                p_budget -= c
            k += 1
        if not evicted:
            while budget > 0 and p_budget > 0 and self._waiting and len(self._running) < self._R:
                i = self._waiting[0]
                need = int(inp[i])
                wm = self._wm if self._running else 0
                if self._blk(need) + wm > free:
                    break
                c = min(need, budget, p_budget)
                self._waiting.popleft()
                self._running.append(i)
                free -= self._blk(c)
                ids.append(i)
                toks.append(c)
                budget -= c
                p_budget -= c
        if not ids:
            return Plan(_NONE, _NONE, np.asarray(evicted, dtype=np.int64))
        return Plan(np.asarray(ids, dtype=np.int64), np.asarray(toks, dtype=np.int64),
                    np.asarray(evicted, dtype=np.int64))


@register_scheduler("vllm-v1", "vLLM V1 as it runs (vllm 0.32): running requests first under one token budget "
                    "(chunked prefill), preempting the latest-admitted; FCFS admission of whole inputs' blocks")
def _vllm_v1(R_max: int | None = None, watermark: float = 0.0) -> VllmV1:
    return VllmV1(R_max=R_max, watermark=watermark)
