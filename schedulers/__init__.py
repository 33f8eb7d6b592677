"""infermax.schedulers: the GetNextBatch framework and every policy built on it.

``available()`` lists registered names; ``get_scheduler(name, **options)`` builds
one; ``register_scheduler(name)`` adds your own.
"""
from . import boundguided, medha, pecsched, rank, sarathi, vllm  # noqa: F401  (registration side effects)
from .base import Plan, Scheduler
from .framework import GetNextBatch, Policy, register_family
from .registry import available, describe_all, get_scheduler, register_scheduler, split_specs

__all__ = ["GetNextBatch", "Plan", "Policy", "Scheduler", "available", "describe_all", "get_scheduler",
           "register_family", "register_scheduler", "split_specs"]
