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

import numpy as np

from infermax.state import ServingState

from .base import Plan, Scheduler
from .longctx import BatchDraft, phases, work_timer
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

    # complexity: Medha's batch rule in order: decodes, slack-ordered prefills, shares, chunk sizes
    def next_batch(self, state: ServingState) -> Plan:
        running, dec, cand = phases(state)
        draft = BatchDraft(state, self._R, running, self._timer)
        draft.add_decodes(dec)
        target = min(self.target_batch_s, float(self._tpot[dec].min())) if dec.size else float("inf")
        if not cand.size or draft.C <= 0:
            return draft.plan()
        if not self.fcfs:
            slack = self.slack(state, cand)
            order = np.lexsort((state.arrivals_s[cand], slack))
            cand, slack = cand[order], slack[order]
        share = 0.0
        if not self.fcfs and cand.size > 1:   # prefill-prefill batching: urgency of the runner-up
            share = min(self.max_share, float(np.clip(1.0 - slack[1], 0.0, 1.0)))
        for k, x in enumerate(cand.tolist()):
            room = draft.room(x)
            if room <= 0:
                if draft.C <= 0 or draft.P <= 0:
                    break
                continue
            if draft.idx and target != float("inf") and draft.time_with(x, 1) > target:
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
