"""The read-only face of a ``ServingState`` that schedulers may be handed (``simulate(read_only_state=True)``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .state import ServingState


class StateView:
    """A :class:`ServingState` as a scheduler may see it: every attribute readable, nothing writable.

    Arrays come back as read-only views (writing one raises NumPy's ``ValueError: assignment destination
    is read-only``), setting an attribute raises, and the transitions (:data:`TRANSITIONS`) are not there:
    only the engine moves the state. ``simulate(..., read_only_state=True)`` hands every scheduler this view
    (the test suite runs every registered scheduler so); the default hands the state itself, because a
    view costs an attribute lookup per read on the simulator's hot path.
    """

    __slots__ = ("_state",)
    #: what changes a ServingState: the engine's alone
    TRANSITIONS = frozenset({"apply", "apply_decode_run", "apply_hybrid_run", "advance_clock", "admit_arrivals",
                             "dispatch", "receive", "hand_off", "_take_kv", "_queue", "_complete", "_decode_segment"})

    def __init__(self, state: ServingState) -> None:
        object.__setattr__(self, "_state", state)

    def __getattr__(self, name: str):
        if name in StateView.TRANSITIONS:
            raise AttributeError(f"a scheduler may not call ServingState.{name}: the state is read-only to "
                                 f"schedulers (the engine applies the Plan a scheduler returns)")
        value = getattr(self._state, name)
        if isinstance(value, np.ndarray) and value.flags.writeable:
            value = value.view()
            value.flags.writeable = False
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a scheduler may not set ServingState.{name}: the state is read-only to schedulers")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a scheduler may not delete ServingState.{name}: the state is read-only to schedulers")
