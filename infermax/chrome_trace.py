"""Chrome-trace / Perfetto export of a schedule: every batch on a timeline, one track per replica.

The file is the Trace Event Format's JSON object form (``{"traceEvents": [...], "displayTimeUnit":
"ms"}``), which both chrome://tracing (Chrome or Chromium: *Load*) and https://ui.perfetto.dev
(*Open trace file*; it runs in the browser, nothing is uploaded) open. Times are in microseconds
from the workload's first arrival, as the judge recomputes them: the export replays the schedule
(:func:`infermax.replay`, :func:`infermax.cluster.replay_cluster`) and draws what the judge saw.

What it holds, per replica (one *process* each, ``replica R``):

- a ``batches`` thread: one complete event per batch, named ``prefill``, ``decode`` or
  ``mixed`` by what it processed, its arguments the batch number, requests, tokens, prefill
  tokens, KV tokens, running requests, evicted ids and the prefill chunks (request -> tokens,
  the first :data:`MAX_LISTED` of them);
- counters ``kv_tokens`` and ``running`` at each batch start;
- on a cluster, a ``gang`` thread with the sequence-parallel steps a gang ran on that replica, and
  KV migrations as events on the sending replica's ``migrations`` thread.

And one ``requests`` process: per request an async span from arrival to completion, with nested
``queued`` (to its first batch), ``prefill`` (to its first token) and ``decode`` spans; Perfetto
lays each request on its own row (``--no-requests`` in the CLI leaves them out for big traces).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .cluster.judge import replay_cluster
from .replay import replay
from .schedule import Schedule
from .trace import Trace
from .types import Limits, Workload

MAX_LISTED = 64            # prefill chunks listed per batch event
_US = 1e6


def _meta(pid: int, name: str, threads: dict[int, str]) -> list[dict]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}} for t, n in threads.items()]
    return out


def batch_events(schedule: Schedule, trace: Trace, pid: int = 0) -> list[dict]:
    """The batches of one replica (``schedule`` and its judged ``trace``) as complete and counter events."""
    b = trace.batches
    events = _meta(pid, f"replica {pid}", {0: "batches"})
    for j, batch in enumerate(schedule):
        ts, dur = float(b["start_s"][j]) * _US, float(b["duration_s"][j]) * _US
        pre, tokens = int(b["num_prefill_tokens"][j]), int(b["num_tokens"][j])
        kind = "decode" if pre == 0 else "prefill" if pre == tokens else "mixed"
        ids, tok = np.asarray(batch.ids), np.asarray(batch.tokens)
        chunks = {str(int(i)): int(c) for i, c in zip(ids, tok) if c > 1}
        args = {"batch": j, "requests": int(b["num_requests"][j]), "tokens": tokens, "prefill_tokens": pre,
                "kv_tokens": int(b["kv_tokens"][j]), "running": int(b["num_running"][j]),
                "chunks": dict(list(chunks.items())[:MAX_LISTED])}
        if len(batch.evict):
            args["evicted"] = [int(i) for i in batch.evict]
        events.append({"name": kind, "cat": "batch", "ph": "X", "pid": pid, "tid": 0, "ts": ts, "dur": dur,
                       "args": args})
        events.append({"name": "kv_tokens", "ph": "C", "pid": pid, "ts": ts, "args": {"kv": args["kv_tokens"]}})
        events.append({"name": "running", "ph": "C", "pid": pid, "ts": ts, "args": {"running": args["running"]}})
    return events


def request_events(requests: dict[str, np.ndarray], pid: int) -> list[dict]:
    """Per request an async span arrival -> completion with nested queued / prefill / decode spans."""
    events = _meta(pid, "requests", {})
    arrival, first, token, done = (requests[k] for k in ("arrival_s", "first_scheduled_s", "first_token_s",
                                                          "completion_s"))
    for k, rid in enumerate(requests["id"].tolist()):
        spans = [(f"request {rid}", arrival[k], done[k]), ("queued", arrival[k], first[k]),
                 ("prefill", first[k], token[k]), ("decode", token[k], done[k])]
        for name, a, z in spans:
            if not (np.isfinite(a) and np.isfinite(z)):
                continue
            common = {"name": name, "cat": "request", "id": int(rid), "pid": pid, "tid": 0}
            events.append({**common, "ph": "b", "ts": float(a) * _US})
            events.append({**common, "ph": "e", "ts": float(z) * _US})
    return events


def document(events: list[dict], meta: dict[str, Any]) -> dict[str, Any]:
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def schedule_trace(schedule: Schedule, workload: Workload, limits: "Limits | str | None" = None, cost: Any = None,
                   with_requests: bool = True) -> dict[str, Any]:
    """The trace document of a single-replica ``schedule`` (judged by :func:`infermax.replay` first)."""
    trace = replay(schedule, workload, limits, cost)
    events = batch_events(schedule, trace, 0)
    if with_requests:
        events += request_events(trace.requests, 1)
    return document(events, {"source": "infermax", "scheduler": schedule.meta.get("scheduler"),
                             "workload": workload.name, "num_batches": len(schedule)})


def cluster_trace(schedule: Any, workload: Workload, cost: Any = None, with_requests: bool = True) -> dict[str, Any]:
    """The trace document of a :class:`~infermax.cluster.ClusterSchedule` (judged by ``replay_cluster``)."""
    judged = replay_cluster(schedule, workload, cost)
    R = len(schedule.replicas)
    events: list[dict] = []
    for r, (sched, trace) in enumerate(zip(schedule.replicas, judged.traces)):
        events += batch_events(sched, trace, r)
    for g in schedule.gangs:
        for step in g["steps"]:
            for r in g["members"]:
                events.append({"name": f"gang {g['request']} {step['phase']}", "cat": "gang", "ph": "X", "pid": r,
                               "tid": 1, "ts": step["start_s"] * _US, "dur": (step["end_s"] - step["start_s"]) * _US,
                               "args": {"request": g["request"], "members": list(g["members"])}})
    events += [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": n}}
               for r in range(R) for t, n in ((1, "gang"), (2, "migrations"))]
    for m in schedule.migrations:
        events.append({"name": f"KV of {m['request']} to replica {m['dst']}", "cat": "migration", "ph": "X",
                       "pid": m["src"], "tid": 2, "ts": m["sent_s"] * _US, "dur": (m["arrive_s"] - m["sent_s"]) * _US,
                       "args": {"request": m["request"], "bytes": m["bytes"]}})
    if with_requests:
        events += request_events(judged.requests, R)
    return document(events, {"source": "infermax", "cluster": schedule.meta.get("cluster"),
                             "policy": schedule.meta.get("policy"), "workload": workload.name})


def write(doc: dict[str, Any], path: "str | Path") -> Path:
    """Write the document as JSON (compact: traces of many batches are large)."""
    path = Path(path)
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path
