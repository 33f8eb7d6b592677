"""infermax.costmodel: batch-time models, specs, profiles and fitting.

- :mod:`.linear`    the per-operator linear model (the default, MILP-ready)
- :mod:`.specs`     model and GPU specifications, KV capacity M
- :mod:`.profiles`  loaders for Vidur-format CSV profiles (packaged A100/H100 data)
- :mod:`.fitting`   per-operator regressions → LinearCoefficients
- :mod:`.lsq`       relative least squares, behind every fitted line
- :mod:`.accuracy`  held-out error of a fit (per operator and per batch)
- :mod:`.roofline`  lower-bound batch times from specs alone
- :mod:`.communication`, :mod:`.parallel`  TP / PP / SP / KVP terms
- :mod:`.unit`      ``unit``: every batch costs one round (the scheduling papers' unit time)
- :mod:`.catalog`   named fitted and roofline models, registered on import
- :mod:`.transfer`  ``scaled:<gpu>/<model>``: unmeasured models at a measured model's roofline efficiency
- :mod:`.profiler`  measure a profile with PyTorch (CPU or CUDA; torch imported lazily)
- :mod:`.packed`    the packed-batch layout the profiler times and the executor runs
"""
from .base import CostModel
from .catalog import ProfiledCostModel, register_catalog
from .linear import LinearCoefficients, LinearCostModel, linear_coefficients
from .parallel import ParallelConfig, ParallelCostModel
from .registry import available_cost_models, get_cost_model, register_cost_model
from .roofline import RooflineCostModel
from .specs import GPUS, MODELS, GpuSpec, ModelSpec, get_gpu_spec, get_model_spec, kv_capacity_tokens
from .transfer import register_scaled
from .unit import register_unit, unit_cost_model

register_catalog()
register_scaled()
register_unit()

__all__ = ["GPUS", "MODELS", "CostModel", "GpuSpec", "LinearCoefficients", "LinearCostModel", "ModelSpec",
           "ParallelConfig", "ParallelCostModel", "ProfiledCostModel", "RooflineCostModel", "available_cost_models",
           "get_cost_model", "get_gpu_spec", "get_model_spec", "kv_capacity_tokens", "linear_coefficients",
           "register_cost_model", "unit_cost_model"]
