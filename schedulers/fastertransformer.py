"""FasterTransformer as Vidur simulates it (microsoft/vidur ``faster_transformer_replica_scheduler``):
request-level (static) batching.

A *cohort* of waiting requests is formed, first come first served, each with its whole
prompt and ``max_tokens`` of KV reserved; the cohort then decodes, batch after batch, its
members that have not finished, and no other request joins it until every member has
completed — only then is its KV given back (all at once) and the next cohort formed. No
request is ever evicted.

Vidur's code means to free a cohort's KV when its last member completes, but frees only
the members of the last batch (the others are left allocated: a leak that shrinks every
later cohort); this follows the intent. Where infermax's rules add to Vidur's: a cohort's
prefill batch holds at most C tokens and P prefill tokens, and at most ``R_max`` requests
(Vidur's batch cap), as in :mod:`.orca`; ``max_tokens`` as there.
"""
from __future__ import annotations

import numpy as np

from infermax.state import ServingState

from .base import Plan
from .orca import ReservingScheduler, admit_fifo, decode_plan, running_and_waiting
from .registry import register_scheduler


class FasterTransformer(ReservingScheduler):
    """Static batching: a cohort of whole prompts runs to its last completion before the next forms."""

    def __init__(self, *, R_max: int | None = None, max_tokens: int | None = None,
                 name: str = "fastertransformer") -> None:
        super().__init__(R_max=R_max, max_tokens=max_tokens, name=name)

    def next_batch(self, state: ServingState) -> Plan:
        lim = state.limits
        running, waiting = running_and_waiting(state)
        if running.size:                    # the cohort in flight decodes; nobody joins it
            return decode_plan(running[:lim.C], running[:0], state)
        return decode_plan(running, admit_fifo(state, waiting, min(self._R, self._slots), lim.C, lim.P), state)

    def decode_run(self, state: ServingState, plan: Plan) -> tuple[np.ndarray, int]:
        """While a cohort is in flight, every next batch decodes it until its last member completes,
        whatever arrives (the engine voids the promise at an arrival; the next batch is the same)."""
        running = running_and_waiting(state)[0]
        if not running.size or running.size > state.limits.C or (state.m[running] < state.inp[running]).any():
            return running[:0], 0
        return running, int((state.output_lens[running] - state.gen[running]).max())


@register_scheduler("fastertransformer", "FasterTransformer (as Vidur simulates it): static batches of whole "
                    "prompts, each cohort decodes to its last completion before the next forms")
def fastertransformer(R_max: int | None = None, max_tokens: int | None = None) -> FasterTransformer:
    return FasterTransformer(R_max=R_max, max_tokens=max_tokens)
