"""Exact batches left from any state of the chain-packing relaxation (:mod:`.batchcount`), as a table.

:class:`RemainingBatches` is built backwards from the goal, layer by layer of minimal states, and
answers two questions for the exact search (:mod:`.search`): how many batches are left from a
state (the strongest part of its bound), and what one batch must run to leave one batch fewer
(:meth:`RemainingBatches.requirements`, which lets the search enumerate only such batches).

    >>> RemainingBatches([(16, 16, 7)], 128).num_batches
    23
"""
from __future__ import annotations

import math
import time

import numpy as np


def _minimal_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of a non-negative integer array that no other row is componentwise below."""
    if len(rows) == 0:
        return rows
    bits = int(rows.max()).bit_length()
    if bits * rows.shape[1] <= 62:           # distinct rows through one integer key per row (fast)
        keys = rows.astype(np.int64) @ (np.int64(1) << (bits * np.arange(rows.shape[1], dtype=np.int64)))
        rows = rows[np.unique(keys, return_index=True)[1]]
    else:
        rows = np.unique(rows, axis=0)
    if len(rows) <= 512:
        below = (rows[:, None, :] <= rows[None, :, :]).all(axis=2)   # below[i, j]: row i <= row j
        return rows[below.sum(axis=0) == 1]                          # only itself below it
    return rows[[i for i in range(len(rows))
                 if not ((rows <= rows[i]).all(axis=1) & (rows != rows[i]).any(axis=1)).any()]]


class RemainingBatches:
    """Exact batches left in the chain-packing relaxation, from any state, built backwards from the goal.

    ``layers[d]`` holds the minimal states (per class, sorted levels = items done) from which every chain
    finishes within d batches; the set of such states is upward closed (more progress never hurts when
    idling is free), and its minimal elements for d + 1 are the minimal *predecessors* of those for d:
    some requests one level back, their items (KV I + level) fitting in M together (at most R_max). A
    state's exact remainder is the least d with an element of ``layers[d]`` below it; past the layers
    built within the budget, ``len(layers)`` is still a lower bound.
    """

    def __init__(self, classes: list[tuple[int, int, int]], M: int, R_max: int | None = None,
                 time_budget_s: float = 10.0, max_elements: int = 200_000):
        self.classes, self.M = classes, M
        self.R_max = R_max or sum(n for _, _, n in classes)
        self._cut = np.cumsum([0] + [n for _, _, n in classes])
        self._cache: dict = {}
        self._needs: dict = {}
        self._at_least: dict = {}
        t0 = time.perf_counter()
        goal = np.concatenate([np.full(n, O, dtype=np.int16) for _, O, n in classes])[None, :]
        self.layers = [goal]
        self.is_complete = False
        deadline = t0 + time_budget_s
        while len(self.layers[-1]) <= max_elements:
            if not self.layers[-1].any(axis=1).all():          # the start (all levels 0) is covered
                self.is_complete = True
                break
            preds = self._predecessors(self.layers[-1], deadline)
            layer = None if preds is None else _minimal(preds, deadline)
            if layer is None:                                  # out of time: the layers so far stay valid
                break
            self.layers.append(layer)

    @property
    def num_batches(self) -> int:
        """The least batch count of the whole instance (a lower bound if the table is incomplete)."""
        return len(self.layers) - 1 if self.is_complete else len(self.layers)

    def __call__(self, levels: tuple, at_least: int = 0) -> int:
        """Exact batches left from ``levels`` (per class sorted, concatenated), or a lower bound past the table.

        at_least: a known lower bound (e.g. the area bound), where the upward scan starts.
        """
        d = self._cache.get(levels)
        if d is None:
            row = np.asarray(levels, dtype=np.int16)
            d = min(at_least, len(self.layers))
            while d < len(self.layers) and not (self.layers[d] <= row).all(axis=1).any():
                d += 1
            self._cache[levels] = d
        return d

    def requirements(self, levels: tuple, d: int) -> list[tuple]:
        """What one batch from ``levels`` must run to leave at most ``d`` batches: a list of alternatives,
        each ((level index, count), ...) — at least ``count`` requests at that level (per class: class
        offset + level, offsets by cumulated O) — minimal ones only; [] if no batch can.

        A sorted row reaches an element m of layer d iff, at every v, as many of its requests are at
        level >= v as m's; one batch adds one level to the requests it runs, so m asks for at least
        #m(>= t+1) - #(>= t+1) of the requests at level t, and is out of reach if that exceeds them.
        """
        if d < 0 or d >= len(self.layers):
            return [()] if d >= len(self.layers) else []
        key = (levels, d)
        out = self._needs.get(key)
        if out is not None:
            return out
        if d not in self._at_least:          # per element of layer d and class: #(level >= v), v = 1..O
            cols = []
            for c, (_, O, _) in enumerate(self.classes):
                seg = self.layers[d][:, self._cut[c]:self._cut[c + 1]]
                cols.append((seg[:, :, None] >= np.arange(1, O + 1)).sum(axis=1))
            self._at_least[d] = np.concatenate(cols, axis=1).astype(np.int16)
        row = np.asarray(levels, dtype=np.int16)
        have, here = [], []
        for c, (_, O, _) in enumerate(self.classes):
            seg = row[self._cut[c]:self._cut[c + 1]]
            have.append((seg[:, None] >= np.arange(1, O + 1)).sum(axis=0))
            here.append((seg[:, None] == np.arange(O)).sum(axis=0))
        have, here = np.concatenate(have).astype(np.int16), np.concatenate(here).astype(np.int16)
        at_least = self._at_least[d]
        need = np.maximum(at_least[(at_least <= have + here).all(axis=1)] - have, 0)
        need = _minimal_rows(need)
        out = self._needs[key] = [tuple((i, n) for i, n in enumerate(r) if n) for r in need.tolist()]
        return out

    def _predecessors(self, layer: np.ndarray, deadline: float) -> np.ndarray | None:
        out: set = set()
        for n, m in enumerate(layer.tolist()):
            if n % 256 == 0 and time.perf_counter() > deadline:
                return None
            groups = []                                      # (position of the first of a run, count, item KV)
            for c, (I, _, _) in enumerate(self.classes):
                a, b = self._cut[c], self._cut[c + 1]
                k = a
                while k < b:
                    e = k
                    while e < b and m[e] == m[k]:
                        e += 1
                    if m[k] >= 1:
                        groups.append((k, e - k, I + m[k] - 1))
                    k = e
            _maximal_moves(m, groups, self.M, self.R_max, out)
        return np.array(sorted(out), dtype=np.int16)


def _maximal_moves(m: list, groups: list, M: int, R_max: int, out: set) -> None:
    """Every inclusion-maximal choice of items (counts per equal-level run) that fits; adds its predecessor.

    ``need`` is the least item KV of a run not taken whole so far: the choice is maximal only if the
    room left at the end is below it or R_max is used up, so a branch whose remaining runs can do
    neither is cut.
    """
    G = len(groups)
    suffix = [0] * (G + 1)                                   # KV of all items of runs g..
    items = [0] * (G + 1)                                    # and their number
    for g in range(G - 1, -1, -1):
        suffix[g] = suffix[g + 1] + groups[g][1] * groups[g][2]
        items[g] = items[g + 1] + groups[g][1]
    taken = [0] * G

    def walk(g: int, room: int, slots: int, need: int) -> None:
        if slots > items[g] and suffix[g] <= room - need:  # neither room nor R_max can run out: not maximal
            return
        if g == G:
            p = list(m)
            for n, (k, _, _) in zip(taken, groups):
                for q in range(k, k + n):                    # move the first n of the run back: stays sorted
                    p[q] -= 1
            out.add(tuple(p))
            return
        _, cnt, w = groups[g]
        for n in range(min(cnt, room // w, slots), -1, -1):
            taken[g] = n
            walk(g + 1, room - n * w, slots - n, need if n == cnt else min(need, w))
        taken[g] = 0

    walk(0, M, R_max, 1 << 30)


def _minimal(rows: np.ndarray, deadline: float = math.inf, block: int = 512) -> np.ndarray | None:
    """The distinct rows not dominated (>= elementwise) by another row (None if past ``deadline``).

    Bitsets: for column k and value v, the set of rows whose column k is <= v (packed into uint64
    words); a row is dominated when the AND of its columns' sets holds a row other than itself.
    """
    rows = np.unique(rows, axis=0)
    n, width = rows.shape
    words = -(-n // 64)
    dominated = np.zeros(n, dtype=bool)
    sets = []                                                # per column: (values, bitset per value)
    for k in range(width):
        col = rows[:, k]
        values = np.unique(col)
        below = col[None, :] <= values[:, None]              # (num values, n)
        packed = np.packbits(below, axis=1, bitorder="little")
        packed = np.pad(packed, ((0, 0), (0, words * 8 - packed.shape[1]))).view(np.uint64)
        sets.append((values, packed))
    for a in range(0, n, block):
        if time.perf_counter() > deadline:
            return None
        idx = np.arange(a, min(n, a + block))
        acc = None
        for k, (values, packed) in enumerate(sets):
            part = packed[np.searchsorted(values, rows[idx, k])]
            acc = part if acc is None else acc & part
        acc[np.arange(idx.size), idx // 64] &= ~(np.uint64(1) << (idx % 64).astype(np.uint64))  # not itself
        dominated[idx] = acc.any(axis=1)
    return rows[~dominated]
