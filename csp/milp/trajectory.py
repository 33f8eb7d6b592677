"""A schedule's per-request state trajectory, and the schedule rewrites the MILP relies on.

``trajectory`` steps a schedule through ``ServingState`` (the judge's rules)
and records m, I, G, c, e and the phase of every request around every batch;
the warm start turns that into model values. The rewrites keep a schedule valid
and never make it slower: dropping prefill work that an eviction later
discards (the dominance rule of :mod:`.strengthening`), relabelling
interchangeable requests into the symmetry-breaking order, and a sequential
schedule that is feasible whenever every request fits in M.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from infermax.costmodel import CostModel
from infermax.state import ScheduleError, ServingState
from infermax.types import Batch, Limits, Schedule, Workload

from .formulation import num_identical_classes
from .policy import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trajectory:
    """Per request (rows) and state/batch (columns) values of a schedule under ServingState."""

    m: np.ndarray      # [B, n+1] KV after batch
    inp: np.ndarray    # [B, n+1] input size
    gen: np.ndarray    # [B, n+1] tokens generated
    c: np.ndarray      # [B, n] tokens processed
    e: np.ndarray      # [B, n] evicted before the batch
    decode: np.ndarray  # [B, n] phase before the batch (pre-eviction)
    start_s: np.ndarray
    duration_s: np.ndarray


def trajectory(schedule: Schedule, workload: Workload, limits: Limits, cost: CostModel) -> Trajectory:
    """Step ``schedule`` through ServingState and record the state after every batch."""
    st = ServingState(workload, limits, cost)
    B, n = len(workload), len(schedule)
    m, inp, gen = (np.zeros((B, n + 1), dtype=np.int64) for _ in range(3))
    c, e = np.zeros((B, n), dtype=np.int64), np.zeros((B, n), dtype=np.int64)
    dec = np.zeros((B, n), dtype=bool)
    starts, durs = np.zeros(n), np.zeros(n)
    inp[:, 0] = workload.input_lens
    for j, b in enumerate(schedule.batches):
        idx, ev = workload.indices_of(b.ids), workload.indices_of(b.evict)
        dec[:, j] = (st.m >= st.inp) & (st.m > 0)
        e[ev, j] = 1
        c[idx, j] = b.tokens
        starts[j], durs[j], _ = st.apply(idx, b.tokens, ev, b.not_before_s)
        m[:, j + 1], inp[:, j + 1], gen[:, j + 1] = st.m, st.inp, st.gen
    return Trajectory(m, inp, gen, c, e, dec, starts, durs)


def respects_policy(schedule: Schedule, workload: Workload, limits: Limits, cost: CostModel,
                    policy: Policy) -> bool:
    """Whether ``schedule`` lies in ``policy``'s class (and within its effective limits)."""
    try:
        tr = trajectory(schedule, workload, policy.effective_limits(limits), cost)
    except ScheduleError:
        return False
    if not policy.allow_eviction and tr.e.any():
        return False
    pre = (tr.c > 0) & ~(tr.decode & (tr.e == 0))
    if not policy.hybrid and np.any(pre.any(axis=0) & ((tr.c > 0) & ~pre).any(axis=0)):
        return False
    if not policy.chunked_prefill and np.any(pre & (tr.gen[:, 1:] == tr.gen[:, :-1])):
        return False
    return True


def strip_wasted_work(schedule: Schedule, workload: Workload, limits: Limits, cost: CostModel) -> Schedule:
    """Drop prefill chunks whose KV is evicted before the (re)fill completes, and the empty batches left.

    The result is a valid schedule, never slower (fewer tokens, no later batch).
    """
    tr = trajectory(schedule, workload, limits, cost)
    keep_c, keep_e = tr.c.copy(), tr.e.copy()
    B, n = keep_c.shape
    for i in range(B):
        seg: list[int] = []                       # batches of the current unfinished (re)fill
        for j in range(n):
            if tr.e[i, j] and not tr.decode[i, j]:
                keep_c[i, seg] = 0                # wasted partial prefill
                keep_e[i, j] = 0                  # ... so nothing is left to evict
                seg = []
            elif tr.e[i, j]:
                seg = []
            if tr.c[i, j] and not (tr.decode[i, j] and not tr.e[i, j]):
                seg.append(j)
            if tr.gen[i, j + 1] > tr.gen[i, j]:
                seg = []
    if np.array_equal(keep_c, tr.c) and np.array_equal(keep_e, tr.e):
        return schedule
    cleaned = _rebuild(schedule, workload, keep_c, keep_e)
    try:
        trajectory(cleaned, workload, limits, cost)
    except ScheduleError as exc:   # never expected; keep the original rather than fail the solve
        log.warning("strip_wasted_work produced an invalid schedule (%s); keeping the original", exc)
        return schedule
    return cleaned


