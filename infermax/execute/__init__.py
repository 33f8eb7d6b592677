"""infermax.execute: run a Schedule on a real (small, random-weight) Llama model.

    >>> from infermax.execute import execute
    >>> sim = infermax.simulate("fixed:I=32,O=8,B=8", "vllm", "M=512,C=256")
    >>> result = execute(sim.schedule, "fixed:I=32,O=8,B=8")      # doctest: +SKIP
    >>> result.compare(sim.trace)["batch_time_median_ape"]        # doctest: +SKIP

- :mod:`.executor`   ``execute`` and ``ExecutionResult`` (per-batch wall times, tokens)
- :mod:`.forward`    packing a batch for the paged cache, the forward pass, backends
- :mod:`.model`      the model built from a profiler ModelSpec, prompts, the reference decode
- :mod:`.validation` profile -> fit -> simulate -> execute -> compare (``infermax validate``)
- :mod:`.cli`        the ``validate`` command

torch is an optional extra: importing this package does not import it; the
names below load their module on first use.
"""
from importlib import import_module

_LAZY = {"execute": "executor", "ExecutionResult": "executor", "build_model": "model",
         "model_config": "model", "prompt_tokens": "model", "reference_tokens": "model",
         "validate": "validation", "ValidationReport": "validation"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)


class _CallablePackage(type(import_module(__name__))):
    """Makes ``infermax.execute(schedule, workload, ...)`` work as the design's API says,
    while ``infermax.execute`` stays the subpackage (``infermax.execute.validate`` ...)."""

    def __call__(self, *args, **kwargs):
        return getattr(import_module(f"{__name__}.executor"), "execute")(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallablePackage
