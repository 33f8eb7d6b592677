"""The trajectory LP: each request's path through a fixed number of batches, and the bounds its prices give.

For a fixed batch count Y, every request follows a path through batches 0..Y-1 over the slots of
:class:`.classstate.ClassStateSpace` (waiting at level t, resident at level t, done), one move per
batch: wait, (re)fill (I + t KV and tokens), decode (I + t KV, one token), hold idle (I + t - 1 KV),
or — where the policy evicts — be evicted (nothing this batch, waiting after) or evicted and refilled.
The LP chooses, per class, a convex combination of n_c paths (λ_p >= 0, Σ λ_p = n_c) so that every
batch j fits::

    Σ λ_p·kv_pj <= M + s_j      memory of running items and idle residents (s_j: priced slack)
    Σ λ_p·tok_pj <= C + o_j,   Σ λ_p·fill_pj <= P + o_j,   Σ λ_p·res_pj <= R_max + o_j
    z_j >= a_k + b_k·Σ λ_p·tok_pj            for every line k (the batch's non-attention time)
    M·(u_j + s_j) >= Σ λ_p·deckv_pj,  M·(v_j + s_j) >= Σ λ_p·fillkv_pj,  u_j + v_j >= 1
    (u_j + v_j <= 1 without hybrid batches; 0 <= u_j, v_j <= 1)

minimising Σ_j (z_j + db·u_j + pb·v_j + BIG·(s_j + o_j)) + Σ_p λ_p·(item costs of p). Every schedule
with exactly Y non-empty batches is a solution (integer λ, s = o = 0, u and v its decode and prefill
indicators), so the LP value bounds it from below. The priced slacks s and o keep every restricted
LP feasible, whatever its columns: the first columns (paths that never pause) cannot meet C, P or
R_max on their own when the optimum needs a request evicted and refilled (three requests of I = 1,
O = 2 under M = 4, R_max = 2 in three batches), and an infeasible restricted LP has no prices. Unlike the
class-state bound, the LP prices residency: a request that pauses either holds its KV or is evicted and pays
its refill. Paths are priced by column generation — a shortest path over slots and batches
(:meth:`TrajectoryLP.paths`) — and the LP is solved by GLOP (:mod:`.backends.lp`).

The prices say more than the root bound. Relaxing every batch row with prices y of the right sign
leaves one shortest-path problem per request, so for any state s after k batches, and Y in all::

    time of the batches left >= Σ_{j >= k} φ_j(y) + Σ_q s_q·V_k(q)

with V_k(q) the least priced path from slot q at batch k to done by batch Y and φ_j the least
priced value of batch j's own variables (Lagrangian duality: valid for any such prices, and equal
to the LP value at the start state once column generation has converged).
:class:`.trajectorybound.TrajectoryBound` keeps these tables for every Y a schedule better than the
incumbent may have, and :meth:`.classstate.ClassStateSpace.bound` takes the least over them, each Y's
value no lower than the class-state bound for that many batches. The configuration LP
(:mod:`.configlp`), which makes every batch whole, gives tables of the same form; where it is built,
each Y takes the larger.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..backends import lp as lp_engines

_SLACK_S = 1.0          # price of one token of KV overflow (s_j): keeps every restricted LP feasible
_UNIT_S = 1e-3          # the LP's unit of time


def is_available() -> bool:
    """GLOP (OR-Tools) is installed."""
    return lp_engines.is_available("glop")


@dataclass(frozen=True, slots=True)
class _Path:
    """A request's path: per batch, (slot, move) for the batches in which it runs or holds."""

    start: int               # the slot it starts from
    moves: tuple             # ((batch, slot, "decode" | "fill" | "hold"), ...)


