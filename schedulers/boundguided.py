"""Bound-guided scheduling: the order of the TTFT / e2e lower bounds, run as a policy (issue 23 item 4).

The bounds of :mod:`infermax.bounds.order` charge every request a *work* w_i — the cheapest path
of its fill and later tokens under the linear cost model (``request_works`` with no multipliers) —
and bound the k-th event by the k least works (SRPT on a fluid machine). These schedulers take
that work as their priority key:

- ``bound-e2e``: one group, hybrid batching, chunked prefill, requests by least *remaining* work
  (the fill left, then every later token at its context: the fluid machine's SRPT order, which the
  order-statistic bound serves; on the Splitwise traces it beats the total work w_i fixed at arrival:
  conversation 15.77 -> 15.73 s, code 10.76 -> 10.67 s at their best budgets). A running request short
  of KV evicts the running requests of lowest priority (recompute; the victim's key rises by its refill);
  a waiting one is admitted only into free KV (its whole input reserved), in priority order.
  ``bound-e2e-ef`` reserves the peak I + O - 1 instead: no eviction.
  ``prefill_budget=N`` caps a batch's prompt tokens at N (default: the limits' P); decode-bound traces
  want a small N, prompt-bound ones a larger one (docs/bounds.md, "Both traces, one knob").
- ``bound-ttft``: the witness of the TTFT bound made a policy. Requests still waiting for their
  first token come first, by remaining first-token work (the fill left, recomputed every batch);
  they may evict requests past their first token (recomputed later), and a running (partial) fill
  may evict lower-priority fills too. The prefill budget of each batch is the one of C / 2^s
  (s < 5) that minimises the estimated mean first-token time of the pending fills (SRPT order,
  every batch as dear as the first): big batches pay the per-batch overhead less often, small ones
  hand out first tokens sooner. Requests past their first token run as in ``bound-e2e``, in the
  batches no fill is waiting for (``co_batch=true``: also in what the fills leave of C), each
  kept within ``decode_slowdown`` times the time of one decode (default 4; ``none``: uncapped),
  because a prompt that arrives during such a batch waits for all of it.

Both are live: the top-priority request may evict every running request below it (a running fill
needs no new KV, its input is reserved), its key never rises while it runs (for e2e a key falls
while its request runs and rises only when a higher-priority request evicts it), and an empty cache
takes any single request (I + O - 1 <= M). KV is counted against what ``ServingState.apply`` checks
(reserved >= held, in blocks when ``Limits.block_size`` > 1), so a plan is valid as built.
Cost models that are not linear (the bounds do not cover them) price work in tokens instead: a
prompt token 1, a later token a measured decode/prefill cost ratio scaled by its context.
"""
from __future__ import annotations

import numpy as np

from infermax.bounds.costs import coefficients_of
from infermax.bounds.requests import cost_lines
from infermax.state import RUNNING, ServingState

from .base import Plan, Scheduler
from .registry import register_scheduler

OBJECTIVES = ("ttft", "e2e")
#: prefill budgets tried per batch by ``bound-ttft``: C / 2^s, s < NUM_BUDGETS
NUM_BUDGETS = 5
#: ``bound-ttft``'s batches without a first-token fill: at most this many times one decode's time
#: (measured on the Splitwise conversation trace, n = 2,000: 2 -> mean TTFT 0.133 s, e2e 65.7 s;
#: 4 -> 0.138 s, 46.1 s; 8 -> 0.140 s, 55.1 s; uncapped 0.158 s, 76.1 s)
DECODE_SLOWDOWN = 4.0


