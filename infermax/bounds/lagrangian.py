"""Lagrangian relaxation of the per-batch coupling constraints, by subgradient ascent.

The batch constraints Σ_i KV_ij <= M, Σ_i c_ij <= C, Σ_i prefill_ij <= P and
Σ_i [i holds KV in j] <= R_max are dualised (summed over batches, multipliers
μ = (μ_M, μ_C, μ_P, μ_R) >= 0). What remains separates:

    L(μ) = min_J J·(a_k + β - μ_M M - μ_C C - μ_P P - μ_R R)      batches (J >= max O)
         + Σ_i SP_i(μ)                                             one shortest path per request

where β is the cheapest per-batch attention bias and SP_i is request i's
shortest path over its own state graph: states are context lengths; an edge is a
chunk of c tokens from m to m + c (cost b c + prefill_attn (c m + c(c + 1)/2) + prefill_token c
+ μ_C c + μ_P c + μ_M (m + c) + μ_R — one batch holding m + c KV), a decode at
length ℓ (b + decode_kv ℓ + μ_C + μ_M ℓ + μ_R), or an eviction back to 0. Since no
edge depends on the request, one dynamic programme over lengths (O(L)) prices
every request at once. Every L(μ) is a valid lower bound; the subgradient method
(Polyak steps towards an upper bound) searches for the best. Unlike the
closed-form bound it prices the memory and running-slot time each chunk and each
decode holds (causal attention work is the same however a fill is chunked).
"""
from __future__ import annotations

import math

import numpy as np

from infermax.costmodel import LinearCoefficients
from infermax.types import Limits, Workload

_FEATURES = 4  # per-path totals: KV footprint, tokens, prefill tokens, batches held


def fill_table(co: LinearCoefficients, per_token_s: float, mu: np.ndarray,
               max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest fill of every length 0..max_len from an empty cache, and its feature totals.

    A chunk from m to e does causal work (e - m)·m + (e - m)(e - m + 1)/2 = (e² + e - m² - m)/2, so

    F(e) = min_{m<e} F(m) + lin (e-m) + attn (e² + e - m² - m)/2 + μ_M e + μ_R
         = lin e + attn e(e+1)/2 + μ_M e + μ_R + min_{m<e} G(m),   G(m) = F(m) - lin m - attn m(m+1)/2,

    a running minimum: O(L). (With μ >= 0 the minimum is G(0) = 0, one chunk, but the DP does not rely on it.)
    """
    mu_M, mu_C, mu_P, mu_R = mu
    lin = per_token_s + co.prefill_token_s + mu_C + mu_P
    attn = co.prefill_attn_s
    per_chunk = mu_R + co.request_s
    cost = [0.0] * (max_len + 1)
    arg = [0] * (max_len + 1)
    best_g, best_m = 0.0, 0                      # min over m < e of G(m), and where
    for e in range(1, max_len + 1):
        cost[e] = lin * e + attn * e * (e + 1) / 2 + mu_M * e + per_chunk + best_g
        arg[e] = best_m
        g = cost[e] - lin * e - attn * e * (e + 1) / 2
        if g < best_g:
            best_g, best_m = g, e
    feats = np.zeros((max_len + 1, _FEATURES))
    for e in range(1, max_len + 1):
        j = arg[e]
        feats[e] = feats[j]
        feats[e] += (e, e - j, e - j, 1)
    return np.asarray(cost), feats


def path_totals(co: LinearCoefficients, workload: Workload, per_token_s: float, mu: np.ndarray):
    """Σ_i SP_i(μ) and the summed feature totals of the chosen paths."""
    I, O = workload.input_lens, workload.output_lens
    max_len = int((I + O - 1).max())
    fill, ffeat = fill_table(co, per_token_s, mu, max_len)
    ell = np.arange(max_len + 1, dtype=np.float64)
    mu_M, mu_C, _, mu_R = mu
    decode = per_token_s + co.decode_kv_s * ell + mu_C + mu_M * ell + mu_R + co.request_s
    use_refill = fill < decode
    best = np.where(use_refill, fill, decode)
    dfeat = np.stack([ell, np.ones_like(ell), np.zeros_like(ell), np.ones_like(ell)], axis=1)
    bfeat = np.where(use_refill[:, None], ffeat, dfeat)
    # tokens g = 2..O use lengths I+1 .. I+O-1: prefix sums over lengths
    cum = np.concatenate(([0.0], np.cumsum(best[1:])))
    cumf = np.vstack([np.zeros(_FEATURES), np.cumsum(bfeat[1:], axis=0)])
    hi, lo = I + O - 1, I
    total = float(fill[I].sum() + (cum[hi] - cum[lo]).sum())
    feats = ffeat[I].sum(axis=0) + (cumf[hi] - cumf[lo]).sum(axis=0)
    return total, feats


def lagrangian_bound(co: LinearCoefficients, workload: Workload, limits: Limits, upper: float | None = None,
                     iterations: int = 40, patience: int = 8, start: np.ndarray | None = None) -> tuple[float, dict]:
    """Best L(μ) found by projected subgradient ascent (each value is a valid bound)."""
    O = workload.output_lens
    caps = np.array([limits.M, limits.C, limits.P, limits.R_max if limits.R_max is not None else 0.0],
                    dtype=np.float64)
    usable = caps > 0
    J_lo = int(O.max())
    beta = min(co.decode_bias_s, co.prefill_bias_s)
    best, best_detail = -math.inf, {}
    for k, (a, b) in enumerate(co.nonattn_lines):
        per_batch = a + beta
        mu = np.array(start if start is not None else [per_batch / limits.M, 0.0, 0.0, 0.0], dtype=np.float64)
        step_scale = 1.0
        stalled = 0
        for it in range(iterations):
            mu = np.where(usable, np.maximum(mu, 0.0), 0.0)
            slack = per_batch - float(mu @ caps)
            if slack < 0:  # J -> infinity would make L(μ) = -inf: project onto μ·caps <= per_batch
                mu *= per_batch / float(mu @ caps)
                slack = 0.0
            paths, feats = path_totals(co, workload, b, mu)
            value = J_lo * slack + paths
            stalled = 0 if value > best * (1 + 1e-6) else stalled + 1
            if stalled > patience:
                break
            if value > best:
                best = value
                best_detail = {"line": k, "multipliers": {"M": mu[0], "C": mu[1], "P": mu[2], "R_max": mu[3]},
                               "iteration": it, "batches": J_lo}
            # subgradient of L at μ: Σ path features - caps·J*(μ) (J* = J_lo while slack > 0)
            grad = np.where(usable, feats - caps * J_lo, 0.0)
            if slack == 0.0:  # J* is free to grow: only directions that keep μ·caps <= per_batch help
                grad = grad - caps * (grad @ caps) / float(caps @ caps)
            norm = float(grad @ grad)
            if norm == 0.0:
                break
            target = upper if upper is not None and upper > value else value * 1.05 + 1e-9
            mu = mu + step_scale * (target - value) / norm * grad
            step_scale *= 0.95
    return best, best_detail
