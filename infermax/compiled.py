"""When the simulator runs compiled code: one rule for its three compiled paths (numba, each a twin of a pure
path the tests compare it with) — the whole vLLM/Sarathi loop (:mod:`infermax.fastloop`), the steps of
``ServingState.apply`` (:mod:`infermax.state_kernel`) and Medha's planner (:mod:`infermax.schedulers.medha_compiled`).

``simulate(..., compiled=...)`` hands its choice to the state it builds (``ServingState.compiled``), where every
path reads it: False runs none (the reference), True every one that covers the run, None each from its own size
threshold (below it, loading numba costs more than it saves). ``INFERMAX_PURE=1`` in the environment is False
for every run, ``INFERMAX_COMPILED=1`` True for every run not given False. A leaf: nothing of infermax imported.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np


def wanted(compiled: bool | None, size: int, threshold: int) -> bool:
    """Whether a compiled path whose run has ``size`` (its own measure of it) against ``threshold`` runs, given the
    caller's ``compiled`` (None: by size) and the environment; never without numba installed."""
    if compiled is False or os.environ.get("INFERMAX_PURE") == "1":
        return False
    if compiled is None and os.environ.get("INFERMAX_COMPILED") != "1" and size < threshold:
        return False
    return importlib.util.find_spec("numba") is not None


def timer_arrays(cost: Any) -> "tuple[np.ndarray, np.ndarray, np.ndarray] | None":
    """The linear cost model's coefficients as a compiled batch timer reads them: its lines' intercepts and slopes,
    and (decode_bias_s, decode_kv_s, prefill_bias_s, prefill_attn_s, prefill_token_s, request_s); None when ``cost``
    prices batches otherwise (:meth:`~infermax.costmodel.LinearCostModel.work_coefficients`)."""
    coefficients = getattr(cost, "work_coefficients", None)
    k = coefficients() if coefficients is not None else None
    if k is None:
        return None
    lines, *rest = k
    return (np.array([float(a) for a, _ in lines]), np.array([float(b) for _, b in lines]),
            np.array(rest, dtype=np.float64))
