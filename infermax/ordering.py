"""What orders the requests of a :class:`infermax.policy.Policy`: rank keys and victim choices.

A *rank key* says who goes first inside each group of GetNextBatch (Algorithm 1's order of
candidates); a *victim choice* says which of the running requests that a request short of KV
may evict goes first. Both are functions of a read-only :class:`RequestView` of the requests
being ordered, returning one number per request::

    def key(view: RequestView) -> np.ndarray     # shape (len(view),); the smallest goes first

Ties go by arrival, then by request index (rank keys), or to the lowest-priority request
(victims). A Policy names a key of :data:`RANK_KEYS` / :data:`VICTIMS` or holds a callable of
that signature; :func:`register_rank_key` and :func:`register_victim` add named ones.

Which requests may be evicted is not the victim choice's to say: only running requests of
lower priority than the one short of KV, not in the batch and not pinned (see
:mod:`infermax.schedulers.pinning`), and the request itself last — what keeps the
highest-priority request moving. The victim choice orders those.

A rank key that reads only what a request brings (arrival, prompt and output lengths) is
*static* (``is_static``): GetNextBatch orders the workload once. Every other key, and every
callable, is evaluated again before each batch over the active requests: exact, at the cost
of a sort per batch and without the engine's fast-forward of decode runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from .state import RUNNING, ServingState


@dataclass(frozen=True, slots=True)
class RequestView:
    """Per-request facts of the requests ``index`` (workload indices), as read-only arrays.

    arrival_s: arrival time (s). prompt_tokens: I. output_tokens: O. generated_tokens: tokens
    generated so far. remaining_tokens: O − generated. cached_tokens: KV tokens held now (m).
    fill_left_tokens: tokens to (re)fill before the next token is generated (0 in decode phase).
    is_running: holds KV (admitted, not evicted). now_s: the engine's clock (s).
    """

    index: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    generated_tokens: np.ndarray
    remaining_tokens: np.ndarray
    cached_tokens: np.ndarray
    fill_left_tokens: np.ndarray
    is_running: np.ndarray
    now_s: float

    def __len__(self) -> int:
        return int(self.index.size)

    @classmethod
    def of(cls, state: ServingState, idx: np.ndarray) -> "RequestView":
        """The view of requests ``idx`` in ``state`` (copies: changing them changes nothing)."""
        gen, m = state.gen[idx], state.m[idx]
        out = state.output_lens[idx]
        arrays = (np.array(idx, dtype=np.int64), state.arrivals_s[idx], state.input_lens[idx], out, gen,
                  out - gen, m, np.maximum(state.inp[idx] - m, 0), state.status[idx] == RUNNING)
        for a in arrays:
            a.setflags(write=False)
        return cls(*arrays, now_s=float(state.clock_s))


Key = Callable[[RequestView], np.ndarray]


class NamedKey(NamedTuple):
    """A registered key: its function, whether it is static (reads only arrival, prompt and output
    lengths), and one line saying what it does."""

    fn: Key
    is_static: bool
    doc: str


#: rank keys by name: the smallest key goes first
RANK_KEYS: dict[str, NamedKey] = {}
#: victim choices by name: the smallest key is evicted first ("lowest-priority" needs no key)
VICTIMS: dict[str, NamedKey] = {}
LOWEST_PRIORITY = "lowest-priority"


def register_rank_key(name: str, doc: str, is_static: bool = False) -> Callable[[Key], Key]:
    """Decorator: register a rank key under ``name`` (``is_static``: reads only arrival, prompt and
    output lengths, so the workload is ordered once)."""

    def deco(fn: Key) -> Key:
        RANK_KEYS[name] = NamedKey(fn, is_static, doc)
        return fn

    return deco


def register_victim(name: str, doc: str) -> Callable[[Key], Key]:
    """Decorator: register a victim choice under ``name``."""

    def deco(fn: Key) -> Key:
        VICTIMS[name] = NamedKey(fn, False, doc)
        return fn

    return deco


@register_rank_key("arrival", "first come, first served", is_static=True)
def _arrival(v: RequestView) -> np.ndarray:
    return v.arrival_s


@register_rank_key("input", "shortest prompt first", is_static=True)
def _input(v: RequestView) -> np.ndarray:
    return v.prompt_tokens


@register_rank_key("output", "shortest output first", is_static=True)
def _output(v: RequestView) -> np.ndarray:
    return v.output_tokens


@register_rank_key("remaining", "fewest tokens left to generate first")
def _remaining(v: RequestView) -> np.ndarray:
    return v.remaining_tokens


VICTIMS[LOWEST_PRIORITY] = NamedKey(lambda v: np.zeros(len(v)), False, "the lowest-priority request first")


@register_victim("youngest", "the latest arrival first")
def _youngest(v: RequestView) -> np.ndarray:
    return -v.arrival_s


@register_victim("least-cached", "the request holding the least KV first (the cheapest to recompute)")
def _least_cached(v: RequestView) -> np.ndarray:
    return v.cached_tokens


def key_name(key: "str | Key") -> str:
    """A printable name of a key: its registered name, else the callable's qualified name."""
    return key if isinstance(key, str) else getattr(key, "__qualname__", repr(key))


def evaluate(key: Key, view: RequestView, field: str) -> np.ndarray:
    """``key(view)`` as a float array of one value per request, or ValueError naming ``field``."""
    out = np.asarray(key(view), dtype=np.float64)
    if out.shape != (len(view),) or np.isnan(out).any():
        raise ValueError(f"Policy.{field} {key_name(key)} must return {len(view)} numbers (no NaN), one per "
                         f"request of the view; got shape {out.shape}")
    return out
