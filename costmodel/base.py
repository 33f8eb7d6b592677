"""The cost-model interface: how long one batch takes.

A batch is described by three aligned NumPy arrays over the requests it
processes: ``tokens`` (c, tokens processed), ``kv_before`` (m, KV tokens cached
before the batch) and ``is_decode`` (the request was in decode phase, m >= its
current input size). Simulator, replay, the MILP and the bound all price batches
through this one method, so "optimal vs vLLM" is never a comparison of two
timing models.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from itertools import accumulate
from typing import Any

import numpy as np


class CostModel(ABC):
    """Predicts the wall time of one forward pass (seconds)."""

    #: short identifier shown in tables and stored in schedule metadata
    name: str = "cost"

    @abstractmethod
    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        """Seconds to run one batch.

        tokens: int64[n], c_i >= 1; kv_before: int64[n], m_i >= 0;
        is_decode: bool[n]. KV read by request i is m_i + c_i; prefill-attention
        work of request i grows with its causal (query, key) pairs
        c_i * m_i + c_i * (c_i + 1) / 2, which add up to L(L + 1)/2 over any
        chunking of an L-token prompt.
        """

    def decode_run_times(self, kv_before: np.ndarray, num_steps: int) -> np.ndarray:
        """Durations (s) of ``num_steps`` consecutive decode batches of the same requests.

        Step s has ``tokens = 1`` and ``kv_before + s`` for every request. Must equal,
        bit for bit, ``batch_time`` called step by step (the simulator's fast path
        relies on it); override only with an exact closed form.
        """
        ones = np.ones(kv_before.size, dtype=np.int64)
        dec = np.ones(kv_before.size, dtype=bool)
        return np.array([self.batch_time(ones, kv_before + s, dec) for s in range(num_steps)], dtype=np.float64)

    def decode_run_starts(self, kv_before: np.ndarray, num_steps: int, start_s: float,
                          stop_s: float | None) -> tuple[list[float], list[float]]:
        """The batches of :meth:`decode_run_times` run back to back from ``start_s`` up to the first that
        would start at or after ``stop_s`` (None: all ``num_steps``): (their durations, their starts and
        then the end of the last), the starts added one after another as the simulator adds batch times.
        A closed form may override it to compute only the batches that run."""
        durations = self.decode_run_times(kv_before, num_steps).tolist()
        starts = list(accumulate(durations, initial=start_s))
        if stop_s is not None:
            num_steps = min(num_steps, bisect_left(starts, stop_s, 0, num_steps))
        return durations[:num_steps], starts[:num_steps + 1]

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable description (name and parameters)."""
        return {"name": self.name}
