"""Model and hardware specifications, and the KV-cache capacity they imply.

Numbers are the public datasheet/config values (dense FP16/BF16 tensor-core
peaks, not the sparsity figures; bandwidths in bytes per second, one direction,
per GPU). Model shapes are the Hugging Face configs. Names are looked up
loosely: ``"llama2-7b"``, ``"Llama-2-7b-hf"`` and ``"meta-llama/Llama-2-7b-hf"``
are the same model; ``"a100"``, ``"A100-80G"`` the same GPU.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

GIB = 1024**3


def _check_positive(owner: str, obj: object) -> None:
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{owner}.{f.name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only Llama-architecture transformer."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    dtype_bytes: int = 2
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        _check_positive("ModelSpec", self)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"ModelSpec.hidden_size must be a multiple of num_heads, got {self.hidden_size!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec.num_kv_heads must divide num_heads, got {self.num_kv_heads!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer (QKV, O, MLP, two norms)."""
        d, hd = self.hidden_size, self.head_dim
        attn = d * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * d
        mlp = (3 if self.gated_mlp else 2) * d * self.ffn_size
        return attn + mlp + 2 * d

    @property
    def num_params(self) -> int:
        """All weights: layers, input embedding, final norm and (untied) LM head."""
        return self.num_layers * self.layer_params + 2 * self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cached per token over all layers (medha Eq. 2: 4·n·d·h_kv at 2 bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One accelerator: peak dense FP16 FLOP/s, HBM and interconnect bandwidths (B/s)."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    memory_bytes: float
    nvlink_bandwidth: float
    network_bandwidth: float
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        _check_positive("GpuSpec", self)


MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec(name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
              ffn_size=11008, vocab_size=32000),
    ModelSpec(name="llama2-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
              ffn_size=28672, vocab_size=32000),
    ModelSpec(name="llama3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              ffn_size=14336, vocab_size=128256),
    ModelSpec(name="llama3-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
              ffn_size=28672, vocab_size=128256),
    ModelSpec(name="mistral-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              ffn_size=14336, vocab_size=32000),
    # PecSched §6.2 (Table 5), Hugging Face configs: Mistral-7B-v0.3 (32,768-token vocabulary),
    # Phi-3-medium (14B), Yi-34B, Llama-3.1-70B (the Llama-3-70B shape)
    ModelSpec(name="mistral-7b-v0.3", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              ffn_size=14336, vocab_size=32768),
    ModelSpec(name="phi3-14b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=10,
              ffn_size=17920, vocab_size=32064),
    ModelSpec(name="yi-34b", num_layers=60, hidden_size=7168, num_heads=56, num_kv_heads=8,
              ffn_size=20480, vocab_size=64000),
    ModelSpec(name="llama3.1-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
              ffn_size=28672, vocab_size=128256),
    # CSPS §3.1: the two 1M-context models of its evaluation, Hugging Face configs (GLM-4-9B-Chat-1M:
    # 2 KV groups, 151,552-token padded vocabulary; InternLM2.5-7B-Chat-1M: 8 KV heads, 92,544 tokens)
    ModelSpec(name="glm4-9b", num_layers=40, hidden_size=4096, num_heads=32, num_kv_heads=2,
              ffn_size=13696, vocab_size=151552),
    ModelSpec(name="internlm2.5-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
              ffn_size=14336, vocab_size=92544),
    # small Llama-architecture config measured by the CPU profiler
    ModelSpec(name="llama-tiny", num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=2,
              ffn_size=688, vocab_size=4096, dtype_bytes=4),
)}

GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    # A100 SXM4 80GB: 312 TFLOP/s dense FP16, 2.039 TB/s HBM2e, NVLink3 600 GB/s bidirectional,
    # DGX A100: one 200 Gb/s HDR InfiniBand port per GPU
    GpuSpec(name="a100", peak_flops=312e12, hbm_bandwidth=2.039e12, memory_bytes=80 * GIB,
            nvlink_bandwidth=300e9, network_bandwidth=25e9),
    # H100 SXM5 80GB: 989 TFLOP/s dense FP16, 3.35 TB/s HBM3, NVLink4 900 GB/s bidirectional,
    # DGX H100: one 400 Gb/s NDR port per GPU
    GpuSpec(name="h100", peak_flops=989.4e12, hbm_bandwidth=3.35e12, memory_bytes=80 * GIB,
            nvlink_bandwidth=450e9, network_bandwidth=50e9),
    # H200 SXM 141GB: H100 compute, 4.8 TB/s HBM3e
    GpuSpec(name="h200", peak_flops=989.4e12, hbm_bandwidth=4.8e12, memory_bytes=141e9,
            nvlink_bandwidth=450e9, network_bandwidth=50e9),
)}

