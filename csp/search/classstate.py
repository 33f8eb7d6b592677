"""The state space of interchangeable requests: counts per level, batches as moves, a cost bound.

For the latency objective of an offline workload, requests with the same
(I, O) are interchangeable, so after any batch the serving state is, per class,
how many requests wait at each token level t (W_t: not started at t = 0, evicted
after t tokens otherwise) and how many are resident at each level (R_t: t tokens
generated, I + t - 1 KV held), the rest being done. A batch moves counts: it
fills d waiting requests of level t (I + t tokens, one token generated), decodes
d resident ones (one token, I + t KV read), and evicts idle resident ones
(R_t -> W_t). Its time is the simulator's linear cost model, a function of the
counts alone, so the optimal schedule is a shortest path from "all waiting at
0" to "all done" (found by :mod:`.search`). The admissible remaining-cost bound:

    h(s) = max_k(Y·a_k + b_k·N) + Σ item costs + least biases for Y batches,

with Y a lower bound on the batches left — the exact batches left of the
chain-packing relaxation where its table (:class:`.batchtable.RemainingBatches`)
could be built, else the longest chain, ⌈remaining KV / M⌉ and items / R_max;
never less than the least total batch count minus the batches spent — N
the fewest tokens left, and the biases those of Y batches of which at least
⌈KV of the (re)fills left / M⌉ prefill (whole fills, each held in its batch;
chunked ones merge into whole ones at no more cost, as :mod:`.aggregate`
argues). The batches generated from a state are cut exactly:

- *lazy eviction*: an idle resident request is evicted only when M or R_max
  would otherwise be exceeded, and only minimal sets — keeping it resident one
  more batch and evicting it before the next is the same state at the same cost;
- a decode and a refill of the same item lead to the same state, so a batch
  converts either none or all of its decodes into evict-and-refill (the latter
  can save the decode bias of a batch that prefills anyway); converting only
  some never pays when a refill costs at least a decode (checked by
  :func:`.search.is_applicable`).

A (re)fill of L tokens is priced at its causal prefill work (L² + L)/2, the
same however it is chunked; when the policy allows chunked prefill the search
still fills whole, which loses nothing where :func:`.aggregate.chunking_bound_holds`
(checked by :func:`.search.is_applicable`). A path's value is exact.
"""
from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np

from infermax.costmodel import CostModel, linear_coefficients
from infermax.types import Batch, Limits, Schedule, Workload

from ..milp.formulation import num_identical_classes
from ..milp.policy import Policy
from .batchtable import RemainingBatches


class Slot(NamedTuple):
    """One index of a state: the requests of one class at one level, waiting or resident."""

    class_index: int
    is_resident: bool
    level: int              # tokens generated so far
    item_kv: int            # I + level: the tokens of a (re)fill at this level, the KV a decode here reads
    held_kv: int            # KV an idle request here holds: I + level - 1 if resident, else 0


class Move(NamedTuple):
    """One batch as counts: ``taken`` (slot, count) pairs run an item each, ``evicted`` (slot, count) pairs
    of idle residents are evicted; ``is_converted``: every decode runs as an evict-and-refill."""

    taken: tuple
    evicted: tuple
    is_converted: bool


class Successor(NamedTuple):
    """A batch from a state: the state after it, its time (s) and the batch itself."""

    state: tuple
    time_s: float
    move: Move


def classes_of(workload: Workload) -> list[tuple[int, int, list[int]]]:
    """(I, O, request indices) per class of interchangeable requests (:func:`.formulation.num_identical_classes`)."""
    return [(int(workload.input_lens[idx[0]]), int(workload.output_lens[idx[0]]), idx)
            for idx in num_identical_classes(workload)]


