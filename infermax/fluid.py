"""The fluid model of Ao, Luo, Simchi-Levi, Wang ("Optimizing LLM Inference: Fluid-Guided Online Scheduling
with Memory Constraints", arXiv 2504.11320, 2025): the equilibrium batch and the stability limit.

Requests of type j arrive at λ_j per second with prompt I and output O (their moments over the type).
In the fluid equilibrium every batch lasts τ seconds and admits x_j = λ_j·τ prompts of type j (fractional),
each of which then decodes once per batch until done, so a batch holds, per unit of τ (Little's law over
the O batches a request spends: its prefill, which gives the first token, and O − 1 decodes):

    prefill tokens    n_p = Σ λ_j E[I]              decode tokens  n_d = Σ λ_j E[O − 1]
    requests          r   = Σ λ_j E[O]              decode KV read k   = Σ λ_j E[(O − 1)·I + O(O − 1)/2]
    prefill work      w   = Σ λ_j E[I(I + 1)/2]     KV held        s   = Σ λ_j E[I·O + O(O − 1)/2]

(KV counted as infermax counts it, m + c during a batch). Under a linear cost model
(:func:`infermax.costmodel.linear_coefficients`) the batch time of that batch is
``max_k (A_k + τ·B_k)`` (every fluid batch holds both prefill and decode work, so both indicator biases
are in A_k), and the equilibrium is its fixed point τ* = max_k A_k / (1 − B_k), which exists when every
B_k < 1. Scaling every rate by ρ scales B_k by ρ: the *compute* limit is ρ = 1 / max_k B_k. The limits
bound the rest: KV τ·ρ·s <= M, tokens τ·ρ·(n_p + n_d) <= C, prefill tokens τ·ρ·n_p <= P and running
requests τ·ρ·r <= R_max; each grows with ρ, so :func:`stability_limit` finds the largest stable ρ by
bisection and names the constraint that binds. (Ao et al. take the batch time linear in the tokens
processed; the linear model here adds the attention terms, which the fluid batch also holds.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .costmodel import CostModel, linear_coefficients
from .types import Limits, Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class FluidType:
    """One request type: its name, arrival rate (requests/s) and the moments of (I, O) the model reads."""

    name: str
    rate_per_s: float
    prompt: float            # E[I]
    output: float            # E[O]
    prompt_sq: float         # E[I²]
    prompt_x_output: float   # E[I·O]
    output_sq: float         # E[O²]


def fluid_types(workload: Workload, rate_per_s: float | None = None) -> list[FluidType]:
    """The types of ``workload``: one per request tag (untagged requests: one type ``""``), with moments
    over their requests and rates in proportion to their counts; the total rate is ``rate_per_s``, else the
    workload's own ((n − 1) / its arrival span; inf when every request arrives at once)."""
    tags = np.array([r.tag or "" for r in workload.requests])
    I, O = workload.input_lens.astype(np.float64), workload.output_lens.astype(np.float64)
    if rate_per_s is None:
        T = workload.arrivals_s
        span = float(T.max() - T.min())
        rate_per_s = (len(T) - 1) / span if span > 0 else math.inf
    out = []
    for tag in dict.fromkeys(tags.tolist()):
        sel = tags == tag
        i, o = I[sel], O[sel]
        out.append(FluidType(name=tag, rate_per_s=rate_per_s * sel.sum() / len(tags), prompt=float(i.mean()),
                             output=float(o.mean()), prompt_sq=float((i * i).mean()),
                             prompt_x_output=float((i * o).mean()), output_sq=float((o * o).mean())))
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class FluidPoint:
    """The equilibrium at rate scale ``scale``: batch time (s), per-batch admissions of each type, and the
    batch's tokens, prefill tokens, running requests and KV held (all per batch, fractional)."""

    scale: float
    batch_time_s: float
    admissions: dict[str, float]
    tokens: float
    prefill_tokens: float
    running: float
    kv_tokens: float

    @property
    def throughput_rps(self) -> float:
        """Requests completed per second (= arriving, in equilibrium)."""
        return sum(self.admissions.values()) / self.batch_time_s


