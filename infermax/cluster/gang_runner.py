"""Gangs on the replicas: forming one, holding its KV, its prefill (suspended and resumed), its decode steps.

A long request runs on a gang of replicas (:mod:`~infermax.cluster.gang`): a
sequence-parallel prefill, then decode steps over its sharded KV. The gang starts
when its members have no short work left; it holds its KV share on every member
from then to its completion (``external_kv``, which the members' schedulers admit
around). Under PecSched a short request dispatched to a member *suspends* the
gang's prefill at the next kernel boundary (PecSched §5.1) — the members keep
one layer's activations meanwhile — and the gang resumes where it stopped once its
members have no short work left. Its decode is *colocated* with short prefills of
at most ``colocate_tokens`` tokens per member and step (§5.2, Fig. 7); without
colocation (/CoL) a long decode step yields to any short work.

Every phase change and every unit of progress is told to the load index
(:mod:`~infermax.cluster.loads`): a member's tier for short requests follows the
gang's phase, and its queue length includes its share of what the gang has left.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from infermax.trace import TraceRecorder

from .csps import decode_phases, kv_gather_phases
from .gang import DECODE, DONE, PREFILL, WAIT, Gang, decode_comm_s
from .loads import FREE, GANG_DECODE, GANG_PREFILL, GANG_WAIT, Loads
from .policies import ClusterPolicy
from .replicas import GANG, Replicas
from .spec import Cluster

_TIER = {WAIT: GANG_WAIT, PREFILL: GANG_PREFILL, DECODE: GANG_DECODE}


class GangRunner:
    """The gangs of a run and every step they take on their members."""

    def __init__(self, cluster: Cluster, pol: ClusterPolicy, cost: Any, replicas: Replicas, loads: Loads,
                 colocate_tokens: int, handoffs: Any) -> None:
        self.cluster, self.pol, self.cost = cluster, pol, cost
        self.replicas, self.loads = replicas, loads
        self.colocate_tokens = colocate_tokens
        self.handoffs = handoffs                    # the migrations' ``handoffs(r)``, after a colocated batch
        R = len(replicas)
        self.gangs: list[Gang] = []
        self.gang_of = np.full(R, -1, dtype=np.int64)
        self.recorders: dict[int, TraceRecorder] = {}   # per member: its gang steps as batch rows
        self.busy_s = np.zeros(R)
        self._comm_s: dict[int, tuple] = {}             # per gang: a decode step's communication (before, after)
        self._alone_s: dict[int, float] = {}            # per KV share: a lone one-token decode over it
        self.scale_down: Any = None     # LoongServe (:class:`~infermax.cluster.elastic.ScaleDown`): after the
                                        # prefill the KV leaves the gang for a decode instance

    def of(self, r: int) -> Gang | None:
        g = self.gang_of[r]
        return self.gangs[g] if g >= 0 else None

    @property
    def all_done(self) -> bool:
        return all(g.phase == DONE for g in self.gangs)

    # --- bookkeeping -----------------------------------------------------------------------------------
    def _set_phase(self, g: Gang, phase: str) -> None:
        g.phase = phase
        tier = _TIER.get(phase, FREE)
        for r in g.members:
            self.loads.set_tier(r, tier)

    def _account(self, g: Gang) -> None:
        """Each member's share of the tokens the gang has left (its local queue length counts it)."""
        left = 0
        if g.phase != DONE:
            left = ((g.units - g.units_done) * g.input_len // g.units + g.output_len - g.gen) // len(g.members)
        for r in g.members:
            self.loads.gang_tokens[r] = left
            self.loads.touch(r)

    def _hold(self, r: int, tokens: int, now: float) -> None:
        """Change what replica r holds for its gang by ``tokens`` (KV share, saved state)."""
        st = self.replicas.state(r)
        st.external_kv += tokens
        self.replicas.scheduler(r).set_kv_budget(st, st.external_kv)
        self.replicas.event(r, now, "hold", -1, int(st.external_kv))

    def _recorder(self, r: int) -> TraceRecorder:
        rec = self.recorders.get(r)
        if rec is None:
            rec = self.recorders[r] = TraceRecorder()
        return rec

    def _members_idle(self, g: Gang) -> bool:
        return not any(self.replicas.has_work(r) for r in g.members)

    def most_held(self, g: Gang) -> int:
        """The most KV tokens each member holds for g: its share, plus the saved activations while suspended."""
        return g.share_tokens + self._saved_tokens(g)

    def _saved_tokens(self, g: Gang) -> int:
        return math.ceil(g.saved_bytes / self.cluster.model.kv_bytes_per_token)

    # --- forming and starting ----------------------------------------------------------------------------
    def form(self, i: int, members: tuple[int, ...], input_len: int, output_len: int, now: float) -> None:
        """Long request i gets a gang on ``members``; it starts at once if they have no short work."""
        g = self.pol.gang(self.cluster, len(self.gangs), int(i), members, input_len, output_len)
        self.gangs.append(g)
        for r in members:
            self.gang_of[r] = g.gid
        self._set_phase(g, WAIT)
        self._account(g)
        self.try_start(g, now)

    def try_start(self, g: Gang, now: float) -> None:
        """Start the gang's next step if it may run now."""
        if g.phase == WAIT:
            if not self._members_idle(g):
                return
            start = max([now] + [self.replicas.clock_s(r) for r in g.members])
            if math.isnan(g.first_scheduled_s):
                g.first_scheduled_s = start
                for r in g.members:
                    self._hold(r, g.share_tokens, start)
            switch = 0.0
            if g.suspended:
                switch = g.switch_s
                saved = self._saved_tokens(g)
                for r in g.members:
                    self._hold(r, -saved, start)
                g.suspended = False
            self._set_phase(g, PREFILL)
            self._begin(g, start, start + switch + (g.units - g.units_done) * g.unit_s, switch=switch)
        elif g.phase == DECODE and (not g.suspended or self._members_idle(g)):
            g.suspended = False             # a yielded decode resumes once its members have no work
            self._decode_step(g, now)

    def _begin(self, g: Gang, start: float, end: float, switch: float = 0.0) -> None:
        for r in g.members:
            self.replicas.held[r] = True
        g.step_start, g.step_end = start, end
        g.step_seq += 1
        g.switch_applied = switch
        self.replicas.push(end, GANG, (g.gid, g.step_seq))

    # --- prefill: segments and suspensions -------------------------------------------------------------
    def suspend(self, g: Gang, now: float) -> None:
        """A short request preempts the gang's prefill at the next kernel boundary after ``now``."""
        compute_start = g.step_start + g.switch_applied
        done = max(0, math.ceil((now - compute_start) / g.unit_s - 1e-9)) if now > compute_start else 0
        stop = compute_start + done * g.unit_s
        if g.units_done + done >= g.units or stop >= g.step_end:
            return                          # the prefill ends first: nothing to suspend
        g.steps.append({"phase": PREFILL, "start_s": g.step_start, "end_s": stop, "units": [g.units_done,
                        g.units_done + done], "switch_s": g.switch_applied, "suspended": True})
        self._record_prefill(g, g.step_start, stop, done)
        g.units_done += done
        g.step_seq += 1                     # its end event is void
        self._set_phase(g, WAIT)
        g.suspended = True
        g.num_suspensions += 1
        self._account(g)
        saved = self._saved_tokens(g)
        for r in g.members:
            self.replicas.held[r] = False
            self.replicas.wait_until(r, stop)
            self._hold(r, saved, stop)
            self.replicas.wake(r)

    def _record_prefill(self, g: Gang, start: float, end: float, units: int) -> None:
        """A prefill segment as a batch row on every member (its share of the prompt's tokens)."""
        tokens = max(1, round(g.input_len * units / g.units / len(g.members)))
        for r in g.members:
            self._recorder(r).add(start, end - start, (1, tokens, tokens, 0, g.share_tokens, 1, 0))
            self.busy_s[r] += end - start

    # --- decode steps -------------------------------------------------------------------------------------
    def _decode_step(self, g: Gang, now: float) -> None:
        if not self.pol.colocate and not self._members_idle(g):      # short work first: the long decode yields
            g.suspended = True
            g.num_suspensions += 1
            for r in g.members:
                self.replicas.held[r] = False
                self.replicas.wake(r)
            return
        start = max([now] + [self.replicas.clock_s(r) for r in g.members])
        shares = g.decode_shares()
        ends, colocated = [], []
        q_ship, comm = self._decode_comm(g)         # CSPS: the first layer's Q reaches the members first
        attend = shares
        gather = self.pol.csps is not None and self.pol.csps.decode == "kv"
        if gather:                                  # the first member gathers the KV and attends alone
            q_ship, comm = kv_gather_phases(self.cluster, g.members, int(shares.sum()))
            attend = np.zeros_like(shares)
            attend[0] = shares.sum()
        for j, r in enumerate(g.members):
            if attend[j]:
                ends.append(self._member_decode(g, r, int(attend[j]), start + q_ship, colocated))
        end = max(ends) + comm
        step = {"phase": DECODE, "start_s": start, "end_s": end, "gen": g.gen, "shares": shares.tolist(),
                "colocated": colocated}
        if self.pol.csps is not None:
            step["kv_gather" if gather else "q_ship"] = [start, start + q_ship]
        if gather:
            step["attend"] = attend.tolist()
        g.steps.append(step)
        self._begin(g, start, end)

    def _decode_comm(self, g: Gang) -> tuple[float, float]:
        """(before the members' attention, after it) of one of g's decode steps."""
        comm = self._comm_s.get(g.gid)
        if comm is None:
            comm = self._comm_s[g.gid] = (decode_phases(self.cluster, g.members) if self.pol.csps is not None
                                          else (0.0, decode_comm_s(self.cluster, g.members)))
        return comm

    def _member_decode(self, g: Gang, r: int, share: int, start: float, colocated: list) -> float:
        """Member r's part of a decode step from ``start``: attention over its ``share`` of the KV, inside its
        own next batch (colocated: at most ``colocate_tokens`` short prefill tokens) or alone. Its end time."""
        reps = self.replicas
        reps.held[r] = True
        runner = reps.runner(r)
        if runner.state.clock_s < start or runner.not_before < start:
            reps.wait_until(r, start)
        if self.pol.colocate and runner.state.has_work:
            sched = reps.scheduler(r)
            sched.set_token_budget(runner.state, self.colocate_tokens)
            ran = reps.step(r, _one_decode(share))
            sched.set_token_budget(runner.state, None)
            if ran:
                colocated.append((r, runner.state.num_batches - 1))
                self.handoffs(r)
                return runner.state.clock_s
        d = self._alone_s.get(share)
        if d is None:
            if len(self._alone_s) >= 4096:
                self._alone_s.clear()
            d = self._alone_s[share] = float(self.cost.batch_time(*_one_decode(share)))
        self._recorder(r).add(start, d, (1, 1, 0, 1, share, 1, 0))
        self.busy_s[r] += d
        return start + d

    # --- a step ends ----------------------------------------------------------------------------------------
    def step_done(self, gid: int, seq: int, t: float) -> None:
        """Gang ``gid``'s step ends at ``t`` (ignored if a suspension cut it): the next step, or the end."""
        g = self.gangs[gid]
        if seq != g.step_seq:
            return                           # the step was cut by a suspension
        if self.scale_down is not None and self.scale_down.waiting(g):
            self.scale_down.retry(g, t)      # its KV still waits for a decode instance with room
            return
        if g.phase == PREFILL:
            g.steps.append({"phase": PREFILL, "start_s": g.step_start, "end_s": t,
                            "units": [g.units_done, g.units], "switch_s": g.switch_applied, "suspended": False})
            self._record_prefill(g, g.step_start, t, g.units - g.units_done)
            g.units_done = g.units
            g.gen = 1
            g.first_token_s = t
            if self.scale_down is not None and g.output_len > 1:
                self.scale_down.start(g, t)
                return
            self._set_phase(g, DECODE)
        else:
            g.gen += 1
        for r in g.members:
            self.replicas.wait_until(r, t)
        if g.gen >= g.output_len:
            self._release(g, t)
            return
        self._account(g)
        self.try_start(g, t)

    def release(self, g: Gang, t: float, complete: bool = True) -> None:
        """The gang ends at ``t``: its request is complete there, or (``complete=False``) its KV left."""
        self._release(g, t, complete)

    def _release(self, g: Gang, t: float, complete: bool = True) -> None:
        """The long request is complete at ``t`` (or its KV left): its members drop its KV and are free again."""
        if complete:
            g.completion_s = t
        for r in g.members:
            self.gang_of[r] = -1
        self._set_phase(g, DONE)
        self._account(g)
        for r in g.members:
            self.replicas.held[r] = False
            self._hold(r, -g.share_tokens, t)
            self.replicas.wake(r)


def _one_decode(share: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A one-token decode over ``share`` cached tokens, as (tokens, cached, is_decode) of a batch."""
    return np.ones(1, dtype=np.int64), np.array([share], dtype=np.int64), np.ones(1, dtype=bool)
