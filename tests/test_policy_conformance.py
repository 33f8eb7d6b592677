"""Policy conformance (issue 22): every registered scheduler keeps to what its policy declares.

On small instances, for each scheduler in the registry (and the example Policy value of
test_policy.py): no batch mixes decodes with (re)fills where the policy forbids hybrid batches,
no (re)fill is split over batches where it forbids chunked prefill, nothing is evicted where it
is eviction-free, and the judge (``replay``) accepts the schedule under the Limits tightened by
the scheduler's own C, P and R_max — so every batch keeps within them — and reproduces the
simulator's trace. What a scheduler declares is its ``describe()`` (the keys the MILP's
``Policy.from_description`` reads, plus ``C``); one that does not say is held to the Limits.
"""
from typing import NamedTuple

import numpy as np
import pytest
from factories import make_workload, small_instances
from hypothesis import given, settings
from test_policy import LONGEST_REMAINING_EVICT_YOUNGEST

from infermax import Limits, Schedule, Workload, replay, simulate
from infermax.schedulers import GetNextBatch, Scheduler, available, get_scheduler


class Declared(NamedTuple):
    """What a scheduler promises of its schedules (None: the Limits' own cap)."""

    hybrid: bool
    chunked: bool
    eviction_free: bool
    C: int | None
    P: int | None
    R_max: int | None


def declared(sched: Scheduler) -> Declared:
    d = sched.describe()
    return Declared(d.get("hybrid", True), d.get("chunked", True), d.get("eviction_free", False),
                    d.get("C"), d.get("P"), d.get("R_max"))


def tightened(limits: Limits, dec: Declared) -> Limits:
    """``limits`` with the scheduler's own caps applied."""
    caps = {k: min(v, getattr(limits, k) if k != "R_max" else limits.max_running)
            for k, v in (("C", dec.C), ("P", dec.P), ("R_max", dec.R_max)) if v is not None}
    return limits.replace(**caps) if caps else limits


def class_breaches(schedule: Schedule, workload: Workload, dec: Declared) -> list[str]:
    """Batches that leave the declared class, found by following m (KV) and inp (input) per request."""
    n = len(workload)
    m, inp, gen = np.zeros(n, dtype=np.int64), workload.input_lens.copy(), np.zeros(n, dtype=np.int64)
    out = []
    for j, b in enumerate(schedule):
        ev, idx = workload.indices_of(b.evict), workload.indices_of(b.ids)
        if ev.size and dec.eviction_free:
            out.append(f"batch {j}: evicts {b.evict.tolist()} though eviction-free")
        decoding = m[ev] >= inp[ev]
        inp[ev[decoding]] = m[ev[decoding]] + 1       # a decode-phase eviction recomputes its tokens
        m[ev] = 0
        dec_now = m[idx] >= inp[idx]
        if not dec.hybrid and 0 < np.count_nonzero(dec_now) < idx.size:
            out.append(f"batch {j}: mixes decodes and (re)fills though not hybrid")
        fill = ~dec_now
        if not dec.chunked and np.any(b.tokens[fill] != (inp - m)[idx[fill]]):
            out.append(f"batch {j}: splits a (re)fill though not chunked")
        m[idx] += b.tokens
        gen[idx] += m[idx] >= inp[idx]
        m[idx[gen[idx] == workload.output_lens[idx]]] = 0
    return out


def conforms(sched: Scheduler, workload: Workload, limits: Limits) -> None:
    block = sched.block_size or limits.block_size
    if block > 1:       # a *-real preset: every request fits in whole blocks of a cache rounded up to them
        limits = limits.replace(M=-(-limits.M // block) * block, block_size=block)
    dec = declared(sched)
    result = simulate(workload, sched, limits)
    assert replay(result.schedule, workload, tightened(limits, dec)) == result.trace   # C, P, R_max, M kept
    assert not class_breaches(result.schedule, workload, dec), class_breaches(result.schedule, workload, dec)[:3]


# --- instances: prompts fit min(C, P) whole, so no scheduler refuses them ---------------------------
def _online(n: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload.from_lengths(rng.integers(4, 48, n), rng.integers(2, 40, n), np.sort(rng.uniform(0, 0.4, n)),
                                 name="online")


INSTANCES = {
    # refills near C: non-chunked schedulers pin and preempt, the rest evict
    "tight": (make_workload([(9, 7), (5, 12), (12, 3), (7, 9), (3, 11), (10, 10)]), Limits(M=26, C=14)),
    # online arrivals under a scheduler-sized P and R_max
    "online": (_online(24, 1), Limits(M=220, C=120, P=96, R_max=6)),
}
SLOW_INSTANCES = {
    "online-long": (_online(120, 2), Limits(M=600, C=256, P=128)),
    "offline": (Workload.from_spec("fixed:I=48,O=40,B=40"), Limits(M=700, C=200)),
}
SCHEDULERS = [*available(), "lrf-youngest"]


def scheduler(name: str) -> Scheduler:
    if name == "lrf-youngest":
        return GetNextBatch(LONGEST_REMAINING_EVICT_YOUNGEST, name=name)
    return get_scheduler(name)


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("case", [*INSTANCES, *(pytest.param(k, marks=pytest.mark.slow) for k in SLOW_INSTANCES)])
def test_scheduler_keeps_to_its_policy(name, case):
    workload, limits = {**INSTANCES, **SLOW_INSTANCES}[case]
    conforms(scheduler(name), workload, limits)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEDULERS)
@settings(max_examples=20)
@given(inst=small_instances(max_requests=8, max_len=24))
def test_scheduler_keeps_to_its_policy_on_random_instances(name, inst):
    conforms(scheduler(name), *inst)


def test_the_checks_catch_a_breach():
    """The checks are not vacuous: a sarathi schedule leaves the classes it is not in."""
    w, lim = INSTANCES["tight"]
    sched = simulate(w, "sarathi", lim).schedule
    strict = Declared(hybrid=False, chunked=False, eviction_free=True, C=None, P=None, R_max=None)
    found = " ".join(class_breaches(sched, w, strict))
    assert "mixes" in found and "splits" in found and "evicts" in found
    with pytest.raises(Exception, match="R_max"):
        replay(sched, w, tightened(lim, strict._replace(R_max=1)))
