"""LightLLM as Vidur simulates it (microsoft/vidur ``lightllm_replica_scheduler``): separate prefill
and decode batches, and admission by the future peak of the KV.

With no request running, a batch prefills waiting requests, first come first served,
whole prompts, while they fit the token budget (C, P), the running cap (R_max) and the
*future-peak* check. With requests running, the batch decodes all of them — except that
after ``max_waiting_iters`` decode batches in a row (Vidur's default 10) a prefill batch is
tried first; if no waiting request can be admitted, the decodes go on (the count starts
again either way). Prefill and decode never share a batch.

Future-peak check (LightLLM's token-attention admission): every running request, and the
candidate, holds ``held`` KV tokens now and will grow by ``left`` more before it completes
and frees them; with the requests sorted by ``left``, longest first, the KV in use peaks
at one of their completions, ``max_k Σ_{j<=k} held_j + k·left_k``. A candidate is
admitted only if that peak stays within M (so no request is ever evicted). In infermax's
terms a running request holds ``m`` and grows by ``O - gen``; a candidate holds ``I``
after its prefill and grows by ``O - 1`` (peak I + O - 1). Vidur counts a candidate as
``(I + 1, O - 2)`` and admits while the peak is strictly below M; here the peak is
infermax's and may reach M. Vidur refuses KV blocks larger than one token; here, with
``Limits.block_size`` > 1, the peak is counted in whole blocks per request.

A request is admitted only while the running requests number fewer than
``min(R_max, C)``, so that every running request decodes in every decode batch.
"""
from __future__ import annotations

import numpy as np

from infermax.state import ServingState

from .base import Plan, Scheduler
from .orca import check_whole_prompts, decode_plan, running_and_waiting
from .registry import register_scheduler


def future_peak(held: np.ndarray, left: np.ndarray, block_size: int = 1) -> int:
    """The most KV (tokens, or blocks of ``block_size``) in use at once while requests holding ``held``
    and growing by ``left`` more decode in lockstep, each freeing its KV when it completes."""
    if not held.size:
        return 0
    order = np.argsort(-left, kind="stable")
    held, left = held[order], left[order]
    if block_size == 1:
        return int((np.cumsum(held) + left * np.arange(1, held.size + 1)).max())
    # at request k's completion every j <= k holds held_j + left_k tokens, in whole blocks
    at = -(-(held[None, :] + left[:, None]) // block_size)            # [k, j]
    return int(np.tril(at).sum(axis=1).max())


class LightLLM(Scheduler):
    """Prefill-only or decode-only batches; admission while the future KV peak fits M."""

    def __init__(self, *, R_max: int | None = None, max_waiting_iters: int = 10, name: str = "lightllm") -> None:
        if R_max is not None and (isinstance(R_max, bool) or not isinstance(R_max, int) or R_max < 1):
            raise ValueError(f"LightLLM.R_max must be an integer >= 1 or None, got {R_max!r}")
        if isinstance(max_waiting_iters, bool) or not isinstance(max_waiting_iters, int) or max_waiting_iters < 1:
            raise ValueError(f"LightLLM.max_waiting_iters must be an integer >= 1, got {max_waiting_iters!r}")
        self.R_max, self.max_waiting_iters, self.name = R_max, max_waiting_iters, name

    def reset(self, state: ServingState) -> None:
        lim = state.limits
        check_whole_prompts(state, self.name, lim.C, lim.P)
        self._R = min(self.R_max or lim.max_running, lim.max_running, lim.C)
        self._iters = 0                 # decode batches since the last prefill attempt
        self._asked: tuple[int, int] = (-1, 0)    # (batch number, _iters before it was planned)

    def _admit(self, state: ServingState, running: np.ndarray, waiting: np.ndarray) -> np.ndarray:
        """The longest first-come-first-served prefix of ``waiting`` that fits C, P, the running cap and
        the future-peak check."""
        lim = state.limits
        held = state.m[running]
        left = state.output_lens[running] - state.gen[running]
        budget, k = min(lim.C, lim.P), 0
        for x in waiting[: max(self._R - running.size, 0)].tolist():
            budget -= int(state.input_lens[x])
            if budget < 0:
                break
            held = np.append(held, state.input_lens[x])
            left = np.append(left, state.output_lens[x] - 1)
            if future_peak(held, left, lim.block_size) > lim.num_blocks:
                break
            k += 1
        return waiting[:k]

    def next_batch(self, state: ServingState) -> Plan:
        if self._asked[0] == state.num_batches:     # the last plan was not applied: plan it again
            self._iters = self._asked[1]
        self._asked = (state.num_batches, self._iters)
        running, waiting = running_and_waiting(state)
        if not running.size or self._iters >= self.max_waiting_iters:
            self._iters = 0
            new = self._admit(state, running, waiting)
            if new.size or not running.size:
                return decode_plan(running[:0], new, state)
        self._iters += 1
        return decode_plan(running[: state.limits.C], running[:0], state)

    def describe(self) -> dict:
        return {"name": self.name, "R_max": self.R_max, "max_waiting_iters": self.max_waiting_iters}


@register_scheduler("lightllm", "LightLLM (as Vidur simulates it): prefill-only or decode-only batches, "
                    "admission while the future KV peak fits M, a prefill try every max_waiting_iters decodes")
def lightllm(R_max: int | None = None, max_waiting_iters: int = 10) -> LightLLM:
    return LightLLM(R_max=R_max, max_waiting_iters=max_waiting_iters)