def _per_tau(types: list[FluidType]) -> dict[str, float]:
    """The batch's contents per second of τ at scale 1 (the module docstring's n_p, n_d, r, k, w, s)."""
    lam = np.array([t.rate_per_s for t in types])
    I, O = np.array([t.prompt for t in types]), np.array([t.output for t in types])
    I2, IO, O2 = (np.array([t.prompt_sq for t in types]), np.array([t.prompt_x_output for t in types]),
                  np.array([t.output_sq for t in types]))
    return {"n_p": float(lam @ I), "n_d": float(lam @ (O - 1)), "r": float(lam @ O),
            "k": float(lam @ (IO - I + (O2 - O) / 2)), "w": float(lam @ ((I2 + I) / 2)),
            "s": float(lam @ (IO + (O2 - O) / 2))}


def _lines(types: list[FluidType], cost: CostModel) -> list[tuple[float, float]]:
    """(A_k, B_k) at scale 1: the fluid batch time is max_k (A_k + τ·B_k)."""
    co = linear_coefficients(cost, "the fluid model")
    q = _per_tau(types)
    rest = (co.request_s * q["r"] + co.decode_kv_s * q["k"] + co.prefill_attn_s * q["w"]
            + co.prefill_token_s * q["n_p"])
    bias = co.decode_bias_s + co.prefill_bias_s
    return [(a + bias, b * (q["n_p"] + q["n_d"]) + rest) for a, b in co.nonattn_lines]


def _check_types(types: list[FluidType]) -> None:
    if not types:
        raise ValueError("the fluid model needs at least one request type")
    for t in types:
        if not (t.rate_per_s > 0 and math.isfinite(t.rate_per_s)):
            raise ValueError(f"the fluid model needs a finite rate > 0 per type; type {t.name!r} has "
                             f"rate_per_s = {t.rate_per_s!r} (an offline workload has no equilibrium)")


def equilibrium(types: list[FluidType], cost: CostModel, scale: float = 1.0) -> FluidPoint | None:
    """The fluid equilibrium with every rate times ``scale``; None when it does not exist (compute-unstable).
    The limits are not checked here (:func:`binding`)."""
    _check_types(types)
    lines = [(a, scale * b) for a, b in _lines(types, cost)]
    if any(b >= 1 for _, b in lines):
        return None
    tau = max(a / (1 - b) for a, b in lines)
    q = _per_tau(types)
    f = tau * scale
    return FluidPoint(scale=scale, batch_time_s=tau, admissions={t.name: f * t.rate_per_s for t in types},
                      tokens=f * (q["n_p"] + q["n_d"]), prefill_tokens=f * q["n_p"], running=f * q["r"],
                      kv_tokens=f * q["s"])


def binding(point: FluidPoint | None, limits: Limits) -> str | None:
    """The first limit the equilibrium ``point`` exceeds ("compute" when there is none), or None."""
    if point is None:
        return "compute"
    for name, used, cap in (("M", point.kv_tokens, limits.M), ("C", point.tokens, limits.C),
                            ("P", point.prefill_tokens, limits.P), ("R_max", point.running, limits.max_running)):
        if used > cap:
            return name
    return None


def stability_limit(types: list[FluidType], limits: Limits, cost: CostModel, rel_tol: float = 1e-9
                    ) -> tuple[float, str]:
    """The largest rate scale ρ whose equilibrium exists within the limits, and the constraint that binds
    there ("compute", "M", "C", "P" or "R_max"). Requests/s at the limit: ρ · Σ rate_j."""
    _check_types(types)
    b_max = max(b for _, b in _lines(types, cost))
    lo, hi = 0.0, (1.0 / b_max if b_max > 0 else math.inf)
    if binding(equilibrium(types, cost, 1e-12), limits) is not None:
        return 0.0, binding(equilibrium(types, cost, 1e-12), limits) or "compute"
    if math.isinf(hi):                  # no compute limit (e.g. unit time): grow until a limit binds
        hi = 1.0
        while binding(equilibrium(types, cost, hi), limits) is None:
            hi *= 2.0
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binding(equilibrium(types, cost, mid), limits) is None else (lo, mid)
    return lo, binding(equilibrium(types, cost, hi), limits) or "compute"