class TrajectoryLP:
    """The trajectory LP for exactly ``Y`` batches from the start state, solved by column generation
    (module docstring)."""

    def __init__(self, sp, Y: int):
        self._setup(sp, Y)
        self.lp = lp_engines.new_lp("glop")
        self._build()

    def _setup(self, sp, Y: int) -> None:
        """The slot layout and the cost model's constants, in the LP's units."""
        self.sp, self.Y = sp, Y
        self.state = sp.start
        slots = sp.slots
        self.L = np.array([sl[3] for sl in slots], dtype=np.float64)
        self.held = np.array([sl[4] for sl in slots], dtype=np.float64)
        self.resident = np.array([sl[1] and sl[2] > 0 for sl in slots])
        self.fill_work = np.array(sp.slot_fill_work)
        S = len(slots)
        self.next = np.array([q if q >= 0 else S for q in sp.next_slot])
        self.waiting = np.array(sp.waiting_slot)
        self.num_requests = sum(len(idx) for _, _, idx in sp.classes)
        self.starts = [q for q, n in enumerate(self.state) if n]
        # times in the LP are in milliseconds (GLOP copes badly with costs of 1e-9 s next to KV of 1e3)
        self.t_lines = [(a / _UNIT_S, b / _UNIT_S) for a, b in sp.lines]
        self.t_db, self.t_pb, self.t_dk, self.t_pa, self.t_pt, self.t_rq = (
            x / _UNIT_S for x in (sp.decode_bias_s, sp.prefill_bias_s, sp.decode_kv_s, sp.prefill_attn_s,
                                  sp.prefill_token_s, sp.request_s))

    def _build(self) -> None:
        """Batch variables z, u, v, s, o and the rows of every batch; one convexity row per starting slot."""
        sp, Y, M, lp = self.sp, self.Y, self.sp.M, self.lp
        inf, slack = math.inf, _SLACK_S / _UNIT_S
        # upper bounds of z (the batch's non-attention time), s (KV overflow) and o (token/resident overflow)
        self.f_max = max(a + b * sp.C for a, b in self.t_lines)
        self.s_max = float(M * Y)
        self.o_max = float(self.num_requests * max(1.0, float(self.L.max(initial=1.0))) + sp.C + sp.P)
        self.z = [lp.add_col(1.0, 0.0, self.f_max, name=f"z{j}") for j in range(Y)]
        self.u = [lp.add_col(self.t_db, 0.0, 1.0, name=f"u{j}") for j in range(Y)]
        self.v = [lp.add_col(self.t_pb, 0.0, 1.0, name=f"v{j}") for j in range(Y)]
        self.s = [lp.add_col(slack, 0.0, self.s_max, name=f"s{j}") for j in range(Y)]
        self.o = [lp.add_col(slack, 0.0, self.o_max, name=f"o{j}") for j in range(Y)]
        self.rows: dict[str, list[int]] = {k: [] for k in ("kv", "tok", "fill", "res", "dec", "pre", "one", "alt")}
        self.lines: list[list[int]] = [[] for _ in self.t_lines]
        has_res = sp.R_max < self.num_requests
        for j in range(Y):
            z, u, v, s, o = self.z[j], self.u[j], self.v[j], self.s[j], self.o[j]
            self._row("kv", -inf, M, {s: -1.0})
            self._row("tok", -inf, sp.C, {o: -1.0})
            self._row("fill", -inf, sp.P, {o: -1.0})
            self._row("res", -inf, sp.R_max if has_res else inf, {o: -1.0})
            for (a, _), rows in zip(self.t_lines, self.lines):
                rows.append(lp.add_row(a, inf, {z: 1.0}))
            self._row("dec", 0.0, inf, {u: M, s: M})
            self._row("pre", 0.0, inf, {v: M, s: M})
            self._row("one", 1.0, inf, {u: 1.0, v: 1.0})
            self._row("alt", -inf, inf if sp.hybrid else 1.0, {u: 1.0, v: 1.0})
        self.convex = {q: lp.add_row(self.state[q], self.state[q]) for q in self.starts}
        for path in self._unpaused_paths():
            self.add(path)

    def _unpaused_paths(self):
        """The first columns: from each starting slot, the paths that run in every batch from some batch on."""
        S, Y = len(self.L), self.Y
        for q0 in self.starts:
            for first in range(Y):
                q, moves, j = q0, [], first
                while q != S and j < Y:
                    moves.append((j, q, "decode" if self.resident[q] else "fill"))
                    q, j = int(self.next[q]), j + 1
                if q != S:
                    break
                yield _Path(q0, tuple(moves))

    def _row(self, kind: str, lb: float, ub: float, coefs: dict) -> None:
        self.rows[kind].append(self.lp.add_row(lb, ub, coefs))

    def add(self, path: _Path) -> None:
        """A column for ``path``: its KV, tokens and indicators in each batch, its item costs."""
        R = self.rows
        coefs: dict = {}
        cost = 0.0

        def put(row, a: float) -> None:
            coefs[row] = coefs.get(row, 0.0) + a

        for j, q, move in path.moves:
            L = int(self.L[q])
            if move == "hold":
                put(R["kv"][j], self.held[q])
                put(R["res"][j], 1.0)
                continue
            tokens = L if move == "fill" else 1
            put(R["kv"][j], L)
            put(R["res"][j], 1.0)
            put(R["tok"][j], tokens)
            for (_, b), rows in zip(self.t_lines, self.lines):
                put(rows[j], -b * tokens)
            if move == "fill":
                put(R["fill"][j], L)
                put(R["pre"][j], -L)
                cost += self.t_pa * self.fill_work[q] + self.t_pt * L + self.t_rq
            else:
                put(R["dec"][j], -L)
                cost += self.t_dk * L + self.t_rq
        coefs[self.convex[path.start]] = 1.0
        self.lp.add_col(cost, 0.0, math.inf, coefs)

    @property
    def value_s(self) -> float:
        """The restricted LP's value (s) after the last solve."""
        return self.lp.objective_value * _UNIT_S

    def prices(self) -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray]:
        """From the LP's row prices (signs clipped to valid ones): φ_j per batch and, per batch and slot,
        the priced cost of a decode or fill (``run``), of a refill (residents), of staying."""
        sp, Y, R, rd = self.sp, self.Y, self.rows, self.row_dual
        dual = lambda row, sign: min(0.0, rd[row]) if sign < 0 else max(0.0, rd[row])
        L, held, res, fw = self.L, self.held, self.resident, self.fill_work
        run = np.empty((Y, len(L)))
        refill = np.empty((Y, len(L)))
        stay = np.empty((Y, len(L)))
        phi = []
        for j in range(Y):
            kv, tok, fill, rs = (dual(R[k][j], -1) for k in ("kv", "tok", "fill", "res"))
            dec, pre, one = (dual(R[k][j], +1) for k in ("dec", "pre", "one"))
            alt = 0.0 if sp.hybrid else dual(R["alt"][j], -1)
            ls = [dual(rows[j], +1) for rows in self.lines]
            per_token = sum(y * b for y, (_, b) in zip(ls, self.t_lines))      # line prices of one token
            fill_cost = (self.t_pa * fw + self.t_pt * L + self.t_rq - kv * L - rs
                         - (tok + fill - per_token) * L + pre * L)
            decode_cost = self.t_dk * L + self.t_rq - kv * L - rs - tok + per_token + dec * L
            run[j] = np.where(res, decode_cost, fill_cost)
            refill[j] = np.where(res, fill_cost, math.inf) if sp.evict else math.inf
            stay[j] = np.where(res, -kv * held - rs, 0.0)
            # batch j's own variables at their least priced values, plus the rows' right-hand sides
            own = [(1.0 - sum(ls), self.f_max), (self.t_db - sp.M * dec - one - alt, 1.0),
                   (self.t_pb - sp.M * pre - one - alt, 1.0),
                   (_SLACK_S / _UNIT_S + kv - sp.M * (dec + pre), self.s_max),
                   (_SLACK_S / _UNIT_S + tok + fill + (rs if sp.R_max < self.num_requests else 0.0),
                    self.o_max)]
            value = sum(min(0.0, rc) * ub for rc, ub in own)
            value += kv * sp.M + tok * sp.C + fill * sp.P + one + sum(y * a for y, (a, _) in zip(ls, self.t_lines))
            if sp.R_max < self.num_requests:
                value += rs * sp.R_max
            if not sp.hybrid:
                value += alt
            phi.append(value * _UNIT_S)
        return phi, run * _UNIT_S, refill * _UNIT_S, stay * _UNIT_S

    def paths(self, run: np.ndarray, refill: np.ndarray, stay: np.ndarray) -> np.ndarray:
        """V[k, q]: the least priced path from slot q at batch k to done by batch Y (inf if none); the
        last column is "done" (0). Residents may also be evicted (free, waiting at batch k + 1)."""
        Y, S = self.Y, len(self.L)
        V = np.full((Y + 1, S + 1), math.inf)
        V[:, S] = 0.0
        nxt, waiting, res = self.next, self.waiting, self.resident
        for k in range(Y - 1, -1, -1):
            after = V[k + 1]
            best = np.minimum(after[:S] + stay[k], run[k] + after[nxt])
            if self.sp.evict:
                best = np.minimum(best, np.where(res, np.minimum(after[waiting], refill[k] + after[nxt]), math.inf))
            V[k, :S] = best
        return V

    def best_path(self, q0: int, V: np.ndarray, run: np.ndarray, refill: np.ndarray, stay: np.ndarray,
                  first: int = 0, q: int | None = None, moves: list | None = None) -> _Path:
        """The path from slot ``q0`` at batch 0 that attains V[0, q0] (module docstring's moves); or, given
        ``moves`` up to batch ``first`` ending in slot ``q``, the best way on from there."""
        q, moves, S = (q0 if q is None else q), list(moves or []), len(self.L)
        for k in range(first, self.Y):
            if q == S:
                break
            after, target = V[k + 1], V[k, q]
            tol = 1e-12 * max(1.0, abs(target))
            nq = int(self.next[q])
            options = [(after[q] + stay[k, q], q, "hold" if self.resident[q] else None),
                       (run[k, q] + after[nq], nq, "decode" if self.resident[q] else "fill")]
            if self.sp.evict and self.resident[q]:
                options += [(after[self.waiting[q]], int(self.waiting[q]), None),
                            (refill[k, q] + after[nq], nq, "fill")]
            value, q_next, move = next(o for o in options if o[0] <= target + tol)
            if move is not None:
                moves.append((k, q, move))
            q = q_next
        return _Path(q0, tuple(moves))

    def _lagrangian(self, phi: list, V: np.ndarray) -> float:
        """The Lagrangian bound at the start state: Σ_j φ_j + Σ_slots count·V[0, slot]."""
        return sum(phi) + sum(self.state[q] * V[0, q] for q in self.starts)

    def _resolve(self) -> None:
        """Solve the restricted LP and keep its row duals (RuntimeError unless its engine finds the optimum)."""
        if not self.lp.solve():
            raise RuntimeError(f"{type(self).__name__} (Y={self.Y}): {self.lp.ENGINE} returned {self.lp.status}")
        self.row_dual = self.lp.row_duals()

    def solve(self, deadline: float, rel_tol: float = 1e-7) -> tuple[float, list, np.ndarray, bool]:
        """Column generation until no path prices out (or ``deadline``): (bound, φ, V, converged).

        The bound is the Lagrangian value at the start state — valid at every iteration, the LP value
        at convergence; ``best_prices`` keeps the item prices (run, refill, stay) that gave it."""
        best = (-math.inf, None, None)
        self.best_prices = None
        converged = False
        while True:
            self._resolve()
            phi, run, refill, stay = self.prices()
            V = self.paths(run, refill, stay)
            starts = [V[0, q] for q in self.starts]
            bound = self._lagrangian(phi, V)
            if bound > best[0]:
                best = (bound, phi, V)
                self.best_prices = (run, refill, stay)
            lp = self.value_s
            added = 0
            mu = [self.row_dual[self.convex[q]] * _UNIT_S for q in self.starts]   # read all before adding any
            for q, v, m in zip(self.starts, starts, mu):
                if v - m < -rel_tol * abs(lp):
                    self.add(self.best_path(q, V, run, refill, stay))
                    added += 1
            if not added or lp - best[0] <= rel_tol * abs(lp):
                converged = True
                break
            if time.perf_counter() > deadline:
                break
        return best[0], best[1], best[2], converged
