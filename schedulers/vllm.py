"""vLLM and vLLM-hy (InferMax Table 1): prefills first, no chunked prefill.

vLLM: waiting requests first (whole prompts, up to C tokens), no hybrid batches:
a batch is all-prefill or all-decode. When a running decode cannot get a KV slot
it evicts the lowest-priority running requests, and finally itself.
vLLM-hy: the same with hybrid batching (decodes may join a prefill batch).
vLLM-real: vLLM as deployed (and as Vidur simulates it): KV in blocks of 16
tokens and a 1 % admission watermark for first fills and refills.
"""
from .presets import register_family, register_preset

register_family("vllm", "vLLM: prefill priority, no hybrid batching, no chunked prefill, P=C",
                priority="prefill", hybrid=False, chunked_prefill=False)
register_family("vllm-hy", "vLLM-hy: prefill priority, hybrid batching, no chunked prefill, P=C",
                priority="prefill", hybrid=True, chunked_prefill=False)
register_preset("vllm-real", "vLLM as deployed: vllm with KV blocks of 16 tokens and a 1 % admission watermark",
                priority="prefill", hybrid=False, chunked_prefill=False)
