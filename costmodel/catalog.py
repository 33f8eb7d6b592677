"""Named cost models: fitted profiles (``a100/llama2-7b``) and rooflines (``roofline:h100/llama3-8b``).

Fitted models are stored as JSON in ``data/fitted/`` (one per packaged
profile: TP-1 coefficients plus one set per measured TP degree), built by
:func:`build_catalog` from the packaged Vidur profiles; a test re-fits them.
Where a profile has no attention measurements, attention comes from the
nearest profile that has them (same GPU if possible, and the same attention
kind, MHA or GQA), each coefficient scaled by the ratio of the two models'
roofline coefficients — the same fraction of peak is assumed. The model's
``description`` says so. A TP degree with non-attention but no attention
measurements takes the TP-1 attention / t.

Any name takes an ``@`` suffix with a parallel configuration:
``a100/llama2-7b@tp=2,pp=2``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from .fitting import fit_operators, operator_data
from .linear import LinearCoefficients, LinearCostModel
from .parallel import ParallelConfig, ParallelCostModel
from .profiles import ProfileFormatError, available_profiles, data_root, load_attention_profile, load_mlp_profile
from .registry import register_cost_model, register_default_cost_model
from .roofline import RooflineCostModel, roofline_terms
from .specs import VIDUR_MODEL_DIRS, ModelSpec, canonical_name, get_model_spec

log = logging.getLogger(__name__)
DEFAULT_NAME = "a100/llama2-7b"
FIT_SETTINGS = {"num_lines": 2, "extended": False}
_PROFILE_OF = {v: k for k, v in VIDUR_MODEL_DIRS.items()}


class ProfiledCostModel(LinearCostModel):
    """A fitted linear model that knows its GPU and model, so it can go parallel."""

    def __init__(self, coefficients: LinearCoefficients, *, gpu: str, model: str,
                 tp_coefficients: dict[int, LinearCoefficients] | None = None, name: str = "", description: str = ""):
        super().__init__(coefficients, name=name or f"{gpu}/{model}", description=description)
        self.gpu, self.model = gpu, model
        self.tp_coefficients = dict(tp_coefficients or {})

    def with_parallel(self, parallel: ParallelConfig) -> LinearCostModel:
        if parallel.is_single_gpu:
            return self
        return ParallelCostModel(self.coefficients, parallel, self.model, self.gpu, tp_measured=self.tp_coefficients,
                                 name=f"{self.name}@{parallel.to_text()}")

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(gpu=self.gpu, model=self.model,
                   tp_coefficients={str(t): k.to_dict() for t, k in sorted(self.tp_coefficients.items())})
        return out


# --- fitting the catalog ----------------------------------------------------------------

def _has_attention(profile: str, tp: int = 1) -> bool:
    try:
        load_attention_profile(profile, tp)
        return True
    except ProfileFormatError:
        return False


def _attention_source(gpu: str, model: ModelSpec) -> str:
    """The profile to borrow attention from: same GPU first, then same MHA/GQA kind."""
    candidates = [p for p in available_profiles() if _has_attention(p)]
    is_gqa = model.num_kv_heads < model.num_heads

    def rank(profile: str) -> tuple[int, int]:
        g, m = profile.split("/")
        other = get_model_spec(_PROFILE_OF.get(m, m))
        return ((other.num_kv_heads < other.num_heads) != is_gqa, g != gpu)
    return min(candidates, key=rank)


def _transfer_attention(k: LinearCoefficients, source: tuple[str, ModelSpec, int],
                        target: tuple[str, ModelSpec, int]) -> LinearCoefficients:
    """Scale attention coefficients by target/source roofline slopes (each (gpu, model, tp));
    biases (kernel launches) by the ratio of layer counts."""
    rs, rt = roofline_terms(source[1], source[0], source[2]), roofline_terms(target[1], target[0], target[2])
    layers = target[1].num_layers / source[1].num_layers
    dec = max(rt.decode_bytes_s, rt.decode_flops_s) / max(rs.decode_bytes_s, rs.decode_flops_s)
    pf = rt.prefill_flops_s / rs.prefill_flops_s
    return dataclasses.replace(k, decode_bias_s=k.decode_bias_s * layers, decode_kv_s=k.decode_kv_s * dec,
                               prefill_bias_s=k.prefill_bias_s * layers, prefill_attn_s=k.prefill_attn_s * pf,
                               prefill_token_s=k.prefill_token_s * pf)


def fit_catalog_entry(profile: str) -> ProfiledCostModel:
    """Fit one packaged profile (``<gpu>/<vidur model dir>``) at every TP degree it has."""
    gpu, model_dir = profile.split("/")
    model = get_model_spec(_PROFILE_OF.get(model_dir, model_dir))
    name = f"{gpu}/{model.name}"
    attention_from = profile if _has_attention(profile) else _attention_source(gpu, model)
    src_model = get_model_spec(_PROFILE_OF.get(attention_from.split("/")[1], attention_from.split("/")[1]))
    by_tp: dict[int, LinearCoefficients] = {}
    scaled_tp = []
    for tp in (1, 2, 4, 8):
        try:
            mlp = load_mlp_profile(profile, tp)
        except ProfileFormatError:
            continue
        att_tp = tp if _has_attention(attention_from, tp) else 1
        data = operator_data(attention_from, src_model, att_tp)
        data = dataclasses.replace(data, nonattn_tokens=mlp.num_tokens, nonattn_s=mlp.total_s(model.num_layers),
                                   nonattn_group=mlp.num_tokens.copy())
        k = fit_operators(data, roofline_terms(model, gpu, tp), **FIT_SETTINGS,
                          attention_roofline=roofline_terms(src_model, attention_from.split("/")[0], att_tp))
        if attention_from != profile:
            k = _transfer_attention(k, (attention_from.split("/")[0], src_model, att_tp), (gpu, model, tp))
        elif att_tp != tp:
            k = dataclasses.replace(k, decode_kv_s=k.decode_kv_s / tp, prefill_attn_s=k.prefill_attn_s / tp)
            scaled_tp.append(tp)
        by_tp[tp] = k
    description = f"fitted to Vidur's {profile} measurements (TP {', '.join(map(str, by_tp))})"
    if attention_from != profile:
        description += (f"; no attention profile: attention fitted to {attention_from} and scaled by the "
                        f"roofline ratio ({gpu}/{model.name} vs {attention_from})")
    if scaled_tp:
        description += f"; attention at TP {', '.join(map(str, scaled_tp))} not measured: TP-1 attention / TP"
    base = by_tp.pop(1)
    return ProfiledCostModel(base, gpu=gpu, model=model.name, tp_coefficients=by_tp, name=name,
                             description=description)


def _fitted_dir() -> Any:
    return data_root().joinpath("fitted")


def _file_name(name: str) -> str:
    return name.replace("/", "_") + ".json"


def build_catalog(out_dir: str | Path | None = None) -> list[Path]:
    """Re-fit every packaged profile and write the JSON files (default: the package's data/fitted)."""
    out = Path(out_dir) if out_dir is not None else Path(str(_fitted_dir()))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for profile in available_profiles():
        model = fit_catalog_entry(profile)
        path = out / _file_name(model.name)
        path.write_text(json.dumps({**model.describe(), "fit_settings": FIT_SETTINGS}, indent=2) + "\n")
        log.info("wrote %s", path)
        written.append(path)
    return written


def fitted_names() -> list[str]:
    folder = _fitted_dir()
    if not folder.is_dir():
        return []
    return sorted(f.name[:-5].replace("_", "/", 1) for f in folder.iterdir() if f.name.endswith(".json"))


def load_fitted(name: str) -> ProfiledCostModel:
    """A fitted model by name (``a100/llama2-7b``; model spellings are loose)."""
    canonical = canonical_name(name) or name
    entry = _fitted_dir().joinpath(_file_name(canonical))
    if not entry.is_file():
        raise ValueError(f"no fitted cost model {name!r}; fitted: {', '.join(fitted_names())}; "
                         f"any GPU/model pair works as 'roofline:{canonical}'")
    data = json.loads(entry.read_text())
    tp = {int(t): LinearCoefficients.from_dict(k) for t, k in data.get("tp_coefficients", {}).items()}
    return ProfiledCostModel(LinearCoefficients.from_dict(data["coefficients"]), gpu=data["gpu"], model=data["model"],
                             tp_coefficients=tp, name=data["name"], description=data.get("description", ""))


def default_cost_model() -> ProfiledCostModel:
    """The fitted A100 + Llama-2-7B model, named ``default``."""
    model = load_fitted(DEFAULT_NAME)
    model.name = "default"
    return model


# --- registration -------------------------------------------------------------------

def _split_parallel(spec: str) -> tuple[str, ParallelConfig | None]:
    """``name@tp=2,pp=2`` → (name, config); an empty or repeated setting is refused."""
    head, sep, tail = spec.partition("@")
    if not sep:
        return head, None
    keys = [part.partition("=")[0].strip().rstrip("0123456789") for part in tail.split(",") if part.strip()]
    if not keys:
        raise ValueError(f"cost model {spec!r}: nothing after '@'; write e.g. {head}@tp=2")
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise ValueError(f"cost model {spec!r}: parallel setting {dup} is given twice")
    return head, ParallelConfig.parse(tail)


def _fitted_factory(spec: str) -> LinearCostModel:
    name, parallel = _split_parallel(spec)
    model = load_fitted(name)
    return model.with_parallel(parallel) if parallel else model


def _roofline_factory(spec: str) -> Any:
    name, parallel = _split_parallel(spec.split(":", 1)[1] if ":" in spec else "")
    gpu_name, _, model_name = name.partition("/")
    if not model_name:
        raise ValueError(f"roofline cost model needs 'roofline:<gpu>/<model>', got {spec!r}")
    model = RooflineCostModel(model_name, gpu_name)
    return model.with_parallel(parallel) if parallel else model


def register_catalog() -> None:
    """Register the default model, every fitted name and the ``roofline:`` prefix (called on import of the
    package)."""
    register_default_cost_model(default_cost_model)
    for name in fitted_names():
        register_cost_model(name, _fitted_factory)
    register_cost_model("roofline", _roofline_factory)
