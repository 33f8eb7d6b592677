"""The unified GetNextBatch framework (InferMax Algorithm 1, §3.1).

GetNextBatch walks groups of candidates (hook 1, GroupRequests); skips a
candidate whose phase differs from the batch's when hybrid batching is off
(hook 2, CheckHybridBatching); admits it if the C / P / M / R_max budgets allow
(hook 3, CanAllocate; a prefill may be cut to a chunk when chunked prefill is
on); and otherwise evicts lower-priority running requests, skips the candidate,
or moves to the next group (hook 4, GotoNextGroupOrEvict).

Candidates are handled a *prefix at a time*: cumulative sums of the per-candidate
token, prefill-token, memory and new-running needs find how many of the next
candidates fit at once, so a decode batch of a hundred requests costs a handful
of NumPy operations rather than a hundred Python iterations. Only the first
candidate that does not fit is treated on its own — exactly what the sequential
loop of Algorithm 1 would do with it.

Memory (CanAllocate's M check) counts *reserved* KV of running requests:
``max(m, inp)`` tokens (a prefill reserves its whole input at admission, as vLLM
does) or, for eviction-free variants, ``I + O - 1`` reserved at admission — in
whole blocks of ``Limits.block_size`` tokens out of M // block_size (one block
is one token by default). A decode needs a new block only when its KV fills the
last one. With an admission *watermark* (vLLM's ``watermark``, 0.01 there), a
request taking KV from nothing — a first fill or the refill of an evicted
request, both of which vLLM admits from its waiting queue — is admitted only if
``watermark · (M // block_size)`` blocks (rounded down) stay free after it; the
gate is waived for a request that would enter an empty cache (vLLM would drop
such a request as too long; infermax never drops one).

Without chunked prefill a decoding request that outgrows a one-batch refill is
*pinned*: never evicted, and let grow only while every pinned request can still
finish (:mod:`.pinning`).
"""
from __future__ import annotations

import numpy as np

from infermax.fastloop_layout import LoopSpec
from infermax.ordering import LOWEST_PRIORITY, RANK_KEYS, VICTIMS, RequestView, evaluate, key_name
from infermax.policy import Policy
from infermax.state import RUNNING, WAITING, ServingState, _count_nonzero

from .base import Plan, Scheduler
from .lookahead import Admission
from .pinning import PinGuard

#: a batch's phase (``_Builder.phase``): none yet (no candidate taken), prefill or decode
NO_PHASE, PREFILL, DECODE = 0, 1, 2
# what the members of a candidate group are (lets CanAllocate skip per-candidate work)
DECODE_GROUP, PREFILL_GROUP, WAITING_GROUP, MIXED_GROUP = 0, 1, 2, 3
_PHASE_OF = {DECODE_GROUP: DECODE, PREFILL_GROUP: PREFILL, WAITING_GROUP: PREFILL}
_NONE = np.zeros(0, dtype=np.int64)
_NONE.setflags(write=False)
_NOTHING = (0, 0, 0, 0)      # the (Σtokens, Σprefill, Σmemory, Σnew) of an empty prefix
# what hook 4 (GotoNextGroupOrEvict) did with the first candidate of a group that does not fit
_RETRY = 0      # evicted (for it, or it) or set pinned requests aside: the rest of the group is tried again
_PASSED = 1     # it took a chunk or was left out: the group ends there, unless skip mode goes on
# the reductions behind ndarray.sum/min/max, called directly: the methods' per-call overhead shows on the
# small arrays a batch decision handles
_sum, _min, _max = np.add.reduce, np.minimum.reduce, np.maximum.reduce
_ONES = np.ones(4096, dtype=np.int64)     # decode tokens, sliced (_ones)
_ONES.setflags(write=False)


def _ones(k: int) -> np.ndarray:
    """``k`` ones (the tokens of ``k`` decodes), read-only: a slice of one array when it is long enough."""
    return _ONES[:k] if k <= _ONES.size else np.ones(k, dtype=np.int64)


class _Builder:
    """Budgets and choices of the batch under construction (one per next_batch call)."""

    __slots__ = ("C", "P", "mem", "run", "pins", "phase", "idx", "tok", "evicted", "stamp", "j", "profile",
                 "future_refusal")

    def __init__(self, C: int, P: int, mem: int, run: int, stamp: np.ndarray, j: int,
                 pins: dict[int, tuple[int, int]] | None = None) -> None:
        self.C, self.P, self.mem, self.run = C, P, mem, run
        self.pins = pins   # pinned {index: (m, peak)} after this batch's steps so far (None: no guard)
        self.phase = NO_PHASE
        self.idx: list[np.ndarray] = []
        self.tok: list[np.ndarray] = []
        self.evicted: list[int] = []
        self.stamp, self.j = stamp, j   # stamp[i] == j: i is in this batch or evicted by it
        self.profile: np.ndarray | None = None   # look-ahead KV profile, built on first use
        self.future_refusal = False              # a candidate was refused for a *future* overflow

    def take(self, idx: np.ndarray, tok: np.ndarray, phase: int) -> None:
        self.idx.append(idx)
        self.tok.append(tok)
        self.stamp[idx] = self.j
        self.phase = self.phase or phase

    def plan(self) -> Plan:
        ev = np.asarray(self.evicted, dtype=np.int64) if self.evicted else _NONE
        if not self.idx:
            return Plan(_NONE, _NONE, ev)
        if len(self.idx) == 1:
            return Plan(self.idx[0], self.tok[0], ev)
        return Plan(np.concatenate(self.idx), np.concatenate(self.tok), ev)


