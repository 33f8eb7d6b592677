"""Resolve a cost model from a name, a path or an object.

``get_cost_model(None)`` and ``"default"`` give the default model (A100 +
Llama-2-7B linear model). A path ending in ``.json`` loads a serialised
LinearCostModel. Further names (fitted profiles such as ``a100/llama2-7b``,
``roofline:h100/llama3-8b``) are added with :func:`register_cost_model`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .base import CostModel
from .linear import LinearCostModel

_FACTORIES: dict[str, Callable[[str], CostModel]] = {}


def register_cost_model(prefix: str, factory: Callable[[str], CostModel]) -> None:
    """Register ``factory(spec)`` for specs equal to ``prefix`` or starting with ``prefix:``."""
    _FACTORIES[prefix] = factory


def available_cost_models() -> list[str]:
    return ["default", *sorted(_FACTORIES)]


def get_cost_model(spec: "str | CostModel | None" = None) -> CostModel:
    if isinstance(spec, CostModel):
        return spec
    if spec is None or spec == "default":
        return LinearCostModel(name="default")
    if not isinstance(spec, str):
        raise ValueError(f"cost must be a CostModel, a name or a path, got {spec!r}")
    if spec.endswith(".json"):
        if not Path(spec).exists():
            raise ValueError(f"cost model file {spec!r} does not exist")
        return LinearCostModel.from_json(spec)
    head = spec.split(":", 1)[0]
    for key in (spec, head):
        if key in _FACTORIES:
            return _FACTORIES[key](spec)
    raise ValueError(f"unknown cost model {spec!r}; available: {', '.join(available_cost_models())}")
