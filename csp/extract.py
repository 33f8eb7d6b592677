"""Read a solution back as a Schedule: batch j holds the requests with c_ij > 0.

Empty batches (y_j = 0, pushed to the end of the horizon) are dropped;
evictions e_ij = 1 go on their batch; online, each batch's solver start time
is kept as ``not_before_s`` so that an idle period chosen by the solver is
replayed as such.
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
    starts = [values[s.index] for s in v.start] if getattr(v, "start", None) else None
    batches = []
    for j in range(fm.horizon):
        idx = np.flatnonzero(c[:, j] > 0)
        ev = np.flatnonzero(e[:, j] > 0)
        if idx.size == 0:
            if ev.size:
                raise RuntimeError(f"solution evicts in empty batch {j}")
            continue
        not_before = float(starts[j]) if starts is not None else 0.0
        batches.append(Batch(ids=ids[idx], tokens=c[idx, j], evict=ids[ev], not_before_s=not_before))
    return Schedule(tuple(batches), meta)