class GetNextBatch(Scheduler):
    """A scheduler of the Algorithm 1 family, configured by a :class:`~infermax.policy.Policy`.

    The policy's rank key orders the candidates of each group (a static key once per run, any
    other before every batch) and its victim choice orders the requests a candidate short of KV
    may evict (:mod:`infermax.ordering`).
    """

    def __init__(self, policy: Policy, name: str = "getnextbatch") -> None:
        self.policy = policy
        self.name = name
        self.block_size = policy.block_size
        self._ef = not policy.allow_eviction            # eviction-free: reserve I + O - 1 at admission
        self._dynamic = not policy.is_static             # the order is recomputed before every batch
        key = policy.rank_key
        self._rank = RANK_KEYS[key].fn if isinstance(key, str) else key
        victim = policy.victim
        self._victim = None if victim == LOWEST_PRIORITY else VICTIMS[victim].fn if isinstance(victim, str) else victim

    def describe(self) -> dict:
        p = self.policy
        out = {"name": self.name, "priority": p.priority, "hybrid": p.hybrid, "chunked": p.chunked_prefill,
               "P": p.P, "R_max": p.R_max, "eviction_free": self._ef, "rank_key": key_name(p.rank_key)}
        if p.victim != LOWEST_PRIORITY:
            out["victim"] = key_name(p.victim)
        for key, default in (("C", None), ("watermark", 0.0), ("block_size", None), ("stagger", True)):
            if getattr(p, key) != default:      # only what departs from the paper's semantics
                out[key] = getattr(p, key)
        return out

    # --- set-up -----------------------------------------------------------------
    def _ranked(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """``idx`` in priority order: by the rank key, then arrival, then index."""
        arrivals = state.arrivals_s[idx]
        if self.policy.rank_key == "arrival":
            return idx[np.lexsort((idx, arrivals))]
        key = evaluate(self._rank, RequestView.of(state, idx), "rank_key")
        return idx[np.lexsort((idx, arrivals, key))]

    def reset(self, state: ServingState) -> None:
        n = state.num_requests
        self._order = self._ranked(state, np.arange(n))      # the priority order (at the start, if dynamic)
        self._fcfs = bool(np.array_equal(self._order, state.arrival_order))   # active set is in order
        self._pos = np.empty(n, dtype=np.int64)      # place in the priority order (of the active set, if dynamic)
        self._pos[self._order] = np.arange(n)
        self._stamp = np.full(n, -1, dtype=np.int64)
        self._peak = state.peak_kv
        self._version = -1
        self._future_refusal = False
        lim, p = state.limits, self.policy
        self._check_blocks(lim)
        self._bs = lim.block_size
        # log2 of the block size when it is a power of two > 1 (blocks by shifts and masks), else 0
        self._shift = self._bs.bit_length() - 1 if self._bs > 1 and not self._bs & (self._bs - 1) else 0
        # each running request reserves its max(m, inp) tokens of KV (so a decoding one its m): token-granular
        # KV, evicting; then when every running request decodes, Σ reserved = Σ m = state.kv_used
        self._reserves_m = self._bs == 1 and not self._ef
        # the same in blocks: when every running request decodes, each reserves ceil(m / block_size) blocks, so
        # Σ reserved = state.blocks_used (which the state keeps when block_size > 1)
        self._reserves_blocks = self._bs > 1 and not self._ef
        self._blocks = lim.num_blocks          # the KV budget, in blocks (tokens when block_size is 1)
        self._wm = int(p.watermark * self._blocks)
        self._C, self._P = self._own_budgets(lim)
        self._R = min(p.R_max, lim.max_running) if p.R_max is not None else lim.max_running
        # largest (re)fill one batch can hold without chunked prefill (None: chunks have no such bound)
        self._cap = None if p.chunked_prefill else min(self._C, self._P)
        self._admission = Admission(self._P, self._R, p.priority, p.hybrid, p.stagger) if p.lookahead else None
        self._pins = PinGuard(self._cap, self._peak, self._blocks, p.hybrid,
                              active=not (self._ef or p.lookahead), block=self._bs)
        self._hybrid_runs = self._runs_hybrid()
        if not p.chunked_prefill:
            self._check_prompts_fit(state)

    def _own_budgets(self, lim) -> tuple[int, int]:
        """C and P of this scheduler's batches: the policy's where it sets them, within the Limits'."""
        p = self.policy
        C = min(p.C, lim.C) if p.C is not None else lim.C
        P = min(p.P, lim.P) if p.P is not None else lim.P
        return C, P

    def _runs_hybrid(self) -> bool:
        """Whether :meth:`hybrid_run` may run hybrid batches in closed form: decode priority with hybrid batches
        and chunked prefill, a static order, no look-ahead or pins, and this class's own hooks (a subclass
        may group or fill otherwise)."""
        p = self.policy
        return (type(self) is GetNextBatch and p.priority == "decode" and p.hybrid and p.chunked_prefill
                and not self._dynamic and self._admission is None and not self._pins.active)

    def loop_spec(self, state: ServingState):
        """This scheduler's batches as the simulator's compiled loop (:mod:`infermax.fastloop`) plans them, or
        None where it decides otherwise: a subclass (its own hooks), an order other than first come first
        served or recomputed each batch, a victim choice, look-ahead admission, eviction-free reservations,
        skip mode, pinned requests, or prefill priority with chunked prefill (a mixed group). Call after
        :meth:`reset`."""
        p = self.policy
        if (type(self) is not GetNextBatch or self._dynamic or not self._fcfs or self._victim is not None
                or self._admission is not None or self._ef or p.skip_on_fail or self._pins.active
                or p.priority not in ("prefill", "decode") or (p.priority == "prefill" and p.chunked_prefill)):
            return None
        return LoopSpec(p.priority == "prefill", p.hybrid, p.chunked_prefill, self._C, self._P, self._R,
                        self._blocks, self._wm, self._bs)

    def _check_blocks(self, lim) -> None:
        """(``reset``) The policy's KV blocks are the Limits' (``simulate`` applies them), and look-ahead
        admission, which predicts KV in tokens, runs on tokens."""
        p = self.policy
        if p.block_size is not None and lim.block_size != p.block_size:
            raise ValueError(f"scheduler {self.name!r} models KV blocks of {p.block_size} tokens but "
                             f"Limits.block_size = {lim.block_size}; run it through simulate, which applies it")
        if p.lookahead and lim.block_size > 1:
            raise ValueError(f"scheduler {self.name!r}: look-ahead admission predicts KV in tokens; "
                             f"Limits.block_size = {lim.block_size} > 1 is not supported (use the plain or -ef "
                             f"variant)")

    def _check_prompts_fit(self, state: ServingState) -> None:
        """(``reset``, without chunked prefill) Every prompt that may reach this scheduler fits in one batch."""
        cap = self._cap
        too_long = np.flatnonzero((state.input_lens > cap) & (True if state.serves is None else state.serves))
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"scheduler {self.name!r} has no chunked prefill, but request "
                             f"{int(state.workload.ids[i])} has {int(state.input_lens[i])} prompt tokens > "
                             f"min(C = {self._C}, P = {self._P}); raise C/P or use a chunked scheduler")

    def _sets(self, state: ServingState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Running, waiting and both, in priority order (recomputed only on status changes,
        from the state's active set: O(active), not O(workload))."""
        if state.version != self._version:
            act = state.active
            if self._dynamic:
                act = self._ranked(state, act)
                self._pos[act] = np.arange(act.size)
            elif not self._fcfs:
                act = act[np.argsort(self._pos[act])]
            self._running, self._waiting = self._split(state, act)
            self._active = act if self.policy.priority == "rank" else None
            self._version = state.version
        return self._running, self._waiting, self._active

    def _split(self, state: ServingState, act: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The running and the waiting requests of ``act`` (the active requests in priority order), each in
        that order. When the ``num_waiting`` last ones are waiting, the rest run: both are slices. (Checked
        only in arrival order, where the waiting requests are usually the latest arrivals.)"""
        k = state.num_waiting
        if self._fcfs and k <= act.size:
            if not k:
                return act, _NONE
            tail = act[act.size - k:]
            if state.status[tail].tobytes().count(WAITING) == k:
                return act[:act.size - k], tail
        run = state.status[act] == RUNNING
        return act[run], act[~run]

    # --- hook 1: GroupRequests --------------------------------------------------------
    def group_requests(self, state: ServingState, all_decode: bool | None = None) -> list[tuple[np.ndarray, int]]:
        """Groups of candidates in priority order, each tagged with what its members are
        (all decodes, all running prefills, all waiting, or mixed). ``all_decode``: whether every
        running request decodes, when the caller knows (None: looked up)."""
        running, waiting, active = self._sets(state)
        prio = self.policy.priority
        if prio == "prefill":
            return [(waiting, WAITING_GROUP), (running, MIXED_GROUP if self.policy.chunked_prefill else DECODE_GROUP)]
        if prio == "decode":
            if all_decode is None:
                all_decode = self._all_decode(state, running)
            if all_decode:     # (usually, at decode priority: no split)
                return [(running, DECODE_GROUP), (_NONE, PREFILL_GROUP), (waiting, WAITING_GROUP)]
            dec = state.m[running] >= state.inp[running]
            return [(running[dec], DECODE_GROUP), (running[~dec], PREFILL_GROUP), (waiting, WAITING_GROUP)]
        return [(active, MIXED_GROUP)]

    @staticmethod
    def _all_decode(state: ServingState, running: np.ndarray) -> bool:
        """Whether every one of the ``running`` requests is in decode phase (the flags' bytes searched for a
        0, without a NumPy call)."""
        return 0 not in (state.m[running] >= state.inp[running]).tobytes()

    # --- the loop ------------------------------------------------------------------------
    def _blk(self, tokens):
        """KV blocks that ``tokens`` take (tokens themselves when block_size is 1): ceil(tokens / block_size),
        as a shift when the block size is a power of two (floor((t + b - 1) / b) = ceil(t / b) for every
        integer t; one NumPy call fewer than the negated floor division)."""
        if self._bs == 1:
            return tokens
        if self._shift:
            return (tokens + (self._bs - 1)) >> self._shift
        return -(-tokens // self._bs)

    def _reserved(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """KV blocks reserved by running requests ``idx``."""
        if self._ef:
            return self._blk(self._peak[idx])
        return self._blk(np.maximum(state.m[idx], state.inp[idx]))

    def _decode_blocks(self, m: np.ndarray) -> np.ndarray:
        """New blocks a decode needs at ``m`` KV tokens: 1 when its last block is full (ceil((m + 1) / b) -
        ceil(m / b) is 1 exactly when b divides m; with a power-of-two block, its low bits are 0)."""
        if self._shift:
            return (m & (self._bs - 1)) == 0 if isinstance(m, np.ndarray) else int(m % self._bs == 0)
        return self._blk(m + 1) - self._blk(m)

    def _gate(self, b: _Builder, c_mem: np.ndarray, mem: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Per candidate of a prefix (cumulative blocks ``c_mem``, own ``mem``), the watermark
        that must stay free after it: for a request taking KV from nothing into a cache that
        is not empty (the blocks reserved before it, ``self._blocks - b.mem + c_mem - mem``)."""
        return np.where(new & (self._blocks - b.mem + c_mem - mem > 0), self._wm, 0)

    def _room(self, b: _Builder, is_new: bool) -> int:
        """Blocks a single candidate may take: less the watermark for a new one in a non-empty cache."""
        return b.mem - self._wm if is_new and b.mem < self._blocks else b.mem

    def next_batch(self, state: ServingState) -> Plan:
        if self._dynamic:
            self._version = -1        # keys move with every batch: order the active requests again
        running = self._sets(state)[0]
        reserves_m, reserves_blocks = self._reserves_m, self._reserves_blocks
        ask = reserves_m or reserves_blocks or self.policy.priority == "decode"
        all_decode = self._all_decode(state, running) if ask else None
        if all_decode and reserves_m:
            reserved = state.kv_used     # each running request decodes and reserves its m: Σ m = kv_used
        elif all_decode and reserves_blocks:
            reserved = state.blocks_used     # (in blocks: Σ ceil(m / block_size))
        else:
            reserved = int(_sum(self._reserved(state, running)))
        mem_free = self._blocks - reserved
        b = _Builder(self._C, self._P, mem_free, self._R - running.size, self._stamp, state.num_batches,
                     self._pins.start(state, running))
        for group, kind in self.group_requests(state, all_decode):
            if group.size:
                if b.evicted:
                    group = group[self._stamp[group] != b.j]
                self._fill(state, b, group, kind)
            if b.C == 0:
                break
        self._future_refusal = b.future_refusal
        return b.plan()

    def set_kv_budget(self, state: ServingState, held_tokens: int) -> None:
        """The cluster layer holds ``held_tokens`` of this replica's KV for work scheduled elsewhere
        (a gang's share of a long request): the budget this scheduler admits into shrinks by it."""
        lim = state.limits
        self._blocks = lim.num_blocks - (int(lim.kv_blocks(held_tokens)) if held_tokens else 0)
        self._pins.M = self._blocks
        self._version = -1

    def set_token_budget(self, state: ServingState, tokens: int | None) -> None:
        """Cap the tokens of the next batches at ``tokens`` (None: the scheduler's own C and P again) —
        the cluster layer's colocation threshold (PecSched §5.2)."""
        C, P = self._own_budgets(state.limits)
        self._C, self._P = (C, P) if tokens is None else (min(C, tokens), min(P, tokens))

    # complexity: one branch per case of the run's horizon, decided inline: called before every batch
    def decode_run(self, state: ServingState, plan: Plan) -> tuple[np.ndarray, int]:
        """When every running request is decoding, the next batches decode them all, in priority
        order, while they fit (C, and the KV slots without reservations):
        - with no request waiting, through completions (a completion frees KV and a running
          slot, which could only let a waiting request in), to the end of the last one, unless
          pinned requests (:mod:`.pinning`) must be checked batch by batch;
        - with requests waiting, only after a pure-decode batch of every running request with
          no status change, and until the first completion: the waiting candidates were refused
          for a reason that only gets worse (less free KV, the same C, P, R_max budgets and
          phase rule)."""
        if self._dynamic:
            return plan.idx[:0], 0    # the order may change from one batch to the next
        if not state.num_waiting:
            # every active request runs: in arrival (= priority) order when the order is FCFS
            running, waiting = (state.active, _NONE) if self._fcfs else self._sets(state)[:2]
        elif state.version != self._version or plan.evict.size or self._future_refusal:
            return plan.idx[:0], 0      # (decided before the sets are rebuilt: the waiting ones may fit now)
        else:
            running, waiting = self._sets(state)[:2]
        n = running.size
        if not n or n > self._C:
            return running, 0
        m, inp = state.m[running], state.inp[running]
        # (the flags' bytes searched: no NumPy call)
        if waiting.size:
            if plan.idx.size != n or 1 in (m <= inp).tobytes():    # (m == inp: a prefill completed in this batch)
                return running, 0
            running, horizon = plan.idx, self._first_done(state, running) - 1   # (the same requests in the same order)
        elif 1 in (m < inp).tobytes():
            return running, 0
        elif self._pins.active:
            horizon = self._first_done(state, running) - 1
        elif self._reserves_m:
            # all running decode: each reserves its m, so Σ reserved = Σ m = kv_used. A run ends with its last
            # request (apply_decode_run): no need to count the batches until then, only the KV bound can cut it
            return running, max((self._blocks - state.kv_used) // n, 0)
        elif self._reserves_blocks:
            # the same in blocks: Σ reserved = Σ ceil(m / b) = blocks_used, and only the KV bound can cut the run
            return running, max(self._decode_steps(m, self._blocks - state.blocks_used), 0)
        else:
            horizon = int(_max(state.output_lens[running] - state.gen[running]))     # the last completion
        if not self._ef:
            if self._bs == 1:
                horizon = min(horizon, (self._blocks - state.kv_used) // n)
            else:
                # (every running request decodes: Σ reserved = Σ ceil(m / block_size) = blocks_used)
                horizon = min(horizon, self._decode_steps(m, self._blocks - state.blocks_used))
        return running, max(self._pins.repeat_limit(state, running, horizon), 0)

    def hybrid_run(self, state: ServingState, plan: Plan) -> tuple[np.ndarray, int, int]:
        """When exactly one running request is in (re)fill, ``x``, and the others decode: the next batches are
        the decodes (group 1, in priority order) and a chunk of ``x`` (group 2) of ``f = min(C - n, P)``
        tokens (n decodes), while
        - the decodes fit: the KV they take only grows, so the most steps whose new blocks fit in the KV
          not reserved (``x`` reserves its whole input) bound the run;
        - ``x`` takes a whole chunk and does not reach its input (its last chunk may leave room for others);
        - no request completes before the last (a completion frees KV and a running slot).
        Nothing else joins such a batch: the chunk leaves no token (C) or no prefill token (P) for a waiting
        request, and no request changes status, so the groups are the same each batch."""
        if not self._hybrid_runs:
            return _NONE, 0, 0
        running = self._sets(state)[0]
        n = running.size - 1
        if n < 1 or n >= self._C:
            return _NONE, 0, 0
        m, inp = state.m[running], state.inp[running]
        flags = (m < inp).tobytes()      # (the flags' bytes counted and searched: no NumPy call)
        if flags.count(1) != 1:
            return _NONE, 0, 0
        p = flags.index(1)
        f = min(self._C - n, self._P)
        mx, ix = int(m[p]), int(inp[p])
        k = (ix - mx - 1) // f          # whole chunks that leave some of its input
        if k < 1:
            return _NONE, 0, 0
        idx = np.concatenate((running[:p], running[p + 1:], running[p:p + 1]))     # the decodes, then x
        dec = idx[:n]
        k = min(k, self._first_done(state, dec))       # (the last may complete requests)
        if not self._ef and k > 0:
            # reserved: the decodes' m (in blocks, ceil(m / b)), x its whole input: Σ m = kv_used, Σ ceil(m / b)
            # = blocks_used over every running request
            if self._bs == 1:
                k = min(k, (self._blocks - (state.kv_used - mx + ix)) // n)
            else:
                free = self._blocks - (state.blocks_used - self._blk(mx) + self._blk(ix))
                if n * -(-k // self._bs) > free:     # (k steps take at most ceil(k / b) blocks each: else all fit)
                    k = min(k, self._decode_steps(np.concatenate((m[:p], m[p + 1:])), free))
        if k < 1:
            return _NONE, 0, 0
        return idx, f, k

    @staticmethod
    def _first_done(state: ServingState, running: np.ndarray) -> int:
        """Batches until the first of the ``running`` requests completes."""
        return int(_min(state.output_lens[running] - state.gen[running]))

    def _decode_steps(self, m: np.ndarray, free: int) -> int:
        """Most decode steps of requests holding ``m`` tokens each whose new blocks fit in ``free``.

        In closed form: a request with ``r = (-m) mod b`` free slots in its last block needs, after
        ``s = q b + t`` steps (0 <= t < b), q new blocks plus one more if r < t. So n requests need
        ``n q + #{r < t}`` blocks, and the most steps within ``free`` are ``(free // n) b + r_(free mod n)``
        (the ``free mod n``-th smallest r): one more step would need a block more. The same number as
        :meth:`_decode_steps_search` (the binary search over those sums), without the search."""
        n = int(m.size)
        if free < 0 or not n:
            return self._decode_steps_search(m, free)
        q, rem = divmod(free, n)
        r = -m & (self._bs - 1) if self._shift else (-m) % self._bs
        if rem:
            r.partition(rem)     # (in place: r is this call's own array)
            return q * self._bs + int(r[rem])
        return q * self._bs + int(_min(r))

    def _decode_steps_search(self, m: np.ndarray, free: int) -> int:
        """:meth:`_decode_steps` by binary search over the blocks the steps take (the reference)."""
        base = int(self._blk(m).sum())
        lo, hi = 0, free * self._bs + self._bs     # hi steps need more than ``free`` new blocks
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if int(self._blk(m + mid).sum()) - base <= free else (lo, mid)
        return lo

    def _needs(self, state: ServingState, cand: np.ndarray):
        """Per candidate: tokens wanted, decode?, prefill tokens, new KV reserved, newly running."""
        m, inp = state.m[cand], state.inp[cand]
        dec = m >= inp
        tok = np.where(dec, 1, inp - m)
        new = m == 0
        if self._ef:
            mem = np.where(new, self._blk(self._peak[cand]), 0)
        else:
            mem = np.where(dec, self._decode_blocks(m), np.where(new, self._blk(inp), 0))
        return tok, dec, np.where(dec, 0, tok), mem, new

    def _need_one(self, state: ServingState, x: int) -> tuple[int, bool, int, int]:
        """Scalar needs of one candidate: tokens, decode?, KV reserved, newly running."""
        m, inp = int(state.m[x]), int(state.inp[x])
        if m >= inp:
            return 1, True, 0 if self._ef else int(self._decode_blocks(m)), 0
        new = m == 0
        mem = self._blk(int(self._peak[x]) if self._ef else inp) if new else 0
        return inp - m, False, mem, int(new)

    # --- hook 3: CanAllocate, a prefix of a group at a time ---------------------------------------------
    # Each returns (rest, k, tokens of the k, (Σtokens, Σprefill, Σmemory, Σnew), phase) for the longest prefix
    # of ``rest`` (a group of kind ``kind``) that fits whole; ``rest`` may shrink when hybrid batching is off.
    def _admit_decodes(self, state: ServingState, b: _Builder, rest: np.ndarray, kind: int):
        """The running decodes that fit: C, a new KV block for each that fills its last one (none when
        eviction-free: reserved at admission), the pinned requests' room."""
        per = 0 if self._ef else 1
        c_new = None           # cumulative new blocks, when a decode needs one only at a block's end
        if self._bs > 1 and per:
            new = self._decode_blocks(state.m[rest[:b.C]])
            total = int(_count_nonzero(new))      # (a 0 or a 1 each)
            if total <= b.mem and b.pins is None:   # all fit (usually): no prefix sums
                return rest, new.size, _ones(new.size), (new.size, 0, total, 0), DECODE
            c_new = new.cumsum()
            k = int(c_new.searchsorted(b.mem, "right"))
        else:
            k = max(0, min(rest.size, b.C, b.mem // per if per else rest.size))
        if b.pins is not None:
            k = self._pins.after(state, b, rest[:k], _ones(k))[0]
        used = k * per if c_new is None else (int(c_new[k - 1]) if k else 0)
        return rest, k, _ones(k), (k, 0, used, 0), DECODE

    def _admit_fills(self, state: ServingState, b: _Builder, rest: np.ndarray, kind: int):
        """Whole (re)fills that fit in C and P: the rest of the input of running prefills, or (a waiting
        group) the whole input of requests taking KV and a running slot (:meth:`_admit_waiting`)."""
        waiting = kind == WAITING_GROUP
        inp = state.inp[rest]
        tok = inp if waiting else inp - state.m[rest]
        cap = min(b.C, b.P)
        head, head_mem = int(tok[0]), self._head_mem(tok, rest) if waiting else 0
        if head > cap or (waiting and (b.run < 1 or head_mem > self._room(b, True))):
            return rest, 0, tok[:0], _NOTHING, PREFILL
        c_tok = c_mem = None    # prefix sums of the tokens and of the KV taken, when there are several
        if rest.size == 1:      # (one candidate, usually: the head, which fits, as just checked)
            k = 1
        else:
            c_tok = tok.cumsum()
            k = int(c_tok.searchsorted(cap, "right"))
        if waiting:
            k, c_mem = self._admit_waiting(state, b, rest, tok, c_tok, k)
        used = (head if c_tok is None else int(c_tok[k - 1])) if k else 0
        mem = (head_mem if c_mem is None else int(c_mem[k - 1])) if k and waiting else 0
        return rest, k, tok[:k], (used, used, mem, k if waiting else 0), PREFILL

    def _admit_waiting(self, state: ServingState, b: _Builder, rest: np.ndarray, tok: np.ndarray,
                       c_tok: np.ndarray | None, k: int) -> tuple[int, np.ndarray | None]:
        """Of the first ``k`` waiting candidates (their tokens ``tok``, prefix sums ``c_tok``: None for the head
        alone), how many also fit in the KV (less the watermark), the running slots, the look-ahead
        admission and the pinned requests' room; and the prefix sums of the KV they take (None: the head's)."""
        c_mem = None
        if c_tok is not None:
            own = self._blk(self._peak[rest] if self._ef else tok)
            c_mem = own.cumsum() if self._ef or self._bs > 1 else c_tok
            if self._wm and int(c_mem[-1]) > b.mem - self._wm:     # (the head passed its own check)
                fits = c_mem <= b.mem - self._gate(b, c_mem, own, np.ones(rest.size, dtype=bool))
                k = min(k, rest.size if fits.all() else max(1, int(np.argmin(fits))), b.run)
            elif self._wm:   # all fit even with the watermark kept free after each (the gate is 0 or it)
                k = min(k, rest.size, b.run)
            else:
                k = min(k, int(c_mem.searchsorted(b.mem, "right")), b.run)
        if k and self.policy.lookahead:
            k = self._admission.admit(state, b, self._sets(state)[0], rest[:k], tok[:k])
        if b.pins is not None:
            k, k_all = self._pins.after(state, b, rest[:k], tok[:k])[0], k
            b.future_refusal |= k < k_all   # the pinned requests' room changes as they grow
        return k, c_mem

    def _admit_mixed(self, state: ServingState, b: _Builder, rest: np.ndarray, kind: int):
        """Candidates of both phases, each with its own needs (hook 2, CheckHybridBatching, first: without
        hybrid batches the candidates of the other phase than the batch's are skipped)."""
        tok, dec, pf, mem, new = self._needs(state, rest)
        if not self.policy.hybrid:  # hook 2: CheckHybridBatching — other-phase candidates are skipped
            keep = dec == ((b.phase or (DECODE if dec[0] else PREFILL)) == DECODE)
            if not keep.all():
                rest, tok, dec, pf, mem, new = rest[keep], tok[keep], dec[keep], pf[keep], mem[keep], new[keep]
                if not rest.size:
                    return rest, 0, tok, _NOTHING, NO_PHASE
        c_tok, c_pf, c_mem, c_new = tok.cumsum(), pf.cumsum(), mem.cumsum(), new.cumsum()
        room = b.mem - self._gate(b, c_mem, mem, new) if self._wm else b.mem
        fits = (c_tok <= b.C) & (c_pf <= b.P) & (c_mem <= room) & (c_new <= b.run)
        k = rest.size if fits.all() else int(np.argmin(fits))
        if not k:
            return rest, 0, tok[:0], _NOTHING, NO_PHASE
        last = k - 1
        totals = (int(c_tok[last]), int(c_pf[last]), int(c_mem[last]), int(c_new[last]))
        return rest, k, tok[:k], totals, DECODE if dec[0] else PREFILL

    def _head_mem(self, tok: np.ndarray, rest: np.ndarray) -> int:
        return int(self._blk(self._peak[rest[0]] if self._ef else tok[0]))

    # --- the loop over one group: hooks 2-4 -----------------------------------------------------------------
    def _fill(self, state: ServingState, b: _Builder, rest: np.ndarray, kind: int) -> None:
        """Hooks 2-4 over one group ``rest`` of candidates of kind ``kind``: take the longest prefix that fits
        (CanAllocate), then decide about the first candidate that does not (GotoNextGroupOrEvict), until the
        group or the batch's tokens run out."""
        admit = (self._admit_decodes if kind == DECODE_GROUP else self._admit_mixed if kind == MIXED_GROUP
                 else self._admit_fills)
        hybrid, skip = self.policy.hybrid, self.policy.skip_on_fail
        while rest.size and b.C > 0:
            if not hybrid and b.phase and kind != MIXED_GROUP and b.phase != _PHASE_OF[kind]:
                return  # hook 2: the whole group is of the other phase
            rest, k, tok, (d_tok, d_pf, d_mem, d_new), phase = admit(state, b, rest, kind)
            if k:
                b.take(rest[:k], tok, phase)
                b.C, b.P, b.mem, b.run = b.C - d_tok, b.P - d_pf, b.mem - d_mem, b.run - d_new
                if b.pins is not None:
                    b.pins = self._pins.after(state, b, rest[:k], tok, check=False)[1]
            if k == rest.size or b.C == 0:
                return  # (with no token left, evicting for the next candidate could not let it run)
            rest, outcome = self._goto_next_or_evict(state, b, int(rest[k]), rest[k + 1:])
            if outcome == _PASSED:
                if not skip:
                    return
                rest = self._feasible_alone(state, b, rest)

    # --- hook 4: GotoNextGroupOrEvict --------------------------------------------------------------------------
    def _goto_next_or_evict(self, state: ServingState, b: _Builder, x: int, rest: np.ndarray
                            ) -> tuple[np.ndarray, int]:
        """The first candidate ``x`` of a group that does not fit (``rest``: the candidates after it): a decode the
        pinned requests refuse waits or is preempted, a decode short of KV evicts (:meth:`_evict_for`), a
        prefill with chunked prefill on takes a chunk (:meth:`_chunk_prefill`). Returns the candidates left and
        :data:`_RETRY` (try them: evictions or pins changed the budgets) or :data:`_PASSED` (``x`` is done with)."""
        tx, dx, mx, nx = self._need_one(state, x)
        if dx and b.pins is not None and self._pins.refuses(state, b, x):
            return self._pin_refused(state, b, x, rest), _RETRY
        if mx > b.mem and dx and not self._ef:
            return self._evict_for(state, b, x, mx, rest), _RETRY
        if mx <= self._room(b, bool(nx)) and nx <= b.run and not dx and self.policy.chunked_prefill:
            self._chunk_prefill(state, b, x, tx, mx, nx)
        return rest, _PASSED

    def _pin_refused(self, state: ServingState, b: _Builder, x: int, rest: np.ndarray) -> np.ndarray:
        """The pinned requests refuse decode ``x`` a token: a pinned ``x`` waits, and so does every pinned request
        needing as much (slack only shrinks); an unpinned one is preempted while its refill still fits in one
        batch. Returns the candidates left."""
        if self._pins.pinned(state, np.array([x]))[0]:
            # in blocks, counted in blocks, and only a step that takes a new block (another grows in place)
            need = self._blk(self._peak[rest]) - self._blk(state.m[rest])
            need_x = int(self._blk(self._peak[x]) - self._blk(state.m[x]))
            same = self._pins.pinned(state, rest) & (need >= need_x)
            if self._bs > 1:
                same &= self._decode_blocks(state.m[rest]) > 0
            return rest[~same]
        return self._evict(b, np.array([x]), int(self._blk(state.m[x])), rest)

    def _chunk_prefill(self, state: ServingState, b: _Builder, x: int, tx: int, mx: int, nx: int) -> None:
        """Chunked prefill: (re)fill ``x`` (``tx`` tokens left, ``mx`` KV blocks to reserve, ``nx``: newly
        running) takes the tokens the batch has left, min(C, P), cut further by the look-ahead admission."""
        chunk = min(tx, b.C, b.P)
        if chunk >= 1 and nx and self.policy.lookahead:
            chunk *= self._admission.admit(state, b, self._sets(state)[0], np.array([x]), np.array([chunk]))
        if chunk >= 1:
            b.take(np.array([x]), np.array([chunk]), PREFILL)
            b.C, b.P, b.mem, b.run = b.C - chunk, b.P - chunk, b.mem - mx, b.run - nx

    def _feasible_alone(self, state: ServingState, b: _Builder, rest: np.ndarray) -> np.ndarray:
        """Skip mode: drop candidates that could not be allocated even alone (decodes may evict)."""
        if not rest.size:
            return rest
        tok, dec, pf, mem, new = self._needs(state, rest)
        if self.policy.chunked_prefill:
            ok = np.where(dec, b.C >= 1, min(b.C, b.P) >= 1)
        else:
            ok = (tok <= b.C) & (pf <= b.P)
        ok &= (mem <= np.where(new & (b.mem < self._blocks), b.mem - self._wm, b.mem)) & (new <= b.run)
        if not self._ef:
            ok |= dec & (b.C >= 1)
        return rest[ok]

    def _evict_for(self, state: ServingState, b: _Builder, x: int, need: int, rest: np.ndarray) -> np.ndarray:
        """Evict lowest-priority running requests (not in the batch) until ``x`` fits; else ``x`` itself.

        Returns the remaining candidates, with ``x`` first again when it can now be allocated.
        A pinned request (see the module docstring) is never a victim; if ``x`` is pinned and
        the victims cannot free enough, nothing is evicted and ``x`` waits in place.
        """
        running = self._sets(state)[0]
        victims = running[(self._pos[running] > self._pos[x]) & (b.stamp[running] != b.j)]
        victims = victims[~self._pins.pinned(state, victims)][::-1]      # lowest priority first
        if self._victim is not None and victims.size > 1:                  # the policy's victim choice
            victims = victims[np.argsort(evaluate(self._victim, RequestView.of(state, victims), "victim"),
                                         kind="stable")]
        freed = np.cumsum(self._reserved(state, victims))
        short = need - b.mem
        if victims.size and freed[-1] >= short:
            v = int(np.searchsorted(freed, short)) + 1
            return np.concatenate(([x], self._evict(b, victims[:v], int(freed[v - 1]), rest)))
        if self._pins.pinned(state, np.array([x]))[0]:
            return rest
        gain = (int(freed[-1]) if victims.size else 0) + int(self._reserved(state, np.array([x]))[0])
        return self._evict(b, np.append(victims, x), gain, rest)

    @staticmethod
    def _evict(b: _Builder, chosen: np.ndarray, gain: int, rest: np.ndarray) -> np.ndarray:
        """Evict ``chosen`` (freeing ``gain`` reserved KV tokens); returns ``rest`` without them."""
        b.evicted.extend(chosen.tolist())
        b.stamp[chosen] = b.j
        b.mem += gain
        b.run += chosen.size
        return rest[b.stamp[rest] != b.j]
