"""infermax.costmodel: batch-time models, specs, profiles and fitting."""
from .base import CostModel
from .linear import LinearCoefficients, LinearCostModel
from .registry import available_cost_models, get_cost_model, register_cost_model

__all__ = ["CostModel", "LinearCoefficients", "LinearCostModel", "available_cost_models",
           "get_cost_model", "register_cost_model"]
