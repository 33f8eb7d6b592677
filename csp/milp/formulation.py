"""The CSP of InferMax §3.3 as a solver-neutral model: variables and constraints (1)–(5).

Indices: request i (position in the workload), batch j = 0..J-1 (the paper's
j + 1), state s = 0..J (state *after* batch s - 1; s = 0 is the paper's virtual
initial state). Every constraint family is one function whose docstring gives
the math it encodes. The semantics are those of ``infermax.state.ServingState``
(evictions happen before a batch; KV is freed after the batch that completes a
request), which generalise the paper's in two ways it leaves open: an evicted
request may be refilled in the same batch, and ``m`` after a batch excludes the
KV of requests that just completed, while the M limit (5) counts KV *during*
the batch, ``k_ij = m'_ij + c_ij``.

Notation: Pk_i = I_i + O_i - 1 (peak KV), G_is = tokens generated after state s,
D_is = decode phase, F_is = finished. A request in prefill phase has current
input I_is = I_i + G_is (the invariant that lets the chunk rule be written
without I_is), and a request in decode phase holds m_is = I_i + G_is - 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermax.costmodel import CostModel
from infermax.types import Limits, Workload

from .model import Model, Var
from .policy import Policy

Grid = list[list[Var]]          # [request][state s] or [request][batch j]


@dataclass(slots=True)
class Variables:
    """The named variable families of a formulation; each module fills the families it adds.

    A family left at None was not built (its objective, cut or model is not in this formulation):
    the warm start (:func:`infermax.csp.warmstart.assign`) and the read-back test for that.
    """

    # data per request, read by every family (:func:`add_variables`)
    I: list[int] = field(default_factory=list)         # prompt tokens I_i
    O: list[int] = field(default_factory=list)         # output tokens O_i
    Pk: list[int] = field(default_factory=list)        # peak KV I_i + O_i - 1
    cmax: list[int] = field(default_factory=list)      # largest chunk min(C, P, Pk_i)
    # state after batch s - 1, [request][s = 0..J] (:func:`add_variables`)
    m: Grid | None = None            # KV tokens cached
    inp: Grid | None = None          # current input size
    G: Grid | None = None            # tokens generated
    D: Grid | None = None            # decode phase
    F: Grid | None = None            # finished
    mz: Grid | None = None           # [m > 0]
    # per batch, [request][j = 0..J-1] (:func:`add_variables`)
    c: Grid | None = None            # tokens processed
    k: Grid | None = None            # KV held during the batch
    ev: Grid | None = None           # KV evicted before the batch
    e: Grid | None = None            # evicted before the batch
    g: Grid | None = None            # a token generated
    cz: Grid | None = None           # [c > 0]
    kz: Grid | None = None           # [k > 0]
    dp: Grid | None = None           # a decode step
    f: Grid | None = None            # completes in the batch
    nb: Grid | None = None           # KV blocks held (block_size > 1 only, :func:`add_kv_blocks`)
    y: list[Var] | None = None       # the batch is non-empty
    # batch time (:func:`.objectives.add_batch_time_terms`, or :func:`.aggregate.build_aggregate`)
    f0: float | None = None          # non-attention time of an empty batch, max_k a_k
    segs: list[tuple[int, float]] | None = None   # (length, slope) of the non-attention envelope
    yd: list[Var] | None = None      # the batch has a decode step
    yp: list[Var] | None = None      # the batch has a prefill chunk
    seg: Grid | None = None          # [batch][segment] tokens on each segment of the envelope
    kvd: Grid | None = None          # decode KV read
    qe: Grid | None = None           # ev² (exact batch times only)
    h: Grid | None = None            # 2k - c + 1 per prefill cell (None where no chunk can be)
    w: Grid | None = None            # c·h, twice the causal pairs
    pw: Grid | None = None           # c·h/2 in prefill phase
    # event times (:mod:`.objectives`)
    start: list[Var] | None = None   # batch start, s
    end: list[Var] | None = None     # batch end, s
    completion: dict[int, Var] | None = None    # {request: completion time}
    first: dict[int, Var] | None = None         # {request: first-token time}
    started: dict[int, list[Var]] | None = None  # {request: [G_is >= 1] per state}
    ft: dict[int, list[Var]] | None = None      # {request: [first token in batch j]}
    # strengthening and class flows (:mod:`.strengthening`, :mod:`.flows`, :mod:`.aggregate`)
    gam: list[list[list[Var]]] | None = None   # [request][state][t] = [G_is >= t + 1]
    classes: list[list[int]] | None = None     # identical-request classes (aggregate model)
    flows: list | None = None                  # one :class:`.flows.ClassFlow` per class


@dataclass
class Formulation:
    """A built model plus the handles needed to hint it, read it back and explain it."""

    model: Model
    workload: Workload
    limits: Limits          # effective limits (policy applied)
    cost: CostModel
    policy: Policy
    horizon: int
    objective: str
    v: Variables = field(default_factory=Variables)
    info: dict[str, Any] = field(default_factory=dict)
    #: auxiliary variables and how to compute each from the others (filled in order)
    derived: list[tuple[Var, Callable[[np.ndarray], float]]] = field(default_factory=list)

    def derive(self, var: Var, fn: Callable[[np.ndarray], float]) -> None:
        """Record how ``var`` follows from earlier variables (used to turn a schedule into a hint)."""
        self.derived.append((var, fn))

    @property
    def num_requests(self) -> int:
        return len(self.workload)


def _grid(model: Model, B: int, n: int, make) -> list[list[Var]]:
    return [[make(i, s) for s in range(n)] for i in range(B)]


def add_variables(fm: Formulation) -> None:
    """Variables of §3.3 with bounds tightened per request.

    State (s = 0..J): m_is ∈ [0, Pk_i - 1] KV after the batch, I_is ∈ [I_i, Pk_i]
    input size, G_is ∈ [max(0, O_i - (J - s)), min(O_i, s)] tokens generated (one
    per batch at most, all O_i by batch J), D_is decode phase, F_is finished,
    mz_is = [m_is > 0].
    Batch (j): c_ij ∈ [0, min(C, P, Pk_i)] tokens, k_ij ∈ [0, Pk_i] KV held during
    the batch, ev_ij = e_ij·m_is evicted KV, e_ij evicted before the batch, g_ij a
    token generated, cz_ij = [c_ij > 0], kz_ij = [k_ij > 0], dp_ij = d_ij ∧ cz_ij
    (the paper's dg: a decode step), f_ij completes; y_j = the batch is non-empty.
    """
    m, w, lim, J = fm.model, fm.workload, fm.limits, fm.horizon
    B = len(w)
    I = w.input_lens.tolist()
    O = w.output_lens.tolist()
    Pk = [a + b - 1 for a, b in zip(I, O)]
    cmax = [min(lim.C, lim.P, p) for p in Pk]
    v = fm.v
    v.I, v.O, v.Pk, v.cmax = I, O, Pk, cmax

    def state(name, lo, hi):
        return _grid(m, B, J + 1, lambda i, s: m.const(lo(i, 0), f"{name}[{i},0]") if s == 0
                     else m.int_var(lo(i, s), hi(i, s), f"{name}[{i},{s}]"))

    zero = lambda i, s: 0
    v.m = state("m", zero, lambda i, s: Pk[i] - 1)
    v.inp = state("I", lambda i, s: I[i], lambda i, s: Pk[i])
    v.G = state("G", lambda i, s: max(0, O[i] - (J - s)), lambda i, s: min(O[i], s))
    v.D = state("D", zero, lambda i, s: 1 if O[i] > 1 else 0)
    v.F = state("F", lambda i, s: 1 if s >= J else 0, lambda i, s: 1 if s >= O[i] else 0)
    v.mz = state("mz", zero, lambda i, s: 1)

    def batch(name, hi):
        return _grid(m, B, J, lambda i, j: m.int_var(0, hi(i), f"{name}[{i},{j}]"))

    v.c = batch("c", lambda i: cmax[i])
    v.k = batch("k", lambda i: Pk[i])
    v.ev = batch("ev", lambda i: Pk[i] - 1)
    v.e = batch("e", lambda i: 1 if fm.policy.allow_eviction else 0)
    v.g, v.cz, v.kz, v.dp, v.f = (batch(name, lambda i: 1) for name in ("g", "cz", "kz", "dp", "f"))
    v.y = [m.bool_var(f"y[{j}]") for j in range(J)]


def add_termination(fm: Formulation) -> None:
    """(1) Σ_j g_ij = O_i, kept as running totals G_i,s+1 = G_is + g_ij with G_iJ = O_i.

    F_is = [G_is = O_i]: G_is >= O_i·F_is and G_is <= O_i - 1 + F_is.
    """
    m, v, J = fm.model, fm.v, fm.horizon
    for i in range(fm.num_requests):
        O = v.O[i]
        m.add(v.G[i][J] == O, "termination")
        for s in range(1, J + 1):
            m.add(v.G[i][s] == v.G[i][s - 1] + v.g[i][s - 1], "termination")
            m.add(v.G[i][s] >= O * v.F[i][s], "termination")
            m.add(v.G[i][s] <= O - 1 + v.F[i][s], "termination")


def add_input_size(fm: Formulation) -> None:
    """(2) I_ij = m_i,j-1 + 1 if e_ij = d_ij = 1, else I_i,j-1 (eq. (6) is its big-M form).

    An eviction in decode phase turns the generated tokens into prompt. With
    the ServingState invariant, a request in prefill phase that has not
    finished has I_is = I_i + G_is (a link the rest of the model relies on).
    """
    m, v, J = fm.model, fm.v, fm.horizon
    for i in range(fm.num_requests):
        for j in range(J):
            s = j
            ed = m.bool_var(f"ed[{i},{j}]")          # e_ij ∧ d_ij
            fm.derive(ed, lambda x, a=v.e[i][j].index, b=v.D[i][s].index: x[a] * x[b])
            m.add(ed <= v.e[i][j], "input-size")
            m.add(ed <= v.D[i][s], "input-size")
            m.add(ed >= v.e[i][j] + v.D[i][s] - 1, "input-size")
            m.add(v.inp[i][s + 1] == v.m[i][s] + 1, "input-size", enforce=[(ed, 1)])
            m.add(v.inp[i][s + 1] == v.inp[i][s], "input-size", enforce=[(ed, 0)])
            m.add(v.inp[i][s + 1] == v.I[i] + v.G[i][s + 1], "input-size",
                  enforce=[(v.D[i][s + 1], 0), (v.F[i][s + 1], 0)])


def add_memory_management(fm: Formulation) -> None:
    """(3) m_ij = 0 on eviction, else m_i,j-1 + c_ij — with KV freed at completion.

    ev_ij = e_ij·m_i,j-1 (exact bool×int, eq. (6) with M = Pk_i - 1),
    k_ij = m_i,j-1 - ev_ij + c_ij (KV held during batch j),
    m_ij = k_ij - Pk_i·f_ij with f_ij = F_ij - F_i,j-1 (a completing request
    holds exactly Pk_i during its last batch and nothing after),
    mz_ij = [m_ij >= 1], kz_ij = [k_ij >= 1], e_ij <= mz_i,j-1 (only a request
    holding KV can be evicted), e_ij <= y_j.
    """
    m, v, J = fm.model, fm.v, fm.horizon
    for i in range(fm.num_requests):
        Pk = v.Pk[i]
        for j in range(J):
            s = j
            e, ev, k = v.e[i][j], v.ev[i][j], v.k[i][j]
            m.add(ev <= (Pk - 1) * e, "memory")
            m.add(ev <= v.m[i][s], "memory")
            m.add(ev >= v.m[i][s] - (Pk - 1) * (1 - e), "memory")
            m.add(k == v.m[i][s] - ev + v.c[i][j], "memory")
            m.add(v.f[i][j] == v.F[i][s + 1] - v.F[i][s], "memory")
            m.add(v.m[i][s + 1] == k - Pk * v.f[i][j], "memory")
            m.add(v.m[i][s + 1] <= (Pk - 1) * v.mz[i][s + 1], "memory")
            m.add(v.m[i][s + 1] >= v.mz[i][s + 1], "memory")
            m.add(k <= Pk * v.kz[i][j], "memory")
            m.add(k >= v.kz[i][j], "memory")
            m.add(e <= v.mz[i][s], "memory")
            m.add(e <= v.y[j], "memory")


def add_chunk_control(fm: Formulation) -> None:
    """(4) c_ij = 0 if evicted-and-idle; c_ij <= 1 in decode phase; prefill chunks fit the input.

    With I_is = I_i + G_is in prefill and m_is = I_i + G_is - 1 in decode, both
    cases are the single rule k_ij <= I_i + G_is - 1 + g_ij, and a token is
    generated exactly when the request reaches its input: g_ij = 1 ⇒ k_ij >=
    I_i + G_is (written k >= (I+O)·g + G - O). Phase: D_i,s+1 = (g_ij ∨ (D_is ∧
    ¬e_ij)) ∧ ¬F_i,s+1; dp_ij = D_is ∧ ¬e_ij ∧ cz_ij; cz_ij = [c_ij >= 1]; a
    finished request processes nothing.
    """
    m, v, J = fm.model, fm.v, fm.horizon
    for i in range(fm.num_requests):
        I, O, cmax = v.I[i], v.O[i], v.cmax[i]
        for j in range(J):
            s = j
            c, k, g, e, cz, dp = v.c[i][j], v.k[i][j], v.g[i][j], v.e[i][j], v.cz[i][j], v.dp[i][j]
            D0, D1, G0 = v.D[i][s], v.D[i][s + 1], v.G[i][s]
            m.add(k <= I - 1 + G0 + g, "chunk")
            m.add(k >= (I + O) * g + G0 - O, "chunk")
            m.add(c <= cmax * cz, "chunk")
            m.add(c >= cz, "chunk")
            m.add(c <= cmax * (1 - v.F[i][s]), "chunk")
            m.add(D1 >= g - v.f[i][j], "phase")
            m.add(D1 >= D0 - e - v.f[i][j], "phase")
            m.add(D1 <= g + D0, "phase")
            m.add(D1 <= g + 1 - e, "phase")
            m.add(D1 <= 1 - v.F[i][s + 1], "phase")
            m.add(dp <= D0, "phase")
            m.add(dp <= 1 - e, "phase")
            m.add(dp <= cz, "phase")
            m.add(dp >= D0 - e + cz - 1, "phase")


def add_batch_limits(fm: Formulation) -> None:
    """(5) Σ_i c_ij <= C, Σ_i (c_ij - dp_ij) <= P, Σ_i k_ij <= M, Σ_i kz_ij <= R_max.

    The KV limit counts KV during the batch (k, not the paper's m after it). The
    batch indicator: cz_ij <= y_j <= Σ_i cz_ij, and y_j >= y_j+1 pushes the
    empty batches of the horizon to its end (they cost nothing).
    """
    m, v, J, lim = fm.model, fm.v, fm.horizon, fm.limits
    B = fm.num_requests
    for j in range(J):
        y = v.y[j]
        m.add(sum((v.c[i][j] for i in range(B)), 0 * y) <= lim.C * y, "batch")
        m.add(sum((v.c[i][j] - v.dp[i][j] for i in range(B)), 0 * y) <= lim.P, "batch")
        m.add(sum((v.k[i][j] for i in range(B)), 0 * y) <= lim.M * y, "batch")
        if lim.R_max is not None and lim.R_max < B:
            m.add(sum((v.kz[i][j] for i in range(B)), 0 * y) <= lim.R_max * y, "batch")
        m.add(y <= sum((v.cz[i][j] for i in range(B)), 0 * y), "batch")
        for i in range(B):
            m.add(v.cz[i][j] <= y, "batch")
        if j + 1 < J:
            m.add(y >= v.y[j + 1], "batch-order")


def add_kv_blocks(fm: Formulation) -> None:
    """(5b) KV in whole blocks when ``Limits.block_size`` = b > 1: Σ_i n_ij <= (M // b)·y_j with
    integer n_ij ∈ [0, ceil(Pk_i / b)] and b·n_ij >= k_ij, so n_ij >= ceil(k_ij / b) (a solution
    never needs more; a schedule's hint sets it to exactly that). Nothing is added when b = 1.
    """
    m, v, J, lim = fm.model, fm.v, fm.horizon, fm.limits
    b = lim.block_size
    if b == 1:
        return
    B = fm.num_requests
    v.nb = _grid(m, B, J, lambda i, j: m.int_var(0, -(-v.Pk[i] // b), f"nb[{i},{j}]"))
    for i in range(B):
        for j in range(J):
            m.add(b * v.nb[i][j] >= v.k[i][j], "kv-blocks")
            fm.derive(v.nb[i][j], lambda x, a=v.k[i][j].index: float(-(-round(x[a]) // b)))
    for j in range(J):
        y = v.y[j]
        m.add(sum((v.nb[i][j] for i in range(B)), 0 * y) <= lim.num_blocks * y, "kv-blocks")


def add_policy(fm: Formulation) -> None:
    """Policy classes (§3.3 last paragraph, Table 1).

    No eviction: e_ij = 0 (bounds). No chunked prefill: every prefill row
    completes its (re)fill, cz_ij - dp_ij <= g_ij. No hybrid batching:
    yd_j + yp_j <= 1 (added with the batch-time terms in :mod:`.objectives`).
    P and R_max are folded into the effective limits of (5).
    """
    m, v, J = fm.model, fm.v, fm.horizon
    if not fm.policy.chunked_prefill:
        for i in range(fm.num_requests):
            for j in range(J):
                m.add(v.cz[i][j] - v.dp[i][j] <= v.g[i][j], "policy")


def build_core(fm: Formulation) -> None:
    """Variables and constraint families (1)–(5) plus the policy class."""
    add_variables(fm)
    add_termination(fm)
    add_input_size(fm)
    add_memory_management(fm)
    add_chunk_control(fm)
    add_batch_limits(fm)
    add_kv_blocks(fm)
    add_policy(fm)


def check_instance(workload: Workload, limits: Limits, policy: Policy) -> None:
    """Raise ValueError naming the first request no schedule can serve (before any solver runs)."""
    workload.check_fits(limits)
    if not policy.chunked_prefill:
        cap = min(limits.C, limits.P)
        for r in workload.requests:
            if r.input_len > cap:
                raise ValueError(f"request {r.id} cannot be prefilled without chunking: input_len = "
                                 f"{r.input_len} > min(C, P) = {cap} under policy no-chunked-prefill")
    if limits.R_max is not None and limits.R_max < 1:
        raise ValueError(f"Limits.R_max must be >= 1, got {limits.R_max}")


def empty_formulation(workload: Workload, limits: Limits, cost: CostModel, policy: Policy,
                      horizon: int, objective: str) -> Formulation:
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1 batch, got {horizon}")
    model = Model(name=f"infermax-{objective}")
    return Formulation(model=model, workload=workload, limits=policy.effective_limits(limits), cost=cost,
                       policy=policy, horizon=horizon, objective=objective)


def num_identical_classes(workload: Workload) -> list[list[int]]:
    """Groups of request indices that are interchangeable (same I, O, arrival and tag: a per-tag
    objective such as ``ttft:short`` tells requests of different tags apart)."""
    keys: dict[tuple, list[int]] = {}
    for i, r in enumerate(workload.requests):
        keys.setdefault((r.input_len, r.output_len, r.arrival_s, r.tag), []).append(i)
    return list(keys.values())


def as_array(grid: list[list[Var]]) -> np.ndarray:
    """Variable indices of a 2-D grid as an int64 array."""
    return np.array([[x.index for x in row] for row in grid], dtype=np.int64)
