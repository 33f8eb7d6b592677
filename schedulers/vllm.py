"""vLLM and vLLM-hy (infermax.txt Table 1): prefills first, no chunked prefill.

vLLM: waiting requests first (whole prompts, up to C tokens), no hybrid batches:
a batch is all-prefill or all-decode. When a running decode cannot get a KV slot
it evicts the lowest-priority running requests, and finally itself.
vLLM-hy: the same with hybrid batching (decodes may join a prefill batch).
"""
from .framework import register_family

register_family("vllm", "vLLM: prefill priority, no hybrid batching, no chunked prefill, P=C",
                priority="prefill", hybrid=False, chunked=False)
register_family("vllm-hy", "vLLM-hy: prefill priority, hybrid batching, no chunked prefill, P=C",
                priority="prefill", hybrid=True, chunked=False)
