"""infermax.kernels: attention kernels for paged KV caches, each beside its PyTorch reference.

Modules (import them directly; this package imports neither torch nor triton):

- ``reference``          dense softmax attention with log-sum-exp, the ground truth
- ``merge``              merge_states / merge_states_multi: combine partial attention
- ``paged``              paged KV cache layout, writes, gathers, block allocator
- ``prefill_attention``  causal chunked-prefill attention over the paged cache (GQA)
- ``decode_attention``   split-KV decode attention (flash-decoding)
- ``csa``                CSA multi-level sparse attention (reads only the kept keys) and its error vs dense
- ``llama``              small random-weight Llama model running on the paged cache

Log-sum-exp values are natural logarithms everywhere. Every public wrapper runs the
Triton kernel when triton is importable and the tensors are on CUDA (or
``TRITON_INTERPRET=1`` is set, for CPU tensors), else the PyTorch reference.
Attributes listed in ``_LAZY`` resolve on first access, importing torch then.
"""

from importlib import import_module

_LAZY = {
    "attention_with_lse": "reference",
    "merge_states": "merge",
    "merge_states_multi": "merge",
    "PagedKVCache": "paged",
    "write_kv": "paged",
    "gather_kv": "paged",
    "prefill_attention": "prefill_attention",
    "decode_attention": "decode_attention",
    "csa_attention": "csa",
    "csa_attention_reference": "csa",
    "csa_error_vs_dense": "csa",
    "LlamaConfig": "llama",
    "LlamaModel": "llama",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
