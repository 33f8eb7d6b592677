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

import numpy as np

from infermax.costmodel import CostModel, linear_coefficients
from infermax.types import Batch, Limits, Schedule, Workload

from .batchtable import RemainingBatches
from ..milp.formulation import num_identical_classes
from ..milp.policy import Policy


def classes_of(workload: Workload) -> list[tuple[int, int, list[int]]]:
    """(I, O, request indices) per class of interchangeable requests (:func:`.formulation.num_identical_classes`)."""
    return [(int(workload.input_lens[idx[0]]), int(workload.output_lens[idx[0]]), idx)
            for idx in num_identical_classes(workload)]


class ClassStateSpace:
    """The class state space: index layout, per-item constants, successors and the remaining-cost bound."""

    def __init__(self, workload: Workload, limits: Limits, cost: CostModel, policy: Policy, min_batches: int,
                 rest: "RemainingBatches | None" = None):
        k = linear_coefficients(cost, "the class-state search")
        self.lines = tuple(k.nonattn_lines)
        # f(N) for the token counts batches have (at most min(C, M): a batch's tokens never exceed its KV)
        self._f = [max(a + b * n for a, b in self.lines) for n in range(min(limits.C, limits.M, 1 << 16) + 1)]
        self.db, self.dk, self.pb, self.pa = k.decode_bias_s, k.decode_kv_s, k.prefill_bias_s, k.prefill_attn_s
        self.pt, self.rq = k.prefill_token_s, k.request_s
        self.M, self.C, self.P = limits.M, limits.C, limits.P
        self.R_max = limits.R_max if limits.R_max is not None else len(workload)
        self.evict, self.hybrid = policy.allow_eviction, policy.hybrid
        self.min_batches = min_batches
        self.rest = rest
        self.classes = classes_of(workload)
        # flat layout: class c occupies [base_c, base_c + 2 O_c): W_0..W_{O-1}, then R_0..R_{O-1} (R_0 unused)
        self.slots = []                     # per flat index: (class, is_resident, level, item KV, held KV)
        self.base = []
        for c, (I, O, _) in enumerate(self.classes):
            self.base.append(len(self.slots))
            self.slots += [(c, False, t, I + t, 0) for t in range(O)]
            self.slots += [(c, True, t, I + t, I + t - 1) for t in range(O)]
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
            item = self.dk * L + self.rq
            if self.evict and t > 0:      # a resident item may be refilled instead: never cheaper (is_applicable)
                item = min(item, self.pa * self.fill_work(L) + self.pt * L + b_min * (L - 1) + self.rq)
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
        db, pb = self.db, self.pb
        bias = min(db * max(need_decode, y - fills) + pb * fills,          # as many decode batches
                   db * need_decode + pb * max(fills, y - need_decode))   # as many prefill batches
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
                    other += w * (self.pa * self.fill_work(L) + self.pt * L + self.rq + other_t)
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

    def successors(self, s: tuple, greedy: bool = False, budget: float = math.inf, spent: int = 0):
        """(next state, batch time, move) for every batch allowed from ``s`` (lazy, minimal evictions).

        greedy: only batches to which no further item fits — with whatever evictions that needs, or
        without any (a heuristic cut for :func:`beam_search`, not exact).
        budget: leave out batches whose time plus :meth:`bound` after them (``spent`` batches in) exceeds
        it. The items a batch runs fix the levels after it; of its eviction variants, the one evicting
        nobody has the least bound (an evicted request's refill costs at least its decode, as
        :func:`.search.is_applicable` checks, and adds to the fills), so that one is tested for all.
        """
        slots, M, P, R_max = self.slots, self.M, self.P, self.R_max
        needs = self._needs(s, spent, budget) if budget < math.inf and self.rest is not None else None
        if needs == []:
            return []
        level_index = self.level_index
        groups = [q for q, n in enumerate(s) if n and not (slots[q][1] and slots[q][2] == 0)]
        if needs is not None:       # a level's groups side by side: its needs are checked, and cut, early
            groups.sort(key=level_index.__getitem__)
        G = len(groups)
        take = [0] * G
        out: list = []
        held_all = sum(slots[q][4] * s[q] for q in groups)           # idle residents' KV if nobody runs
        residents_all = sum(s[q] for q in groups if slots[q][1])
        fill_work = self.slot_fill_work
        if needs is not None:   # needs are checked at the last group of a level, with the others of that level
            level_of = [level_index[q] for q in groups]
            is_last = [level_of[g] not in level_of[g + 1:] for g in range(G)]
            same_level = [[h for h in range(g) if level_of[h] == level_of[g]] for g in range(G)]

        def choose(g: int, mem: int, held: int, items: int, fill_tok: int, dec_n: int, work: float,
                   dec_work: float, alive: list | None) -> None:
            """Pick how many of group g run; mem: KV of running items, held: KV of residents not running;
            dec_n: decodes; work, dec_work: the fill work of the fills, of the decodes (if refilled);
            alive: the needs (dicts level -> count) the levels decided so far meet (None: no needs)."""
            if g == G:
                if items:
                    close(mem, held, items, fill_tok, dec_n, work, dec_work)
                return
            q = groups[g]
            _, resident, _, L, h = slots[q]
            fw = fill_work[q]
            check = alive is not None and is_last[g]
            if check:
                lvl = level_of[g]
                before = sum(take[x] for x in same_level[g])
            for d in range(s[q] + 1):
                if d:
                    mem += L
                    if mem > M or (not resident and fill_tok + d * L > P):
                        break
                    if resident:
                        held -= h
                take[g] = d
                rest = alive
                if check:
                    rest = [a for a in alive if a.get(lvl, 0) <= before + d]
                    if not rest:
                        continue                     # more of this level may meet one
                if resident:
                    choose(g + 1, mem, held, items + d, fill_tok, dec_n + d, work, dec_work + d * fw, rest)
                else:
                    choose(g + 1, mem, held, items + d, fill_tok + d * L, dec_n, work + d * fw, dec_work, rest)
            take[g] = 0

        def close(mem: int, held: int, items: int, fill_tok: int, dec_n: int, work: float,
                  dec_work: float) -> None:
            if greedy and not is_full(mem, held, fill_tok):
                return
            running = items + residents_all - dec_n
            fits = mem + held <= M and running <= R_max
            if not (fits or self.evict):
                return
            # price the batch: plainly, or with every decode turned into an evict-and-refill
            dec_kv = mem - fill_tok
            tokens = dec_n + fill_tok
            plain = convert = math.inf
            if (self.hybrid or not (dec_n and fill_tok)) and tokens <= self.C:
                plain = self.batch_time(tokens, items, dec_n, dec_kv, items - dec_n, fill_tok, work)
            if self.evict and dec_n and fill_tok + dec_kv <= min(self.C, P):
                convert = self.batch_time(fill_tok + dec_kv, items, 0, 0, items, fill_tok + dec_kv,
                                          work + dec_work)
            if plain == convert == math.inf:
                return
            dt = min(plain, convert)
            taken = tuple(zip(groups, take))
            base = self.advance_list(s, taken)
            if budget < math.inf and not self._within(tuple(base), dt, spent, budget):
                return
            move = (taken, (), convert < plain)
            if fits:
                out.append((tuple(base), dt, move))
                return
            idle = [(q, s[q] - d) for q, d in zip(groups, take) if slots[q][1] and s[q] > d]
            sets: list = []
            evictions(idle, 0, M - mem, held, running, [], 10 ** 9, sets)
            waiting_slot = self.waiting_slot
            for evicted in sets:
                ns = base.copy()
                for q, e in evicted:
                    ns[q] -= e
                    ns[waiting_slot[q]] += e
                out.append((tuple(ns), dt, (taken, evicted, move[2])))

        def is_full(mem: int, held: int, fill_tok: int) -> bool:
            fits = fits_kept = False
            for q, d in zip(groups, take):
                if d < s[q]:
                    _, resident, _, L, h = slots[q]
                    if resident or fill_tok + L <= P:
                        fits = fits or mem + L <= M
                        fits_kept = fits_kept or mem + held + L - (h if resident else 0) <= M
            return not fits or (mem + held <= M and not fits_kept)

        def evictions(idle, k: int, room: int, held: int, running: int, chosen: list, smallest: int,
                      sets: list) -> None:
            """Minimal eviction sets (appended to ``sets``): after them KV <= M and running <= R_max; without
            any one, not."""
            if held + smallest <= room and running + 1 <= R_max:
                return                              # an evicted request could stay: not minimal, ever
            if k == len(idle):
                if held <= room and running <= R_max:
                    sets.append(tuple(chosen))
                return
            q, n = idle[k]
            h = slots[q][4]
            for e in range(n + 1):
                evictions(idle, k + 1, room, held - e * h, running - e, chosen + [(q, e)] if e else chosen,
                          min(smallest, h) if e else smallest, sets)

        choose(0, 0, held_all, 0, 0, 0, 0.0, 0.0, None if needs is None else [dict(a) for a in needs])
        return out

    def batch_time(self, tokens: int, items: int, dec_n: int, dec_kv: int, fill_n: int, fill_tok: int,
                   work: float) -> float:
        f = self._f[tokens] if tokens < len(self._f) else max(a + b * tokens for a, b in self.lines)
        t = f + self.rq * items
        if dec_n:
            t += self.db + self.dk * dec_kv
        if fill_n:
            t += self.pb + self.pa * work + self.pt * fill_tok
        return t


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
