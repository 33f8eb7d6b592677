"""infermax.schedulers: the GetNextBatch framework and every policy built on it.

``available()`` lists registered names; ``get_scheduler(name, **options)`` builds
one; ``register_scheduler(name)`` adds your own. A new policy of the family is a
``GetNextBatch(Policy(...))``: its rank key and victim choice are names or
callables over a :class:`RequestView` (:mod:`infermax.ordering`).
"""
from infermax.ordering import RequestView, register_rank_key, register_victim
from infermax.policy import Policy

from . import (boundguided, mcsf, medha, nested_wait, pecsched, rank, sarathi, vllm,  # noqa: F401  (registration)
               vllm_v1, wait)
from . import fastertransformer, lightllm, mnemosyne, orca  # noqa: F401  (Vidur's replica schedulers)
from .base import Plan, Scheduler
from .framework import GetNextBatch, register_family
from .registry import available, describe_all, get_scheduler, register_scheduler, split_specs

__all__ = ["GetNextBatch", "Plan", "Policy", "RequestView", "Scheduler", "available", "describe_all",
           "get_scheduler", "register_family", "register_rank_key", "register_scheduler", "register_victim",
           "split_specs"]
