"""infermax.execute: run a Schedule on a real (small, random-weight) Llama model.

    >>> import infermax
    >>> sim = infermax.simulate("fixed:I=32,O=8,B=8", "vllm", "M=512,C=256")
    >>> result = infermax.execute(sim.schedule, "fixed:I=32,O=8,B=8")     # doctest: +SKIP
    >>> result.compare(sim.trace)["batch_time_median_ape"]                # doctest: +SKIP

``infermax.execute`` is this package, and calling it calls its function :func:`.executor.execute`
(:mod:`infermax._callable`, as for ``infermax.replay``); its modules are imported by name
(``from infermax.execute.validation import validate``):

- :mod:`.executor`   ``execute`` and ``ExecutionResult`` (per-batch wall times, tokens)
- :mod:`.forward`    packing a batch for the paged cache, the forward pass, backends
- :mod:`.model`      the model built from a profiler ModelSpec, prompts, the reference decode
- :mod:`.validation` profile -> fit -> simulate -> execute -> compare (``infermax validate``)
- :mod:`.cli`        the ``validate`` command

torch is an optional extra: importing this package does not import it (each
function imports it when it runs); the validation names load their module on first use.
"""
import sys
from importlib import import_module

from .._callable import CallableModule
from .executor import ExecutionResult, execute  # torch-free at import; torch loads when a schedule runs
from .model import build_model, model_config, prompt_tokens, reference_tokens

_LAZY = {"validate": "validation", "ValidationReport": "validation"}

__all__ = ["ExecutionResult", "ValidationReport", "build_model", "execute", "model_config", "prompt_tokens",
           "reference_tokens", "validate"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_LAZY[name]}", __name__), name)


sys.modules[__name__].__class__ = CallableModule   # calling the module calls execute (infermax._callable)
