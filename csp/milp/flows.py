"""Aggregated class flows: a strong extended formulation for interchangeable requests.

Requests with the same (I, O, arrival) form a class. Seen by token count, a
request at the start of batch j is *resident* with t tokens (R_t, decode phase,
holding I + t - 1 KV), *waiting* with t tokens (W_t: not started, or evicted
since its t-th token and refilling), or done. During batch j it follows one arc:

    R_t --decode (XD)--> R_t+1      R_t --idle (H)--> R_t
    R_t --evict (EW)--> W_t         R_t --evict + refill whole (EC)--> R_t+1
    W_t --(re)fill completes (XP)--> R_t+1      W_t --wait / partial chunk (WW)--> W_t

(R_O is "done".) The counts of a class on these arcs form an integer flow in a
time-expanded graph; any schedule induces one, and its LP relaxation is a
flow polytope, far tighter than the big-M phase logic. The arcs carry exact
KV: a request generating token t+1 holds I + t, an idle resident holds
I + t - 1, an eviction at R_t discards I + t - 1. That makes these links exact:

    Σ_class g_ij = Σ_t (XD + EC + XP)_tj       Σ_class dp_ij = Σ_t XD_tj
    Σ_class ev_ij = Σ_t (I+t-1)(EW + EC)_tj     Σ_class kvd_ij = Σ_t (I+t) XD_tj
    Σ_class D_ij = Σ_t R_tj                     Σ_class F_ij = done_j

and gives per-batch memory and bin-packing rows without any big-M:
Σ_classes Σ_t f((I+t)/M)(XD+EC+XP) + f((I+t-1)/M) H <= y_j for dual-feasible f
(:mod:`.strengthening`). Evictions of prefill-phase requests are outside the
arcs; the links become inequalities when the dominance rule is off.
"""
from __future__ import annotations

from dataclasses import dataclass

from .formulation import Formulation, Grid, num_identical_classes
from .model import LinExpr, Var
from .strengthening import best_dff, dff_value

_FLOW_NAMES = ("XD", "H", "EW", "EC", "XP", "WW")


@dataclass(slots=True)
class ClassFlow:
    """The flow variables of one class of identical requests: nodes [t][state s], arcs [t][batch j]."""

    cls: list[int]       # the requests of the class (positions in the workload)
    I: int               # their prompt tokens
    O: int               # their output tokens
    R: Grid              # resident with t tokens
    W: Grid              # waiting with t tokens
    done: list[Var]      # done, per state
    XD: Grid             # decode: R_t -> R_t+1
    H: Grid              # idle: R_t -> R_t
    EW: Grid             # evict: R_t -> W_t
    EC: Grid             # evict and refill whole: R_t -> R_t+1
    XP: Grid             # (re)fill completes: W_t -> R_t+1
    WW: Grid             # wait or partial chunk: W_t -> W_t


def _sum(items) -> LinExpr:
    return sum(items, LinExpr())


def add_class_flows(fm: Formulation, dominance: bool, dff_ks: int = 3) -> None:
    """Flow variables, conservation, links to the per-request model, and the per-batch cuts.

    Per class: its flows (:func:`class_flow`), their links to the per-request variables batch by batch
    (:func:`_link_batch`) and state by state (:func:`_link_states`), its share of each batch's loads
    (:func:`_add_loads`); then the per-batch rows on the summed loads (:func:`_add_batch_rows`).
    """
    v, J = fm.v, fm.horizon
    evictable = fm.policy.allow_eviction
    ks = _dff_family(fm, dff_ks)
    fm.info["flow_dff_ks"] = ks
    loads: list[dict] = [{"mem": LinExpr(), "dec": {k: LinExpr() for k in ks}, "pre": {k: LinExpr() for k in ks},
                          "all": {k: LinExpr() for k in ks}} for _ in range(J)]
    v.flows = []
    counts: list[dict] = [{"dec": [], "pre": []} for _ in range(J)]
    for cls in num_identical_classes(fm.workload):
        i0 = cls[0]
        n, I, O = len(cls), v.I[i0], v.O[i0]
        F = class_flow(fm, cls, n, I, O, evictable)
        v.flows.append(F)
        for j in range(J):
            _link_batch(fm, cls, F, I, O, j, dominance)
            _add_loads(loads[j], counts[j], F, I, O, j, ks, fm.limits.M)
        _link_states(fm, cls, F, O)
    _add_batch_rows(fm, loads, counts, ks)


def _generating(F: ClassFlow, t: int, j: int) -> LinExpr:
    """Requests of the class generating their token t + 1 in batch j: decodes, refills after eviction, fills."""
    return F.XD[t][j] + F.EC[t][j] + F.XP[t][j]


