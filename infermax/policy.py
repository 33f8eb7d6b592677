"""One Policy for the heuristics and the MILP: the class of schedules, and how GetNextBatch picks in it.

A :class:`Policy` has two kinds of fields.

- The *class* (InferMax Table 1, §3.3 last paragraph) — which schedules are allowed:
  ``allow_eviction``, ``hybrid``, ``chunked_prefill``, ``P``, ``R_max``. The MILP
  (:mod:`infermax.csp`) reads only these: the optimum within a class is what the heuristics
  of that class are compared with (every ``-ef`` scheduler is in the no-eviction class, vLLM
  in "no hybrid batching, no chunked prefill").
- The *picking rules* of the unified GetNextBatch (Algorithm 1, :mod:`infermax.schedulers.framework`),
  which the MILP ignores: ``priority`` (which group of candidates first), ``rank_key`` (the order
  inside each group), ``victim`` (which running request is evicted first), ``skip_on_fail``,
  ``lookahead``, and the real-system details ``C``, ``watermark``, ``block_size``.

So a new scheduler of the family is a Policy value, not a subclass — e.g. "longest remaining
first, evict the youngest"::

    Policy(priority="rank", rank_key=lambda v: -v.remaining_tokens, victim="youngest", skip_on_fail=True)

(keys and the read-only per-request view they see: :mod:`infermax.ordering`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from .ordering import LOWEST_PRIORITY, RANK_KEYS, VICTIMS, Key
from .types import Limits

#: the groupings of Algorithm 1 (hook 1, GroupRequests) a Policy can name
PRIORITIES = {"prefill": "waiting requests first, then the running ones (vLLM)",
              "decode": "running decodes, then running (partial) fills, then waiting requests (Sarathi)",
              "rank": "one group of every active request (the ranking schedulers of App. A.3)"}


def _check_key(field: str, key: "str | Key", named: Mapping[str, Any]) -> None:
    if isinstance(key, str):
        if key not in named:
            raise ValueError(f"Policy.{field} must be one of {', '.join(named)} or a callable, got {key!r}")
    elif not callable(key):
        raise ValueError(f"Policy.{field} must be a name or a callable taking a RequestView, got {key!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """A class of schedules and, for GetNextBatch, the rules that pick one in it.

    Class — allow_eviction: requests may be evicted (recompute); a GetNextBatch that may not
    reserves I + O − 1 at admission instead. hybrid: a batch may mix decode and prefill
    requests. chunked_prefill: a (re)fill may be split over several batches (otherwise it runs
    whole in one batch). P, R_max: the scheduler's own caps on prefill tokens per batch and
    running requests, on top of ``Limits`` (None = the limit's).

    Picking rules — priority: a key of :data:`PRIORITIES`. rank_key: the order inside each group,
    a name of :data:`infermax.ordering.RANK_KEYS` or a callable ``(RequestView) -> array``, smallest
    first (ties by arrival, then index). victim: which evictable running request goes first, a
    name of :data:`infermax.ordering.VICTIMS` or such a callable, smallest first (ties: lowest
    priority first). skip_on_fail: a candidate that cannot be allocated is skipped and the group
    goes on (otherwise the group stops at it, FCFS head-of-line; in the one group of ``rank``, a
    waiting request at the head that cannot get KV would hold back the running requests that hold
    it, so the rank schedulers skip). lookahead: admit a waiting request only if the predicted
    future KV of all running requests stays within M
    (:mod:`infermax.schedulers.lookahead`). stagger: with look-ahead, also spread admissions over time
    (one request every few batches, so that request ages spread evenly; the ``-la`` variants);
    ``stagger=False`` admits every candidate that passes the check at once, in the group's order (MC-SF,
    :mod:`infermax.schedulers.mcsf`). C: tokens per batch of the scheduler itself, decodes
    included (None = Limits.C; real Sarathi's token budget, 512). watermark: fraction of the KV
    blocks a first fill or refill must leave free (0 = the paper's semantics; vLLM's default is
    0.01). block_size: the KV block size the scheduler models (None: whatever the Limits say);
    ``simulate`` applies it to the Limits.
    """

    allow_eviction: bool = True
    hybrid: bool = True
    chunked_prefill: bool = True
    P: int | None = None
    R_max: int | None = None
    priority: Literal["prefill", "decode", "rank"] = "prefill"
    rank_key: "str | Key" = "arrival"
    victim: "str | Key" = LOWEST_PRIORITY
    skip_on_fail: bool = False
    lookahead: bool = False
    stagger: bool = True
    C: int | None = None
    watermark: float = 0.0
    block_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("allow_eviction", "hybrid", "chunked_prefill", "skip_on_fail", "lookahead", "stagger"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Policy.{name} must be a bool, got {getattr(self, name)!r}")
        if self.priority not in PRIORITIES:
            raise ValueError(f"Policy.priority must be prefill, decode or rank, got {self.priority!r}")
        _check_key("rank_key", self.rank_key, RANK_KEYS)
        _check_key("victim", self.victim, VICTIMS)
        if self.lookahead and (self.priority == "rank" or not self.allow_eviction or self.C is not None):
            raise ValueError("Policy.lookahead needs priority prefill or decode, allow_eviction=True and C=None")
        self._check_numbers()

    def _check_numbers(self) -> None:
        """(``__post_init__``) The budgets are positive integers or None, the watermark a fraction."""
        for name in ("P", "R_max", "C", "block_size"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"Policy.{name} must be a positive integer or None, got {v!r}")
        w = self.watermark
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < 1:
            raise ValueError(f"Policy.watermark must be a fraction in [0, 1) of the KV blocks, got {w!r}")

    @property
    def is_static(self) -> bool:
        """Whether the rank key orders the workload once (a static named key) rather than every batch."""
        return isinstance(self.rank_key, str) and RANK_KEYS[self.rank_key].is_static

    # --- the class ----------------------------------------------------------------------------
    @property
    def is_unconstrained(self) -> bool:
        """The class of every schedule (the picking rules do not restrict a class)."""
        return self.to_dict() == Policy().to_dict()

    def effective_limits(self, limits: Limits) -> Limits:
        """``limits`` tightened by this policy's P and R_max."""
        P = limits.P if self.P is None else min(limits.P, self.P)
        R = limits.R_max if self.R_max is None else min(limits.max_running, self.R_max)
        return Limits(M=limits.M, C=limits.C, P=P, R_max=R, block_size=limits.block_size)

    def to_dict(self) -> dict[str, Any]:
        """The class fields (what a solve records of the policy its optimum kept to)."""
        return {"allow_eviction": self.allow_eviction, "hybrid": self.hybrid,
                "chunked_prefill": self.chunked_prefill, "P": self.P, "R_max": self.R_max}

    @classmethod
    def from_description(cls, d: Mapping[str, Any], name: str = "") -> "Policy":
        """The class of a scheduler that describes itself as ``d`` (``Scheduler.describe()``: its
        ``hybrid``, ``chunked``, ``eviction_free`` and optional ``P``, ``R_max``)."""
        missing = [k for k in ("hybrid", "chunked", "eviction_free") if k not in d]
        if missing:
            raise ValueError(f"scheduler {name or d.get('name')!r} does not describe {', '.join(missing)}; "
                             f"build the Policy by hand")
        return cls(allow_eviction=not d["eviction_free"], hybrid=bool(d["hybrid"]),
                   chunked_prefill=bool(d["chunked"]), P=d.get("P"), R_max=d.get("R_max"))

    @classmethod
    def from_spec(cls, spec: str | None) -> "Policy":
        """Parse a class: ``"no-eviction,no-hybrid,no-chunked,P=512,R_max=4"``. A scheduler's class,
        ``"like=vllm"``, is read a layer above (:func:`infermax.optimal.policy_from_spec`): this module is
        below the schedulers."""
        if spec is None or not spec.strip():
            return cls()
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, raw = part.partition("=")
            key = key.strip().lower().replace("_", "-")
            if key == "like":
                raise ValueError(f"policy item {part!r} names a scheduler; read it with "
                                 f"infermax.optimal.policy_from_spec (infermax.solve_optimal does)")
            flags = {"no-eviction": "allow_eviction", "eviction-free": "allow_eviction",
                     "no-hybrid": "hybrid", "no-chunked": "chunked_prefill", "no-chunked-prefill": "chunked_prefill"}
            if key in flags and not raw:
                values[flags[key]] = False
            elif key in ("p", "r-max", "rmax"):
                try:
                    values["P" if key == "p" else "R_max"] = int(raw)
                except ValueError:
                    raise ValueError(f"policy {key} must be an integer, got {raw!r}") from None
            else:
                raise ValueError(f"unknown policy item {part!r}; use no-eviction, no-hybrid, no-chunked, "
                                 f"P=N, R_max=N or like=SCHEDULER")
        return cls(**values)
