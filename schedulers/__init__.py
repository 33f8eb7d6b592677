"""infermax.schedulers: the GetNextBatch framework and every policy built on it.

``available()`` lists registered names; ``get_scheduler(name, **options)`` builds
one; ``register_scheduler(name)`` adds your own. A new policy of the family is a
``GetNextBatch(Policy(...))``: its rank key and victim choice are names or
callables over a :class:`RequestView` (:mod:`infermax.ordering`).
"""
from infermax.ordering import RequestView, register_rank_key, register_victim
from infermax.policy import Policy

from . import (  # noqa: F401  (registration)  # noqa: F401  (Vidur's replica schedulers)
               boundguided,
               fastertransformer,
               lightllm,
               mcsf,
               medha,
               mnemosyne,
               nested_wait,
               orca,
               pecsched,
               rank,
               sarathi,
               vllm,
               vllm_v1,
               wait,
)
from .base import Plan, Scheduler
from .framework import GetNextBatch
from .presets import register_family
from .registry import available, describe_all, get_scheduler, register_scheduler, split_specs

__all__ = ["GetNextBatch", "Plan", "Policy", "RequestView", "Scheduler", "available", "describe_all",
           "get_scheduler", "register_family", "register_rank_key", "register_scheduler", "register_victim",
           "split_specs"]