# complexity: one sum per row of the batch's links (the docstring's list)
def _link_batch(fm: Formulation, cls: list[int], F: ClassFlow, I: int, O: int, j: int, dominance: bool) -> None:
    """Batch j's per-request sums of the class (tokens generated, decodes, KV read, evictions, KV held) equal
    (or, without dominance, bound) the flows' counts. Its complexity is the sums, one per row."""
    m, v = fm.model, fm.v
    m.add(_sum(v.g[i][j] for i in cls) == _sum(_generating(F, t, j) for t in range(O)), "flow-link")
    m.add(_sum(v.dp[i][j] for i in cls) == _sum(F.XD[t][j] for t in range(O)), "flow-link")
    m.add(_sum(v.kvd[i][j] for i in cls) == _sum((I + t) * F.XD[t][j] for t in range(O)), "flow-link")
    ev = _sum((I + t - 1) * (F.EW[t][j] + F.EC[t][j]) for t in range(1, O))
    ee = _sum(F.EW[t][j] + F.EC[t][j] for t in range(1, O))
    if dominance:
        m.add(_sum(v.ev[i][j] for i in cls) == ev, "flow-link")
        m.add(_sum(v.e[i][j] for i in cls) == ee, "flow-link")
    else:
        m.add(_sum(v.ev[i][j] for i in cls) >= ev, "flow-link")
        m.add(_sum(v.e[i][j] for i in cls) >= ee, "flow-link")
    m.add(_sum(v.k[i][j] for i in cls) >= _sum((I + t) * _generating(F, t, j) for t in range(O))
          + _sum((I + t - 1) * F.H[t][j] for t in range(1, O)), "flow-link")


def _add_loads(load: dict, count: dict, F: ClassFlow, I: int, O: int, j: int, ks: list[int], M: int) -> None:
    """Add the class's share of batch j to its KV load, its dual-feasible loads (all, decodes, prefills)
    and its decode and prefill counts."""
    for t in range(O):
        gen_t = _generating(F, t, j)
        count["dec"].append(F.XD[t][j])
        count["pre"] += [F.EC[t][j], F.XP[t][j]]
        w_gen, w_hold = I + t, I + t - 1
        load["mem"] = load["mem"] + w_gen * gen_t + (w_hold * F.H[t][j] if t else 0)
        for k in ks:                      # u_k(w/M)·k(k+1) is an integer: exact rows on every backend
            den = k * (k + 1)
            fg = int(dff_value(k, w_gen, M) * den)
            fh = int(dff_value(k, w_hold, M) * den) if t else 0
            load["all"][k] = load["all"][k] + fg * gen_t + fh * F.H[t][j]
            load["dec"][k] = load["dec"][k] + fg * F.XD[t][j]
            load["pre"][k] = load["pre"][k] + fg * (F.EC[t][j] + F.XP[t][j])


def _link_states(fm: Formulation, cls: list[int], F: ClassFlow, O: int) -> None:
    """At every state s, the class's requests decoding, done and their tokens generated match the node counts."""
    m, v = fm.model, fm.v
    for s in range(fm.horizon + 1):
        m.add(_sum(v.D[i][s] for i in cls) == _sum(F.R[t][s] for t in range(1, O)), "flow-link")
        m.add(_sum(v.F[i][s] for i in cls) == F.done[s], "flow-link")
        m.add(_sum(v.G[i][s] for i in cls) == _sum(t * (F.R[t][s] + F.W[t][s]) for t in range(O)) + O * F.done[s],
              "flow-link")


