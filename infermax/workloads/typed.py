"""Typed multi-class workloads: request types, each with a prompt and an output length distribution and a
Poisson arrival rate — the setups of the scheduling-theory papers (Jaillet et al. 2025's synthetic
instances, Ao et al. 2025's request types).

Spec (:mod:`infermax.workloads.spec`): ``typed:types=NAME/PROMPT/OUTPUT/RATE+...,n=N[,seed=S][,offline=1]
[,tick=T]``, e.g. ``typed:types=short/64/32/2+long/512/128/0.5,n=1000``. A length is ``64`` (fixed),
``32-96`` (uniform integers, both ends included) or ``e64`` (geometric with mean 64, at least 1). RATE is
requests/s of the type: the types are independent Poisson processes, merged (so the next request is of
type j with probability rate_j / Σ rate, after an exponential gap of mean 1 / Σ rate); the first arrives at
0. ``offline=1``: every request at t = 0, the types in proportion to their rates. ``tick=T``: arrival times
rounded up to multiples of T seconds (``tick=1`` with the ``unit`` cost model: arrivals at whole rounds).
Each request's ``tag`` is its type's name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..types import MAX_TOKENS, Request, Workload
from . import MAX_REQUESTS, check_count, check_real

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Lengths:
    """A length distribution: ``kind`` fixed (lo), uniform (lo..hi) or geometric (mean lo)."""

    kind: str
    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str, where: str) -> "Lengths":
        t = text.strip()
        try:
            if t.startswith("e"):
                lengths = cls(kind="geometric", lo=int(t[1:]), hi=int(t[1:]))
            elif "-" in t:
                a, b = t.split("-", 1)
                lengths = cls(kind="uniform", lo=int(a), hi=int(b))
            else:
                lengths = cls(kind="fixed", lo=int(t), hi=int(t))
        except ValueError:
            raise ValueError(f"{where} must be N, A-B or eN (positive integers), got {text!r}") from None
        if not 1 <= lengths.lo <= lengths.hi < MAX_TOKENS:
            raise ValueError(f"{where} must lie in 1..{MAX_TOKENS - 1} with A <= B, got {text!r}")
        return lengths

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(size, self.lo, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.lo, self.hi + 1, size=size)
        return np.minimum(rng.geometric(1.0 / self.lo, size=size), MAX_TOKENS - 1)

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestType:
    """One type: its name (the requests' tag), prompt and output length distributions, rate (requests/s)."""

    name: str
    prompt: Lengths
    output: Lengths
    rate_per_s: float

    @classmethod
    def parse(cls, text: str) -> "RequestType":
        parts = text.split("/")
        if len(parts) != 4:
            raise ValueError(f"request type {text!r} must look like NAME/PROMPT/OUTPUT/RATE, e.g. short/64/32/2")
        name = parts[0].strip()
        if not _NAME.match(name):
            raise ValueError(f"request type {text!r}: NAME must be a word (letters, digits, _ . -), got {name!r}")
        try:
            rate = float(parts[3])
        except ValueError:
            raise ValueError(f"request type {text!r}: RATE must be a number, got {parts[3]!r}") from None
        check_real(f"request type {name!r}: RATE", rate, unit=" requests/s")
        return cls(name=name, prompt=Lengths.parse(parts[1], f"request type {name!r}: PROMPT"),
                   output=Lengths.parse(parts[2], f"request type {name!r}: OUTPUT"), rate_per_s=rate)


def parse_types(text: str) -> tuple[RequestType, ...]:
    """``NAME/PROMPT/OUTPUT/RATE+...`` as request types (names unique)."""
    types = tuple(RequestType.parse(t) for t in text.split("+") if t.strip())
    if not types:
        raise ValueError("types must name at least one NAME/PROMPT/OUTPUT/RATE")
    names = [t.name for t in types]
    if len(set(names)) != len(names):
        raise ValueError(f"types: names must be unique, got {names}")
    return types


def typed(types: "tuple[RequestType, ...] | str", n: int, seed: int = 0, offline: bool = False,
          tick_s: float | None = None) -> Workload:
    """``n`` requests of the given types (see the module docstring), seeded and deterministic."""
    if isinstance(types, str):
        types = parse_types(types)
    check_count("n", n, 1, MAX_REQUESTS)
    if tick_s is not None:
        check_real("tick", tick_s, unit=" s")
    rng = np.random.default_rng(seed)
    rates = np.array([t.rate_per_s for t in types], dtype=np.float64)
    kind = rng.choice(len(types), size=n, p=rates / rates.sum())
    if offline:
        arrivals = np.zeros(n)
    else:
        gaps = rng.exponential(1.0 / rates.sum(), size=n)
        gaps[0] = 0.0
        arrivals = np.cumsum(gaps)
        if tick_s is not None:
            arrivals = np.ceil(arrivals / tick_s - 1e-12) * tick_s + 0.0     # (+ 0.0: no -0.0)
    I, O = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for j, t in enumerate(types):
        sel = kind == j
        I[sel], O[sel] = t.prompt.draw(rng, int(sel.sum())), t.output.draw(rng, int(sel.sum()))
    label = "+".join(f"{t.name}/{t.rate_per_s:g}" for t in types)
    reqs = tuple(Request(id=i, input_len=int(I[i]), output_len=int(O[i]), arrival_s=float(arrivals[i]),
                         tag=types[int(kind[i])].name) for i in range(n))
    return Workload(requests=reqs, name=f"typed:{label},n={n}{',offline' if offline else ''}")

