"""Fit the linear cost model to operator profiles (InferMax §3.2).

Three regressions, each on whole-model seconds (per-layer times x layers):

- non-attention vs N tokens: a max of ``num_lines`` lines (convex piecewise
  linear; weight-read floor, then FLOP-bound slope);
- decode attention vs K = Σ(m + c) = batch · (kv + 1): bias + slope · K;
- prefill attention vs the causal work W = c·m + c(c + 1)/2 (the (query, key)
  pairs FlashAttention computes; ``attention_form="square"`` fits the
  pre-causal W = c·(m + c) instead, for comparison only): bias + slope · W
  (+ slope · c with ``extended=True``);
- when the profile has an ``lm_head`` column (CPU profiler): LM head + sampling
  vs R logits rows: bias + slope · R; the bias, paid once per forward, joins
  the non-attention data before its lines are fitted, and decode attention
  gains a per-request slope (t = bias + slope · K + per_request · batch).
  ``request_s`` = the two per-request slopes (one logits row and one decode
  query row per request).

Every fit minimises *relative* residuals (a 1 ms and a 100 ms batch count
alike) with a soft-L1 loss (:func:`.lsq.relative_lsq`), via
``scipy.optimize.lsq_linear`` (start) and ``scipy.optimize.least_squares``
(robust refinement), under bounds: every
coefficient >= 0 and, when GPU specs are given, every attention slope at least
the roofline slope and the steepest non-attention line at least the roofline's
FLOP slope, so the fit never undercuts the roofline at large batches. If the
fitted non-attention still dips under the roofline at a profiled point, the
roofline's own lines join the max (it stays convex piecewise linear).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .linear import LinearCoefficients, prefill_attention_work
from .lsq import SOFT_L1_SCALE, relative_lsq
from .profiles import MissingProfileError, load_attention_profile, load_mlp_profile
from .roofline import RooflineTerms
from .specs import ModelSpec, get_model_spec

log = logging.getLogger(__name__)
#: prefill-attention work of a chunk of c tokens after m cached, per form: "causal" is the linear model's
#: W (c·m + c(c+1)/2); "square" is the pre-causal c·(m + c), kept to compare fits (its slope is not a
#: LinearCoefficients.prefill_attn_s)
ATTENTION_FORMS = {"causal": prefill_attention_work,
                   "square": lambda c, m: np.asarray(c, np.float64) * (np.asarray(m, np.float64) + c)}


def attention_work(form: str, chunk: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """Prefill-attention work per row under ``form`` ("causal" or "square", see ATTENTION_FORMS)."""
    if form not in ATTENTION_FORMS:
        raise ValueError(f"attention_form must be one of {', '.join(ATTENTION_FORMS)}, got {form!r}")
    return ATTENTION_FORMS[form](np.asarray(chunk, dtype=np.float64), kv)


def _max_lines(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.max(p[0::2, None] + p[1::2, None] * x[None, :], axis=0)


def fit_nonattention(num_tokens: np.ndarray, time_s: np.ndarray, num_lines: int = 2,
                     min_slope: float = 0.0) -> tuple[tuple[float, float], ...]:
    """Fit t(N) = max_k (a_k + b_k N) by relative least squares; lines sorted by slope."""
    from scipy.optimize import least_squares
    x, y = np.asarray(num_tokens, dtype=np.float64), np.asarray(time_s, dtype=np.float64)
    if num_lines < 1:
        raise ValueError(f"num_lines must be >= 1, got {num_lines!r}")
    edges = np.quantile(x, np.linspace(0, 1, num_lines + 1))
    start = []
    for k in range(num_lines):            # one line per quantile segment to start
        seg = (x >= edges[k]) & (x <= edges[k + 1])
        if seg.sum() < 2:
            seg = np.ones_like(x, dtype=bool)
        start.extend(relative_lsq(np.c_[np.ones(seg.sum()), x[seg]], y[seg]))
    lb = np.zeros(2 * num_lines)
    lb[-1] = min_slope
    p0 = np.maximum(np.asarray(start), lb)
    if num_lines > 1:
        p0 = least_squares(lambda p: _max_lines(p, x) / y - 1, p0, bounds=(lb, np.inf),
                           loss="soft_l1", f_scale=SOFT_L1_SCALE).x
    lines = sorted(zip(p0[0::2], p0[1::2]), key=lambda line: line[1])
    lines = _polish(x, y, lines, min_slope)
    active = {int(np.argmax([a + b * xi for a, b in lines])) for xi in x}
    active.add(len(lines) - 1)                 # the steepest line governs beyond the data
    return tuple((float(lines[i][0]), float(lines[i][1])) for i in sorted(active))


def _polish(x: np.ndarray, y: np.ndarray, lines: list, min_slope: float, rounds: int = 10) -> list:
    """Alternate: give each point to the line that is max there, refit each line on its points
    (max-affine regression, Magnani & Boyd 2009); keeps the result only if the loss drops."""
    def loss(ls: list) -> float:
        r = np.max([a + b * x for a, b in ls], axis=0) / y - 1
        return float(np.sum(2 * SOFT_L1_SCALE**2 * (np.sqrt(1 + (r / SOFT_L1_SCALE) ** 2) - 1)))
    best, best_loss = list(lines), loss(lines)
    current = list(lines)
    for _ in range(rounds):
        owner = np.argmax([a + b * x for a, b in current], axis=0)
        refit = []
        for k, line in enumerate(current):
            mine = owner == k
            if mine.sum() < 2:
                refit.append(line)
                continue
            lower = [0.0, min_slope if k == len(current) - 1 else 0.0]
            refit.append(tuple(relative_lsq(np.c_[np.ones(mine.sum()), x[mine]], y[mine], lower)))
        current = sorted(refit, key=lambda line: line[1])
        if loss(current) < best_loss - 1e-15:
            best, best_loss = list(current), loss(current)
        else:
            break
    return best


def fit_decode(batch: np.ndarray, kv: np.ndarray, time_s: np.ndarray, min_kv_slope: float = 0.0) -> tuple[float, float]:
    """Decode attention: t = bias + slope · K with K = batch · (kv + 1)."""
    K = batch * (kv + 1.0)
    bias, slope = relative_lsq(np.c_[np.ones_like(K), K], time_s, lower=[0.0, min_kv_slope])
    return float(bias), float(slope)


def fit_decode_per_request(batch: np.ndarray, kv: np.ndarray, time_s: np.ndarray, min_kv_slope: float = 0.0
                           ) -> tuple[float, float, float]:
    """Decode attention with a per-request cost: t = bias + slope · K + per_request · batch."""
    K = batch * (kv + 1.0)
    p = relative_lsq(np.c_[np.ones_like(K), K, batch], time_s, lower=[0.0, min_kv_slope, 0.0])
    return float(p[0]), float(p[1]), float(p[2])


def fit_prefill(chunk: np.ndarray, kv: np.ndarray, time_s: np.ndarray, min_attn_slope: float = 0.0,
                extended: bool = False, attention_form: str = "causal") -> tuple[float, float, float]:
    """Prefill attention: t = bias + slope · W [+ token_slope · c], W of ``attention_form``."""
    c = np.asarray(chunk, dtype=np.float64)
    work = attention_work(attention_form, c, kv)
    X = np.c_[np.ones_like(c), work, c] if extended else np.c_[np.ones_like(c), work]
    p = relative_lsq(X, time_s, lower=[0.0, min_attn_slope, 0.0][: X.shape[1]])
    return float(p[0]), float(p[1]), float(p[2]) if extended else 0.0


@dataclass(frozen=True)
class OperatorData:
    """Whole-model operator measurements in seconds, ready to fit or to hold out.

    ``*_group`` label the units a train/test split must keep together: one token
    count for non-attention, one clump of the attention profile for attention.
    ``head_s``: LM head + sampling per forward at ``head_rows`` logits rows
    (empty when the profile has no ``lm_head`` column).
    """

    nonattn_tokens: np.ndarray
    nonattn_s: np.ndarray
    nonattn_group: np.ndarray
    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_s: np.ndarray
    decode_group: np.ndarray
    prefill_chunk: np.ndarray
    prefill_kv: np.ndarray
    prefill_s: np.ndarray
    prefill_group: np.ndarray
    head_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    head_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def subset(self, nonattn: np.ndarray, decode: np.ndarray, prefill: np.ndarray,
               head: np.ndarray | None = None) -> "OperatorData":
        """The rows under each mask (``head``: all LM-head rows when None)."""
        def pick(prefix: str, mask: np.ndarray) -> dict[str, np.ndarray]:
            return {k: v[mask] for k, v in vars(self).items() if k.startswith(prefix)}
        head = np.ones(self.head_s.size, bool) if head is None else head
        return OperatorData(**pick("nonattn", nonattn), **pick("decode", decode), **pick("prefill", prefill),
                            **pick("head", head))

    def lm_head_at(self, num_requests: np.ndarray | float) -> np.ndarray:
        """Measured LM head + sampling (s) at ``num_requests`` rows, interpolated between the profiled rows
        (0 without LM-head data)."""
        if not self.head_s.size:
            return np.zeros_like(np.asarray(num_requests, dtype=np.float64))
        order = np.argsort(self.head_rows)
        return np.interp(num_requests, self.head_rows[order], self.head_s[order])


def operator_data(profile: "str | Path", model: "str | ModelSpec", tp: int = 1,
                  require_attention: bool = True, stat: str = "median") -> OperatorData:
    """Load a profile's mlp and attention files as whole-model seconds.

    With ``require_attention=False`` a profile without an attention file gives
    empty attention arrays (a malformed attention file still raises). ``stat``:
    which summary of repeated runs to read (profiles.py).
    """
    m = get_model_spec(model)
    mlp = load_mlp_profile(profile, tp, stat)
    L = m.num_layers
    head = mlp.lm_head_s()
    measured = head > 0 if head is not None else np.zeros(mlp.num_tokens.size, bool)
    head_data = {"head_rows": mlp.num_tokens[measured], "head_s": head[measured] if head is not None else np.zeros(0)}
    try:
        att = load_attention_profile(profile, tp, stat)
    except MissingProfileError:
        if require_attention:
            raise
        empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0)
        return OperatorData(mlp.num_tokens, mlp.total_s(L), mlp.num_tokens.copy(),
                            empty_i, empty_i, empty_f, empty_i, empty_i, empty_i, empty_f, empty_i, **head_data)
    return OperatorData(mlp.num_tokens, mlp.total_s(L), mlp.num_tokens.copy(),
                        att.decode_batch, att.decode_kv, att.decode_time_s * L, att.decode_group,
                        att.prefill_chunk, att.prefill_kv, att.prefill_time_s * L, att.prefill_group, **head_data)


def fit_lm_head(rows: np.ndarray, time_s: np.ndarray, per_request: bool = True) -> tuple[float, float]:
    """LM head + sampling: t = bias + slope · R for R logits rows; ``per_request=False`` fits a constant."""
    R = np.asarray(rows, dtype=np.float64)
    X = np.c_[np.ones_like(R), R] if per_request else np.ones((R.size, 1))
    p = relative_lsq(X, np.asarray(time_s, dtype=np.float64))
    return float(p[0]), float(p[1]) if per_request else 0.0


def fit_operators(data: OperatorData, roofline: RooflineTerms | None = None, num_lines: int = 2,
                  extended: bool = False, attention_roofline: RooflineTerms | None = None,
                  request_term: bool | None = None, attention_form: str = "causal") -> LinearCoefficients:
    """Fit all operators; with ``roofline``, slopes are bounded below by it.

    ``attention_form="square"`` fits prefill attention to the pre-causal W = c(m + c), for comparison:
    the result's ``prefill_attn_s`` then prices that W, not the linear model's (see ATTENTION_FORMS).

    ``attention_roofline`` (default: ``roofline``) bounds the attention slopes
    when the attention data come from another GPU or model than the rest.
    ``request_term`` (default: when the profile has LM-head data) fits
    ``request_s`` = the LM head's per-row slope + decode attention's
    per-request slope (t = bias + slope · K + per_request · batch); False: no
    request term, the LM head is one constant per forward in the lines' biases.
    """
    attention_work(attention_form, np.zeros(0), np.zeros(0))      # a bad form is refused even without rows
    att = attention_roofline or roofline
    na_min = roofline.nonattn_lines[-1][1] if roofline else 0.0
    dec_min = max(att.decode_flops_s, att.decode_bytes_s) if att else 0.0
    pf_min = att.prefill_flops_s if att else 0.0     # per causal pair; c(m + c) >= pairs, so it bounds both forms
    per_request = bool(data.head_s.size) if request_term is None else request_term
    head_bias = head_s = 0.0
    if data.head_s.size:
        head_bias, head_s = fit_lm_head(data.head_rows, data.head_s, per_request)
    lines = fit_nonattention(data.nonattn_tokens, data.nonattn_s + head_bias, num_lines, na_min)
    if roofline is not None:
        lines = _respect_roofline(lines, roofline, data.nonattn_tokens)
    d_bias = d_kv = d_req = p_bias = p_attn = p_tok = 0.0      # no rows: that term is unknown, left 0
    if data.decode_s.size and per_request:
        d_bias, d_kv, d_req = fit_decode_per_request(data.decode_batch, data.decode_kv, data.decode_s, dec_min)
    elif data.decode_s.size:
        d_bias, d_kv = fit_decode(data.decode_batch, data.decode_kv, data.decode_s, dec_min)
    if data.prefill_s.size:
        p_bias, p_attn, p_tok = fit_prefill(data.prefill_chunk, data.prefill_kv, data.prefill_s, pf_min, extended,
                                            attention_form)
    return LinearCoefficients(nonattn_lines=lines, decode_bias_s=d_bias, decode_kv_s=d_kv,
                              prefill_bias_s=p_bias, prefill_attn_s=p_attn, prefill_token_s=p_tok,
                              request_s=head_s + d_req)


def request_parts(data: OperatorData, coefficients: LinearCoefficients) -> tuple[float, float]:
    """``coefficients.request_s`` (fitted to ``data`` by :func:`fit_operators`) split into its LM-head and
    decode-attention shares (s per request)."""
    if coefficients.request_s == 0.0:
        return 0.0, 0.0
    head = fit_lm_head(data.head_rows, data.head_s)[1] if data.head_s.size else 0.0
    return head, coefficients.request_s - head


def _respect_roofline(lines: tuple[tuple[float, float], ...], roofline: RooflineTerms,
                      num_tokens: np.ndarray) -> tuple[tuple[float, float], ...]:
    fitted = LinearCoefficients(nonattn_lines=lines).nonattention_s(num_tokens)
    if np.all(fitted >= roofline.nonattention_s(num_tokens)):
        return lines
    log.warning("fitted non-attention undercuts the roofline at %d profiled points; adding the roofline's lines",
                int(np.sum(fitted < roofline.nonattention_s(num_tokens))))
    return tuple(sorted(set(lines) | set(roofline.nonattn_lines), key=lambda line: line[1]))
