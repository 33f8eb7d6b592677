"""Optional Triton import and the backend choice every public wrapper makes.

Kernel modules write ``from ._triton import triton, tl`` and decorate with
``@triton.jit`` as usual. When Triton is not installed, ``triton.jit`` becomes an
identity decorator and ``tl.constexpr`` a plain placeholder, so the module still
imports and its PyTorch reference still runs; only launching a kernel needs Triton.

Triton reads ``TRITON_INTERPRET`` when a function is decorated, so the variable must
be set before the first kernel module is imported (tests do this in conftest.py).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # torch-only install: references only
    HAS_TRITON = False
    triton = SimpleNamespace(jit=lambda fn=None, **_: fn, cdiv=lambda a, b: -(-a // b))
    tl = SimpleNamespace(constexpr=None)

BACKENDS = ("auto", "triton", "torch")


def is_interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(backend: str, *tensors) -> bool:
    """Decide whether a wrapper launches its Triton kernel (True) or its reference.

    ``backend="auto"`` picks Triton when it is importable and either every tensor is
    on CUDA or the interpreter is on (tensors on CPU); ``"triton"`` insists (and
    raises if that is impossible); ``"torch"`` always takes the reference.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    possible = HAS_TRITON and (on_cuda or (on_cpu and is_interpreting()))
    if backend == "triton" and not possible:
        raise RuntimeError(
            "backend='triton' needs triton installed and CUDA tensors, "
            "or CPU tensors with TRITON_INTERPRET=1 set before import"
        )
    return possible


def tile_dtype(t) -> tuple:
    """(dtype of the loaded tiles, ``tl.dot`` input precision) for tensors like ``t``.

    float16/bfloat16 tiles stay in their dtype on CUDA (tensor cores, float32
    accumulation). float32 inputs, and every input under the interpreter (which
    mishandles bfloat16), are computed in float32 with exact IEEE products.
    """
    half = {"torch.float16": "float16", "torch.bfloat16": "bfloat16"}.get(str(t.dtype))
    if half and not is_interpreting():
        return getattr(tl, half), "tf32"
    return tl.float32, "ieee"


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (tile sizes in Triton must be powers of two)."""
    return 1 << max(0, (int(n) - 1).bit_length())
