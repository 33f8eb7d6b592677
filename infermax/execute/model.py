"""The executed model, its prompts and the reference it must agree with.

The executor runs :class:`infermax.kernels.llama.LlamaModel` (random weights from
a seed, no download) built from a :class:`~infermax.costmodel.specs.ModelSpec`,
the same spec the CPU profiler measures (``llama-tiny`` by default), so a cost
model fitted to that profile prices exactly the model that runs. Prompts are
token ids drawn from a per-request seeded RNG; the reference output of a request
is :meth:`LlamaModel.generate_greedy` on its prompt alone (dense attention, no
cache, no batching), the ground truth that no schedule may change.

torch is imported inside the functions only.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Mapping

import numpy as np

from infermax.costmodel.specs import ModelSpec, get_model_spec
from infermax.types import Workload

DEFAULT_MODEL = "llama-tiny"
_DTYPES = {4: "float32", 2: "float16"}


def model_config(spec: "str | ModelSpec" = DEFAULT_MODEL, seed: int = 0) -> Any:
    """The :class:`LlamaConfig` of a model spec (same shapes the profiler times), weights from ``seed``."""
    from infermax.kernels.llama import LlamaConfig

    s = get_model_spec(spec)
    if not s.gated_mlp:
        raise ValueError(f"model {s.name!r}: the executor runs a gated (SwiGLU) MLP, spec has gated_mlp=False")
    return LlamaConfig(num_layers=s.num_layers, hidden_size=s.hidden_size, num_q_heads=s.num_heads,
                       num_kv_heads=s.num_kv_heads, intermediate_size=s.ffn_size, vocab_size=s.vocab_size,
                       seed=seed)


def build_model(spec: "str | ModelSpec" = DEFAULT_MODEL, device: str = "cpu", seed: int = 0,
                dtype: str | None = None) -> Any:
    """A random-weight LlamaModel of ``spec`` drawn on ``device``, in ``dtype`` ("float32", "float16",
    "bfloat16"; default the spec's: 4 bytes float32, 2 bytes float16)."""
    import torch

    from infermax.kernels.llama import LlamaModel

    s = get_model_spec(spec)
    check_device(device)
    name = dtype or _DTYPES.get(s.dtype_bytes, "float32")
    if name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    return LlamaModel(model_config(s, seed), device=device, dtype=getattr(torch, name))


def check_device(device: str) -> None:
    """Raise ValueError for anything but ``cpu`` or an available ``cuda[:i]``."""
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")


@contextmanager
def torch_threads(num_threads: int | None):
    """Run with ``num_threads`` torch CPU threads (None: unchanged), then restore.

    One thread is the default everywhere here: on a busy 2-core machine torch's
    thread pool spins, and a dense forward of 40 tokens took 0.15 s with 2
    threads against 0.024 s with 1.
    """
    import torch

    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def prompt_tokens(workload: Workload, vocab_size: int, seed: int = 0) -> dict[int, tuple[int, ...]]:
    """Prompt token ids of every request: ``input_len`` ids from an RNG seeded by (seed, request id)."""
    return {int(r.id): tuple(int(t) for t in np.random.default_rng((seed, int(r.id))).integers(
        0, vocab_size, r.input_len)) for r in workload.requests}


def reference_tokens(model: Any, prompts: Mapping[int, tuple[int, ...]], workload: Workload,
                     num_threads: int | None = 1) -> dict[int, tuple[int, ...]]:
    """Single-request greedy decode of each prompt (``output_len`` tokens), the executor's ground truth."""
    import torch

    with torch_threads(num_threads), torch.inference_mode():
        return {int(r.id): tuple(model.generate_greedy(list(prompts[int(r.id)]), r.output_len))
                for r in workload.requests}