class Works:
    """Remaining bound work of requests, in seconds, from their state (``order.request_works`` at μ = 0).

    A fill of the tokens ``m..inp`` costs ``lin·c + attn·(inp(inp+1) - m(m+1))/2 + ⌈c / cp⌉·req``
    (c = inp - m); the token at context ℓ after the first costs ``token[ℓ]`` (decode or refill,
    whichever is cheaper), summed through ``cum``.
    """

    def __init__(self, state: ServingState) -> None:
        lim = state.limits
        self.cp = float(min(lim.C, lim.P))
        ell = np.arange(int(state.peak_kv.max()) + 2, dtype=np.float64)
        try:
            co = coefficients_of(state.cost)
        except ValueError:      # not linear: tokens, later tokens weighted by a measured ratio
            self.lin, self.attn, self.req = 1.0, 0.0, 0.0
            decode = self._decode_ratio(state) * np.maximum(ell, 1.0) / max(float(ell[-1]), 1.0)
            token = np.minimum(decode, ell)
        else:
            a, b = max(cost_lines(co, lim.C), key=lambda line: line[0] + line[1] * lim.C)   # a full batch's line
            self.lin, self.attn, self.req = b + co.prefill_token_s, co.prefill_attn_s, co.request_s
            decode = b + co.request_s + co.decode_kv_s * ell
            token = np.minimum(decode, self.fill(np.zeros_like(ell), ell))
        token[0] = 0.0
        self.cum = np.cumsum(token)

    @staticmethod
    def _decode_ratio(state: ServingState) -> float:
        """Prefill tokens one decode at the longest context costs, measured on the model at C tokens."""
        C, ctx = state.limits.C, int(state.peak_kv.max())
        full = state.cost.batch_time(np.array([C]), np.array([0]), np.array([False])) / C
        dec = (state.cost.batch_time(np.ones(C, dtype=np.int64), np.full(C, ctx), np.ones(C, dtype=bool))) / C
        return max(float(dec / full), 1e-9)

    def fill(self, m: np.ndarray, inp: np.ndarray) -> np.ndarray:
        """Seconds of work to fill ``m..inp``."""
        m, inp = m.astype(np.float64), inp.astype(np.float64)
        c = inp - m
        return self.lin * c + self.attn * (inp * (inp + 1) - m * (m + 1)) / 2 + self.req * np.ceil(c / self.cp)

    def first_left(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """Work left before the next generated token (0 for a decode)."""
        m, inp = state.m[idx], state.inp[idx]
        return np.where(m < inp, self.fill(m, inp), 0.0)

    def total_left(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """Work left until completion: the fill left, then every later token at its context."""
        m, inp, gen = state.m[idx], state.inp[idx], state.gen[idx]
        filling = m < inp
        first_ctx = state.input_lens[idx] + gen + filling            # context of the next decode-able token
        last_ctx = state.peak_kv[idx]                                 # I + O - 1
        later = self.cum[last_ctx] - self.cum[np.minimum(first_ctx, last_ctx + 1) - 1]
        return np.where(filling, self.fill(m, inp), 0.0) + later


class _Draft:
    """The batch under construction: budgets left (tokens, prefill tokens, KV units, running slots)."""

    __slots__ = ("C", "P", "free", "run", "idx", "tok", "evicted", "stamp", "j")

    def __init__(self, state: ServingState, R: int, stamp: np.ndarray, reserved: int) -> None:
        lim = state.limits
        self.C, self.P = lim.C, lim.P
        self.free = lim.num_blocks - reserved
        self.run = R - state.num_running
        self.idx: list[int] = []
        self.tok: list[int] = []
        self.evicted: list[int] = []
        self.stamp, self.j = stamp, state.num_batches    # stamp[i] == j: in this batch or evicted by it

    def plan(self) -> Plan:
        return Plan(np.array(self.idx, dtype=np.int64), np.array(self.tok, dtype=np.int64),
                    np.array(self.evicted, dtype=np.int64))


class BoundGuided(Scheduler):
    """Shortest remaining bound-work first; for TTFT, first tokens before everything else.

    Not a GetNextBatch policy (:class:`infermax.policy.Policy`): ``bound-ttft`` picks each batch's
    prefill budget by estimated mean TTFT and lets a waiting first-token fill evict, and in both
    a waiting request never overtakes a higher-priority waiting one that must wait for KV (GetNextBatch
    either stops the group there or skips it) — admission rules, not a key or a victim choice.
    The work key itself is priced by the cost model, which a rank key's RequestView does not carry.
    """

    def __init__(self, *, objective: str = "ttft", co_batch: bool = False, prefill_budget: int | None = None,
                 eviction_free: bool = False, R_max: int | None = None, name: str | None = None,
                 decode_slowdown: float | None = None) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"BoundGuided.objective must be one of {OBJECTIVES}, got {objective!r}")
        if prefill_budget is not None and (isinstance(prefill_budget, bool) or prefill_budget < 1):
            raise ValueError(f"BoundGuided.prefill_budget must be a positive integer or None, got {prefill_budget!r}")
        if R_max is not None and (isinstance(R_max, bool) or R_max < 1):
            raise ValueError(f"BoundGuided.R_max must be a positive integer or None, got {R_max!r}")
        if eviction_free and objective != "e2e":
            raise ValueError("BoundGuided.eviction_free is for objective='e2e' (bound-ttft evicts for first tokens)")
        self.objective, self.co_batch, self.prefill_budget, self.R_max = objective, co_batch, prefill_budget, R_max
        if decode_slowdown is not None and (isinstance(decode_slowdown, bool) or not decode_slowdown >= 1):
            raise ValueError(f"BoundGuided.decode_slowdown must be a number >= 1 or None, got {decode_slowdown!r}")
        self.eviction_free, self.decode_slowdown = eviction_free, decode_slowdown
        self.name = name or f"bound-{objective}"

    def describe(self) -> dict:
        return {"name": self.name, "objective": self.objective, "co_batch": self.co_batch,
                "prefill_budget": self.prefill_budget, "eviction_free": self.eviction_free, "R_max": self.R_max,
                "decode_slowdown": self.decode_slowdown}

    def reset(self, state: ServingState) -> None:
        lim = state.limits
        self._works = Works(state)
        self._total = self._works.total_left(state, np.arange(state.num_requests))   # bound-ttft's later tokens
        self._R = min(self.R_max or lim.max_running, lim.max_running)
        self._bs = lim.block_size
        self._stamp = np.full(state.num_requests, -1, dtype=np.int64)
        self._pos = np.zeros(state.num_requests, dtype=np.int64)

    # --- priorities -------------------------------------------------------------------
    def _order(self, state: ServingState) -> tuple[np.ndarray, int]:
        """Active requests by priority, and how many lead as first-token fills (ttft; else 0)."""
        act = state.active
        if self.objective == "e2e":
            left = self._works.total_left(state, act)
            return act[np.lexsort((act, state.arrivals_s[act], left))], 0
        pre = state.gen[act] == 0
        key = np.where(pre, self._works.first_left(state, act), self._total[act])
        order = act[np.lexsort((act, state.arrivals_s[act], key, ~pre))]
        return order, int(np.count_nonzero(pre))

    def _budget(self, state: ServingState, pre: np.ndarray) -> int:
        """Prefill tokens for this batch: the C / 2^s least in estimated mean first-token time of ``pre``."""
        lim = state.limits
        cap = min(lim.C, lim.P)
        if self.prefill_budget is not None:
            return min(self.prefill_budget, cap)
        m = state.m[pre]
        left = state.inp[pre] - m
        cum = np.cumsum(left)
        best, best_s = cap, np.inf
        for s in {max(cap >> k, 1) for k in range(NUM_BUDGETS)}:
            chunk = np.clip(s - (cum - left), 0, left)
            took = chunk > 0
            batch_s = state.cost.batch_time(chunk[took], m[took], np.zeros(int(took.sum()), dtype=bool))
            estimate = batch_s * float(np.ceil(cum / s).mean())
            if estimate < best_s or (estimate == best_s and s > best):
                best, best_s = s, estimate
        return best

    # --- the batch --------------------------------------------------------------------------
    def next_batch(self, state: ServingState) -> Plan:
        order, num_pre = self._order(state)
        if not order.size:
            return Plan.empty()
        self._pos[order] = np.arange(order.size)
        running = order[state.status[order] == RUNNING]
        d = _Draft(state, self._R, self._stamp, int(self._reserved(state, running).sum()))
        if self.objective == "e2e" and self.prefill_budget is not None:
            d.P = min(d.P, self.prefill_budget)       # prompt tokens a batch may carry (as Limits.P)
        if num_pre:
            budget = self._budget(state, order[:num_pre])
            C = d.C
            d.C = min(C, budget)
            self._serve(state, d, order, 0, num_pre, num_pre)
            d.C += C - budget if C > budget else 0
            if d.idx and not self.co_batch:
                return d.plan()
        if not num_pre and self.decode_slowdown is not None:     # no first token waits: a short decode batch
            d.C = min(d.C, self._decode_cap(state, order))
        self._serve(state, d, order, num_pre, order.size, num_pre)
        return d.plan()

    def _decode_cap(self, state: ServingState, order: np.ndarray) -> int:
        """Tokens of a batch without first-token fills: as many decodes as keep its estimated time within
        ``decode_slowdown`` times that of the first one alone (the time is linear in the decodes taken),
        so that a prompt arriving during it waits little longer than for one decode."""
        k = int(order.size)
        m = state.m[order]
        one = state.cost.batch_time(np.ones(1, dtype=np.int64), m[:1], np.ones(1, dtype=bool))
        if k == 1:
            return 1
        every = state.cost.batch_time(np.ones(k, dtype=np.int64), m, np.ones(k, dtype=bool))
        per = (every - one) / (k - 1)
        return k if per <= 0 else max(1, 1 + int((self.decode_slowdown - 1.0) * one / per))

    def _units(self, tokens: np.ndarray) -> np.ndarray:
        """KV units (blocks, or tokens when block_size is 1) that ``tokens`` occupy."""
        return tokens if self._bs == 1 else -(-tokens // self._bs)

    def _reserved(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """KV units held for running ``idx``: a (re)fill reserves its whole input, as at its admission
        (``eviction_free``: its peak I + O - 1)."""
        if self.eviction_free:
            return self._units(state.peak_kv[idx])
        return self._units(np.maximum(state.m[idx], state.inp[idx]))

    def _need(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """New KV units a step of ``idx`` takes: a decode's next block, a waiting request's whole input
        (``eviction_free``: nothing once running, its peak at admission)."""
        m, inp = state.m[idx], state.inp[idx]
        running = state.status[idx] == RUNNING
        if self.eviction_free:
            return np.where(running, 0, self._units(state.peak_kv[idx]))
        return np.where(m >= inp, self._units(m + 1) - self._units(m), np.where(running, 0, self._units(inp)))

    def _serve(self, state: ServingState, d: _Draft, order: np.ndarray, lo: int, hi: int, num_pre: int) -> None:
        """Take candidates ``order[lo:hi]`` in order: whole prefixes that fit at once, then the first that
        does not on its own (a partial chunk, or evictions below it), and so on."""
        cand = order[lo:hi]
        while cand.size and d.C > 0:
            cand = cand[d.stamp[cand] != d.j]
            if not cand.size:
                return
            m, inp = state.m[cand], state.inp[cand]
            new = state.status[cand] != RUNNING
            dec = m >= inp
            tok = np.where(dec, 1, inp - m)
            pf = np.where(dec, 0, tok)
            need = self._need(state, cand)
            fits = ((np.cumsum(tok) <= d.C) & (np.cumsum(pf) <= d.P) & (np.cumsum(need) <= d.free)
                    & (np.cumsum(new) <= d.run))
            k = cand.size if fits.all() else int(np.argmin(fits))
            if k:
                d.idx += cand[:k].tolist()
                d.tok += tok[:k].tolist()
                d.stamp[cand[:k]] = d.j
                d.C -= int(tok[:k].sum())
                d.P -= int(pf[:k].sum())
                d.free -= int(need[:k].sum())
                d.run -= int(new[:k].sum())
            if k == cand.size:
                return
            x = int(cand[k])
            taken = self._one(state, d, x, order, num_pre)
            cand = self._hopeful(state, d, cand[k + 1:], order, num_pre,
                                 blocked=not taken and state.status[x] != RUNNING and not self._may_evict(state, x))

    def _victims(self, state: ServingState, d: _Draft, x: int, order: np.ndarray, num_pre: int) -> np.ndarray:
        """Running requests ``x`` may evict, lowest priority first (none for a waiting request, except
        that a waiting first-token fill may evict requests past their first token)."""
        waiting = state.status[x] != RUNNING
        if waiting and (self.objective == "e2e" or state.gen[x] > 0):
            return order[:0]
        below = order[max(int(self._pos[x]) + 1, num_pre if waiting else 0):]
        return below[(state.status[below] == RUNNING) & (d.stamp[below] != d.j)][::-1]

    def _may_evict(self, state: ServingState, x: int) -> bool:
        """Running requests may evict below them; waiting ones only as first-token fills of bound-ttft."""
        return state.status[x] == RUNNING or (self.objective == "ttft" and state.gen[x] == 0)

    def _hopeful(self, state: ServingState, d: _Draft, rest: np.ndarray, order: np.ndarray,
                 num_pre: int, blocked: bool) -> np.ndarray:
        """``rest`` without the candidates that can neither fit alone nor evict anyone below them."""
        rest = rest[d.stamp[rest] != d.j]
        if not rest.size:
            return rest
        m, inp = state.m[rest], state.inp[rest]
        new = state.status[rest] != RUNNING
        fill = m < inp
        alone = ((self._need(state, rest) <= d.free) & (~new | (d.run >= 1))
                 & (~fill | (d.P >= 1)))
        holders = np.flatnonzero((state.status[order] == RUNNING) & (d.stamp[order] != d.j))
        last = int(holders[-1]) if holders.size else -1          # lowest-priority possible victim
        pos = self._pos[rest]
        if self.objective == "e2e":
            evicts = ~new
        else:
            evicts = ~new | ((state.gen[rest] == 0) & (last >= num_pre))
        keep = alone | (evicts & (pos < last) & (~fill | (d.P >= 1)))
        stuck = new & ~evicts & ~alone               # a waiting request that must wait for free KV ...
        if blocked:                                  # ... holds back the waiting ones after it (no overtaking)
            keep &= ~(new & ~evicts)
        elif stuck.any():
            keep &= ~(new & ~evicts & (np.arange(rest.size) > int(np.argmax(stuck))))
        return rest[keep]

    def _one(self, state: ServingState, d: _Draft, x: int, order: np.ndarray, num_pre: int) -> bool:
        """Candidate ``x`` that does not fit whole: evict below it if it may and must, then take a
        chunk (of a fill) that fits the tokens left. True when ``x`` joined the batch."""
        m, inp = int(state.m[x]), int(state.inp[x])
        new = int(state.status[x] != RUNNING)
        dec = m >= inp
        chunk = min(1 if dec else min(inp - m, d.P), d.C)
        if chunk < 1:
            return False
        need = int(self._need(state, np.array([x]))[0])
        if need > d.free or new > d.run:
            victims = self._victims(state, d, x, order, num_pre)
            freed = np.cumsum(self._reserved(state, victims))
            if not victims.size or freed[-1] < need - d.free or victims.size < new - d.run:
                return False
            v = max(int(np.searchsorted(freed, need - d.free)) + 1 if need > d.free else 0, new - d.run)
            chosen = victims[:v]
            d.evicted += chosen.tolist()
            d.stamp[chosen] = d.j
            d.free += int(freed[v - 1])
            d.run += int(chosen.size)
        d.idx.append(x)
        d.tok.append(chunk)
        d.stamp[x] = d.j
        d.C -= chunk
        d.P -= 0 if dec else chunk
        d.free -= need
        d.run -= new
        return True


@register_scheduler("bound-ttft", "Bound-guided TTFT: first-token fills first by least remaining bound work, "
                    "evicting decodes for them; prefill budget by estimated mean TTFT")
def bound_ttft(co_batch: bool = False, prefill_budget: int | None = None, R_max: int | None = None,
               decode_slowdown: float | None = DECODE_SLOWDOWN) -> BoundGuided:
    return BoundGuided(objective="ttft", co_batch=co_batch, prefill_budget=prefill_budget, R_max=R_max,
                       decode_slowdown=decode_slowdown)


@register_scheduler("bound-e2e", "Bound-guided e2e: shortest remaining bound work first (fluid SRPT order), "
                    "hybrid chunked batches, running requests evict the lowest priority")
def bound_e2e(eviction_free: bool = False, R_max: int | None = None,
              prefill_budget: int | None = None) -> BoundGuided:
    return BoundGuided(objective="e2e", eviction_free=eviction_free, R_max=R_max, prefill_budget=prefill_budget)


@register_scheduler("bound-e2e-ef", "Bound-guided e2e, eviction-free: shortest remaining bound work first, "
                    "each request's peak KV (I+O-1) reserved at admission")
def bound_e2e_ef(R_max: int | None = None, prefill_budget: int | None = None) -> BoundGuided:
    return BoundGuided(objective="e2e", eviction_free=True, R_max=R_max, prefill_budget=prefill_budget,
                       name="bound-e2e-ef")