def _add_batch_rows(fm: Formulation, loads: list[dict], counts: list[dict], ks: list[int]) -> None:
    """Per batch: KV load <= M, decodes and prefills at most the requests that fit, and the dual-feasible cuts."""
    m, v, M = fm.model, fm.v, fm.limits.M
    I_min = min(v.I)
    num_gen = max(1, M // I_min)                 # requests generating in one batch hold >= I_min each
    num_dec = max(1, M // (I_min + 1))           # decoding requests hold >= I_min + 1 each
    if fm.limits.R_max is not None:
        num_gen, num_dec = min(num_gen, fm.limits.R_max), min(num_dec, fm.limits.R_max)
    for j in range(fm.horizon):
        m.add(loads[j]["mem"] <= M * v.y[j], "flow-memory")
        m.add(_sum(counts[j]["dec"]) <= num_dec * v.yd[j], "flow-count")
        m.add(_sum(counts[j]["pre"]) <= num_gen * v.yp[j], "flow-count")
        for k in ks:
            den = k * (k + 1)
            m.add(loads[j]["all"][k] <= den * v.y[j], "flow-dff")
            m.add(loads[j]["dec"][k] <= den * v.yd[j], "flow-dff")
            m.add(loads[j]["pre"][k] <= den * v.yp[j], "flow-dff")


def _dff_family(fm: Formulation, count: int) -> list[int]:
    """The best dual-feasible function u_k for this instance, then the small k's (distinct)."""
    best = best_dff(fm.workload, fm.limits.M)[0]
    return ([best] + [k for k in (1, 2, 3, 4, 5) if k != best])[:count]


# complexity: one block per node and arc family of the flow, with its conservation rows
def class_flow(fm: Formulation, cls: list[int], n: int, I: int, O: int, evictable: bool) -> ClassFlow:
    """Node counts R_t, W_t, done at every state and arc counts on every batch, with conservation.

    Its branches are the arc families and their boundary levels (t = 0, t = O - 1, eviction allowed or
    not), one conservation row per node, read top to bottom."""
    m, J = fm.model, fm.horizon
    name = f"cls{cls[0]}"
    # nodes: state s = start of batch s
    R = [[m.int_var(0, n if 1 <= t <= s else 0, f"{name}.R[{t},{s}]") for s in range(J + 1)] for t in range(O)]
    W = [[m.int_var(0, n if t <= s else 0, f"{name}.W[{t},{s}]") for s in range(J + 1)] for t in range(O)]
    done = [m.int_var(0, n if s >= O else 0, f"{name}.done[{s}]") for s in range(J + 1)]
    arcs = {}
    for a in _FLOW_NAMES:
        resident = a in ("XD", "H", "EW", "EC")
        evict = a in ("EW", "EC")
        arcs[a] = [[m.int_var(0, 0 if (resident and t == 0) or (evict and not evictable) or t > j else n,
                              f"{name}.{a}[{t},{j}]") for j in range(J)] for t in range(O)]
    F = ClassFlow(cls=cls, I=I, O=O, R=R, W=W, done=done, **arcs)
    m.add(F.W[0][0] == n, "flow")
    m.add(F.done[0] == 0, "flow")
    m.add(F.done[J] == n, "flow")
    for t in range(1, O):
        m.add(F.R[t][0] == 0, "flow")
        m.add(F.W[t][0] == 0, "flow")
    m.lb[F.W[0][0].index] = m.ub[F.W[0][0].index] = float(n)
    for j in range(J):
        for t in range(O):
            if t >= 1:
                m.add(F.R[t][j] == F.XD[t][j] + F.H[t][j] + F.EW[t][j] + F.EC[t][j], "flow")
            m.add(F.W[t][j] == F.XP[t][j] + F.WW[t][j], "flow")
            up = F.XD[t - 1][j] + F.EC[t - 1][j] + F.XP[t - 1][j] if t >= 1 else LinExpr()
            if t >= 1:
                m.add(F.R[t][j + 1] == F.H[t][j] + up, "flow")
                m.add(F.W[t][j + 1] == F.WW[t][j] + F.EW[t][j], "flow")
            else:
                m.add(F.W[0][j + 1] == F.WW[0][j], "flow")
        last = O - 1
        m.add(F.done[j + 1] == F.done[j] + F.XD[last][j] + F.EC[last][j] + F.XP[last][j], "flow")
    return F


# complexity: one block per flow variable family, filled from the per-request arrays
def assign_flows(fm: Formulation, x, gen, D, fin, e, g) -> None:
    """Fill the flow variables of ``x`` from per-request arrays (state [B, J+1], batch [B, J]).

    Its branches classify each request's move in each batch into one arc, as :func:`class_flow` defines them."""
    J = fm.horizon
    for cls, F in zip(num_identical_classes(fm.workload), fm.v.flows or []):
        for grid in (F.R, F.W) + tuple(getattr(F, a) for a in _FLOW_NAMES):
            for row in grid:
                for var in row:
                    x[var.index] = 0.0
        for s in range(J + 1):
            x[F.done[s].index] = float(sum(fin[i, s] for i in cls))
            for i in cls:
                if fin[i, s]:
                    continue
                t = int(gen[i, s])
                node = F.R if D[i, s] else F.W
                x[node[t][s].index] += 1.0
                if s == J:
                    continue
                if D[i, s]:
                    arc = ("EC" if g[i, s] else "EW") if e[i, s] else ("XD" if g[i, s] else "H")
                else:
                    arc = "XP" if g[i, s] else "WW"
                x[getattr(F, arc)[t][s].index] += 1.0