_MODEL_ALIASES = {
    "llama27b": "llama2-7b", "llama270b": "llama2-70b", "llama38b": "llama3-8b",
    "llama370b": "llama3-70b", "mistral7b": "mistral-7b", "mistral7bv01": "mistral-7b",
    "llamatiny": "llama-tiny", "mistral7bv03": "mistral-7b-v0.3", "phi314b": "phi3-14b",
    "phi3medium": "phi3-14b", "phi3medium4k": "phi3-14b", "phi3medium128k": "phi3-14b", "yi34b": "yi-34b",
    "llama3170b": "llama3.1-70b", "metallama3170b": "llama3.1-70b",
    "glm49b": "glm4-9b", "glm49bchat1m": "glm4-9b", "internlm257b": "internlm2.5-7b",
    "internlm257bchat1m": "internlm2.5-7b",
}
#: Vidur's profile directory name of each model
VIDUR_MODEL_DIRS = {"llama2-7b": "Llama-2-7b-hf", "llama2-70b": "Llama-2-70b-hf",
                    "llama3-8b": "Meta-Llama-3-8B"}


def _key(name: str) -> str:
    text = name.strip().lower().rsplit("/", 1)[-1]
    text = re.sub(r"^meta-", "", text)
    text = re.sub(r"-(hf|instruct|chat)$", "", text)
    return re.sub(r"[^a-z0-9]", "", text.replace("80gb", "").replace("80g", "").replace("sxm", ""))


def get_model_spec(name: "str | ModelSpec") -> ModelSpec:
    """Look up a model by any common spelling of its name."""
    if isinstance(name, ModelSpec):
        return name
    canonical = _MODEL_ALIASES.get(_key(name))
    if canonical is None:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[canonical]


def get_gpu_spec(name: "str | GpuSpec") -> GpuSpec:
    """Look up a GPU by name (``a100``, ``A100-80G``, ``h100``, ``h200``)."""
    if isinstance(name, GpuSpec):
        return name
    key = _key(name)
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def canonical_name(name: str) -> str | None:
    """``"A100/Llama-2-7b-hf"`` → ``"a100/llama2-7b"``; None if either part is unknown."""
    gpu_name, _, model_name = name.partition("/")
    try:
        return f"{get_gpu_spec(gpu_name).name}/{get_model_spec(model_name).name}"
    except ValueError:
        return None


def kv_capacity_tokens(model: "str | ModelSpec", gpu: "str | GpuSpec", util: float = 0.9,
                       tp: int = 1, pp: int = 1) -> int:
    """M, the KV-cache capacity in tokens (InferMax §2.2).

    M = (util · GPU memory − model size) / KV size per token, per GPU of a
    tp × pp replica: each GPU holds 1/(tp·pp) of the weights and, for its
    1/pp of the layers, ceil(h_kv / tp) KV heads (KV heads are replicated when
    tp > h_kv). Raises ValueError when the weights alone do not fit.
    """
    m, g = get_model_spec(model), get_gpu_spec(gpu)
    if not 0 < util <= 1:
        raise ValueError(f"util must be in (0, 1], got {util!r}")
    for field_name, value in (("tp", tp), ("pp", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field_name} must be an integer >= 1, got {value!r}")
    free = util * g.memory_bytes - m.weight_bytes / (tp * pp)
    kv_heads = math.ceil(m.num_kv_heads / tp)
    per_token = 2 * math.ceil(m.num_layers / pp) * kv_heads * m.head_dim * m.dtype_bytes
    if free <= 0:
        raise ValueError(f"{m.name} ({m.weight_bytes / GIB:.1f} GiB) does not fit on {g.name} "
                         f"at util={util}, tp={tp}, pp={pp}")
    return int(free // per_token)
