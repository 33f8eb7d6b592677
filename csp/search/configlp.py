"""The configuration LP: the trajectory LP with every batch a convex combination of whole batches.

The trajectory LP (:mod:`.trajectorylp`) lets each batch hold fractions of items: 7.5 requests of
17 tokens fill M = 128 exactly, so fractional paths can stagger their starts until memory is used
evenly and never pause. Here a batch is a *configuration* — a multiset of whole items (a decode,
fill or refill at a slot, or an idle hold) that fits M and R_max — and for a fixed batch count Y
the LP picks, per batch, a convex combination of configurations (μ_jκ >= 0, Σ_κ μ_jκ = 1), per
class a convex combination of paths, and asks the batches to supply what the paths use::

    Σ_p λ_p·a_pjτ <= Σ_κ μ_jκ·n_κτ + s_j        for every batch j and item type τ

minimising Σ_j Σ_κ μ_jκ·time(κ) + BIG·Σ_j s_j. A configuration's time is exact — the
non-attention line of its tokens, the decode and prefill biases it pays, its item costs — so the
bias indicators are whole too. Every schedule with Y batches is a solution, so the LP value bounds
it. It applies when a batch's tokens cannot exceed C or P (M <= C and M <= P; a batch never runs
more tokens than it holds KV), which the configurations do not track.

Both kinds of column are priced: paths by the trajectory LP's shortest path over slots and batches,
configurations by an unbounded knapsack over KV (and residents, where R_max binds) per batch —
one per bias case (decode only, prefill only, hybrid) and per line of the non-attention time that
is the largest for some token count up to M. The Lagrangian of the linking rows at prices π >= 0,

    Σ_j min_κ (time(κ) - π_j·n_κ) + Σ_requests min_p π·a_p,

bounds every schedule for any π; the knapsack gives each batch's term (for several lines, the
largest of the per-line minima, which is at most the true one), the paths give V, and
:class:`.trajectorybound.TrajectoryBound` uses the two the same way for either LP.

Column generation here takes hundreds of rounds, so it is helped three ways: the LP is HiGHS
(:mod:`.backends.lp`), re-solved from its last basis after columns are added; every round adds, per waiting start slot,
the best path that starts at each batch (all requests of a class share one slot); and columns are
sought at prices smoothed towards those of the best Lagrangian so far (Wentges), starting from the
trajectory LP's prices — where the Lagrangian is that LP's value (each configuration's exact time
is at least what the trajectory LP's batch variables charge for its items), so the bound never
starts below it. Measured (I=O=16, M=128, latency): B = 10, Y = 30: trajectory LP 0.2900 s in
0.5 s, this LP 0.3028 s, converged within a minute; B = 7, Y = 23: 0.22098 -> 0.22149 s (optimum
0.22359 s). :class:`.trajectorybound.TrajectoryBound` runs it where time is left after the
trajectory LPs (``refine``).
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..backends import lp as lp_engines
from .trajectorylp import _SLACK_S, _UNIT_S, TrajectoryLP, _Path


def is_available() -> bool:
    """HiGHS (highspy) is installed: it solves the restricted LPs, re-solving from the last basis."""
    return lp_engines.is_available("highs")


def applies(sp) -> bool:
    """A batch's tokens can exceed neither C nor P (M <= C and M <= P): the configurations need not track
    them."""
    return sp.M <= sp.C and sp.M <= sp.P


class ConfigLP(TrajectoryLP):
    """The configuration LP for exactly ``Y`` batches from the start state (module docstring)."""

    def __init__(self, sp, Y: int):
        self._setup(sp, Y)
        self.lp = lp_engines.new_lp("highs")
        self._build()

    # complexity: the item kinds (run, refill, hold) written side by side as arrays, one branch each
    def _build(self) -> None:
        """The item types (run, refill, hold per slot) with their sizes, tokens and costs, and the master
        LP's rows; its branches are the item kinds, written side by side as arrays."""
        sp, Y, M = self.sp, self.Y, self.sp.M
        S = len(self.L)
        # item types: run slot q (decode a resident, fill a waiting request) = q, refill resident q = S + q,
        # hold resident q idle = 2S + q; resident level 0 is never occupied
        used_res = self.resident & (np.array([sl[2] for sl in sp.slots]) > 0)
        run_ok = used_res | ~self.resident
        self.type_ok = np.concatenate([run_ok, used_res & sp.evict, used_res])
        self.size = np.concatenate([self.L, self.L, self.held]).astype(np.int64)
        self.tokens = np.concatenate([np.where(self.resident, 1.0, self.L), self.L, np.zeros(S)])
        is_fill = np.concatenate([~self.resident, np.ones(S, dtype=bool), np.zeros(S, dtype=bool)])
        is_dec = np.concatenate([self.resident, np.zeros(S, dtype=bool), np.zeros(S, dtype=bool)])
        self.is_fill, self.is_dec = is_fill & self.type_ok, is_dec & self.type_ok
        fw = np.concatenate([self.fill_work, self.fill_work, np.zeros(S)])
        runs = self.type_ok & (is_fill | is_dec)
        # each item's own cost (ms) beyond the batch's line and biases
        self.item_cost = np.where(self.is_dec, self.t_dk * self.size, 0.0) + np.where(
            self.is_fill, self.t_pa * fw + self.t_pt * self.tokens, 0.0) + np.where(runs, self.t_rq, 0.0)
        self.fw = fw
        self.types = np.flatnonzero(self.type_ok)
        self.link = [{int(t): self.lp.add_row(-math.inf, 0.0) for t in self.types} for j in range(Y)]
        self.link_rows = np.array([[self.link[j][int(t)] for t in self.types] for j in range(Y)])
        self.pick = [self.lp.add_row(1.0, 1.0) for _ in range(Y)]
        for j in range(Y):          # slack: one unit supplies every item type of batch j
            self.lp.add_col(_SLACK_S / _UNIT_S, 0.0, math.inf, {r: -1.0 for r in self.link[j].values()})
        # tokens in a batch never exceed M: the lines that are the largest somewhere on 0..M
        n = np.arange(M + 1, dtype=np.float64)
        top = np.argmax([a + b * n for a, b in self.t_lines], axis=0)
        self.active = sorted(set(int(k) for k in top))
        self.cases = [(True, False), (False, True)] + ([(True, True)] if sp.hybrid else [])
        self.count_cap = min(sp.R_max, self.num_requests, M // int(self.size[self.types].min()))
        self.candidates: list = []
        floor = max(a for a, _ in self.t_lines) + min(self.t_db, self.t_pb)
        for j in range(Y):              # a batch costs at least this: keeps every restricted LP feasible
            self._add_config(j, (), floor)
        self.convex = {q: self.lp.add_row(self.state[q], self.state[q]) for q in self.starts}
        for path in self._unpaused_paths():
            self.add(path)

    def _type_of(self, q: int, move: str) -> int:
        S = len(self.L)
        if move == "hold":
            return 2 * S + q
        return S + q if move == "fill" and self.resident[q] else q

    def add(self, path: _Path) -> None:
        """A column for ``path``: one unit of its item type in each batch it runs or holds in."""
        coefs = {self.link[j][self._type_of(q, move)]: 1.0 for j, q, move in path.moves}
        coefs[self.convex[path.start]] = 1.0
        self.lp.add_col(0.0, 0.0, math.inf, coefs)

    def _config_time(self, items: tuple) -> float | None:
        """The exact time (ms) of a batch of ``items`` (item types, repeated); None if it runs nothing."""
        it = np.array(items, dtype=np.int64)
        dec, fill = self.is_dec[it], self.is_fill[it]
        runs = dec | fill
        if not runs.any():
            return None
        tokens = int(self.tokens[it].sum())
        return self.sp.batch_time(tokens, int(runs.sum()), int(dec.sum()), int(self.size[it][dec].sum()),
                                  int(fill.sum()), int(self.tokens[it][fill].sum()),
                                  float(self.fw[it][fill].sum())) / _UNIT_S

    def _add_config(self, j: int, items: tuple, cost: float) -> None:
        coefs: dict = {self.pick[j]: 1.0}
        for t in items:
            row = self.link[j][t]
            coefs[row] = coefs.get(row, 0.0) - 1.0
        self.lp.add_col(cost, 0.0, math.inf, coefs)

    def _duals(self) -> np.ndarray:
        """The linking rows' prices π >= 0 (ms per item), per batch and item type."""
        pi = np.zeros((self.Y, 3 * len(self.L)))
        pi[:, self.types] = np.maximum(0.0, -self.row_dual[self.link_rows])
        return pi

    def _tables(self, pi: np.ndarray) -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray]:
        """φ_j (each batch's least priced configuration, by knapsack) and the per-slot prices of running,
        refilling and holding (s) at item prices ``pi``; the knapsacks' configurations go to
        ``self.candidates``."""
        S = len(self.L)
        phi = self._price_configs(pi)
        run, refill, stay = pi[:, :S].copy(), pi[:, S:2 * S].copy(), pi[:, 2 * S:].copy()
        refill[:, ~self.type_ok[S:2 * S]] = math.inf
        stay[:, ~self.resident] = 0.0
        return (phi * _UNIT_S).tolist(), run * _UNIT_S, refill * _UNIT_S, stay * _UNIT_S

    def prices(self) -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_tables` at the restricted LP's own prices."""
        return self._tables(self._duals())

    # complexity: column generation with smoothing: one branch per pricing outcome and stopping rule
    def solve(self, deadline: float, rel_tol: float = 1e-7, smoothing: float = 0.9, start=None
              ) -> tuple[float, list, np.ndarray, bool]:
        """Column generation with smoothed prices (Wentges): columns are sought at ``smoothing`` times the
        prices of the best Lagrangian so far plus the rest times the LP's own, and at the LP's own only when
        none found there prices out; returns (bound, φ, V, converged) like the trajectory LP's.

        start: the (run, refill, stay) item prices of a solved trajectory LP for the same Y — the first
        centre; the Lagrangian there is at least that LP's value, so the bound never starts below it.
        Long because it is one column-generation loop (price, smooth, add columns, stop), whose steps share
        the prices and the centre.
        """
        best = (-math.inf, None, None)
        center = None
        converged = False
        if start is not None:
            run, refill, stay = (np.where(np.isfinite(x), x, 0.0) / _UNIT_S for x in start)
            center = np.maximum(0.0, np.concatenate([run, refill, stay], axis=1))
            center[:, ~self.type_ok] = 0.0
            phi, run, refill, stay = self._tables(center)
            V = self.paths(run, refill, stay)
            best = (self._lagrangian(phi, V), phi, V)
        while True:
            self._resolve()
            cur = self._duals()
            lp = self.value_s
            mu = {q: self.row_dual[self.convex[q]] for q in self.starts}
            sigma = self.row_dual[self.pick]
            tol = rel_tol * max(abs(lp) / _UNIT_S, 1.0)
            alpha = smoothing if center is not None else 0.0
            while True:
                pi = cur if alpha == 0.0 else alpha * center + (1 - alpha) * cur
                phi, run, refill, stay = self._tables(pi)
                V = self.paths(run, refill, stay)
                bound = self._lagrangian(phi, V)
                if bound > best[0]:
                    best, center = (bound, phi, V), pi
                paths = [p for p in self._start_paths(V, run, refill, stay)
                         if self._path_price(p, cur) - mu[p.start] < -tol]
                configs = [(j, items, cost) for j, items in set(self.candidates)
                           if (cost := self._config_time(items)) is not None
                           and cost - cur[j, list(items)].sum() - sigma[j] < -tol]
                if paths or configs or alpha == 0.0:
                    break
                alpha = 0.0                     # nothing prices out at the smoothed prices: use the LP's own
            for p in paths:
                self.add(p)
            for column in configs:
                self._add_config(*column)
            if not (paths or configs) or lp - best[0] <= rel_tol * abs(lp):
                converged = True
                break
            if time.perf_counter() > deadline:
                break
        return best[0], best[1], best[2], converged

    def _start_paths(self, V, run, refill, stay) -> list[_Path]:
        """Per starting slot, its best path and — for a waiting slot — the best path that waits until batch k
        and then fills, for every k (many columns per round: all requests of a class share one slot)."""
        out, S = [], len(self.L)
        for q in self.starts:
            out.append(self.best_path(q, V, run, refill, stay))
            if self.resident[q]:
                continue
            nq = int(self.next[q])
            for k in range(self.Y):
                if math.isfinite(run[k, q] + V[k + 1, nq]):
                    out.append(self.best_path(q, V, run, refill, stay, first=k + 1, q=nq, moves=[(k, q, "fill")])
                               if nq != S else _Path(q, ((k, q, "fill"),)))
        return out

    def _path_price(self, path: _Path, pi: np.ndarray) -> float:
        return float(sum(pi[j, self._type_of(q, move)] for j, q, move in path.moves))

    def _price_configs(self, pi: np.ndarray) -> np.ndarray:
        """φ_j (ms) at item prices ``pi``; the knapsacks' configurations go to ``self.candidates``.

        One knapsack per line and bias case, all solved together (rows stacked)."""
        Y = self.Y
        values, required, fixed = [], [], []
        holds = self.type_ok & ~(self.is_dec | self.is_fill)
        for k in self.active:
            a, b = self.t_lines[k]
            value = pi - self.item_cost - b * self.tokens
            for dec_ok, fill_ok in self.cases:
                runs = (self.is_dec & dec_ok) | (self.is_fill & fill_ok)
                v = np.where(runs | holds, value, -math.inf)
                values.append(v)
                required.append(np.where(runs, v, -math.inf))
                fixed.append(a + (self.t_db if dec_ok else 0.0) + (self.t_pb if fill_ok else 0.0))
        best, configs = self._knapsack(np.concatenate(values), np.concatenate(required))
        self.candidates = [(r % Y, c) for r, c in enumerate(configs) if c]
        per = (np.repeat(fixed, Y) - best).reshape(len(self.active), len(self.cases), Y)
        return per.min(axis=1).max(axis=0)          # least over bias cases, largest over lines

    def _knapsack(self, value: np.ndarray, required: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
        """Per row, the most valuable multiset of item types within M KV and ``count_cap`` items holding at
        least one item valued in ``required`` (values per row and type, -inf where not allowed): (best
        values, -inf where none fits; the multisets).

        By item count k: A_k[m] the best k items of m KV in all, R_k[m] the same holding a required type;
        A_k[m] = max_s A_(k-1)[m - s] + best(s), R_k[m] = max_s max(R_(k-1)[m - s] + best(s),
        A_(k-1)[m - s] + best_required(s)), over the item sizes s (per size, only its best type counts).
        Long because the dynamic programme and the traceback of its multisets share their tables.
        """
        Y, M, K = len(value), self.sp.M, self.count_cap
        sizes = np.unique(self.size[self.type_ok])
        by_size = [np.flatnonzero(self.type_ok & (self.size == z)) for z in sizes]

        def best_of(val):           # per row and size: the best type's value and the type
            vals = np.full((Y, len(sizes)), -math.inf)
            arg = np.zeros((Y, len(sizes)), dtype=np.int64)
            for u, ts in enumerate(by_size):
                k = np.argmax(val[:, ts], axis=1)
                vals[:, u], arg[:, u] = val[np.arange(Y), ts[k]], ts[k]
            return vals, arg

        v_any, t_any = best_of(value)
        v_req, t_req = best_of(required)
        back = np.arange(M + 1)[:, None] - sizes[None, :]                  # (M + 1, sizes): m - s
        back = np.where(back >= 0, back, M + 1)                           # column M + 1 stays -inf
        A = np.full((Y, M + 2), -math.inf)
        A[:, 0] = 0.0
        R = np.full((Y, M + 2), -math.inf)
        layers = [(A, R)]
        for _ in range(K):
            na, nr = np.full((Y, M + 2), -math.inf), np.full((Y, M + 2), -math.inf)
            for u, z in enumerate(sizes):              # add one item of size z
                if z > M:
                    continue
                np.maximum(na[:, z:M + 1], A[:, :M + 1 - z] + v_any[:, u, None], out=na[:, z:M + 1])
                np.maximum(nr[:, z:M + 1], R[:, :M + 1 - z] + v_any[:, u, None], out=nr[:, z:M + 1])
                np.maximum(nr[:, z:M + 1], A[:, :M + 1 - z] + v_req[:, u, None], out=nr[:, z:M + 1])
            A, R = na, nr
            layers.append((A, R))
        totals = np.stack([r[:, :M + 1] for _, r in layers[1:]], axis=1)   # (Y, K, M + 1)
        flat = totals.reshape(Y, -1).argmax(axis=1)
        best = totals.reshape(Y, -1)[np.arange(Y), flat]
        configs = []
        for j in range(Y):                 # walk back: at each step, a size whose predecessor attains the value
            if not np.isfinite(best[j]):
                configs.append(())
                continue
            k, m = divmod(int(flat[j]), M + 1)
            k += 1
            items, in_r = [], True
            while k > 0:
                A_prev, R_prev = layers[k - 1]
                target = (layers[k][1] if in_r else layers[k][0])[j, m]
                tol = 1e-9 * max(1.0, abs(target))
                prev = back[m]
                if in_r:
                    stay = R_prev[j, prev] + v_any[j]
                    enter = A_prev[j, prev] + v_req[j]
                    if stay.max() >= target - tol:
                        u = int(np.argmax(stay >= target - tol))
                        t = int(t_any[j, u])
                    else:
                        u = int(np.argmax(enter >= target - tol))
                        t, in_r = int(t_req[j, u]), False
                else:
                    u = int(np.argmax(A_prev[j, prev] + v_any[j] >= target - tol))
                    t = int(t_any[j, u])
                items.append(t)
                m -= int(sizes[u])
                k -= 1
            configs.append(tuple(sorted(items)))
        return best, configs
