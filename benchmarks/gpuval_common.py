"""Shared pieces of ``gpu_validation.py``'s steps: the step context, the device's physical limits, a timer.

Every step runs in its own forked process (see ``gpu_validation.py``) and gets a :class:`Ctx`:
``ctx.record(kind, **fields)`` appends one JSON line to the step's file at once (so whatever
finished survives a step that is killed at its budget), and ``ctx.time_left()`` is the
step's own deadline, checked between sub-cases.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

#: Dense bf16/fp16 tensor-core peaks and HBM bandwidths (datasheets, no sparsity), by a name fragment
#: of ``torch.cuda.get_device_name()``; the first fragment found wins (so "H100 PCIe" before "H100").
PEAKS = (
    ("H200", "h200 (SXM datasheet)", 989.4e12, 4.8e12),
    ("H100 PCIe", "h100-pcie (datasheet)", 756.5e12, 2.0e12),
    ("H100 NVL", "h100-nvl (datasheet)", 835.5e12, 3.9e12),
    ("H100", "h100 (SXM datasheet)", 989.4e12, 3.35e12),
    ("A100", "a100 (SXM datasheet)", 312e12, 2.039e12),
)
#: The CPU dry run has no datasheet: a nominal figure so that the same code runs; its ratios mean nothing.
CPU_NOMINAL = ("cpu (nominal 1e11 FLOP/s, 2e10 B/s: not a measurement; ratios meaningless)", 1e11, 2e10)
TOLERANCES = {"bfloat16": (2e-2, 1e-3), "float16": (2e-3, 1e-3), "float32": (1e-4, 1e-4)}   # (o abs, lse abs)


def tiny_model() -> Any:
    """The ``--tiny`` model: Llama-3-8B's attention grouping (4 query heads per KV head), a few thousand
    times smaller, so that the CPU dry run profiles and executes in seconds."""
    from infermax.costmodel.specs import ModelSpec

    return ModelSpec(name="llama-micro", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=1, ffn_size=128,
                     vocab_size=512, dtype_bytes=2)


@dataclass
class Ctx:
    """What a step knows: device, mode, dtype, folders, its deadline and its record file."""

    device: str
    tiny: bool
    dtype: str
    out: Path
    work: Path
    deadline: float
    records: Path
    repo: Path

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        row = finite({"kind": kind, **fields})
        with open(self.records, "a") as fh:
            fh.write(json.dumps(row, default=_plain, allow_nan=False) + "\n")
            fh.flush()
        return row

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _plain(value: Any) -> Any:
    """JSON for numpy scalars, paths and non-finite floats (as strings: JSON has no NaN)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def finite(value: Any) -> Any:
    """``value`` with non-finite floats (nested) replaced by their string, for ``json.dumps(allow_nan=False)``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def device_info(device: str) -> dict[str, Any]:
    """Name, versions and the physical limits the speed ratios use (stated, with their source)."""
    import torch
    import triton

    info = {"device": device, "torch": torch.__version__, "triton": triton.__version__}
    if not device.startswith("cuda"):
        info.update(name="cpu", spec=CPU_NOMINAL[0], peak_flops=CPU_NOMINAL[1], hbm_bytes_per_s=CPU_NOMINAL[2])
        return info
    name = torch.cuda.get_device_name(device)
    props = torch.cuda.get_device_properties(device)
    info.update(name=name, memory_gib=round(props.total_memory / 2**30, 1), sm_count=props.multi_processor_count,
                cuda=torch.version.cuda, spec=None, peak_flops=None, hbm_bytes_per_s=None)
    for fragment, label, flops, bandwidth in PEAKS:
        if fragment.lower() in name.lower():
            info.update(spec=label, peak_flops=flops, hbm_bytes_per_s=bandwidth)
            break
    return info


class Timer:
    """Median time of a call: CUDA events around the call after flushing L2 (as triton.testing.do_bench);
    on CPU ``perf_counter``. ``budget_s`` caps the repeats of one case."""

    def __init__(self, device: str, budget_s: float = 0.5, max_reps: int = 50, min_reps: int = 3) -> None:
        self.device, self.budget_s, self.max_reps, self.min_reps = device, budget_s, max_reps, min_reps
        self._flush = None
        if device.startswith("cuda"):
            import torch

            self._flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device)

    def __call__(self, fn: Callable[[], Any]) -> float:
        """Seconds (median)."""
        if self._flush is not None:
            fn()                                        # warm-up and Triton compile (the interpreter has none)
        first = self._once(fn)
        reps = max(self.min_reps, min(self.max_reps, int(self.budget_s / max(first, 1e-6))))
        return statistics.median([first] + [self._once(fn) for _ in range(reps - 1)])

    def _once(self, fn: Callable[[], Any]) -> float:
        if self._flush is None:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        import torch

        self._flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e-3


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
