"""A request's state in ``ServingState.status``, by name and as the plain ints the hot paths compare with."""
from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    """A request's state in ``ServingState.status`` (an int8 array: compare with these names)."""

    FUTURE = 0       # not arrived (or not dispatched here)
    WAITING = 1      # arrived, holds no KV
    RUNNING = 2      # holds KV
    DONE = 3         # finished, its KV freed


# plain ints for the hot paths: NumPy compares an int8 array with an IntEnum member ~4x slower than with an int
FUTURE, WAITING, RUNNING, DONE = (int(s) for s in (Status.FUTURE, Status.WAITING, Status.RUNNING, Status.DONE))
