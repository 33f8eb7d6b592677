"""Per-token cost tables of the linear cost model, shared by every bound method.

Any valid schedule processes, for every generated token, either one decode
token at context length ℓ (= I + g - 1 for the g-th token, g >= 2) or a (re)fill
of all ℓ context tokens from an empty cache (after an eviction); the first token
always needs a fill of I. Charging each batch's non-attention time on one line
(a_k, b_k) of the model (Σ_j max_k(...) >= Σ_j (a_k + b_k N_j)) makes the cost of
a schedule separable into per-batch constants and per-request path costs; the
tables below give those path costs.
"""
from __future__ import annotations

import numpy as np

from infermax.costmodel import CostModel, LinearCoefficients, linear_coefficients


def coefficients_of(cost: CostModel) -> LinearCoefficients:
    """The linear coefficients (:func:`infermax.costmodel.linear_coefficients`) as plain floats, after
    checking on random batches that ``batch_time`` obeys them: a bound is certified only for the
    formula it was computed from, so a subclass that overrides ``batch_time`` is refused here."""
    k = linear_coefficients(cost, "a certified bound")
    co = LinearCoefficients(nonattn_lines=tuple((float(a), float(b)) for a, b in k.nonattn_lines),
                            decode_bias_s=float(k.decode_bias_s), decode_kv_s=float(k.decode_kv_s),
                            prefill_bias_s=float(k.prefill_bias_s), prefill_attn_s=float(k.prefill_attn_s),
                            prefill_token_s=float(k.prefill_token_s), request_s=float(k.request_s))
    rng = np.random.default_rng(7)
    for _ in range(8):
        n = int(rng.integers(1, 40))
        tokens = rng.integers(1, 600, n)
        dec = rng.random(n) < 0.5
        tokens[dec] = 1
        kv = rng.integers(0, 4000, n)
        if abs(cost.batch_time(tokens, kv, dec) - formula_time(co, tokens, kv, dec)) > 1e-9:
            raise ValueError(f"cost model {cost.name!r} does not follow the linear formula its coefficients "
                             f"state (e.g. it has parallelism terms); bounds are not supported for it")
    return co


def formula_time(co: LinearCoefficients, tokens: np.ndarray, kv_before: np.ndarray, dec: np.ndarray) -> float:
    """The documented linear formula, evaluated independently of the model object."""
    n = float(tokens.sum())
    kv = kv_before + tokens
    t = max(a + b * n for a, b in co.nonattn_lines) + co.request_s * tokens.size
    if dec.any():
        t += co.decode_bias_s + co.decode_kv_s * float(kv[dec].sum())
    if (~dec).any():
        c = tokens[~dec]
        pairs = 0.5 * float(np.dot(c, 2 * kv_before[~dec] + c + 1))         # causal: c·m + c(c + 1)/2
        t += co.prefill_bias_s + co.prefill_attn_s * pairs + co.prefill_token_s * float(c.sum())
    return t


def context_lengths(input_lens: np.ndarray, output_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ℓ of every generated token g >= 2 of every request (concatenated), and the owner index."""
    counts = np.maximum(output_lens - 1, 0)
    owner = np.repeat(np.arange(input_lens.size), counts)
    starts = np.cumsum(counts) - counts
    g = np.arange(counts.sum()) - np.repeat(starts, counts) + 2
    return input_lens[owner] + g - 1, owner


def cheapest_fill(length: np.ndarray, per_token_s: float, attn_s: float, per_request_s: float = 0.0) -> np.ndarray:
    """A lower bound on filling ℓ tokens from an empty cache: the causal prefill work Σ c·m + c(c + 1)/2
    of any chunking is exactly ℓ(ℓ + 1)/2, and any fill is at least one chunk (one request slot)."""
    ell = length.astype(np.float64)
    return per_token_s * ell + attn_s * ell * (ell + 1) / 2 + per_request_s


def chunk_end_sum(ell: np.ndarray, chunk: float) -> np.ndarray:
    """The least Σ of the KV after each chunk of a fill of ℓ tokens from an empty cache in chunks of at
    most ``chunk``: k = ⌈ℓ / chunk⌉ chunks, full ones last, Σ = k·ℓ − chunk·k(k − 1)/2 (more chunks only
    add ends)."""
    ell = np.asarray(ell, dtype=np.float64)
    k = np.ceil(ell / chunk)
    return k * ell - chunk * k * (k - 1) / 2
