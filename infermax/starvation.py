"""Starvation: long requests a policy leaves unserved while it keeps serving short ones (PecSched §3.2).

The paper's Table 2 counts the long requests that "never get served" under Priority while short
requests keep arriving and keep the GPUs busy. A finite trace ends, and an overloaded cluster
leaves requests waiting under *every* policy, so "not served by some time" alone measures load,
not the policy. Here a long request is **starved** under a policy when

1. FIFO, on the same workload and cluster, first schedules it before the *window end* — the last
   arrival of a request of any other tag (the end of the short requests' stream): the cluster
   could serve it while short requests kept arriving;
2. the policy does not first schedule it by then; and
3. the policy does serve short requests that arrived after it before then (it is overtaken: short
   requests keep being served while it waits).

The share is over the long requests of (1): ``starved / num_fifo_served``. A policy that serves long
requests as FIFO does starves none, however overloaded the cluster; Priority that never lets a long
request in starves them all.

The old count — requests first scheduled only after the last arrival, whatever FIFO does — is
``num_unserved_by_last_arrival`` in :func:`~infermax.metrics.metrics_by_tag`.

Calling the module calls :func:`starvation`: ``infermax.starvation(run, fifo)``.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._callable import CallableModule
from .trace import Trace


def _trace(run: Any) -> Trace:
    return run if isinstance(run, Trace) else run.trace


def starvation(run: Any, fifo: Any, tag: str = "long") -> dict[str, float]:
    """Starvation of the ``tag`` requests in ``run`` measured against ``fifo``, the same workload's FIFO run
    (both a :class:`~infermax.trace.Trace` or a result with ``.trace``). Keys: ``num_requests`` (tagged,
    arrived before the window end), ``num_fifo_served`` (of those, first scheduled by the window end under
    FIFO), ``num_unserved`` (not first scheduled by then in ``run``), ``num_starved`` (the three conditions
    of the module docstring), ``starved_share`` (``num_starved / num_fifo_served``; NaN when FIFO serves
    none of them), ``window_end_s``."""
    a, b = _trace(run).requests, _trace(fifo).requests
    for key in ("arrival_s", "tag"):
        if a[key].shape != b[key].shape or not np.array_equal(a[key], b[key]):
            raise ValueError(f"starvation: the run and its FIFO baseline differ in their requests' {key}: "
                             f"they must be runs of the same workload")
    is_tag = a["tag"] == tag
    if not is_tag.any():
        raise ValueError(f"starvation: no request is tagged {tag!r}")
    if is_tag.all():
        raise ValueError(f"starvation: every request is tagged {tag!r}; starvation needs other requests served")
    arrival = a["arrival_s"]
    end = float(arrival[~is_tag].max())
    came = is_tag & (arrival < end)
    fifo_served = came & (b["first_scheduled_s"] <= end)
    first = a["first_scheduled_s"]
    unserved = came & ~(first <= end)               # (NaN: never scheduled)
    # overtaken: a request of another tag arrived after it and was first scheduled by the window end
    served_others = ~is_tag & (first <= end)
    latest_other = float(arrival[served_others].max()) if served_others.any() else -np.inf
    overtaken = unserved & (arrival < latest_other)
    starved = fifo_served & overtaken
    n_fifo = int(fifo_served.sum())
    return {"num_requests": int(came.sum()), "num_fifo_served": n_fifo, "num_unserved": int(unserved.sum()),
            "num_starved": int(starved.sum()),
            "starved_share": float(starved.sum() / n_fifo) if n_fifo else float("nan"), "window_end_s": end}


sys.modules[__name__].__class__ = CallableModule   # calling the module calls starvation (infermax._callable)
