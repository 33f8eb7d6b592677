"""When the simulator runs compiled code: one rule for its three compiled paths (numba, each a twin of a pure
path the tests compare it with) — the whole vLLM/Sarathi loop (:mod:`infermax.fastloop`), the steps of
``ServingState.apply`` (:mod:`infermax.state_kernel`) and Medha's planner (:mod:`infermax.schedulers.medha_compiled`).

``simulate(..., compiled=...)`` hands its choice to the state it builds (``ServingState.compiled``), where every
path reads it: False runs none (the reference), True every one that covers the run, None each from its own size
threshold (below it, loading numba costs more than it saves). ``INFERMAX_PURE=1`` in the environment is False
for every run, ``INFERMAX_COMPILED=1`` True for every run not given False. A leaf: nothing imported.
"""
from __future__ import annotations

import importlib.util
import os


def wanted(compiled: bool | None, size: int, threshold: int) -> bool:
    """Whether a compiled path whose run has ``size`` (its own measure of it) against ``threshold`` runs, given the
    caller's ``compiled`` (None: by size) and the environment; never without numba installed."""
    if compiled is False or os.environ.get("INFERMAX_PURE") == "1":
        return False
    if compiled is None and os.environ.get("INFERMAX_COMPILED") != "1" and size < threshold:
        return False
    return importlib.util.find_spec("numba") is not None
