"""Per-request bounds on TTFT, end-to-end latency and TPOT: what each request takes alone.

Restrict any valid schedule to one request i: keep the batches that give it
tokens, with only its tokens (and its evictions). That is a valid schedule of i
alone (it holds less KV, fewer tokens and fewer running requests than the
original batches), and each of its batches is no slower than the original
batch, because the batch time only grows with more tokens, more KV read and
more requests (non-attention lines with slope b_k >= 0, non-negative
attention and bias terms). Every time i waits — before its first batch,
between its batches — only adds. So, for any line k of the non-attention model:

- TTFT_i >= fill_k(I_i): its first token needs a fill of I_i tokens in at
  least ⌈I_i / min(C, P)⌉ batches, each a prefill batch (a_k + prefill bias +
  one request slot), with causal prefill-attention work I(I+1)/2 (any chunking);
- E2E_i >= fill_k(I_i) + Σ_{g=2..O} token_k(ℓ_g): every later token g (context
  ℓ_g = I + g - 1) is its own batch: a decode reading ℓ_g KV, or a refill of ℓ_g
  tokens after an eviction, whichever is cheaper;
- TPOT_i >= Σ_{g=2..O} token_k(ℓ_g) / (O_i - 1): between its first token and its
  completion lie at least those O_i - 1 batches.

The bound of a mean is the mean of these, each request taking its best line.
They need no horizon and hold online (every batch of i starts after its
arrival). They ignore contention (requests sharing batches, memory and
slots), so they are loose where contention dominates; they are the floor every
schedule stands on.
"""
from __future__ import annotations

import math

import numpy as np

from infermax.costmodel import LinearCoefficients
from infermax.types import Limits, Workload

from .costs import context_lengths


def cost_lines(co: LinearCoefficients, max_tokens: int) -> list[tuple[float, float]]:
    """The non-attention time of a batch of n <= ``max_tokens`` tokens as lines ``a + b·n`` that never fall:
    the cost model's lines (a, b) with b >= 0, and, if one falls, a flat line at the model's least value
    over 1..max_tokens. The bounds charge a batch on them; so do the bound-guided schedulers
    (:mod:`infermax.schedulers.boundguided`), which is why the function is public."""
    lines = [(a, b) for a, b in co.nonattn_lines if b >= 0]
    if len(lines) < len(co.nonattn_lines):    # a falling line: charge the model's least value instead
        n = np.arange(1, max_tokens + 1, dtype=np.float64)
        least = float(np.max([a + b * n for a, b in co.nonattn_lines], axis=0).min())
        lines.append((least, 0.0))
    return lines


def fill_s(co: LinearCoefficients, lengths: np.ndarray, limits: Limits, a: float, b: float) -> np.ndarray:
    """Least time of a fill of ``lengths`` tokens from an empty cache, charged on the line (a, b)."""
    ell = lengths.astype(np.float64)
    batches = np.ceil(ell / min(limits.C, limits.P))
    return (batches * (a + co.prefill_bias_s + co.request_s) + (b + co.prefill_token_s) * ell
            + co.prefill_attn_s * ell * (ell + 1) / 2)


def token_s(co: LinearCoefficients, ell: np.ndarray, limits: Limits, a: float, b: float) -> np.ndarray:
    """Least time of a batch that generates a request's token at context length ``ell`` (decode or refill)."""
    decode = a + b + co.request_s + co.decode_bias_s + co.decode_kv_s * ell.astype(np.float64)
    return np.minimum(decode, fill_s(co, ell, limits, a, b))


def request_bounds(co: LinearCoefficients, workload: Workload, limits: Limits) -> dict[str, np.ndarray]:
    """Per request: ``ttft_s``, ``e2e_s`` and ``tpot_s`` (NaN where O = 1) lower bounds."""
    I, O = workload.input_lens, workload.output_lens
    ell, owner = context_lengths(I, O)
    ttft = np.full(I.size, -math.inf)
    e2e = np.full(I.size, -math.inf)
    later = np.full(I.size, -math.inf)
    for a, b in cost_lines(co, limits.C):
        first = fill_s(co, I, limits, a, b)
        rest = np.bincount(owner, weights=token_s(co, ell, limits, a, b), minlength=I.size)
        ttft = np.maximum(ttft, first)
        e2e = np.maximum(e2e, first + rest)
        later = np.maximum(later, rest)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(O > 1, later / np.maximum(O - 1, 1), np.nan)
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot}
