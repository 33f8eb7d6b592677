"""The judge of executed plans (spp or kvp > 1): stages, KVP groups and pipeline order, recomputed.

:func:`~infermax.cluster.judge.replay_cluster` replays every replica of such a cluster with a
:class:`PlanJudge` as its state's cost model and calls it around each batch. The judge
rebuilds each request's KV placement from the recorded onboardings alone (``dynamic``) or
the striping rule (``static``), recomputes every batch's stage time from the cost model's
terms, runs the batches through the stages itself and checks, raising
:class:`~infermax.cluster.judge_gangs.ClusterScheduleError` with these rules:

- ``format``: the record has one entry per batch, p stage starts each, k groups;
- ``stage-busy``: no stage runs two batches at once, and a batch starts stage q only after
  it left stage q − 1 (read from the recorded intervals first, before anything is recomputed);
- ``kvp-capacity``: no group ever holds more KV than its capacity (recorded and recomputed),
  the capacity is the cluster's (M / kvp), and no shard but a request's last holds more than
  the per-group token limit;
- ``kvp-placement``: the recorded KV per group is what the onboardings place;
- ``pipeline-order``: a decode (a prefill chunk too under plain PP) enters only after its
  request's previous batch left the last stage;
- ``plan-time``: the recorded entry is the replayed start, the recorded stage time is the
  recomputed one, and the recorded stage starts are the recomputed ones.

The requests' first-token and completion times are set to their batches' exits from the
last stage, as recomputed here.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from infermax.costmodel.communication import comm_model
from infermax.costmodel.parallel import ParallelCostModel, kvp_merge_s
from infermax.state import DONE

from .judge_gangs import ClusterScheduleError

REL_TOL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def _rows(values: np.ndarray, n: int, width: int) -> np.ndarray:
    """A recorded per-batch table as n rows (a replica that ran no batch: none, of ``width``)."""
    return np.zeros((0, width), dtype=values.dtype) if n == 0 and values.size == 0 else values.reshape(n, -1)


class PlanJudge:
    """One replica's plan, replayed (see the module docstring); the replayed state's cost model."""

    is_linear = False

    def __init__(self, r: int, schedule: Any, cluster: Any, workload: Any) -> None:
        from infermax.costmodel import get_cost_model
        self.r, self.cluster, self.workload = r, cluster, workload
        batches = schedule.replicas[r].batches
        rec = schedule.plans[r] if r < len(schedule.plans) else None
        if rec is None or (not rec and batches):
            raise ClusterScheduleError("format", f"replica {r}: an executed plan needs its record (plans[{r}])")
        self.rec, self.n = rec, len(batches)
        plan = dataclasses.replace(cluster.cost_plan, kvp=1)
        base = cluster.cost_model_name().partition("@")[0]
        self.cost = get_cost_model(base if plan.is_single_gpu else f"{base}@{plan.to_text()}")
        # (one GPU per KVP group, tp = pp = 1: the replica's model prices no communication, the merge does)
        self.comm = self.cost.comm if isinstance(self.cost, ParallelCostModel) else comm_model(cluster.gpu.name)
        self.name = f"plan:{cluster.cost_model_name()}"
        self.p, self.k = plan.pp, cluster.plan.kvp
        self._pending = 0.0
        if not rec:
            return
        self._read_record()
        self.kv = np.zeros(self.k, dtype=np.int64)
        self.held: dict[int, np.ndarray] = {}               # request index -> tokens per group
        self.last: dict[int, list[int]] = {}                # dynamic: request -> [group, tokens] of its last shard
        self.free_s = np.zeros(self.p)
        self.exit_s = np.zeros(len(workload))
        self.onboard: dict[tuple[int, int], list[tuple[int, int]]] = {}
        pos = {int(x): k for k, x in enumerate(workload.ids)}
        for b, rid, g, first in rec["onboard"]:
            if int(rid) not in pos or not 0 <= int(g) < self.k:
                raise ClusterScheduleError("format", f"replica {self.r}: onboarding {[b, rid, g, first]} names an "
                                           f"unknown request or group")
            self.onboard.setdefault((int(b), pos[int(rid)]), []).append((int(first), int(g)))

    # --- the record alone --------------------------------------------------------------------------
    def _read_record(self) -> None:
        rec, r = self.rec, self.r
        try:
            entry = np.asarray(rec["entry_s"], dtype=np.float64)
            stage = np.asarray(rec["stage_s"], dtype=np.float64)
            starts = _rows(np.asarray(rec["stage_start_s"], dtype=np.float64), self.n, self.p)
            group_kv = _rows(np.asarray(rec["group_kv"], dtype=np.int64), self.n, self.k)
            cap, limit = int(rec["group_capacity"]), int(rec["group_tokens"])
            mode, pipeline = rec["onboarding"], rec["pipeline"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterScheduleError("format", f"replica {r}: plan record: {exc!r}") from None
        if entry.size != self.n or stage.size != self.n or starts.shape[1] != self.p or group_kv.shape[1] != self.k \
                or mode not in ("dynamic", "static") or pipeline not in ("spp", "pp"):
            raise ClusterScheduleError("format", f"replica {r}: plan record needs, per batch, an entry, a stage "
                                       f"time, {self.p} stage starts and {self.k} group KVs")
        ends = starts + stage[:, None]
        for q in range(self.p):
            if q and np.any(starts[:, q] < ends[:, q - 1] * (1 - REL_TOL) - 1e-12):
                j = int(np.argmax(starts[:, q] < ends[:, q - 1] * (1 - REL_TOL) - 1e-12))
                raise ClusterScheduleError("stage-busy", f"replica {r}, batch {j}: starts stage {q} at "
                                           f"{starts[j, q]!r} s before leaving stage {q - 1} at {ends[j, q - 1]!r} s")
            overlap = starts[1:, q] < ends[:-1, q] * (1 - REL_TOL) - 1e-12
            if overlap.any():
                j = int(np.argmax(overlap)) + 1
                raise ClusterScheduleError("stage-busy", f"replica {r}: stage {q} runs batch {j} from "
                                           f"{starts[j, q]!r} s while batch {j - 1} runs there until "
                                           f"{ends[j - 1, q]!r} s")
        true_cap = self.cluster.replica_kv_capacity_tokens // self.k
        if cap > true_cap:
            raise ClusterScheduleError("kvp-capacity", f"replica {r}: group capacity {cap} > {true_cap}, what a "
                                       f"KVP group's memory holds on {self.cluster.to_spec()}")
        if group_kv.size and group_kv.max() > cap:
            j, g = map(int, np.unravel_index(np.argmax(group_kv), group_kv.shape))
            raise ClusterScheduleError("kvp-capacity", f"replica {r}, batch {j}: KVP group {g} holds "
                                       f"{int(group_kv[j, g])} KV tokens > its capacity {cap}")
        self.entry, self.stage, self.starts, self.group_kv = entry, stage, starts, group_kv
        self.cap, self.limit, self.mode, self.pipeline = cap, limit, mode, pipeline

    # --- around each batch (judge._replay_replica) ---------------------------------------------------
    def before(self, j: int, state: Any, idx: np.ndarray, tokens: np.ndarray, evict: np.ndarray) -> None:
        for i in evict.tolist():
            self._free(i)
        m0 = np.where(np.isin(idx, evict), 0, state.m[idx])
        dec = m0 >= state.inp[idx]
        self._dec, self._idx, self._gen0 = dec, idx, state.gen[idx].copy()
        dkv, work, ptok = np.zeros(self.k), np.zeros(self.k), np.zeros(self.k)
        merge, span = 0, 1
        for i, c, m, d in zip(idx.tolist(), tokens.tolist(), m0.tolist(), dec.tolist()):
            old = self.held.get(i, np.zeros(self.k, dtype=np.int64))
            new = self._static(i, m, c) if self.mode == "static" else self._dynamic(j, i, m, c)
            now = old + new
            self.held[i] = now
            self.kv += new
            if d:
                dkv += now
            else:
                pairs = c * old + (new * (c + 1) / 2 if self.mode == "static" else self._causal(new, c))
                work += pairs
                ptok += np.where(pairs > 0, c, 0)
            s = int(np.count_nonzero(now))
            if s > 1:
                merge, span = merge + c, max(span, s)
        if self.kv.max() > self.cap:
            raise ClusterScheduleError("kvp-capacity", f"replica {self.r}, batch {j}: a KVP group would hold "
                                       f"{int(self.kv.max())} KV tokens > its capacity {self.cap}")
        self._pending = self._stage_s(int(tokens.sum()), int(idx.size), dkv, work, ptok, merge, span)

    def after(self, j: int, state: Any, start: float) -> None:
        r, idx = self.r, self._idx
        wait = idx if self.pipeline == "pp" else idx[self._dec]
        if wait.size and start < float(self.exit_s[wait].max()) * (1 - REL_TOL) - 1e-12:
            i = int(wait[np.argmax(self.exit_s[wait])])
            raise ClusterScheduleError("pipeline-order", f"replica {r}, batch {j}: request "
                                       f"{int(self.workload.ids[i])} enters at {start!r} s before its previous "
                                       f"batch left the last stage at {float(self.exit_s[i])!r} s")
        stage = self._pending
        if not _close(self.entry[j], start) or not _close(self.stage[j], stage):
            raise ClusterScheduleError("plan-time", f"replica {r}, batch {j}: recorded entry {self.entry[j]!r} s "
                                       f"and stage time {self.stage[j]!r} s; replayed {start!r} s and {stage!r} s")
        t = start
        for q in range(self.p):
            t = max(t, self.free_s[q]) if q else t
            if not _close(self.starts[j, q], t):
                raise ClusterScheduleError("plan-time", f"replica {r}, batch {j}: recorded start of stage {q} "
                                           f"{self.starts[j, q]!r} s; replayed {t!r} s")
            t += stage
            self.free_s[q] = t
        self.exit_s[idx] = t
        emitted = idx[state.gen[idx] > self._gen0]
        state.first_token_s[emitted[state.gen[emitted] == 1]] = t
        for i in emitted[state.status[emitted] == DONE].tolist():
            state.completion_s[i] = t
            self._free(i)
        if not np.array_equal(self.kv, self.group_kv[j]):
            raise ClusterScheduleError("kvp-placement", f"replica {r}, batch {j}: recorded KV per group "
                                       f"{self.group_kv[j].tolist()}; the onboardings place {self.kv.tolist()}")

    # --- the cost model interface of the replayed state ----------------------------------------------
    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        return self._pending

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    # --- placement and time, recomputed ----------------------------------------------------------------
    def _free(self, i: int) -> None:
        self.kv -= self.held.pop(i, 0)
        self.last.pop(i, None)

    def _static(self, i: int, m: int, c: int) -> np.ndarray:
        per = np.full(self.k, c // self.k, dtype=np.int64)
        per[(m + np.arange(c % self.k)) % self.k] += 1
        return per

    def _dynamic(self, j: int, i: int, m: int, c: int) -> np.ndarray:
        """New tokens per group: positions m..m+c-1 follow the last shard until an onboarding starts another."""
        new = np.zeros(self.k, dtype=np.int64)
        self._segments = []
        cuts = sorted(self.onboard.get((j, i), []))
        shard = self.last.get(i)
        u = 0
        for first, g in cuts + [(m + c, -1)]:
            n = first - m - u
            if n < 0:
                raise ClusterScheduleError("format", f"replica {self.r}, batch {j}: onboarding at position {first} "
                                           f"outside the chunk {m}..{m + c - 1}")
            if n:
                if shard is None:
                    raise ClusterScheduleError("kvp-placement", f"replica {self.r}, batch {j}: request "
                                               f"{int(self.workload.ids[i])} writes KV before onboarding a group")
                shard[1] += n
                new[shard[0]] += n
                self._segments.append((shard[0], u, n))
                u += n
            if g >= 0:
                if shard is not None and shard[1] < self.limit and self.kv[shard[0]] + new[shard[0]] < self.cap:
                    raise ClusterScheduleError("kvp-placement", f"replica {self.r}, batch {j}: request "
                                               f"{int(self.workload.ids[i])} onboards group {g} while its shard on "
                                               f"group {shard[0]} has room")
                shard = [g, 0]
        if shard is not None and shard[1] > self.limit:
            raise ClusterScheduleError("kvp-capacity", f"replica {self.r}, batch {j}: request "
                                       f"{int(self.workload.ids[i])} holds {shard[1]} tokens in one shard > the "
                                       f"per-group limit {self.limit}")
        self.last[i] = shard
        return new

    def _causal(self, new: np.ndarray, c: int) -> np.ndarray:
        out = np.zeros(self.k)
        for g, u, n in self._segments:
            out[g] += n * (n + 1) / 2 + n * (c - u - n)
        return out

    def _stage_s(self, num_tokens: int, num_requests: int, dkv: np.ndarray, work: np.ndarray, ptok: np.ndarray,
                 merge: int, span: int) -> float:
        k, c = self.cost.coefficients, self.cluster
        attn = np.where(dkv > 0, k.decode_bias_s + k.decode_kv_s * dkv, 0.0)
        attn += np.where(ptok > 0, k.prefill_bias_s + k.prefill_attn_s * work + k.prefill_token_s * ptok, 0.0)
        whole = max(a + b * num_tokens for a, b in k.nonattn_lines) + k.request_s * num_requests + float(attn.max())
        if span > 1 and merge:
            par = dataclasses.replace(c.cost_plan, kvp=span)
            whole += c.model.num_layers * kvp_merge_s(merge, par, c.model, c.gpu, self.comm)
        if self.p == 1:
            return whole
        hop = self.comm.send_recv_s(num_tokens * c.model.hidden_size * c.model.dtype_bytes,
                                    intra_node=self.cost.parallel.num_gpus <= c.gpu.gpus_per_node)
        return (whole - (self.p - 1) * hop) / self.p + hop
