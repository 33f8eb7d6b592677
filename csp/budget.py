"""The one clock of a ``solve_optimal`` call: every stage asks it for its time.

``time_limit_s`` bounds the whole call — warm start, bounds, model building,
translation and solving. A :class:`Budget` is created once per call; a stage
asks it for a share of what is left (``share``), and gets either a positive
number of seconds or nothing at all (``None``): no stage is ever handed a zero
or negative limit. Work that cannot be split into solver calls (building a
model row by row, translating it for a backend) checks ``deadline`` as it goes
and raises :class:`BudgetExhausted`; ``solve_optimal`` then returns the best
schedule and bound known so far.

The shares themselves are named here, with the reason for each, rather than
written as bare fractions where they are used.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

#: no stage is started with less than this (a solver needs a moment to load a model at all)
MIN_STAGE_S = 0.05
#: warm start: every registered heuristic is tried until this share of the limit has passed
WARM_START_SHARE = 0.25
#: certified lower bounds (work, LP, Lagrangian) get up to this share of what is left
LOWER_BOUND_SHARE = 0.25
#: "auto" with the class-state search: the MILPs keep this share when the search's table of
#: batches left is complete (A* is then what closes gaps; B = 8 of I = O = 16, M = 128 is proven by
#: A* alone), and this larger share when it is not
MILP_RESERVE_WITH_TABLE = 1 / 10
MILP_RESERVE_WITHOUT_TABLE = 1 / 3
#: the search's table of exact batches left may take this share of the search's time
TABLE_SHARE = 1 / 6
#: without the table: the backend may spend this share refuting small batch counts of the relaxation
REFUTE_SHARE = 1 / 12
#: incumbent searches (pilot, beam) run until this share of the search's time has passed; without the
#: table A* rarely finishes and its bound is little above its start, so incumbents get more
INCUMBENT_SHARE_WITH_TABLE = 5 / 12
INCUMBENT_SHARE_WITHOUT_TABLE = 9 / 10
#: of A*'s time: the trajectory LPs' Lagrangian tables (with the table), or the LPs that give the bound
#: (without it, where A* rarely finishes)
LP_SHARE_WITH_TABLE = 1 / 6
LP_SHARE_WITHOUT_TABLE = 9 / 10
#: the aggregate model: the exact least batch count of its packing relaxation, and the batch-count probe
PACKING_SHARE, PACKING_CAP_S = 1 / 6, 10.0
PROBE_SHARE, PROBE_CAP_S = 1 / 20, 2.0
#: building a model (per-request or aggregate) may take this share of what is left, so that the solver
#: keeps the rest: a model that cannot be built in it could not be solved in what would remain
BUILD_SHARE = 1 / 2


class BudgetExhausted(RuntimeError):
    """The time limit ran out inside a stage that cannot stop half-way (model building, translation);
    ``rows``: the rows of the model written when a build stopped (None otherwise)."""

    def __init__(self, message: str, rows: int | None = None) -> None:
        super().__init__(message)
        self.rows = rows


class ModelTooLarge(RuntimeError):
    """A model would be too large to build in memory (its estimated size, named in the message)."""


@dataclass
class Budget:
    """``total_s`` seconds from ``start`` (``time.perf_counter``)."""

    total_s: float
    start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if isinstance(self.total_s, bool) or not isinstance(self.total_s, (int, float)) or \
                not math.isfinite(self.total_s) or self.total_s <= 0:
            raise ValueError(f"time_limit_s must be a finite number of seconds > 0, got {self.total_s!r}")

    @property
    def deadline(self) -> float:
        return self.start + self.total_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.deadline - time.perf_counter())

    @property
    def expired(self) -> bool:
        return self.left() < MIN_STAGE_S

    def share(self, fraction: float = 1.0, *, reserve_s: float = 0.0, cap_s: float = math.inf) -> float | None:
        """``fraction`` of what is left after ``reserve_s``, at most ``cap_s``; None if under MIN_STAGE_S."""
        seconds = min(cap_s, fraction * (self.left() - reserve_s))
        return seconds if seconds >= MIN_STAGE_S else None

    def check(self, what: str) -> None:
        """Raise :class:`BudgetExhausted` naming ``what`` if the limit has passed."""
        if time.perf_counter() > self.deadline:
            raise BudgetExhausted(f"the time limit ({self.total_s:g} s) ran out while {what}")
