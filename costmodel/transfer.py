"""Cost models for models Vidur did not measure: the roofline, at the efficiency a measured model shows.

``scaled:a100/yi-34b@tp=4`` takes the fitted model of the nearest measured model on
the same GPU (same attention kind — GQA or MHA — first, then the closest size)
and scales each coefficient by the ratio of the two models' roofline terms, so the
target runs at the same fraction of the roofline as the measured reference
(PecSched §6.2's models on 4 × 8 A100, issue 20):

- non-attention lines ``(a_k, b_k)``: biases by the ratio of the rooflines'
  weight-read times (the memory-bound bias), slopes by the ratio of their
  compute-bound per-token slopes;
- attention: slopes by the roofline attention ratios, biases by the layer ratio
  (:func:`infermax.costmodel.catalog._transfer_attention`, as the catalogue
  already does for profiles without attention measurements).

Every TP degree the reference measured (the fitted A100/H100 profiles have TP 2,
4, 8) is scaled by the rooflines at that TP, so ``@tp=4`` (and any other
parallel plan) works as it does for a fitted model. The model's ``description``
names the reference and the ratios.
"""
from __future__ import annotations

import dataclasses
import math

from .catalog import ProfiledCostModel, _split_parallel, _transfer_attention, fitted_names, load_fitted
from .linear import LinearCoefficients, LinearCostModel
from .registry import register_cost_model
from .roofline import roofline_terms
from .specs import ModelSpec, get_gpu_spec, get_model_spec


def reference_for(gpu: str, model: "str | ModelSpec") -> str:
    """The fitted model to scale from: same GPU; same attention kind first, then the closest size."""
    g, m = get_gpu_spec(gpu).name, get_model_spec(model)
    gqa = m.num_kv_heads < m.num_heads
    candidates = [n for n in fitted_names() if n.split("/")[0] == g]
    if not candidates:
        raise ValueError(f"no fitted cost model on GPU {g!r} to scale from; fitted: {', '.join(fitted_names())}")

    def rank(name: str) -> tuple[bool, float]:
        ref = get_model_spec(name.split("/")[1])
        return ((ref.num_kv_heads < ref.num_heads) != gqa, abs(math.log(ref.num_params / m.num_params)))
    return min(candidates, key=rank)


def scaled_coefficients(gpu: str, model: "str | ModelSpec", tp: int = 1) -> tuple[LinearCoefficients, str]:
    """Coefficients of ``model`` on ``gpu`` at TP ``tp`` and a sentence saying how they were made."""
    m = get_model_spec(model)
    ref_name = reference_for(gpu, m)
    ref = load_fitted(ref_name)
    ref_model = get_model_spec(ref.model)
    if tp == 1:
        k = ref.coefficients
    elif tp in ref.tp_coefficients:
        k = ref.tp_coefficients[tp]
    else:
        raise ValueError(f"scaled cost model: the reference {ref_name} has no TP-{tp} measurement "
                         f"(measured: 1, {', '.join(map(str, sorted(ref.tp_coefficients)))})")
    rs, rt = roofline_terms(ref_model, gpu, tp), roofline_terms(m, gpu, tp)
    bias_ratio = max(a for a, _ in rt.nonattn_lines) / max(a for a, _ in rs.nonattn_lines)
    slope_ratio = max(b for _, b in rt.nonattn_lines) / max(b for _, b in rs.nonattn_lines)
    lines = tuple((a * bias_ratio, b * slope_ratio) for a, b in k.nonattn_lines)
    k = _transfer_attention(dataclasses.replace(k, nonattn_lines=lines), (gpu, ref_model, tp), (gpu, m, tp))
    why = (f"no Vidur measurement of {m.name}: {ref_name} (TP {tp}) scaled by the roofline ratio "
           f"(non-attention bias x{bias_ratio:.3f}, slope x{slope_ratio:.3f}; attention by its own roofline "
           f"ratios) — the same fraction of the roofline as the measured model")
    return k, why


def scaled_model(gpu: str, model: "str | ModelSpec") -> ProfiledCostModel:
    """The TP-1 model plus every TP degree its reference measured; ``with_parallel`` spreads it."""
    g, m = get_gpu_spec(gpu).name, get_model_spec(model)
    k, why = scaled_coefficients(g, m, 1)
    by_tp = {tp: scaled_coefficients(g, m, tp)[0] for tp in sorted(load_fitted(reference_for(g, m)).tp_coefficients)}
    return ProfiledCostModel(k, gpu=g, model=m.name, tp_coefficients=by_tp, name=f"scaled:{g}/{m.name}",
                             description=why)


def _scaled_factory(spec: str) -> LinearCostModel:
    name, parallel = _split_parallel(spec.split(":", 1)[1] if ":" in spec else "")
    gpu, _, model = name.partition("/")
    if not model:
        raise ValueError(f"scaled cost model needs 'scaled:<gpu>/<model>[@tp=N]', got {spec!r}")
    scaled = scaled_model(gpu, model)
    if parallel is None:
        return scaled
    spread = scaled.with_parallel(parallel)
    spread.description = f"{scaled.description}; spread over {parallel.to_text()}"
    return spread


def register_scaled() -> None:
    register_cost_model("scaled", _scaled_factory)
