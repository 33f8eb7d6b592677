"""Policy classes for the MILP (InferMax §3.3, last paragraph; Table 1).

The unconstrained model allows evictions, hybrid batches and chunked prefill.
A policy class removes some of that freedom so that the optimum *within a class
of schedulers* can be compared with the heuristic of that class: e.g. the vLLM
class is "no hybrid batching, no chunked prefill"; every ``-ef`` scheduler
belongs to the eviction-free class.

A class is the one :class:`infermax.policy.Policy` the heuristics are configured
by; the MILP reads its class fields (``allow_eviction``, ``hybrid``,
``chunked_prefill``, ``P``, ``R_max``) and ignores how GetNextBatch would pick.
"""
from infermax.policy import Policy

__all__ = ["Policy"]
