"""Schedulers only read the ServingState (issue 22 item 5): every registered scheduler, handed a
:class:`~infermax.state_view.StateView`, plans the same schedule; one that writes, or calls a transition, fails
naming what it touched."""
from __future__ import annotations

import numpy as np
import pytest
from factories import ALL_SCHEDULERS

from infermax import Workload, simulate
from infermax.schedulers import Plan, Scheduler
from infermax.state import ServingState
from infermax.state_view import StateView

WORKLOAD = Workload.from_lengths([5, 9, 3, 12, 7, 4], [6, 3, 8, 2, 5, 9], [0, 0, 0.01, 0.02, 0.02, 0.05])


@pytest.mark.parametrize("name", ALL_SCHEDULERS)
def test_every_scheduler_plans_the_same_through_a_read_only_view(name):
    plain = simulate(WORKLOAD, name, "M=24,C=16")
    viewed = simulate(WORKLOAD, name, "M=24,C=16", read_only_state=True)
    assert viewed.schedule.to_json() == plain.schedule.to_json()


class _Writes(Scheduler):
    """Marks the first waiting request as running by hand."""

    name = "writes"

    def next_batch(self, state) -> Plan:
        state.status[0] = 1
        return Plan(np.array([0]), np.array([1]))


class _Applies(Scheduler):
    name = "applies"

    def next_batch(self, state) -> Plan:
        state.apply(np.array([0]), np.array([1]), np.array([], dtype=np.int64))
        return Plan(np.array([0]), np.array([1]))


class _Sets(Scheduler):
    name = "sets"

    def next_batch(self, state) -> Plan:
        state.clock_s = 1.0
        return Plan(np.array([0]), np.array([1]))


@pytest.mark.parametrize("sched, match", [(_Writes(), "read-only"), (_Applies(), "may not call ServingState.apply"),
                                          (_Sets(), "may not set ServingState.clock_s")])
def test_a_scheduler_that_touches_the_state_fails_naming_it(sched, match):
    with pytest.raises((ValueError, AttributeError), match=match):
        simulate(WORKLOAD, sched, "M=24,C=16", read_only_state=True)


def test_the_view_reads_what_the_state_holds():
    state = ServingState(WORKLOAD, __import__("infermax").Limits(M=24, C=16), None)
    view = StateView(state)
    assert view.clock_s == state.clock_s and np.array_equal(view.status, state.status)
    assert not view.status.flags.writeable and state.status.flags.writeable
