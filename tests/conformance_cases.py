"""The cases of ``tests/test_conformance.py``: per serving rule, a tight valid schedule and a mutation that
breaks that rule alone, measured by :func:`walk` (the request semantics re-applied without any check, so no
encoding under test picks its own cases). See docs/rules.md.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np
import pytest

from infermax import Batch, Limits, Schedule, Workload, simulate
from infermax.costmodel import get_cost_model
from infermax.csp import backends

COST = get_cost_model(None)
#: the rulebook's rules (docs/rules.md); the judge's ScheduleError.rule names where it has one
RULES = ("prefill-chunk", "decode-chunk", "C", "P", "M", "M-blocks", "R_max", "evict", "arrival", "finished",
         "incomplete", "kv-freed")
LIMIT_RULES = ("C", "P", "M", "M-blocks", "R_max")
BLOCK = 2                        # block_size of the M-blocks case
EPS_S = 1e-4                     # "before the arrival" by this much (batches take ~9 ms)
SCHEDULERS = ("vllm-hy", "vllm", "sarathi-nocp")     # whole (re)fills: every encoding can read them
CHUNKED_SCHEDULERS = ("sarathi", "sarathi-pc", "rank-i")   # (re)fills in chunks: not the class encodings


def needs_cpsat() -> None:
    if not backends.get_backend("cpsat").is_available():
        pytest.skip("OR-Tools CP-SAT is not installed")


# --- the schedule, re-walked without checks ------------------------------------------------------
class Walk(NamedTuple):
    """What a schedule does by docs/design.md's semantics, checked against nothing.

    States [B, n + 1] before each batch (column j, before its evictions; column n: the end):
    m (KV), inp (input size), gen (tokens generated). Batches [B, n]: c, e (evicted before it).
    Per batch [n]: tokens, prefill tokens, KV held during it (Σ m + c), blocks (Σ ceil / BLOCK),
    running requests, KV that completions had freed before it (Σ I + O - 1), start and end (s).
    """

    m: np.ndarray
    inp: np.ndarray
    gen: np.ndarray
    c: np.ndarray
    e: np.ndarray
    tokens: np.ndarray
    prefill: np.ndarray
    kv: np.ndarray
    blocks: np.ndarray
    running: np.ndarray
    freed: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray


def walk(schedule: Schedule, w: Workload) -> Walk:
    B, n = len(w), len(schedule)
    I, O, T = w.input_lens, w.output_lens, w.arrivals_s
    m, inp, gen = np.zeros(B, np.int64), I.copy(), np.zeros(B, np.int64)
    M_, INP, GEN = (np.zeros((B, n + 1), np.int64) for _ in range(3))
    c, e = np.zeros((B, n), np.int64), np.zeros((B, n), np.int64)
    per = {k: np.zeros(n) for k in ("tokens", "prefill", "kv", "blocks", "running", "freed", "start_s", "end_s")}
    clock = freed = 0.0
    for j, b in enumerate(schedule):
        M_[:, j], INP[:, j], GEN[:, j] = m, inp, gen
        idx, ev = w.indices_of(b.ids), w.indices_of(b.evict)
        e[ev, j] = 1
        for i in ev:                                  # eviction: m -> 0, in decode phase inp -> m + 1
            if m[i] > 0 and m[i] >= inp[i]:
                inp[i] = m[i] + 1
            m[i] = 0
        c[idx, j] = b.tokens
        m0, dec = m[idx].copy(), m[idx] >= inp[idx]
        held = (m > 0) & ~np.isin(np.arange(B), idx)
        after = m0 + b.tokens
        per["tokens"][j], per["prefill"][j] = b.tokens.sum(), b.tokens[~dec].sum()
        per["kv"][j] = m[held].sum() + after.sum()
        per["blocks"][j] = (-(-m[held] // BLOCK)).sum() + (-(-after // BLOCK)).sum()
        per["running"][j] = held.sum() + idx.size
        per["freed"][j] = freed
        clock = max(clock, b.not_before_s, float(T[idx].max()))
        per["start_s"][j] = clock
        clock += COST.batch_time(b.tokens, m0, dec)
        per["end_s"][j] = clock
        m[idx] = after
        grew = idx[after >= inp[idx]]                 # a (re)fill reaching its input, or a decode
        gen[grew] += 1
        for i in grew[gen[grew] == O[grew]]:          # completion frees the KV
            freed += int(I[i] + O[i] - 1)
            m[i] = 0
    M_[:, n], INP[:, n], GEN[:, n] = m, inp, gen
    return Walk(M_, INP, GEN, c, e, **per)


def _whole_fills(wk: Walk) -> bool:
    """Between batches every request holds no KV or a whole input (the class-state encodings' view)."""
    m, inp = wk.m, wk.inp
    return bool(np.all((m == 0) | (m >= inp)))


# --- the cases -----------------------------------------------------------------------------------
class Case(NamedTuple):
    """``schedule`` replay-valid under ``limits`` and tight on ``rule``; ``bad`` (None: no mutation)
    breaks ``rule`` alone under ``bad_limits``; ``where``: the batch the rule binds in or the
    mutated batch; ``seed``: the instance's."""

    rule: str
    workload: Workload
    limits: Limits
    schedule: Schedule
    bad_limits: Limits
    bad: Schedule | None
    where: int
    seed: int

    @property
    def is_offline(self) -> bool:
        return self.workload.is_offline


def _instance(seed: int, online: bool, small_P: bool, chunked: bool) -> tuple[Workload, Limits]:
    """Three or four requests of two shapes (classes of interchangeable requests), a small M; with
    ``small_P``, P the longest prompt (a batch then holds more tokens than prefill tokens: C can bind alone);
    with ``chunked``, C about the longest prompt (prompts are then split when decodes share the batch)."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(3, 5))
    kinds = [(int(rng.integers(1, 5)), int(rng.integers(1, 4))) for _ in range(2)]
    pick = rng.integers(0, 2, B)
    ins, outs = [kinds[p][0] for p in pick], [kinds[p][1] for p in pick]
    peak = max(i + o - 1 for i, o in zip(ins, outs))
    arrivals = sorted(rng.uniform(0.0, 0.03, B).round(4).tolist()) if online else None
    w = Workload.from_lengths(ins, outs, arrivals, name=f"conformance-{seed}")
    C = max(2, max(ins)) + (2 if small_P else 0) if chunked else 64
    return w, Limits(M=int(peak + rng.integers(0, peak + 1)), C=C, P=max(ins) if small_P else None)


def _with_batch(schedule: Schedule, j: int, batch: Batch | None) -> Schedule:
    """``schedule`` with batch ``j`` replaced (None: removed; j = len: appended)."""
    out = list(schedule.batches)
    if j == len(out):
        out.append(batch)
    elif batch is None:
        del out[j]
    else:
        out[j] = batch
    return Schedule(tuple(out), dict(schedule.meta))


def _refilled_later(w: Workload, s: Schedule, wk: Walk, i: int, j: int, base: Limits) -> Schedule | None:
    """``s`` with the first decode of request i after batch j turned into an evict-and-refill of its whole
    context (a valid schedule, the same next state), if that batch has room for it, every batch from j
    until then holds at most M - 1 KV tokens and the request at most I + O - 3 (one token more stays below
    its peak); else None. One token too many in the fill of batch j then reaches the refill, which drops
    it, instead of the request's completion, which would show it."""
    for r in range(j + 1, len(s)):
        if wk.c[i, r] == 0:
            continue
        peak = int(w.input_lens[i] + w.output_lens[i] - 1)
        if wk.e[i, r] or wk.m[i, r] < wk.inp[i, r] or wk.m[i, r] + 1 > peak - 1 \
                or not np.all(wk.kv[j:r] <= base.M - 1):
            return None
        refill = int(wk.m[i, r]) + 1
        if wk.tokens[r] - 1 + refill > base.C or wk.prefill[r] + refill > base.P:
            return None
        b = s[r]
        tokens = np.where(b.ids == w.ids[i], refill, b.tokens)
        return _with_batch(s, r, Batch(b.ids, tokens, np.append(b.evict, w.ids[i]), b.not_before_s))
    return None


def _mutation(rule: str, w: Workload, s: Schedule, wk: Walk, base: Limits,
              chunked: bool) -> tuple[Schedule, Schedule, int] | None:
    """(the schedule, the schedule with one batch changed so that it breaks ``rule``, that batch), or None.

    A prefill chunk made one token too long completes a fill: with ``chunked``, one that continues a fill
    (m > 0 before it); else a whole fill, the request's next decode turned into an evict-and-refill
    (:func:`_refilled_later`) in the schedule itself."""
    ids, B, n = w.ids, len(w), len(s)
    for j, b in enumerate(s):
        idx = w.indices_of(b.ids)
        m_ev = np.where(wk.e[:, j] > 0, 0, wk.m[:, j])             # after the batch's evictions
        inp_ev = np.where((wk.e[:, j] > 0) & (wk.m[:, j] > 0) & (wk.m[:, j] >= wk.inp[:, j]),
                          wk.m[:, j] + 1, wk.inp[:, j])
        for k, i in enumerate(idx):
            prefill = m_ev[i] < inp_ev[i]
            if rule == "prefill-chunk" and prefill and m_ev[i] + b.tokens[k] == inp_ev[i]:
                valid = s if chunked else _refilled_later(w, s, wk, i, j, base)
                if valid is None or (chunked and m_ev[i] == 0):
                    continue
            elif not (rule == "decode-chunk" and not prefill):
                continue
            else:
                valid = s
            tokens = b.tokens.copy()
            tokens[k] += 1
            return valid, _with_batch(valid, j, Batch(b.ids, tokens, b.evict, b.not_before_s)), j
        if rule == "evict":
            idle = [i for i in range(B) if wk.m[i, j] == 0 and wk.gen[i, j] < w.output_lens[i]
                    and i not in idx and not wk.e[i, j]]
            if idle:
                evict = np.append(b.evict, ids[idle[0]])
                return s, _with_batch(s, j, Batch(b.ids, b.tokens, evict, b.not_before_s)), j
    if rule == "finished":                       # one more token for a request already done
        return s, _with_batch(s, n, Batch(ids[[0]], np.array([1]))), n
    if rule == "incomplete":                     # the last batch: one of its completing requests a token short
        last = s[n - 1]
        idx = w.indices_of(last.ids)
        done = np.flatnonzero(wk.gen[idx, n] == w.output_lens[idx])
        if not done.size or last.evict.size:
            return None
        tokens = last.tokens.copy()
        tokens[done[0]] -= 1
        keep = tokens > 0
        batch = Batch(last.ids[keep], tokens[keep], last.evict, last.not_before_s) if keep.any() else None
        return s, _with_batch(s, n - 1, batch), n - 1
    return None


def _limit_case(rule: str, w: Workload, base: Limits, s: Schedule, wk: Walk) -> tuple[Limits, Limits, int] | None:
    """(tight limits, limits one lower on ``rule`` only, the batch where it binds), or None."""
    peak = int((w.input_lens + w.output_lens - 1).max())
    tok, pre, kv, run = int(wk.tokens.max()), int(wk.prefill.max()), int(wk.kv.max()), int(wk.running.max())
    if rule == "C" and pre <= tok - 1:
        return base.replace(C=tok, P=pre), base.replace(C=tok - 1, P=pre), int(np.argmax(wk.tokens))
    if rule == "P" and pre >= 2:
        return base.replace(P=pre), base.replace(P=pre - 1), int(np.argmax(wk.prefill))
    if rule == "M" and kv - 1 >= peak:
        return base.replace(M=kv), base.replace(M=kv - 1), int(np.argmax(wk.kv))
    if rule == "kv-freed" and np.any(wk.kv + wk.freed > kv):
        return base.replace(M=kv), base.replace(M=kv), int(np.argmax(wk.kv + wk.freed > kv))
    if rule == "R_max" and run >= 2:
        return base.replace(R_max=run), base.replace(R_max=run - 1), int(np.argmax(wk.running))
    if rule == "M-blocks":
        blocks = int(wk.blocks.max())
        if kv <= BLOCK * blocks - 1 and -(-peak // BLOCK) <= blocks - 1:
            return (base.replace(M=BLOCK * blocks, block_size=BLOCK), base.replace(M=BLOCK * blocks - 1,
                    block_size=BLOCK), int(np.argmax(wk.blocks)))
    return None


@lru_cache(maxsize=None)
def case_of(rule: str, k: int = 0, chunked: bool = False) -> Case:
    """The ``k``-th seeded instance (one per seed, in seed order from the rule's own start) on which ``rule``
    has a tight schedule and a mutation, from the first scheduler of :data:`SCHEDULERS` that gives one
    (``chunked``: of :data:`CHUNKED_SCHEDULERS`, a schedule that splits some (re)fill)."""
    first = 20 * RULES.index(rule) if k == 0 else case_of(rule, k - 1, chunked).seed + 1   # rules apart
    online = rule == "arrival"
    for seed in range(first, first + 300):
        w, base = _instance(seed, online, small_P=rule == "C", chunked=chunked)
        for name in CHUNKED_SCHEDULERS if chunked else SCHEDULERS:
            s = simulate(w, name, base, COST).schedule
            wk = walk(s, w)
            if _whole_fills(wk) == chunked or (rule == "evict" and not wk.e.any()):
                continue                      # the evict case also replays evictions that are valid
            if rule == "arrival":
                latest = np.array([w.arrivals_s[w.indices_of(b.ids)].max() for b in s])
                gaps = np.flatnonzero((wk.start_s[1:] > wk.end_s[:-1] + 10 * EPS_S)
                                      & (wk.start_s[1:] == latest[1:])) + 1
                if gaps.size:                 # a batch that waits for an arrival
                    return Case(rule, w, base, s, base, None, int(gaps[0]), seed)
                continue
            if rule in LIMIT_RULES or rule == "kv-freed":
                got = _limit_case(rule, w, base, s, wk)
                # the binding batch evicts-and-refills nobody (the class state keeps only the cheaper of that
                # and a decode: the test's successor check compares the slots run, see _is_successor)
                if got is not None and not np.any((wk.e[:, got[2]] > 0) & (wk.c[:, got[2]] > 0)):
                    return Case(rule, w, got[0], s, got[1], None if rule == "kv-freed" else s, got[2], seed)
                continue
            got = _mutation(rule, w, s, wk, base, chunked)
            if got is not None:
                return Case(rule, w, base, got[0], base, got[1], got[2], seed)
    raise AssertionError(f"[{rule}] no seeded instance gives case {k} of this rule")


#: cases per rule: the first in the default run, the others in the slow run
NUM_CASES = 4


def ids_of(encoding: str, rules=RULES, num_cases: int = NUM_CASES, chunked: bool = False) -> list:
    """(rule, case, chunked) parameters named ``rule@encoding`` — ``/chunked`` for the cases whose schedule
    splits a (re)fill, ``#k`` for the slow run's further cases."""
    return [pytest.param(r, k, ch, id=f"{r}@{encoding}" + ("/chunked" if ch else "") + (f"#{k}" if k else ""),
                         marks=[pytest.mark.slow] if k else [])
            for ch in ((False, True) if chunked else (False,)) for r in rules for k in range(num_cases)]
