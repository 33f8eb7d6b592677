"""Registering the GetNextBatch schedulers by family: :func:`register_family` (a policy, its eviction-free
``-ef`` and its look-ahead ``-la`` variants) and :func:`register_preset` (one scheduler that models a real
deployment: KV blocks of :data:`REAL_BLOCK_SIZE` tokens and an admission watermark of :data:`REAL_WATERMARK`).
The families themselves are registered by their modules (vllm, sarathi, rank)."""
from __future__ import annotations

from infermax.policy import Policy

from .framework import GetNextBatch


def register_family(name: str, doc: str, lookahead: bool = True, **policy) -> None:
    """Register ``name``, its eviction-free variant ``name-ef`` (reserves I+O-1 at admission)
    and, unless ``lookahead=False``, its look-ahead variant ``name-la``.

    All accept ``R_max``, ``P`` and ``watermark`` options (e.g. ``get_scheduler("vllm", R_max=128)``,
    ``"vllm:watermark=0.01"``; the watermark defaults to 0, the paper's semantics — vLLM's default
    is 0.01).
    """
    from .registry import register_scheduler

    default_P = policy.pop("P", None)
    variants = {"": {}, "-ef": {"allow_eviction": False}, **({"-la": {"lookahead": True}} if lookahead else {})}
    notes = {"": "", "-ef": " — eviction-free: reserves I+O-1 at admission",
             "-la": " — look-ahead admission: no future KV overflow"}
    for suffix, extra in variants.items():
        full = name + suffix

        def factory(R_max: int | None = None, P: int | None = default_P, watermark: float = 0.0,
                    _extra: dict = extra, _name: str = full) -> GetNextBatch:
            return GetNextBatch(Policy(**policy, **_extra, P=P, R_max=R_max, watermark=watermark), name=_name)

        register_scheduler(full, doc + notes[suffix])(factory)


#: what the ``*-real`` presets model: vLLM's (and Vidur's) KV block size and admission watermark
REAL_BLOCK_SIZE = 16
REAL_WATERMARK = 0.01


def register_preset(name: str, doc: str, **policy) -> None:
    """Register one scheduler that behaves like a real deployment: KV in blocks of
    :data:`REAL_BLOCK_SIZE` tokens (applied to the Limits by ``simulate``) and an admission
    watermark of :data:`REAL_WATERMARK`, on top of ``policy``. Options: ``R_max``, ``P`` and
    ``watermark`` (``"vllm-real:R_max=256"``)."""
    from .registry import register_scheduler

    default_P = policy.pop("P", None)

    def factory(R_max: int | None = None, P: int | None = default_P,
                watermark: float = REAL_WATERMARK) -> GetNextBatch:
        return GetNextBatch(Policy(**policy, P=P, R_max=R_max, watermark=watermark, block_size=REAL_BLOCK_SIZE),
                            name=name)

    register_scheduler(name, doc)(factory)
