"""The linear cost model fitted to a real engine's measured step times, and what it predicts.

Per batch of a recorded schedule, the terms of :class:`~infermax.costmodel.linear.LinearCostModel`
(``batch_time``): tokens ``N``, requests ``R``, whether it decodes and the decodes' KV read
``K = Σ (m + 1)``, whether it prefills and the prefill-attention work ``W = Σ c·m + c(c + 1)/2``
(causal pairs). :func:`fit_step_model` fits the coefficients of one non-attention line, the
per-request term and the two attention terms to the measured step durations by relative least
squares (:func:`infermax.costmodel.lsq.relative_lsq`, the regression behind every fitted line of the
cost model), so the fitted model times a batch exactly as the formula of ``batch_time`` says;
:func:`predicted_vs_measured` replays a recorded schedule under a fitted model and sets its mean
TTFT and end-to-end latency beside the measured ones. Nothing here imports an engine.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..costmodel.linear import LinearCoefficients, LinearCostModel
from ..costmodel.lsq import relative_lsq
from ..replay import replay
from ..schedule import Schedule
from ..types import Workload
from .records import Measurements, first_batch_of, step_times

#: columns of :func:`batch_features`
FEATURES = ("one", "tokens", "requests", "has_decode", "decode_kv", "has_prefill", "prefill_work")


def batch_features(schedule: Schedule, workload: Workload) -> np.ndarray:
    """Per batch the :data:`FEATURES` (rows), following KV ``m`` and input ``inp`` per request through
    the schedule under infermax's semantics (evictions first; a decode-phase eviction refills m + 1)."""
    n = len(workload)
    m, inp, gen = np.zeros(n, dtype=np.int64), workload.input_lens.copy(), np.zeros(n, dtype=np.int64)
    rows = []
    for b in schedule:
        ev, idx = workload.indices_of(b.evict), workload.indices_of(b.ids)
        dec_ev = m[ev] >= inp[ev]
        inp[ev[dec_ev]] = m[ev[dec_ev]] + 1
        m[ev] = 0
        c, m0 = b.tokens, m[idx]
        dec = m0 >= inp[idx]
        pf = ~dec
        work = 0.5 * float(np.dot(c[pf], 2 * m0[pf] + c[pf] + 1))
        rows.append((1.0, float(c.sum()), float(idx.size), float(dec.any()), float((m0[dec] + 1).sum()),
                     float(pf.any()), work))
        m[idx] += c
        gen[idx] += m[idx] >= inp[idx]
        m[idx[gen[idx] == workload.output_lens[idx]]] = 0
    return np.array(rows, dtype=np.float64).reshape(-1, len(FEATURES))


def fit_step_model(features: np.ndarray, durations_s: np.ndarray, name: str = "fitted",
                   loss: str = "relative") -> LinearCostModel:
    """The linear cost model whose ``batch_time`` best matches ``durations_s``, every coefficient >= 0:
    ``loss="relative"``, the cost model's own regression (relative residuals, soft-L1: each step counts
    alike, outliers do not bend it); ``"absolute"``, least squares in seconds (its sum over the steps
    matches the measured sum: what a mean TTFT or e2e, a sum of step times, needs)."""
    from scipy.optimize import lsq_linear  # (as costmodel.lsq: scipy.optimize costs ~0.4 s to import)
    ok = np.isfinite(durations_s) & (durations_s > 0)
    if ok.sum() < len(FEATURES):
        raise ValueError(f"fit_step_model needs at least {len(FEATURES)} measured steps, got {int(ok.sum())}")
    if loss == "relative":
        p = relative_lsq(features[ok], durations_s[ok])
    elif loss == "absolute":
        X = features[ok]
        scale = np.linalg.norm(X, axis=0)
        scale[scale == 0] = 1.0
        p = lsq_linear(X / scale, durations_s[ok], bounds=(0.0, np.inf), tol=1e-12).x / scale
    else:
        raise ValueError(f"loss must be 'relative' or 'absolute', got {loss!r}")
    a, b, req, d_bias, d_kv, p_bias, p_attn = (float(x) for x in p)
    coef = LinearCoefficients(nonattn_lines=((a, b),), decode_bias_s=d_bias, decode_kv_s=d_kv,
                              prefill_bias_s=p_bias, prefill_attn_s=p_attn, request_s=req)
    return LinearCostModel(coef, name=name, description="fitted to measured engine step times")


