"""infermax Limits as vLLM engine options, one to one, and the random-weight model shapes.

=====================  =========================================================
infermax               vLLM (``EngineArgs``)
=====================  =========================================================
``C``                  ``max_num_batched_tokens`` (the one token budget of a step,
                       decodes included; vLLM has no separate prefill budget, so
                       ``P`` must equal ``C``)
``R_max``              ``max_num_seqs`` (None: the number of requests, i.e. no cap)
``block_size``         ``block_size`` (vLLM allocates KV in blocks; the CPU
                       attention backend wants a multiple of 32)
``M // block_size``    ``num_gpu_blocks_override - 1``: vLLM's block pool keeps one
                       block aside as its *null block*, so the engine gets one block
                       more than the usable ``M // block_size``
=====================  =========================================================

Prefix caching is off (infermax requests share no prefix), the watermark is 0 (vLLM's default;
``watermark=`` sets one), chunked prefill is on (vLLM v1 always chunks), and ``max_model_len`` is
the workload's longest ``I + O``. Nothing here imports vLLM.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..types import Limits, Workload

#: random-weight model shapes built locally (no download): name -> transformers LlamaConfig options
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "llama-tiny": dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=4),
    "llama-small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=8),
}
_SHAPE_KEYS = {"vocab": "vocab_size", "hidden": "hidden_size", "ff": "intermediate_size",
               "layers": "num_hidden_layers", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads"}


def parse_shape(spec: str) -> dict[str, int]:
    """A named shape (``llama-tiny``) or ``llama:hidden=256,layers=4,heads=4,kv_heads=4,ff=688,vocab=2048``
    (any subset; the rest from llama-tiny) as LlamaConfig options."""
    if spec in MODEL_SHAPES:
        return dict(MODEL_SHAPES[spec])
    name, _, opts = spec.partition(":")
    if name != "llama":
        raise ValueError(f"model shape {spec!r}: use one of {', '.join(MODEL_SHAPES)} or "
                         f"llama:hidden=H,layers=L,heads=A,kv_heads=K,ff=F,vocab=V")
    shape = dict(MODEL_SHAPES["llama-tiny"])
    for part in filter(None, (p.strip() for p in opts.split(","))):
        key, _, raw = part.partition("=")
        if key not in _SHAPE_KEYS:
            raise ValueError(f"model shape {spec!r}: unknown key {key!r}; use {', '.join(_SHAPE_KEYS)}")
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"model shape {spec!r}: {key} must be a positive integer, got {raw!r}") from None
        if value < 1:
            raise ValueError(f"model shape {spec!r}: {key} must be a positive integer, got {raw!r}")
        shape[_SHAPE_KEYS[key]] = value
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    if shape["hidden_size"] % heads or heads % kv_heads:
        raise ValueError(f"model shape {spec!r}: hidden must be a multiple of heads, heads a multiple of kv_heads")
    return shape


def engine_limits(limits: Limits, workload: Workload) -> dict[str, Any]:
    """The vLLM engine options that give ``limits`` exactly (see the module table); refuses what vLLM
    cannot express, naming the field."""
    if limits.P != limits.C:
        raise ValueError(f"Limits.P = {limits.P} differs from C = {limits.C}: vLLM has one token budget per "
                         f"step (max_num_batched_tokens), shared by prefills and decodes; give P = C")
    if limits.block_size == 1:
        raise ValueError("Limits.block_size = 1: vLLM allocates KV in blocks; give block=32 (the CPU build "
                         "wants a multiple of 32; 16 is the GPU default)")
    workload.check_fits(limits)
    max_len = int((workload.input_lens + workload.output_lens).max())
    return {"block_size": limits.block_size, "num_gpu_blocks_override": limits.num_blocks + 1,
            "max_num_batched_tokens": limits.C,
            "max_num_seqs": limits.R_max if limits.R_max is not None else len(workload),
            "max_model_len": max_len}


def kv_cache_bytes(shape: Mapping[str, int], num_blocks: int, block_size: int, dtype_bytes: int = 2) -> int:
    """KV memory of ``num_blocks`` blocks for a model of ``shape`` (keys and values of every layer),
    plus a margin of 4 MiB: what the CPU build is told to set aside (``kv_cache_memory_bytes``)."""
    head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * dtype_bytes
    return per_token * block_size * num_blocks + (4 << 20)


def limits_of_engine(options: Mapping[str, Any]) -> Limits:
    """The inverse of :func:`engine_limits`: the infermax Limits an engine configured so runs under."""
    bs = int(options["block_size"])
    return Limits(M=(int(options["num_gpu_blocks_override"]) - 1) * bs, C=int(options["max_num_batched_tokens"]),
                  R_max=int(options["max_num_seqs"]), block_size=bs)
