"""Fixtures for the cost-model tests: random batches and a small synthetic operator set."""
from __future__ import annotations

import numpy as np
import pytest


def random_batch(rng: np.random.Generator, max_requests: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A mixed batch: decode requests (c = 1, m >= 1) and prefill chunks (c >= 1, m >= 0)."""
    num_decode = int(rng.integers(0, max_requests))
    num_prefill = int(rng.integers(0 if num_decode else 1, 4))
    tokens = np.r_[np.ones(num_decode, np.int64), rng.integers(1, 2048, num_prefill)].astype(np.int64)
    kv = np.r_[rng.integers(1, 4096, num_decode), rng.integers(0, 4096, num_prefill)].astype(np.int64)
    return tokens, kv, np.r_[np.ones(num_decode, bool), np.zeros(num_prefill, bool)]


@pytest.fixture
def batches() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [random_batch(rng) for _ in range(200)]
