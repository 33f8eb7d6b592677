"""Medha's slack-aware scheduling with adaptive chunking (Medha §3.2, §4.2).

Each batch: every decode first (decodes are never preempted); then prefill
chunks, requests ordered by input-length-aware least remaining slack (ILRS,
Eq. 7):

    relative_slack = (deadline - now - remaining_prefill_time) / deadline_duration

with the remaining prefill time predicted by the cost model (the request's
remaining tokens as one isolated chunk) and the deadline its TTFT SLO (requests
without one get ``default_ttft_s`` plus ``default_ttft_per_1k_s`` per 1000 prompt
tokens). Adaptive chunking: each chunk is the largest that keeps the predicted
batch time within the TPOT target (the tightest TPOT SLO among the batched
decodes, else ``target_batch_s``), so chunks shrink as a long prefill's KV grows;
at least ``min_chunk`` tokens keep it moving. Prefill–prefill batching: when
other prefills wait, the most urgent one leaves a share of its chunk to them,
proportional to their urgency (1 - slack) and capped by ``max_share``.
``medha-fcfs`` keeps adaptive chunking but serves prefills first come, first
served, without prefill–prefill batching.
"""
from __future__ import annotations

import math

import numpy as np

from infermax.state import ServingState

from .base import Plan, Scheduler
from .longctx import _NO_IDX, BatchDraft, SumsDraft, phases, work_timer
from .medha_compiled import batcher
from .registry import register_scheduler


