"""An exhaustive reference optimum for tiny instances: the test suite's independent judge.

``Oracle(workload, limits, cost).solve(objective, policy)`` runs a label-setting search over the
per-request states (m, inp, gen) of docs/design.md "Request semantics", re-implemented here
(no ``ServingState``, no ``replay`` inside the search) and priced with the library's cost
model only. It returns the optimal value and an optimal :class:`~infermax.Schedule`, so a
test can replay the oracle's own answer. The moves from each state are cached on the
``Oracle``: every objective and policy class of one instance shares them.

One batch, in phases: *evict* any running requests (m > 0 -> 0; in decode phase, m >= inp,
also inp -> m + 1), *choose* a chunk per request (a request evicted here may be refilled
here: prefill/refill phase any 1 <= c <= inp - m, decode phase exactly c = 1), *check*
Σc <= C, prefill tokens <= P, KV Σm <= M — with ``block_size`` b > 1 also Σ ceil(m / b) <=
M // b — and running requests <= R_max (counted after
the tokens are added, before completions free their KV), *price* it with
``cost.batch_time(c, m_before, m_before >= inp)``, *commit* (a token is generated when m
reaches inp or in decode; at gen == O the KV is freed). A batch starts at
max(clock, arrival of each of its requests) (the schedule it returns says so in ``not_before_s``,
in seconds since the first arrival: a schedule's clock, ``infermax.clock``). A policy class (``infermax.csp.Policy``)
keeps
the moves without evictions, without decode and (re)fill requests together (hybrid), without
a (re)fill chunk that does not finish its fill (chunked prefill), within its P and R_max.
An eviction of a request outside the batch that the batch does not need is left to a later
batch (the request must run again): the same states, times and costs with fewer moves.

Objectives as additive non-negative costs (the value reported is recomputed from the
schedule's event times with the formulas of ``infermax.metrics``):

- latency / throughput: the batch's end minus the previous end (the first arrival before
  the first batch): sums to the makespan; throughput is tokens over the least makespan.
- completion / ttft: at the batch where request i completes / gets its first token,
  (end - T_i) / B.
- tpot: each batch costs duration × Σ 1/((O_i - 1)·n) over requests with O_i > 1 that
  hold a first token and are not done (n = number of such requests in the workload).
- ``e2e`` is ``completion``. ``NAME:TAG`` (e.g. ``ttft:short``): the mean over the requests
  tagged TAG only — the weights 1/B above become 1/|TAG| on them and 0 on the others.

Percentiles (``ttft_p99``, ``e2e_p90``, ..., also with ``:TAG``; numpy's linear
interpolation, as ``infermax.metrics``) are not sums. They are monotone in every request's
event time (first token, completion), so a label carries those times: a label that can idle
to another's clock with no later recorded event time dominates it (the same future gives
every event no later). Labels leave the heap in clock order, none is dropped by an estimate;
every complete label is evaluated and the least value wins (``Oracle._solve_percentile``); a
label whose value with every event still to come put at its clock is no better than the best
complete one is dropped (events come later, the percentile is monotone).

Idling and dominance. Idling (``not_before_s``) never leaves the state, so a label
(state, clock, cost) that can idle to a later clock and then copy another label's
future dominates it when its cost *after* idling is still <=. For latency, completion
and ttft idling costs nothing at the time it happens, but every later event moves with
it, so an earlier clock with a cost <= dominates; for the same reason a batch never
waits longer than for its own requests. TPOT is blind to a common shift of all batches
and idling before the first token costs nothing, so waiting for arrivals is free (the
schedule idles once, before its first batch, long enough for every later batch) and the
clock plays no part: a cost <= dominates. Labels leave the heap in order of cost plus a
consistent estimate of the cost to come (A*, see ``Oracle._estimate``), so the first complete
label is optimal.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from infermax import Batch, Limits, Schedule, Workload
from infermax.csp import Policy

OBJECTIVES = ("latency", "completion", "ttft", "tpot", "throughput")
PERCENTILES = tuple(f"{m}_p{q}" for m in ("ttft", "e2e") for q in (50, 90, 99))


class Goal(NamedTuple):
    """A parsed objective: ``metric`` (one of OBJECTIVES), ``percentile`` (None: a mean or a makespan),
    ``weights`` per request of the mean (1/B, or 1/|tag| on a tag's requests), ``members`` (of the tag)."""

    name: str
    metric: str
    percentile: float | None
    weights: tuple[float, ...]
    members: tuple[int, ...]


class Progress(NamedTuple):
    """One request's state: KV tokens cached, current input size, tokens generated."""

    m: int
    inp: int
    gen: int


State = tuple[Progress, ...]


class Move(NamedTuple):
    """One batch from a state: what it does, where it leads, how long it takes, its policy flags."""

    evict: tuple[int, ...]       # request indices evicted before the batch
    idx: tuple[int, ...]         # request indices in the batch (ascending)
    tokens: tuple[int, ...]      # c per request of ``idx``
    after: State
    duration_s: float
    latest_arrival_s: float      # the batch cannot start before this
    first: tuple[int, ...]       # requests whose first token this batch generates
    done: tuple[int, ...]        # requests this batch completes
    is_hybrid: bool              # decode and (re)fill requests together
    is_chunked: bool             # a (re)fill chunk that does not finish its fill


class Label(NamedTuple):
    cost: float
    clock_s: float
    state: State
    move: Move | None
    parent: "Label | None"


@dataclass(frozen=True, slots=True)
class OracleResult:
    """The optimal ``value`` (seconds; tokens/s for throughput) and a schedule that attains it."""

    value: float
    schedule: Schedule
    objective: str
    num_labels: int


def oracle(workload: Workload, limits: Limits, cost, objective: str = "latency",
           policy: Policy | None = None) -> OracleResult:
    """The exact optimum of ``objective`` over every schedule in ``policy``'s class (tiny instances)."""
    return Oracle(workload, limits, cost).solve(objective, policy)


class Oracle:
    """One instance: its requests as tuples, a memo of batch prices and of the moves from each state.

    ``defer_evictions=False`` keeps the moves that evict a request outside the batch although the
    batch does not need it (never needed for an optimum; the tests compare both)."""

    def __init__(self, workload: Workload, limits: Limits, cost, defer_evictions: bool = True) -> None:
        self.workload, self.limits, self.cost = workload, limits, cost
        self.defer_evictions = defer_evictions
        self.I = tuple(map(int, workload.input_lens))
        self.O = tuple(map(int, workload.output_lens))
        self.T = tuple(map(float, workload.arrivals_s))
        self.is_offline = workload.is_offline
        self._prices: dict[tuple, float] = {}
        self._moves: dict[tuple, list[Move]] = {}
        # the least price of a batch, one token alone (checked on every batch priced: the A* estimate needs it)
        self.least_batch_s = 0.0
        self.least_batch_s = min(self.price((1,), (0,), (False,)), self.price((1,), (1,), (True,)))

    def goal(self, objective: str) -> Goal:
        """Parse ``metric[:tag]`` (module docstring)."""
        base, _, tag = objective.partition(":")
        base = "completion" if base == "e2e" else base
        if base not in OBJECTIVES + PERCENTILES or (tag and base in ("latency", "throughput")):
            raise ValueError(f"objective must be one of {OBJECTIVES + PERCENTILES} (but latency and throughput "
                             f"optionally with :tag), got {objective!r}")
        tags = [r.tag for r in self.workload.requests]
        members = tuple(i for i, t in enumerate(tags) if not tag or t == tag)
        if not members:
            raise ValueError(f"no request has tag {tag!r}")
        if base == "tpot" and max(self.O[i] for i in members) == 1:
            raise ValueError("tpot needs a request with output_len > 1")
        weights = tuple(1.0 / len(members) if i in members else 0.0 for i in range(len(self.I)))
        if base in PERCENTILES:
            metric, q = base.split("_p")
            return Goal(objective, "ttft" if metric == "ttft" else "completion", float(q), weights, members)
        return Goal(objective, base, None, weights, members)

    def solve(self, objective: str = "latency", policy: Policy | None = None) -> OracleResult:
        """The optimum of ``objective`` in ``policy``'s class (ValueError: no schedule of the class)."""
        goal = self.goal(objective)
        policy = policy or Policy()
        lim = policy.effective_limits(self.limits)
        if goal.percentile is not None:
            return self._solve_percentile(goal, policy, lim)
        start = Label(0.0, 0.0, tuple(Progress(0, i, 0) for i in self.I), None, None)
        front: dict[State, list[Label]] = {start.state: [start]}
        heap, seq, num_labels = [(0.0, 0.0, 0, start)], itertools.count(1), 1
        while heap:
            label = heapq.heappop(heap)[3]
            if not any(x is label for x in front[label.state]):
                continue                                   # dominated after it was pushed
            if all(p.gen == o for p, o in zip(label.state, self.O)):
                return self._result(goal, label, num_labels)
            for mv in self.moves(label.state, lim):
                if not _allowed(mv, policy):
                    continue
                new = self._extend(goal, label, mv)
                labels = front.setdefault(new.state, [])
                if any(_dominates(goal.metric, old, new) for old in labels):
                    continue
                labels[:] = [old for old in labels if not _dominates(goal.metric, new, old)] + [new]
                heapq.heappush(heap, (new.cost + self._estimate(goal, new, lim), new.clock_s, next(seq), new))
                num_labels += 1
        raise ValueError("no schedule of the class serves this instance")

    def _solve_percentile(self, goal: Goal, policy: Policy, lim: Limits) -> OracleResult:
        """Label setting over (state, clock, event times): see the module docstring."""
        is_first = goal.metric == "ttft"
        start = Label(0.0, 0.0, tuple(Progress(0, i, 0) for i in self.I), None, None)
        nan = float("nan")
        front: dict[State, list[tuple[Label, tuple[float, ...]]]] = {start.state: [(start, (nan,) * len(self.I))]}
        heap, seq, num_labels = [(0.0, 0, start, (nan,) * len(self.I))], itertools.count(1), 1
        best, best_label = float("inf"), None
        while heap:
            _, _, label, times = heapq.heappop(heap)
            if not any(x is label for x, _ in front[label.state]):
                continue
            if best < float("inf") and _percentile_value(goal, self.T, tuple(
                    max(label.clock_s, a) if t != t else t for t, a in zip(times, self.T))) >= best:
                continue                               # every event left comes after the clock: no better
            if all(p.gen == o for p, o in zip(label.state, self.O)):
                value = _percentile_value(goal, self.T, times)
                if value < best:
                    best, best_label = value, label
                continue
            for mv in self.moves(label.state, lim):
                if not _allowed(mv, policy):
                    continue
                end = max(label.clock_s, mv.latest_arrival_s) + mv.duration_s
                new = Label(0.0, end, mv.after, mv, label)
                events = mv.first if is_first else mv.done
                new_times = tuple(end if i in events else t for i, t in enumerate(times))
                labels = front.setdefault(new.state, [])
                if any(_dominates_times(old, old_t, new, new_times) for old, old_t in labels):
                    continue
                labels[:] = [(old, old_t) for old, old_t in labels
                             if not _dominates_times(new, new_times, old, old_t)] + [(new, new_times)]
                heapq.heappush(heap, (end, next(seq), new, new_times))
                num_labels += 1
        if best_label is None:
            raise ValueError("no schedule of the class serves this instance")
        return self._result(goal, best_label, num_labels)

    def price(self, tokens: tuple[int, ...], kv_before: tuple[int, ...], is_decode: tuple[bool, ...]) -> float:
        key = (tokens, kv_before, is_decode)
        if key not in self._prices:
            t = float(self.cost.batch_time(np.array(tokens, dtype=np.int64), np.array(kv_before, dtype=np.int64),
                                           np.array(is_decode, dtype=bool)))
            if t < self.least_batch_s:
                raise AssertionError(f"batch {key} costs {t} s < one token's {self.least_batch_s} s: the "
                                     f"A* estimate assumes a batch never costs less than one token alone")
            self._prices[key] = t
        return self._prices[key]

    # --- one batch: evict -> choose chunks -> check limits -> price -> commit ---------------------
    def moves(self, state: State, lim: Limits) -> list[Move]:
        """Every batch from ``state`` under ``lim`` (policy classes filter these by their flags)."""
        key = (state, lim.P, lim.max_running)
        if key not in self._moves:
            self._moves[key] = list(self._generate(state, lim))
        return self._moves[key]

    def _generate(self, state: State, lim: Limits):
        running = [i for i, p in enumerate(state) if p.m > 0]
        for evict in itertools.chain.from_iterable(itertools.combinations(running, k)
                                                   for k in range(len(running) + 1)):
            cur = list(state)
            for i in evict:          # evict: in decode phase the generated tokens join the input
                p = cur[i]
                cur[i] = Progress(0, p.m + 1 if p.m >= p.inp else p.inp, p.gen)
            kv_left = lim.M - sum(p.m for p in cur)
            new_left = lim.max_running - (len(running) - len(evict))
            top = [0 if p.gen == o else 1 if p.m >= p.inp else min(p.inp - p.m, lim.P)
                   for p, o in zip(cur, self.O)]
            for chunks in itertools.product(*(range(t + 1) for t in top)):
                num_tokens = sum(chunks)
                if not 0 < num_tokens <= min(lim.C, kv_left):
                    continue
                blocks = sum(_blocks(p.m + c, lim.block_size) for p, c in zip(cur, chunks))
                if blocks > lim.num_blocks:
                    continue
                if sum(c for c, p in zip(chunks, cur) if p.m < p.inp) > lim.P:
                    continue
                num_new = sum(1 for c, p in zip(chunks, cur) if c and p.m == 0)
                if num_new > new_left:
                    continue
                # an eviction of a request outside the batch that the batch does not need waits for a later
                # batch (the request must run again): same states, times and costs, fewer moves
                if self.defer_evictions and any(not chunks[i] and num_tokens + state[i].m <= kv_left
                                                and blocks + _blocks(state[i].m, lim.block_size) <= lim.num_blocks
                                                and num_new < new_left for i in evict):
                    continue
                yield self._commit(cur, evict, chunks)

    def _commit(self, cur: list[Progress], evict: tuple[int, ...], chunks: tuple[int, ...]) -> Move:
        """Price the batch giving ``chunks[i]`` tokens to request i of ``cur`` (post-eviction) and apply
        it: a token when the (re)fill completes or in decode; at gen == O the KV is freed."""
        idx = tuple(i for i, c in enumerate(chunks) if c)
        tokens = tuple(chunks[i] for i in idx)
        decode = tuple(cur[i].m >= cur[i].inp for i in idx)
        duration = self.price(tokens, tuple(cur[i].m for i in idx), decode)
        after, first, done, is_chunked = list(cur), [], [], False
        for i, c, d in zip(idx, tokens, decode):
            p = cur[i]
            m = p.m + c
            is_chunked |= m < p.inp
            gen = p.gen + 1 if d or m == p.inp else p.gen
            if gen == 1 and p.gen == 0:
                first.append(i)
            if gen == self.O[i]:
                done.append(i)
                m = 0
            after[i] = Progress(m, p.inp, gen)
        return Move(evict, idx, tokens, tuple(after), duration, max(self.T[i] for i in idx), tuple(first),
                    tuple(done), is_hybrid=any(decode) and not all(decode), is_chunked=is_chunked)

    # --- objectives: additive costs, A* estimates -----------------------------------------------
    def _extend(self, goal: Goal, label: Label, mv: Move) -> Label:
        end = max(label.clock_s, mv.latest_arrival_s) + mv.duration_s
        w = goal.weights
        if goal.metric in ("latency", "throughput"):
            inc = end - max(label.clock_s, min(self.T))
        elif goal.metric == "completion":
            inc = sum((end - self.T[i]) * w[i] for i in mv.done)
        elif goal.metric == "ttft":
            inc = sum((end - self.T[i]) * w[i] for i in mv.first)
        else:
            many = sum(1 for i in goal.members if self.O[i] > 1)
            rate = sum(1.0 / ((self.O[i] - 1) * many) for i, p in enumerate(label.state)
                       if w[i] and self.O[i] > 1 and 1 <= p.gen < self.O[i])
            inc = mv.duration_s * rate
        return Label(label.cost + inc, end, mv.after, mv, label)

    def _estimate(self, goal: Goal, label: Label, lim: Limits) -> float:
        """A consistent A* estimate of the cost still to come. Every batch takes >= ``least_batch_s``;
        request i needs >= ⌈fill left / min(C, P)⌉ batches to finish its (re)fill, then one per token
        left; all need >= tokens left / C, prefill tokens left / P and least KV area left / M batches.
        Each count falls by at most one per batch (and only for requests in the batch)."""
        t, clock, cp, w, objective = self.least_batch_s, label.clock_s, min(lim.C, lim.P), goal.weights, goal.metric
        left = [_Left(o - p.gen, p.inp - p.m if p.m < p.inp and p.gen < o else 0)
                for p, o in zip(label.state, self.O)]
        fills = [-(-f // cp) for _, f in left]                 # batches to finish the current (re)fill
        own = [k + g - (f > 0) for (g, f), k in zip(left, fills)]
        if objective in ("latency", "throughput"):
            tokens = sum(g + f - (f > 0) for g, f in left)
            area = sum(_least_kv_area(p, g, f) for p, (g, f) in zip(label.state, left))
            batches = max(-(-tokens // lim.C), -(-sum(f for _, f in left) // lim.P), -(-area // lim.M))
            finish = max([clock + batches * t] + [max(clock, T) + n * t for n, T in zip(own, self.T) if n])
            return finish - max(clock, min(self.T))
        if objective == "completion":
            return sum((max(clock, T) + n * t - T) * wi for n, T, wi in zip(own, self.T, w) if n)
        if objective == "ttft":
            return sum((max(clock, T) + k * t - T) * wi
                       for k, T, p, wi in zip(fills, self.T, label.state, w) if p.gen == 0)
        many = sum(1 for i in goal.members if self.O[i] > 1)
        return sum(min(g, o - 1) * t / ((o - 1) * many) for (g, _), o, wi in zip(left, self.O, w) if o > 1 and wi)

    # --- the answer: schedule and its value, recomputed like infermax.metrics --------------------
    def _result(self, goal: Goal, label: Label, num_labels: int) -> OracleResult:
        moves = []
        while label.move is not None:
            moves.append(label.move)
            label = label.parent
        moves.reverse()
        # batches start when their requests have arrived; TPOT idles once, up front, instead
        lead_s, elapsed = 0.0, 0.0
        objective = goal.name
        if goal.metric == "tpot" and not self.is_offline:
            for mv in moves:
                lead_s = max(lead_s, mv.latest_arrival_s - elapsed)
                elapsed += mv.duration_s
        ids, origin = self.workload.ids, min(self.T)
        batches, first_s, done_s, clock = [], np.full(len(ids), np.nan), np.full(len(ids), np.nan), 0.0
        for j, mv in enumerate(moves):
            start = max(clock, lead_s if j == 0 else 0.0)
            if not self.is_offline:
                start = max(start, mv.latest_arrival_s)
            # a schedule's times are seconds since the first arrival (infermax.clock), this search's the workload's
            batches.append(Batch(ids=ids[list(mv.idx)], tokens=np.array(mv.tokens, dtype=np.int64),
                                 evict=ids[list(mv.evict)], not_before_s=start - origin if start > clock else 0.0))
            clock = start + mv.duration_s
            first_s[list(mv.first)] = clock
            done_s[list(mv.done)] = clock
        schedule = Schedule(tuple(batches), {"scheduler": {"name": "oracle"}, "objective": objective})
        return OracleResult(_value(objective, self.workload, first_s, done_s), schedule, objective, num_labels)


class _Left(NamedTuple):
    gen: int                     # tokens left to generate
    fill: int                    # tokens left in the current (re)fill (0 in decode phase or done)


def _allowed(mv: Move, policy: Policy) -> bool:
    """Whether ``mv`` (within the policy's limits) is a batch of ``policy``'s class."""
    return ((policy.allow_eviction or not mv.evict) and (policy.hybrid or not mv.is_hybrid)
            and (policy.chunked_prefill or not mv.is_chunked))


def _blocks(tokens: int, block: int) -> int:
    return -(-tokens // block)


def _least_kv_area(p: Progress, gen_left: int, fill_left: int) -> int:
    """Σ over the request's remaining batches of its KV after each, at least (a fill in one chunk):
    a batch holds <= M, and this falls by at most the request's KV after each batch."""
    if gen_left == 0:
        return 0
    if fill_left:                                 # the (re)fill to inp, then gen_left - 1 decodes
        return p.inp * gen_left + gen_left * (gen_left - 1) // 2
    return p.m * gen_left + gen_left * (gen_left + 1) // 2


def _dominates(objective: str, a: Label, b: Label) -> bool:
    """Whether ``a`` can idle to ``b``'s clock and copy its future at a cost <= (module docstring)."""
    if objective == "tpot":
        return a.cost <= b.cost
    return a.clock_s <= b.clock_s and a.cost <= b.cost


def _dominates_times(a: Label, a_times: tuple[float, ...], b: Label, b_times: tuple[float, ...]) -> bool:
    """Whether ``a`` can idle to ``b``'s clock with every recorded event no later (same state: same
    events recorded)."""
    return a.clock_s <= b.clock_s and all(x <= y for x, y in zip(a_times, b_times) if x == x)


def _percentile_value(goal: Goal, arrival_s: tuple[float, ...], times: tuple[float, ...]) -> float:
    return float(np.percentile([times[i] - arrival_s[i] for i in goal.members], goal.percentile))


def _value(objective: str, workload: Workload, first_s: np.ndarray, done_s: np.ndarray) -> float:
    """The value of ``objective`` (``metric[:tag]``) from the event times, like ``infermax.metrics``."""
    base, _, tag = objective.partition(":")
    if tag:
        keep = np.array([r.tag == tag for r in workload.requests])
        sub = Workload(requests=tuple(r for r, k in zip(workload.requests, keep) if k))
        return _value(base, sub, first_s[keep], done_s[keep])
    objective = "completion" if objective == "e2e" else objective
    arrival, out_len = workload.arrivals_s, workload.output_lens
    if objective in PERCENTILES:
        metric, q = objective.split("_p")
        return float(np.percentile((first_s if metric == "ttft" else done_s) - arrival, float(q)))
    latency = float(done_s.max() - arrival.min())
    if objective == "latency":
        return latency
    if objective == "throughput":
        return int(out_len.sum()) / latency
    if objective == "completion":
        return float((done_s - arrival).mean())
    if objective == "ttft":
        return float((first_s - arrival).mean())
    many = out_len > 1
    return float(((done_s - first_s)[many] / (out_len[many] - 1)).mean())
