"""Test configuration: the hypothesis profile and shared fixtures (factories live in factories.py).

Hypothesis runs under one fixed profile so that the default suite is the same on every machine:
derandomized (the examples are a function of the test, not of the clock or a seed file), no
per-example deadline (these machines are shared; time is never a pass/fail criterion), no
example database, and at most the number of examples each test asks for. ``HYPOTHESIS_PROFILE=dev``
selects a randomized profile for local bug hunting.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
    return np.random.default_rng(0)
