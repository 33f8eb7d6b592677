"""Disaggregation: short requests leave their prefill replica after the first token; their KV migrates.

With disaggregation (PecSched §5.2) a short request is *handed off*: its prefill
replica serves it to its first token, and its KV — sent layer by layer while the
prefill runs, so only the last layer's transfer is exposed — reaches the dedicated
decode replica with the shortest local queue, where it continues decoding
(``ServingState.receive``).

A decode replica receives work only by migrations, and nothing else depends on its
progress but the choice of a migration's destination; so it runs on demand — up to
a migration's arrival, up to the time a destination is chosen, and to the end of the
run — in fast-forwarded runs bounded by that time, instead of one batch per event of
the whole cluster.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from infermax.types import Workload

from .loads import Loads
from .replicas import MIGRATE, Replicas
from .spec import Cluster


class Migrations:
    """The run's KV migrations, and the decode replicas they feed."""

    def __init__(self, workload: Workload, cluster: Cluster, replicas: Replicas, loads: Loads) -> None:
        self.workload, self.cluster, self.replicas, self.loads = workload, cluster, replicas, loads
        self.decode_replicas = [int(d) for d in np.flatnonzero(replicas.decode_pool)]
        self.decode_of = np.full(len(workload), -1, dtype=np.int64)   # request -> its decode replica
        self.records: list[dict] = []
        self.link_bytes = {"nvlink": 0.0, "network": 0.0}
        self.on_arrive: dict[int, Any] = {}     # request -> called with the arrival time before it is received

    def handoffs(self, r: int) -> None:
        """Short requests that left replica r after their first token: send their KV to a decode replica."""
        st = self.replicas.state(r)
        if not st.handoffs:
            return
        self.advance_all(self.replicas.now_s)      # the destinations' queues as of now
        w, cluster, loads = self.workload, self.cluster, self.loads
        for i in st.handoffs:
            loads.refresh(self.replicas.local_queue)
            dst = loads.shortest_decode()
            kv = cluster.kv_bytes(int(w.input_lens[i]))
            L = cluster.model.num_layers
            end = float(st.first_token_s[i])
            # layer by layer while the prefill runs: the last layer's KV is the exposed part
            arrive = max(end + cluster.transfer_s(kv / L, r, dst),
                         float(st.first_scheduled_s[i]) + cluster.transfer_s(kv, r, dst))
            self.link_bytes["nvlink" if cluster.same_node(r, dst) else "network"] += kv
            loads.inflight[dst] += int(w.output_lens[i]) - 1
            loads.touch(dst)
            self.decode_of[i] = dst
            self.records.append({"request": int(i), "src": r, "dst": int(dst), "sent_s": end,
                                 "arrive_s": arrive, "bytes": kv})
            self.replicas.push(arrive, MIGRATE, (int(i), int(dst)))
        st.handoffs.clear()

    def advance_all(self, t: float) -> None:
        """Run every decode replica's batches that start before ``t`` (``math.inf``: to the end)."""
        for d in self.decode_replicas:
            if self.replicas.has_work(d):
                self.advance(d, t)

    def advance(self, r: int, t: float) -> None:
        """Run decode replica r's batches that start before ``t``, fast-forwarded up to ``t``."""
        if not self.replicas.is_built(r):
            return                      # nothing was ever sent there
        runner = self.replicas.runner(r)
        st = runner.state
        st.horizon_s = None if t == math.inf else t
        if not st.has_work or st.clock_s >= t:
            return
        self.loads.touch(r)
        while st.has_work and st.clock_s < t:
            if runner.step():
                continue
            own = st.next_arrival_s
            if st.num_pending and own is not None and own < t:
                runner.wait_until(own)
                continue
            break

    def arrive(self, i: int, dst: int, t: float) -> None:
        """Request i's KV reaches decode replica ``dst`` at ``t``: it joins there holding its first token."""
        reps = self.replicas
        self.advance(dst, t)
        self.loads.inflight[dst] -= int(self.workload.output_lens[i]) - 1
        self.loads.touch(dst)
        if reps.clock_s(dst) < t and not reps.has_work(dst):
            reps.wait_until(dst, t)
        release = self.on_arrive.pop(i, None)
        if release is not None:
            release(t)                  # (LoongServe: the KV reserved for it at dst becomes its own)
        I = int(self.workload.input_lens[i])
        reps.receive(dst, int(i), t, I, 1)
        reps.wake(dst)