def predicted_steps(model: LinearCostModel, features: np.ndarray) -> np.ndarray:
    """``model``'s batch time for each row of :func:`batch_features` (its formula, one line)."""
    k = model.coefficients
    (a, b), = k.nonattn_lines
    return (a + b * features[:, 1] + k.request_s * features[:, 2] + features[:, 3] * k.decode_bias_s
            + k.decode_kv_s * features[:, 4] + features[:, 5] * k.prefill_bias_s + k.prefill_attn_s * features[:, 6])


def measured_means(workload: Workload, m: Measurements) -> tuple[float, float]:
    """Mean TTFT and mean end-to-end latency measured (from each request's arrival on the engine clock)."""
    by_id = {t.id: t for t in m.requests}
    ttft = [by_id[r.id].first_token_s - by_id[r.id].arrival_s for r in workload]
    e2e = [by_id[r.id].finish_s - by_id[r.id].arrival_s for r in workload]
    return float(np.mean(ttft)), float(np.mean(e2e))


def predicted_vs_measured(schedule: Schedule, workload: Workload, limits: Any, m: Measurements,
                          model: LinearCostModel) -> dict[str, float]:
    """Mean TTFT and e2e of ``schedule`` replayed under ``model`` (the workload's arrivals), beside the measured
    ones, and the relative errors."""
    trace = replay(schedule, workload, limits, model)
    req = trace.requests
    pred_ttft = float(np.mean(req["first_token_s"] - req["arrival_s"]))
    pred_e2e = float(np.mean(req["completion_s"] - req["arrival_s"]))
    meas_ttft, meas_e2e = measured_means(workload, m)
    return {"pred_ttft_s": pred_ttft, "meas_ttft_s": meas_ttft, "ttft_err": pred_ttft / meas_ttft - 1,
            "pred_e2e_s": pred_e2e, "meas_e2e_s": meas_e2e, "e2e_err": pred_e2e / meas_e2e - 1}


def run_features(runs: Sequence[tuple[Schedule, Workload, Measurements]], clock: str = "wall"
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Stacked features and measured durations (``clock``: wall or cpu) of several recorded runs."""
    feats = [batch_features(s, w) for s, w, _ in runs]
    durs = [step_times(m.records, clock)[1] for _, _, m in runs]
    return np.vstack(feats), np.concatenate(durs)


def means_on_batch_clock(schedule: Schedule, workload: Workload, m: Measurements,
                         durations_s: np.ndarray) -> tuple[float, float]:
    """Mean TTFT and e2e when batch ``j`` lasts ``durations_s[j]``, batches run back to back and each
    request arrives at the start of the first batch that could schedule it (the lockstep arrivals of
    :func:`.records.lockstep_workload`): the same function of measured CPU step times and of a model's
    predicted ones, so that the two compare without the machine's contention or its idle waits."""
    first = first_batch_of(m.requests, m.records)
    ends = np.cumsum(durations_s)
    starts = ends - durations_s
    n = len(workload)
    m_kv, inp, gen = np.zeros(n, dtype=np.int64), workload.input_lens.copy(), np.zeros(n, dtype=np.int64)
    first_tok, done = np.full(n, np.nan), np.full(n, np.nan)
    for j, b in enumerate(schedule):
        ev, idx = workload.indices_of(b.evict), workload.indices_of(b.ids)
        dec = m_kv[ev] >= inp[ev]
        inp[ev[dec]] = m_kv[ev[dec]] + 1
        m_kv[ev] = 0
        m_kv[idx] += b.tokens
        out = idx[m_kv[idx] >= inp[idx]]
        gen[out] += 1
        first_tok[out[np.isnan(first_tok[out])]] = ends[j]
        fin = out[gen[out] == workload.output_lens[out]]
        done[fin], m_kv[fin] = ends[j], 0
    arrive = np.array([starts[first[int(i)]] if first[int(i)] < len(starts) else np.nan for i in workload.ids])
    return float(np.mean(first_tok - arrive)), float(np.mean(done - arrive))