class ClassStateSpace:
    """The class state space: index layout, per-item constants, successors and the remaining-cost bound."""

    # complexity: long only in its tables, each one line, read top to bottom (the docstring's list)
    def __init__(self, workload: Workload, limits: Limits, cost: CostModel, policy: Policy, min_batches: int,
                 rest: "RemainingBatches | None" = None):
        """Per-instance constants: cost coefficients, limits, the flat slot layout and where each slot's
        requests go, the start and goal states. Long only in its tables, each one line, read top to bottom."""
        k = linear_coefficients(cost, "the class-state search")
        self.lines = tuple(k.nonattn_lines)
        # f(N) for the token counts batches have (at most min(C, M): a batch's tokens never exceed its KV)
        self._f = [max(a + b * n for a, b in self.lines) for n in range(min(limits.C, limits.M, 1 << 16) + 1)]
        # the linear cost model's coefficients (s): per decode batch, per decode KV token read, per prefill
        # batch, per (query, key) pair of prefill attention, per prefill token, per request in a batch
        self.decode_bias_s, self.decode_kv_s = k.decode_bias_s, k.decode_kv_s
        self.prefill_bias_s, self.prefill_attn_s, self.prefill_token_s = (k.prefill_bias_s, k.prefill_attn_s,
                                                                          k.prefill_token_s)
        self.request_s = k.request_s
        self.M, self.C, self.P = limits.M, limits.C, limits.P
        self.R_max = limits.R_max if limits.R_max is not None else len(workload)
        self.evict, self.hybrid = policy.allow_eviction, policy.hybrid
        self.min_batches = min_batches
        self.rest = rest
        self.classes = classes_of(workload)
        # flat layout: class c occupies [base_c, base_c + 2 O_c): W_0..W_{O-1}, then R_0..R_{O-1} (R_0 unused)
        self.slots: list[Slot] = []
        self.base = []
        for c, (I, O, _) in enumerate(self.classes):
            self.base.append(len(self.slots))
            self.slots += [Slot(c, False, t, I + t, 0) for t in range(O)]
            self.slots += [Slot(c, True, t, I + t, I + t - 1) for t in range(O)]
        # where a slot's requests go: after running an item (-1 when that was their last), when evicted
        self.next_slot = [self.base[c] + self.classes[c][1] + t + 1 if t + 1 < self.classes[c][1] else -1
                          for c, _, t, _, _ in self.slots]
        self.waiting_slot = [self.base[c] + t for c, _, t, _, _ in self.slots]
        self.slot_fill_work = [self.fill_work(L) for _, _, _, L, _ in self.slots]
        offsets = np.cumsum([0] + [O for _, O, _ in self.classes])   # flat level index: class offset + level
        self.level_index = [int(offsets[c]) + t for c, _, t, _, _ in self.slots]
        self.start = tuple(x for I, O, idx in self.classes for x in [len(idx)] + [0] * (2 * O - 1))
        self.goal = (0,) * len(self.slots)
        self._tail = [self._tail_terms(c) for c in range(len(self.classes))]
        self._terms: dict[tuple, tuple] = {}          # state -> its bound terms (with the table)
        self.trajectories = None     # a .trajectorybound.TrajectoryBound raising the bound, if one was built
        self.memo: dict = {}                           # what a search run over this space remembers

    def advance(self, s: tuple, taken, evicted) -> tuple:
        """The state after a batch that runs ``taken`` ((slot, count) pairs) and evicts ``evicted``."""
        ns = self.advance_list(s, taken)
        for q, e in evicted:
            ns[q] -= e
            ns[self.waiting_slot[q]] += e
        return tuple(ns)

    def advance_list(self, s: tuple, taken) -> list:
        """:meth:`advance` without evictions, as a list."""
        ns = list(s)
        next_slot = self.next_slot
        for q, d in taken:
            if d:
                ns[q] -= d
                if next_slot[q] >= 0:
                    ns[next_slot[q]] += d
        return ns

    @staticmethod
    def fill_work(L: int) -> float:
        """Causal prefill work of a whole (re)fill of L tokens: L(L + 1)/2 (query, key) pairs."""
        return (L * L + L) / 2

    def _tail_terms(self, c: int) -> list[tuple]:
        """Per level t: (KV of items t.., tokens of decodes t.., least non-token cost of decodes t..)."""
        I, O, _ = self.classes[c]
        b_min = min(b for _, b in self.lines)
        out = [(0, 0, 0.0)] * (O + 1)
        for t in range(O - 1, -1, -1):
            L = I + t
            item = self.decode_kv_s * L + self.request_s
            if self.evict and t > 0:      # a resident item may be refilled instead: never cheaper (is_applicable)
                item = min(item, self.prefill_attn_s * self.fill_work(L) + self.prefill_token_s * L + b_min * (L - 1)
                           + self.request_s)
            kv, tok, other = out[t + 1]
            out[t] = (kv + L, tok + 1, other + item)
        return out

    def bound(self, s: tuple, spent: int) -> float:
        """h(s): a lower bound on the time of the batches still needed from ``s`` (module docstring)."""
        return self._bound(s, self._state_terms(s), spent)

    def least_batches(self, s: tuple) -> int:
        """The batches left from ``s`` that its bound counts (the table's exact count, if there is one)."""
        return self._state_terms(s)[0]

    def bound_for(self, s: tuple, y: int, spent: int) -> float:
        """h(s) priced for ``y`` >= :meth:`least_batches` batches left."""
        terms = self._state_terms(s)
        return self._h((y,) + terms[1:], spent) if terms[0] else 0.0

    def _bound(self, s: tuple, terms: tuple, spent: int) -> float:
        """h(s) from its terms, raised by the trajectory LP's Lagrangian tables where they were built."""
        tb = self.trajectories
        if tb is None or not terms[0]:
            return self._h(terms, spent)
        rest = terms[1:]
        return tb.remaining(s, spent, max(terms[0], self.min_batches - spent),
                            lambda y: self._h((y,) + rest, spent))

    def _state_terms(self, s: tuple) -> tuple:
        """The bound terms of ``s`` with the table (computed once per state)."""
        terms = self._terms.get(s)
        if terms is None:
            terms = self._terms[s] = self._with_table(s, self._plain_terms(s))
        return terms

    def _h(self, terms: tuple, spent: int) -> float:
        """h from a state's bound terms, ``spent`` batches in."""
        y, tok, other, fills, need_decode = terms
        if y == 0:
            return 0.0
        if y < self.min_batches - spent:
            y = self.min_batches - spent
        decode_s, prefill_s = self.decode_bias_s, self.prefill_bias_s
        bias = min(decode_s * max(need_decode, y - fills) + prefill_s * fills,          # as many decode batches
                   decode_s * need_decode + prefill_s * max(fills, y - need_decode))   # as many prefill batches
        line = -math.inf
        for a, b in self.lines:
            if a * y + b * tok > line:
                line = a * y + b * tok
        return line + other + bias

    def _with_table(self, s: tuple, terms: tuple) -> tuple:
        """``terms`` with the batches left raised to the table's exact count (if there is a table)."""
        if self.rest is None or not terms[0]:
            return terms
        return (self.rest(self.levels(s), terms[0]),) + terms[1:]

    def _plain_terms(self, s: tuple) -> tuple:
        """The parts of h(s) that do not depend on the batches spent: (batches left, tokens, item costs,
        the prefill batches needed — ⌈KV of the fills left / M⌉ — and the decode batches needed without
        eviction); batches left from the chain, KV and R_max alone (:meth:`_with_table` adds the table)."""
        chain = kv = tok = items = 0
        other = 0.0
        fill_kv = longest_decode = 0
        for c, (I, O, _) in enumerate(self.classes):
            b, tail = self.base[c], self._tail[c]
            for t in range(O):
                w, r = s[b + t], s[b + O + t]
                if w:
                    L = I + t
                    kv_t, tok_t, other_t = tail[t + 1]
                    chain = max(chain, O - t)
                    kv += w * (L + kv_t)
                    tok += w * (L + tok_t)
                    items += w * (O - t)
                    other += w * (self.prefill_attn_s * self.fill_work(L) + self.prefill_token_s * L + self.request_s
                                  + other_t)
                    fill_kv += w * L
                    longest_decode = max(longest_decode, O - t - 1)
                if r:
                    kv_t, tok_t, other_t = tail[t]
                    chain = max(chain, O - t)
                    kv += r * kv_t
                    tok += r * tok_t
                    items += r * (O - t)
                    other += r * other_t
                    longest_decode = max(longest_decode, O - t)
        if chain == 0:
            return (0, 0, 0.0, 0, 0)
        y = max(chain, -(-kv // self.M), -(-items // self.R_max))       # bounds of the relaxation itself
        fills = -(-fill_kv // self.M)         # whole (re)fills of this much KV need this many prefill batches
        return (y, tok, other, fills, 0 if self.evict else longest_decode)

    def _needs(self, s: tuple, spent: int, budget: float) -> list | None:
        """What a batch from ``s`` (``spent`` batches in after it) must run to fit ``budget`` (batch time
        plus bound after it): None if anything may, else the table's requirements
        (:meth:`.batchtable.RemainingBatches.requirements`) for leaving one batch fewer.

        With Y the batches ``s`` is bounded by, every batch that leaves >= Y batches has time plus bound
        after it at least h(s) priced for Y + 1 batches: its own line a_k + b_k N plus the bound's
        a_k Y + b_k (tok - N) at worst, each item's other cost paid by the batch (refills and evictions
        cost at least as much, as :func:`.search.is_applicable` checks), and its bias plus the bound's
        at least the bias of one more batch (a batch with fills pays the prefill bias and leaves at most
        one prefill batch fewer; one without pays the decode bias). Biases are left out when batches
        without eviction need decodes. If that exceeds ``budget``, only batches reducing Y can fit.
        """
        y, tok, other, fills, need_decode = self._state_terms(s)
        if y == 0:
            return None
        y = max(y, self.min_batches - (spent - 1))
        if need_decode:
            least = max(a * (y + 1) + b * tok for a, b in self.lines) + other
        else:
            least = self._h((y + 1, tok, other, fills, 0), self.min_batches)   # y + 1 itself, no floor
        if least <= budget:
            return None
        return self.rest.requirements(self.levels(s), y - 1)

    def _within(self, s: tuple, dt: float, spent: int, budget: float) -> bool:
        """dt + h(s) <= budget; the table is looked up only if the bound without it fits (and then kept)."""
        terms = self._terms.get(s)
        if terms is None:
            terms = self._plain_terms(s)
            if dt + self._h(terms, spent) > budget:
                return False
            terms = self._terms[s] = self._with_table(s, terms)
        if dt + self._h(terms, spent) > budget:
            return False
        return self.trajectories is None or dt + self._bound(s, terms, spent) <= budget

    def levels(self, s: tuple) -> tuple:
        """The relaxation state of ``s``: per class, the sorted items done by each request."""
        out: list[int] = []
        for c, (_, O, idx) in enumerate(self.classes):
            b = self.base[c]
            left = len(idx)
            for t in range(O):
                n = s[b + t] + s[b + O + t]
                out += [t] * n
                left -= n
            out += [O] * left
        return tuple(out)

    def successors(self, s: tuple, greedy: bool = False, budget: float = math.inf,
                   spent: int = 0) -> list[Successor]:
        """Every batch allowed from ``s`` (lazy, minimal evictions), as :class:`Successor` s.

        greedy: only batches to which no further item fits — with whatever evictions that needs, or
        without any (a heuristic cut for :func:`beam_search`, not exact).
        budget: leave out batches whose time plus :meth:`bound` after them (``spent`` batches in) exceeds
        it. The items a batch runs fix the levels after it; of its eviction variants, the one evicting
        nobody has the least bound (an evicted request's refill costs at least its decode, as
        :func:`.search.is_applicable` checks, and adds to the fills), so that one is tested for all.
        The order is that of :class:`_BatchEnumeration` (A* breaks ties by it).
        """
        needs = self._needs(s, spent, budget) if budget < math.inf and self.rest is not None else None
        if needs == []:
            return []
        return _BatchEnumeration(self, s, greedy, budget, spent, needs).run(needs)

    def price(self, items: int, mem: int, fill_tokens: int, num_decodes: int, fill_work: float,
              decode_work: float) -> tuple[float, bool] | None:
        """(time, is_converted) of the cheaper way to run a batch, or None if neither is allowed.

        The batch runs ``items`` items using ``mem`` KV: ``fill_tokens`` tokens of (re)fills of causal
        work ``fill_work`` and ``num_decodes`` decodes (whose refills would have work ``decode_work``).
        Either plainly (hybrid, or only fills or only decodes, within C), or with every decode turned
        into an evict-and-refill (eviction allowed, within C and P); ties go to the plain batch.
        """
        decode_kv = mem - fill_tokens
        tokens = num_decodes + fill_tokens
        plain = convert = math.inf
        if (self.hybrid or not (num_decodes and fill_tokens)) and tokens <= self.C:
            plain = self.batch_time(tokens, items, num_decodes, decode_kv, items - num_decodes, fill_tokens,
                                    fill_work)
        if self.evict and num_decodes and fill_tokens + decode_kv <= min(self.C, self.P):
            convert = self.batch_time(fill_tokens + decode_kv, items, 0, 0, items, fill_tokens + decode_kv,
                                      fill_work + decode_work)
        if plain == convert == math.inf:
            return None
        return min(plain, convert), convert < plain

    def batch_time(self, tokens: int, items: int, num_decodes: int, decode_kv: int, num_fills: int,
                   fill_tokens: int, fill_work: float) -> float:
        """The linear cost model's time (s) of a batch of ``tokens`` tokens running ``items`` items:
        ``num_decodes`` decodes reading ``decode_kv`` KV, ``num_fills`` (re)fills of ``fill_tokens`` tokens
        and causal work ``fill_work``."""
        f = self._f[tokens] if tokens < len(self._f) else max(a + b * tokens for a, b in self.lines)
        t = f + self.request_s * items
        if num_decodes:
            t += self.decode_bias_s + self.decode_kv_s * decode_kv
        if num_fills:
            t += self.prefill_bias_s + self.prefill_attn_s * fill_work + self.prefill_token_s * fill_tokens
        return t


class _BatchEnumeration:
    """The batches from one state ``s``, for :meth:`ClassStateSpace.successors`.

    The groups are the nonempty slots of ``s`` that can run an item (not resident at level 0). A
    depth-first walk picks, group by group, how many of its requests run (:meth:`choose`, counts in
    ``take``); every complete choice that runs something is priced and kept (:meth:`close`), with the
    minimal eviction sets it needs if its idle residents do not fit (:func:`_minimal_evictions`).
    Successors come out in the walk's order: groups in slot order (by level when there are needs),
    counts ascending, then eviction sets in :func:`_minimal_evictions`' order.

    With needs (what a batch must run to leave one batch fewer, :meth:`ClassStateSpace._needs`), the
    groups of one level sit side by side and a choice is cut at the last group of a level once no need
    is met by the counts of that level.
    """

    __slots__ = ("space", "s", "greedy", "budget", "spent", "groups", "group_slots", "counts", "group_fill_work",
                 "num_groups", "take", "residents_all", "M", "P", "R_max", "level_of", "is_last", "same_level",
                 "out")

    def __init__(self, space: ClassStateSpace, s: tuple, greedy: bool, budget: float, spent: int,
                 needs: list | None):
        slots, level_index = space.slots, space.level_index
        self.space, self.s, self.greedy, self.budget, self.spent = space, s, greedy, budget, spent
        self.M, self.P, self.R_max = space.M, space.P, space.R_max
        groups = [q for q, n in enumerate(s) if n and not (slots[q].is_resident and slots[q].level == 0)]
        if needs is not None:       # a level's groups side by side: its needs are checked, and cut, early
            groups.sort(key=level_index.__getitem__)
        self.groups = groups
        self.group_slots = [slots[q] for q in groups]
        self.counts = [s[q] for q in groups]
        self.group_fill_work = [space.slot_fill_work[q] for q in groups]
        self.num_groups = len(groups)
        self.take = [0] * len(groups)                          # how many of each group the batch runs
        self.residents_all = sum(s[q] for q in groups if slots[q].is_resident)
        if needs is not None:
            self._index_levels([level_index[q] for q in groups])
        self.out: list[Successor] = []

    def _index_levels(self, level_of: list[int]) -> None:
        """Where needs are checked: at the last group of a level, counting the others of that level."""
        self.level_of = level_of
        self.is_last = [level_of[g] not in level_of[g + 1:] for g in range(len(level_of))]
        self.same_level = [[h for h in range(g) if level_of[h] == level_of[g]] for g in range(len(level_of))]

    def run(self, needs: list | None) -> "list[Successor]":
        """Walk every choice from the first group; the successors found, in order."""
        held_all = sum(sl.held_kv * n for sl, n in zip(self.group_slots, self.counts))  # idle residents' KV
        self.choose(0, 0, held_all, 0, 0, 0, 0.0, 0.0, None if needs is None else [dict(a) for a in needs])
        return self.out

    # complexity: the recursion over groups: one branch per limit (M, P, C, R_max) a group's count meets
    def choose(self, g: int, mem: int, held: int, items: int, fill_tokens: int, num_decodes: int,
               fill_work: float, decode_work: float, alive: list | None) -> None:
        """Pick how many of group ``g`` run, then the next groups; the groups before ``g`` are chosen.

        mem: KV of the items running so far (tokens); held: KV of the residents not running; items:
        items running; fill_tokens, fill_work: tokens and causal work of the (re)fills; num_decodes,
        decode_work: the decodes, and the causal work of their refills (if converted); alive: the needs
        (dicts level -> count) the levels decided so far meet (None: no needs).
        Its branches are the walk's cuts (KV, P, needs) and the two kinds of group, kept inline because
        this is the innermost loop of the exact search.
        """
        if g == self.num_groups:
            if items:
                self.close(mem, held, items, fill_tokens, num_decodes, fill_work, decode_work)
            return
        _, resident, _, L, h = self.group_slots[g]
        work_each = self.group_fill_work[g]
        M, P, take = self.M, self.P, self.take
        check = alive is not None and self.is_last[g]
        if check:
            level = self.level_of[g]
            before = sum(take[x] for x in self.same_level[g])
        for d in range(self.counts[g] + 1):
            if d:
                mem += L
                if mem > M or (not resident and fill_tokens + d * L > P):
                    break
                if resident:
                    held -= h
            take[g] = d
            rest = alive
            if check:
                rest = [a for a in alive if a.get(level, 0) <= before + d]
                if not rest:
                    continue                     # more of this level may meet one
            if resident:
                self.choose(g + 1, mem, held, items + d, fill_tokens, num_decodes + d, fill_work,
                            decode_work + d * work_each, rest)
            else:
                self.choose(g + 1, mem, held, items + d, fill_tokens + d * L, num_decodes, fill_work + d * work_each,
                            decode_work, rest)
        take[g] = 0

    def close(self, mem: int, held: int, items: int, fill_tokens: int, num_decodes: int, fill_work: float,
              decode_work: float) -> None:
        """Price the chosen batch (arguments as in :meth:`choose`) and keep it, with the evictions it needs."""
        if self.greedy and not self.is_full(mem, held, fill_tokens):
            return
        space = self.space
        running = items + self.residents_all - num_decodes
        fits = mem + held <= self.M and running <= self.R_max
        if not (fits or space.evict):
            return
        priced = space.price(items, mem, fill_tokens, num_decodes, fill_work, decode_work)
        if priced is None:
            return
        dt, is_converted = priced
        taken = tuple(zip(self.groups, self.take))
        after = space.advance_list(self.s, taken)
        if self.budget < math.inf and not space._within(tuple(after), dt, self.spent, self.budget):
            return
        if fits:
            self.out.append(Successor(tuple(after), dt, Move(taken, (), is_converted)))
            return
        s, waiting_slot = self.s, space.waiting_slot
        idle = [(q, s[q] - d) for q, d, sl in zip(self.groups, self.take, self.group_slots)
                if sl.is_resident and s[q] > d]
        evictions: list[tuple] = []
        self.add_evictions(idle, 0, self.M - mem, held, running, [], 10 ** 9, evictions)
        for evicted in evictions:
            state = after.copy()
            for q, e in evicted:
                state[q] -= e
                state[waiting_slot[q]] += e
            self.out.append(Successor(tuple(state), dt, Move(taken, evicted, is_converted)))

    def is_full(self, mem: int, held: int, fill_tokens: int) -> bool:
        """No further item fits the chosen batch — with evictions, or without any (for ``greedy``)."""
        M = self.M
        fits = fits_kept = False
        for (_, resident, _, L, h), n, d in zip(self.group_slots, self.counts, self.take):
            if d < n and (resident or fill_tokens + L <= self.P):
                fits = fits or mem + L <= M
                fits_kept = fits_kept or mem + held + L - (h if resident else 0) <= M
        return not fits or (mem + held <= M and not fits_kept)

    def add_evictions(self, idle: list, k: int, room: int, held: int, running: int, chosen: list, smallest: int,
                      sets: list) -> None:
        """Append to ``sets`` the minimal eviction sets of the ``idle`` residents ((slot, count) pairs) from
        the ``k``-th on, ``chosen`` being those of the earlier ones: after a set, the held KV fits ``room``
        and the running requests R_max; without any one of its requests, not (``smallest``: the least KV
        an evicted request of ``chosen`` holds). A set is a tuple of (slot, count evicted) pairs; sets
        come out with fewer evicted from the earlier slots first."""
        if held + smallest <= room and running + 1 <= self.R_max:
            return                              # an evicted request could stay: not minimal, ever
        if k == len(idle):
            if held <= room and running <= self.R_max:
                sets.append(tuple(chosen))
            return
        q, n = idle[k]
        h = self.space.slots[q].held_kv
        for e in range(n + 1):
            self.add_evictions(idle, k + 1, room, held - e * h, running - e, chosen + [(q, e)] if e else chosen,
                               min(smallest, h) if e else smallest, sets)


def to_schedule(sp: ClassStateSpace, moves: list, workload: Workload) -> Schedule:
    """Carry out ``moves`` (one per batch, in order) on concrete requests (any order within a class)."""
    queues = {q: deque() for q in range(len(sp.slots))}
    for c, (_, _, idx) in enumerate(sp.classes):
        queues[sp.base[c]].extend(idx)
    ids = workload.ids
    batches = []
    for taken, evicted, convert in moves:
        run, tokens, ev, arrive = [], [], [], []
        for q, d in taken:
            _, resident, _, L, _ = sp.slots[q]
            for _ in range(d):
                i = queues[q].popleft()
                run.append(i)
                tokens.append(L if (not resident or convert) else 1)
                if resident and convert:
                    ev.append(i)
                if sp.next_slot[q] >= 0:
                    arrive.append((sp.next_slot[q], i))
        for q, e in evicted:
            for _ in range(e):
                i = queues[q].popleft()
                ev.append(i)
                queues[sp.waiting_slot[q]].append(i)
        for q, i in arrive:
            queues[q].append(i)
        order = np.argsort(run, kind="stable")
        batches.append(Batch(ids=ids[np.asarray(run)[order]], tokens=np.asarray(tokens)[order],
                             evict=ids[np.sort(np.asarray(ev, dtype=np.int64))]))
    return Schedule(tuple(batches), {"method": "search"})
