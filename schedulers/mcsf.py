"""MC-SF, memory-constrained shortest first (Jaillet, Jiang, Mellou, Molinaro, Podimata, Zhou, "Online
Scheduling for LLM Inference with KV Cache Constraints", arXiv 2502.07115, 2025).

Their model: one worker in rounds; a running request holds its prompt plus the tokens generated so far;
no request is preempted once started. MC-SF, every round: the running requests continue; the waiting ones
are taken in order of (predicted) output length, shortest first, and added while the predicted KV of every
admitted and running request stays within M at every future completion time (the peaks of the ramps).

Here it is one :class:`~infermax.policy.Policy` of the GetNextBatch family: decode priority (every running
request takes part in every batch: "running requests continue"), hybrid batches and chunked prefill, the
rank key ``output`` (shortest output first, the order of the running decodes and of the waiting requests),
and look-ahead admission without its stagger (:mod:`.lookahead`: the predicted KV profile of the running
requests plus the candidates' ramps stays <= M at every future batch, which is the check at every
completion time, since a sum of ramps peaks just before a completion). Output lengths are known, so the
prediction is exact: MC-SF never evicts while every running request fits C (admission keeps at most C
requests running); it may still evict as a fallback when a (re)fill shares C with decodes in a way the
prediction did not see, which keeps every instance finishing.

Choices the paper leaves open, as options:

- ``skip`` (default false): the paper's rule reads as a prefix — candidates in order, the first that does
  not fit stops the admission. ``skip=true`` tries the later (longer) ones too.
- ``R_max`` / ``P``: the scheduler's own caps on running requests and prefill tokens per batch (default:
  the limits'). In the paper's unit-time rounds a prompt is processed whole in the round it starts
  (``infermax.costmodel`` preset ``unit`` with C = P large).
"""
from __future__ import annotations

from infermax.policy import Policy

from .framework import GetNextBatch
from .registry import register_scheduler


def mcsf_policy(R_max: int | None = None, P: int | None = None, skip: bool = False) -> Policy:
    """The Policy of MC-SF (see the module docstring)."""
    return Policy(priority="decode", hybrid=True, chunked_prefill=True, rank_key="output", lookahead=True,
                  stagger=False, skip_on_fail=skip, P=P, R_max=R_max)


@register_scheduler("mcsf", "MC-SF (Jaillet et al. 2025): shortest output first, admitted while the predicted "
                    "KV stays <= M at every future completion; no preemption")
def mcsf(R_max: int | None = None, P: int | None = None, skip: bool = False) -> GetNextBatch:
    return GetNextBatch(mcsf_policy(R_max, P, skip), name="mcsf")