def _rebuild(schedule: Schedule, workload: Workload, c: np.ndarray, e: np.ndarray) -> Schedule:
    """Batches from token/eviction matrices; an emptied batch's evictions move to the next batch
    (nothing runs in between, so the KV is dropped at the same moment)."""
    ids = workload.ids
    batches, carry = [], np.zeros(c.shape[0], dtype=bool)
    for j, b in enumerate(schedule.batches):
        carry |= e[:, j] > 0
        idx = np.flatnonzero(c[:, j])
        if idx.size:
            batches.append(Batch(ids=ids[idx], tokens=c[idx, j], evict=ids[np.flatnonzero(carry)],
                                 not_before_s=b.not_before_s))
            carry[:] = False
    return Schedule(tuple(batches), dict(schedule.meta))


def merge_chunks(schedule: Schedule, workload: Workload, limits: Limits, cost: CostModel) -> Schedule | None:
    """Move every partial prefill chunk into the batch that completes its (re)fill (None if that breaks C/P).

    Call after :func:`strip_wasted_work` (every fill then completes).
    """
    tr = trajectory(schedule, workload, limits, cost)
    c = tr.c.copy()
    B, n = c.shape
    for i in range(B):
        pending = 0
        for j in range(n):
            prefill = c[i, j] and not (tr.decode[i, j] and not tr.e[i, j])
            if not prefill:
                continue
            if tr.gen[i, j + 1] > tr.gen[i, j]:
                c[i, j] += pending
                pending = 0
            else:
                pending += c[i, j]
                c[i, j] = 0
    if np.array_equal(c, tr.c):
        return schedule
    merged = _rebuild(schedule, workload, c, tr.e)
    try:
        trajectory(merged, workload, limits, cost)
    except ScheduleError:
        return None
    return merged


def canonical_labels(schedule: Schedule, workload: Workload, limits: Limits, cost: CostModel,
                     symmetry: str) -> Schedule:
    """Relabel interchangeable requests so the schedule meets the symmetry-breaking order."""
    if symmetry == "none":
        return schedule
    tr = trajectory(schedule, workload, limits, cost)
    perm = np.arange(len(workload))               # new index -> old index whose trajectory it takes
    for group in num_identical_classes(workload):
        if len(group) < 2:
            continue
        if symmetry == "lex":
            order = sorted(group, key=lambda i: tuple(-tr.gen[i, 1:]))
        else:
            done = [int(np.argmax(tr.gen[i] == workload.output_lens[i])) for i in group]
            order = [group[k] for k in np.argsort(done, kind="stable")]
        perm[group] = order
    if np.array_equal(perm, np.arange(len(workload))):
        return schedule
    ids = workload.ids
    new_of_old = np.empty_like(perm)
    new_of_old[perm] = np.arange(perm.size)
    batches = [Batch(ids=ids[new_of_old[workload.indices_of(b.ids)]], tokens=b.tokens,
                     evict=ids[new_of_old[workload.indices_of(b.evict)]], not_before_s=b.not_before_s)
               for b in schedule.batches]
    return Schedule(tuple(batches), dict(schedule.meta))


def sequential_schedule(workload: Workload, limits: Limits) -> Schedule:
    """Requests one after another in arrival order, chunked by min(C, P): feasible whenever each fits M."""
    step = min(limits.C, limits.P)
    batches = []
    for i in np.argsort(workload.arrivals_s, kind="stable"):
        r = workload.requests[int(i)]
        left = r.input_len
        while left > 0:
            chunk = min(step, left)
            batches.append(Batch(ids=np.array([r.id]), tokens=np.array([chunk])))
            left -= chunk
        batches.extend(Batch(ids=np.array([r.id]), tokens=np.array([1])) for _ in range(r.output_len - 1))
    return Schedule(tuple(batches), {"scheduler": {"name": "sequential"}})


