"""Policy classes for the MILP (infermax.txt §3.3, last paragraph; Table 1).

The unconstrained model allows evictions, hybrid batches and chunked prefill.
A :class:`Policy` removes some of that freedom so that the optimum *within a
class of schedulers* can be compared with the heuristic of that class: e.g. the
vLLM class is "no hybrid batching, no chunked prefill"; every ``-ef`` scheduler
belongs to the eviction-free class.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from infermax.heuristics import describe_scheduler
from infermax.types import Limits


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """Which scheduling freedoms the optimum may use.

    allow_eviction: requests may be evicted (recompute). hybrid: a batch may mix
    decode and prefill requests. chunked_prefill: a prefill may be split over
    several batches (otherwise each (re)fill runs whole in one batch). P, R_max:
    a scheduler's own caps, applied on top of ``Limits`` (None = the limit's).
    """

    allow_eviction: bool = True
    hybrid: bool = True
    chunked_prefill: bool = True
    P: int | None = None
    R_max: int | None = None

    def __post_init__(self) -> None:
        for name in ("allow_eviction", "hybrid", "chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Policy.{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("P", "R_max"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"Policy.{name} must be a positive integer or None, got {value!r}")

    @property
    def is_unconstrained(self) -> bool:
        return self == Policy()

    def effective_limits(self, limits: Limits) -> Limits:
        """``limits`` tightened by this policy's P and R_max."""
        P = limits.P if self.P is None else min(limits.P, self.P)
        R = limits.R_max if self.R_max is None else min(limits.max_running, self.R_max)
        return Limits(M=limits.M, C=limits.C, P=P, R_max=R, block_size=limits.block_size)

    def to_dict(self) -> dict[str, Any]:
        return {"allow_eviction": self.allow_eviction, "hybrid": self.hybrid,
                "chunked_prefill": self.chunked_prefill, "P": self.P, "R_max": self.R_max}

    @classmethod
    def of_scheduler(cls, name: str) -> "Policy":
        """The policy class a registered heuristic belongs to (from its ``describe()``)."""
        return cls.from_description(describe_scheduler(name), name)

    @classmethod
    def from_description(cls, d: Mapping[str, Any], name: str = "") -> "Policy":
        """The policy class of a scheduler that describes itself as ``d`` (``Scheduler.describe()``: its
        ``hybrid``, ``chunked``, ``eviction_free`` and optional ``P``, ``R_max``)."""
        missing = [k for k in ("hybrid", "chunked", "eviction_free") if k not in d]
        if missing:
            raise ValueError(f"scheduler {name or d.get('name')!r} does not describe {', '.join(missing)}; "
                             f"build the Policy by hand")
        return cls(allow_eviction=not d["eviction_free"], hybrid=bool(d["hybrid"]),
                   chunked_prefill=bool(d["chunked"]), P=d.get("P"), R_max=d.get("R_max"))

    @classmethod
    def from_spec(cls, spec: str | None) -> "Policy":
        """Parse ``"no-eviction,no-hybrid,no-chunked,P=512,R_max=4"`` or ``"like=vllm"``."""
        if spec is None or not spec.strip():
            return cls()
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, raw = part.partition("=")
            key = key.strip().lower().replace("_", "-")
            if key == "like":
                return cls.of_scheduler(raw.strip())
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
