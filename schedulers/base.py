"""The scheduler interface the engine drives (InferMax Algorithm 1, lines 1-7).

Each step is one forward pass. The engine hands the scheduler the read-only
``ServingState``; the scheduler answers with a ``Plan``: which requests process
how many tokens, and which running requests are evicted first. The engine (not
the scheduler) commits the plan through ``ServingState.apply``, which enforces
every rule, so a scheduler can be wrong but never silently invalid.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from infermax.state import ServingState
    from infermax.types import Limits


class Plan(NamedTuple):
    """One batch decision, by request *index*: ``idx[k]`` processes ``tokens[k]``."""

    idx: np.ndarray
    tokens: np.ndarray
    evict: np.ndarray

    @classmethod
    def empty(cls) -> "Plan":
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z)


class Scheduler(ABC):
    """Decides the next batch from the serving state; never mutates it.

    Subclasses implement :meth:`next_batch`; :meth:`reset` is called once per
    run before the first batch (precompute orderings there).
    """

    name: str = "scheduler"
    #: the KV block size (tokens) this scheduler models, e.g. 16 for the ``*-real`` presets;
    #: None: whatever ``Limits.block_size`` says
    block_size: int | None = None

    def limits_for(self, limits: "Limits") -> "Limits":
        """The Limits this scheduler runs under: ``limits`` with the scheduler's block size applied
        when ``limits.block_size`` is left at 1 (token-granular); another block size is refused.

        ``simulate`` calls it, so one word (``vllm-real``) gives the real system's KV blocks.
        """
        want = self.block_size
        if want is None or limits.block_size == want:
            return limits
        if limits.block_size != 1:
            raise ValueError(f"scheduler {self.name!r} models KV blocks of {want} tokens, but "
                             f"Limits.block_size = {limits.block_size}; use block={want} or leave it at 1")
        if limits.M < want:
            raise ValueError(f"scheduler {self.name!r} models KV blocks of {want} tokens, but M = {limits.M} "
                             f"holds no whole block (Limits.block_size)")
        return limits.replace(block_size=want)

    def reset(self, state: "ServingState") -> None:  # noqa: B027 - an optional hook: most schedulers keep no state
        """Prepare for a run over ``state.workload`` (called once, before the first batch)."""

    @abstractmethod
    def next_batch(self, state: "ServingState") -> Plan:
        """The next batch; an empty plan means "nothing can run until the next arrival"."""

    def decode_run(self, state: "ServingState", plan: Plan) -> tuple[np.ndarray, int]:
        """After ``plan`` was applied: requests ``idx`` and a number of batches ``k`` such that,
        barring arrivals, this scheduler's next ``k`` batches would be pure decodes of ``idx``
        (in that order), each request leaving after the batch that completes it — a promise
        that lets the engine fast-forward (``ServingState.apply_decode_run``). ``k = 0``
        (the default) means "ask me every batch"."""
        return plan.idx[:0], 0

    def hybrid_run(self, state: "ServingState", plan: Plan) -> tuple[np.ndarray, int, int]:
        """After ``plan`` was applied: requests ``idx``, a chunk ``c`` and a number of batches ``k`` such that,
        barring arrivals, this scheduler's next ``k`` batches would each be the decodes ``idx[:-1]`` (a token
        each, in that order) and ``c`` tokens of the (re)fill ``idx[-1]``, no request completing and the
        (re)fill not reaching its input within them — a promise that lets the engine fast-forward a prefill
        chunk advancing alongside decodes (``ServingState.apply_hybrid_run``). ``k = 0`` (the default) means
        "ask me every batch"."""
        return plan.idx[:0], 0, 0

    def set_kv_budget(self, state: "ServingState", held_tokens: int) -> None:
        """The cluster layer holds ``held_tokens`` of this replica's KV for work scheduled elsewhere.

        Schedulers that can run on such a replica (the GetNextBatch framework's) shrink their KV
        budget; the default refuses, naming the scheduler."""
        if held_tokens:
            raise ValueError(f"scheduler {self.name!r} cannot share a replica's KV with a gang (a long "
                             f"request sharded over several replicas); use a GetNextBatch scheduler such as vllm")

    def set_token_budget(self, state: "ServingState", tokens: int | None) -> None:
        """Cap the tokens of the next batches (the cluster layer's colocation threshold); the default
        refuses, naming the scheduler."""
        if tokens is not None:
            raise ValueError(f"scheduler {self.name!r} cannot cap its batches for colocation with a long "
                             f"decode; use a GetNextBatch scheduler such as sarathi")

    def describe(self) -> dict:
        return {"name": self.name}
