"""Read a solution back as a Schedule: batch j holds the requests with c_ij > 0.

Empty batches (y_j = 0, pushed to the end of the horizon) are dropped;
evictions e_ij = 1 go on their batch. Online, a batch that waits for an arrival
(its solver start is after the previous batch's end) gets ``not_before_s`` =
the latest arrival among its requests, exactly — never the solver's start
time, whose grid and tolerances would add spurious idle of 1e-10 to 1e-7 s. No
objective gains from idling for anything else, so no other wait is kept.
"""
from __future__ import annotations

import numpy as np

from infermax.types import Batch, Schedule

from .formulation import Formulation, as_array


def to_schedule(fm: Formulation, values: np.ndarray, meta: dict) -> Schedule:
    """The Schedule encoded by ``values`` (a full assignment of ``fm.model``)."""
    v = fm.v
    c = np.rint(values[as_array(v.c)]).astype(np.int64)
    e = np.rint(values[as_array(v.e)]).astype(np.int64)
    ids = fm.workload.ids
    starts = [values[s.index] for s in v.start] if v.start else None
    arrivals = fm.workload.arrivals_s
    prev_end = -np.inf
    batches = []
    for j in range(fm.horizon):
        idx = np.flatnonzero(c[:, j] > 0)
        ev = np.flatnonzero(e[:, j] > 0)
        if idx.size == 0:
            if ev.size:
                raise RuntimeError(f"solution evicts in empty batch {j}")
            continue
        not_before = 0.0
        if starts is not None:
            latest = float(arrivals[idx].max())
            if starts[j] > prev_end + 1e-9 * max(1.0, abs(prev_end)) and latest > 0.0:
                not_before = latest
            prev_end = float(values[v.end[j].index])
        batches.append(Batch(ids=ids[idx], tokens=c[idx, j], evict=ids[ev], not_before_s=not_before))
    return Schedule(tuple(batches), meta)
