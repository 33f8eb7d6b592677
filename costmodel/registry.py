"""Resolve a cost model from a name, a path or an object.

``get_cost_model(None)`` and ``"default"`` give the default model: the linear
model fitted to Vidur's A100 + Llama-2-7B measurements (catalog.py registers it
with :func:`register_default_cost_model`; this module imports no model). A path
ending in ``.json`` loads a serialised LinearCostModel. Further names are added
with :func:`register_cost_model`; importing ``infermax.costmodel`` registers
every fitted profile (``a100/llama2-7b``, ``h100/llama2-70b``, ...) and the
``roofline:<gpu>/<model>`` prefix. Any name may end in ``@tp=2,pp=2,...``
(a :class:`~infermax.costmodel.parallel.ParallelConfig`), or pass ``parallel=``.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable

from .base import CostModel
from .linear import LinearCostModel
from .specs import canonical_name

_FACTORIES: dict[str, Callable[[str], CostModel]] = {}
_default_factory: Callable[[], CostModel] | None = None


def register_default_cost_model(factory: Callable[[], CostModel]) -> None:
    """Register ``factory()`` as the model of ``get_cost_model(None)`` and ``"default"`` (replacing any)."""
    global _default_factory
    _default_factory = factory


def register_cost_model(prefix: str, factory: Callable[[str], CostModel]) -> None:
    """Register ``factory(spec)`` for specs equal to ``prefix`` or starting with ``prefix:``.

    The factory receives the whole spec, including any ``@<parallel>`` suffix.
    """
    _FACTORIES[prefix] = factory


def available_cost_models() -> list[str]:
    return ["default", *sorted(_FACTORIES)]


def _lookup(spec: str) -> CostModel:
    if not spec:
        raise ValueError(f"cost model name is empty; available: {', '.join(available_cost_models())}")
    if spec.lower().endswith(".json"):
        return LinearCostModel.from_json(Path(spec))     # a missing file or a directory is named
    base = spec.split("@", 1)[0]
    for key in (base, base.split(":", 1)[0]):
        if key in _FACTORIES:
            return _FACTORIES[key](spec)
    if "/" in base and ":" not in base:        # loose spellings: "A100/Llama-2-7b-hf"
        name = canonical_name(base)
        if name in _FACTORIES:
            return _FACTORIES[name](spec.replace(base, name, 1))
        if name is not None:
            fitted = ", ".join(k for k in sorted(_FACTORIES) if "/" in k)
            raise ValueError(f"no fitted profile for {name!r} (fitted: {fitted}); "
                             f"use 'scaled:{name}' (a measured model's efficiency) or 'roofline:{name}' (specs only)")
    names = available_cost_models()
    prefix, colon, _ = base.partition(":")
    close = (difflib.get_close_matches(prefix, names, n=1, cutoff=0.6) if colon
             else difflib.get_close_matches(base, names, n=3, cutoff=0.6))
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    raise ValueError(f"unknown cost model {spec!r}{hint}; available: {', '.join(names)} "
                     f"(or 'roofline:<gpu>/<model>', or a cost JSON file)")


def get_cost_model(spec: "str | CostModel | None" = None, parallel: Any = None) -> CostModel:
    """A cost model from a name, a ``.json`` path or a CostModel; ``parallel`` (a ParallelConfig)
    spreads it over several GPUs (models that know their GPU and model support this)."""
    if isinstance(spec, CostModel):
        model = spec
    elif spec is None or spec == "default":
        if _default_factory is None:
            raise ValueError("no default cost model is registered (importing infermax.costmodel registers it)")
        model = _default_factory()
    elif isinstance(spec, (str, Path)):
        model = _lookup(str(spec).strip())
    else:
        raise ValueError(f"cost must be a CostModel, a name or a path, got {spec!r}")
    if parallel is not None and not parallel.is_single_gpu:
        if not hasattr(model, "with_parallel"):
            raise ValueError(f"cost model {model.name!r} does not know its GPU and model; "
                             f"use a fitted or roofline model for parallel configs")
        model = model.with_parallel(parallel)
    return model