class Medha(Scheduler):
    """ILRS slack priority + adaptive chunking + prefill-prefill batching.

    Not a GetNextBatch policy (:class:`infermax.policy.Policy`): its decisions are token counts —
    each chunk the largest whose batch time the cost model predicts within the TPOT target, the
    most urgent prefill leaving a share to the next — not an order of requests or a choice of
    victims (``medha-fcfs``, FCFS with adaptive chunks, is no Policy value either); and its ILRS
    order reads predicted prefill times, which a rank key's RequestView does not carry.
    """

    def __init__(self, *, fcfs: bool = False, target_batch_s: float = 0.2, min_chunk: int = 32,
                 max_share: float = 0.5, default_ttft_s: float = 2.0, default_ttft_per_1k_s: float = 0.5,
                 R_max: int | None = None, name: str = "medha") -> None:
        for field, v in (("target_batch_s", target_batch_s), ("default_ttft_s", default_ttft_s)):
            if not v > 0:
                raise ValueError(f"Medha.{field} must be > 0, got {v!r}")
        if not 0 <= max_share <= 1:
            raise ValueError(f"Medha.max_share must be in [0, 1], got {max_share!r}")
        if min_chunk < 1:
            raise ValueError(f"Medha.min_chunk must be >= 1, got {min_chunk!r}")
        self.fcfs, self.target_batch_s, self.min_chunk, self.max_share = fcfs, target_batch_s, min_chunk, max_share
        self.default_ttft_s, self.default_ttft_per_1k_s = default_ttft_s, default_ttft_per_1k_s
        self.R_max, self.name = R_max, name

    def reset(self, state: ServingState) -> None:
        w = state.workload
        slo = np.array([np.nan if r.ttft_slo_s is None else r.ttft_slo_s for r in w.requests])
        fallback = self.default_ttft_s + self.default_ttft_per_1k_s * w.input_lens / 1000
        self._ttft = np.where(np.isnan(slo), fallback, slo)
        self._tpot = np.array([np.inf if r.tpot_slo_s is None else r.tpot_slo_s for r in w.requests])
        self._R = min(self.R_max or state.limits.max_running, state.limits.max_running)
        self._pred_m = np.full(len(w), -1, dtype=np.int64)   # cache: isolated prefill time at (m, inp)
        self._pred_inp = np.full(len(w), -1, dtype=np.int64)
        self._pred_s = np.zeros(len(w))
        self._timer = work_timer(state.cost)     # (None: the cost model's batch_time on arrays)
        self._no_tpot = bool((self._tpot == np.inf).all())      # the target is target_batch_s whenever decodes run
        if self._timer is not None:   # the slack from Python floats (:meth:`_slack_of_sums`): the cache as lists
            self._deadline_l = (state.arrivals_s + self._ttft).tolist()
            self._ttft_l, self._arrival_l = self._ttft.tolist(), state.arrivals_s.tolist()
            self._pred_ml, self._pred_il, self._pred_sl = [-1] * len(w), [-1] * len(w), [0.0] * len(w)
        self._compiled = batcher(self, state)   # (None: plan in Python)

    def slack(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """Relative slack (Eq. 7) of each request in ``idx``."""
        m = state.m[idx]
        stale = idx[(self._pred_m[idx] != m) | (self._pred_inp[idx] != state.inp[idx])]
        timer = self._timer
        for x in stale.tolist():   # the remaining tokens as one isolated chunk, priced by the cost model
            mx, left = int(state.m[x]), int(state.inp[x] - state.m[x])
            self._pred_s[x] = (state.cost.batch_time(np.array([left]), np.array([mx]), np.array([False]))
                               if timer is None else timer(1, left, 0, 0, left * (2 * mx + left + 1), left))
            self._pred_m[x], self._pred_inp[x] = mx, int(state.inp[x])
        remaining = self._pred_s[idx]
        deadline = state.arrivals_s[idx] + self._ttft[idx]
        return (deadline - state.clock_s - remaining) / self._ttft[idx]

    def _slack_of_sums(self, state: ServingState, cand: list[int]) -> list[float]:
        """:meth:`slack` of the requests ``cand``, with a sums timer, in Python floats: the same float operations on
        the same numbers, each one's isolated prefill time cached as :meth:`slack` caches it."""
        pm, pi, ps, timer = self._pred_ml, self._pred_il, self._pred_sl, self._timer
        deadline, ttft, clock = self._deadline_l, self._ttft_l, state.clock_s
        out = []
        for x, mx, ix in zip(cand, state.m[cand].tolist(), state.inp[cand].tolist()):
            if pm[x] != mx or pi[x] != ix:
                left = ix - mx
                ps[x], pm[x], pi[x] = timer(1, left, 0, 0, left * (2 * mx + left + 1), left), mx, ix
            out.append((deadline[x] - clock - ps[x]) / ttft[x])
        return out

    def _by_slack(self, state: ServingState, cand: np.ndarray) -> tuple[list[int], list[float]]:
        """The candidates in ILRS order (least slack first, ties by arrival, then by position: ``np.lexsort``'s
        order) and their slacks."""
        if self._timer is None:
            slack = self.slack(state, cand)
            order = np.lexsort((state.arrivals_s[cand], slack))
            return cand[order].tolist(), slack[order].tolist()
        idx = cand.tolist()
        slack = self._slack_of_sums(state, idx)
        if math.isnan(sum(slack)):      # (NaN, or infinities that might be: lexsort's order for NaN)
            order = np.lexsort((state.arrivals_s[cand], np.array(slack))).tolist()
        else:
            arrival = self._arrival_l
            order = [k for _, _, k in sorted([(v, arrival[x], k) for k, (x, v) in enumerate(zip(idx, slack))])]
        return [idx[k] for k in order], [slack[k] for k in order]

    # complexity: Medha's batch rule in order: decodes, slack-ordered prefills, shares, chunk sizes
    def next_batch(self, state: ServingState) -> Plan:
        if self._compiled is not None:
            return self._compiled(state)
        running, dec, cand = phases(state)
        draft = (BatchDraft(state, self._R, running) if self._timer is None
                 else SumsDraft(state, self._R, running, self._timer))
        draft.add_decodes(dec)
        if not dec.size:
            target = float("inf")
        else:
            target = self.target_batch_s if self._no_tpot else min(self.target_batch_s, float(self._tpot[dec].min()))
        if not cand.size or draft.C <= 0:
            return draft.plan()
        share = 0.0
        if self.fcfs:
            order = cand.tolist()
        else:
            order, slack = self._by_slack(state, cand)
            if len(order) > 1:   # prefill-prefill batching: urgency of the runner-up
                v = 1.0 - slack[1]       # (clipped to [0, 1] as np.clip, NaN kept: min then takes max_share)
                share = min(self.max_share, 0.0 if v < 0.0 else 1.0 if v > 1.0 else v)
        for k, x in enumerate(order):
            room = draft.room(x)
            if room <= 0:
                if draft.C <= 0 or draft.P <= 0:
                    break
                continue
            if draft.size and target != float("inf") and draft.time_with(x, 1) > target:
                break  # even one more token would break the batch-time target
            chunk = draft.largest_chunk(x, room, target, self.min_chunk if k == 0 else 1)
            if k == 0 and share > 0 and chunk > self.min_chunk:
                chunk = max(self.min_chunk, int(chunk * (1.0 - share)))
            if chunk <= 0:
                break
            draft.add_prefill(x, chunk)
            if draft.C <= 0 or draft.P <= 0:
                break
        return draft.plan()

    def decode_run(self, state: ServingState, plan: Plan) -> tuple[np.ndarray, int]:
        """With no prefill left (none running, none waiting), every next batch decodes all running requests,
        oldest first (:func:`~.longctx.phases`), until the last completes — admission reserved each one's peak KV, so
        none is ever refused a slot — unless they outnumber C. An arrival voids the promise (the engine)."""
        if state.num_waiting:       # (a waiting request is a prefill candidate)
            return _NO_IDX, 0
        _, dec, cand = phases(state)
        if not dec.size or dec.size > state.limits.C or cand.size:
            return dec[:0], 0
        return dec, int((state.output_lens[dec] - state.gen[dec]).max())

    def describe(self) -> dict:
        return {"name": self.name, "fcfs": self.fcfs, "target_batch_s": self.target_batch_s,
                "min_chunk": self.min_chunk, "max_share": self.max_share}


@register_scheduler("medha", "Medha: ILRS slack priority, adaptive chunking, prefill-prefill batching")
def medha(**options) -> Medha:
    return Medha(**options)


@register_scheduler("medha-fcfs", "Medha-FCFS: adaptive chunking, first come first served")
def medha_fcfs(**options) -> Medha:
    return Medha(fcfs=True, name="medha-fcfs", **options)
