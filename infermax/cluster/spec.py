"""A cluster: nodes of GPUs, the links between them, and the model replicas placed on them.

``Cluster.from_spec("a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3,tp=1")`` is
PecSched §6.2's testbed for Mistral 7B: 32 A100-80GB, one replica per GPU.
Keys (all optional but the GPU name in front):

- ``nodes`` (1), ``gpus_per_node`` (the GPU's default, 8), ``model`` (``llama2-7b``);
- the replica's parallel plan: ``tp``, ``pp``, ``spp``, ``sp``, ``kvp`` (1) and ``sp_kind``
  (:class:`~infermax.costmodel.parallel.ParallelConfig`). ``pp`` is plain pipeline
  parallelism, priced as one batch passing every stage in turn (the cost model's
  latency); ``spp`` (Medha §3.3) is the same number of stages *executed*: a
  request's next prefill chunk enters stage 1 as soon as its previous chunk left
  stage 1 (:mod:`~infermax.cluster.plans`). At most one of them is above 1. ``kvp``
  shards a request's KV over KVP groups (§3.4); with ``spp`` or ``kvp`` above 1 the
  replica's plan is executed stage by stage and group by group
  (:mod:`~infermax.cluster.plans`), otherwise priced by the cost model as before;
- ``util`` (0.9), the share of GPU memory for weights and KV (vLLM's
  ``gpu_memory_utilization``); a replica's KV capacity M is
  ``kv_capacity_tokens`` of its plan;
- ``net_gbps``: the network bandwidth of one node in Gbit/s (§6.2: 400); by
  default each GPU has the GPU spec's own port (DGX A100: 200 Gbit/s per GPU).

Links: inside a node, NVLink; across nodes, the network. A point-to-point
transfer between two replicas moves its bytes over the sending replica's GPUs in
parallel: ``latency + bytes / (g · per-GPU bandwidth)`` with g the GPUs of the
sending replica (each GPU holds its own shard of the KV). Where Vidur measured
send/recv on this GPU (``a100_dgx``, ``h100_dgx``) and no ``net_gbps`` overrides
the network, the measured line is used (per GPU); elsewhere the bandwidth bound.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from infermax.costmodel.communication import DEFAULT_LATENCY_S, comm_model
from infermax.costmodel.parallel import ParallelConfig, parallel_kv_capacity_tokens
from infermax.costmodel.specs import GpuSpec, ModelSpec, get_gpu_spec, get_model_spec

_KEYS = ("nodes", "gpus_per_node", "model", "tp", "pp", "spp", "sp", "kvp", "sp_kind", "util", "net_gbps")
_INT_KEYS = ("nodes", "gpus_per_node", "tp", "pp", "spp", "sp", "kvp")
#: the most GPUs a cluster may have: twice the largest size benchmarked (benchmarks/cluster_bench.py --scale:
#: 8,192 GPUs, 2,000 requests, 48 s of CPU and 0.96 GB, memory growing with the GPUs); beyond it a spec is
#: refused rather than left to build millions of replicas
MAX_GPUS = 16_384


@dataclass(frozen=True, slots=True)
class Replica:
    """One model instance: its index, node, and the global indices of its GPUs."""

    index: int
    node: int
    gpus: tuple[int, ...]
    kv_capacity_tokens: int


@dataclass(frozen=True, init=False)
class Cluster:
    """``nodes × gpus_per_node`` GPUs of one type serving one model with one parallel plan per replica.

    ``gpu`` and ``model`` may be given by name (``"a100"``, ``"llama3-8b"``) and ``gpus_per_node`` as 0
    (the GPU spec's default); ``__init__`` resolves them before any field is set, so every field holds
    its final value from the start and is never rewritten.
    """

    gpu: GpuSpec
    model: ModelSpec
    nodes: int
    gpus_per_node: int
    plan: ParallelConfig
    util: float
    net_gbps: float | None
    spp: int                         # sequence-pipeline stages (medha §3.3); the plan's pp stays 1 then

    def __init__(self, gpu: "GpuSpec | str", model: "ModelSpec | str", nodes: int = 1, gpus_per_node: int = 0,
                 plan: ParallelConfig | None = None, util: float = 0.9, net_gbps: float | None = None,
                 spp: int = 1) -> None:
        gpu = get_gpu_spec(gpu)
        values = {"gpu": gpu, "model": get_model_spec(model), "nodes": nodes,
                  "gpus_per_node": gpu.gpus_per_node if gpus_per_node == 0 else gpus_per_node,
                  "plan": ParallelConfig() if plan is None else plan, "util": util, "net_gbps": net_gbps, "spp": spp}
        for name, value in values.items():
            object.__setattr__(self, name, value)     # what a frozen dataclass's generated __init__ does
        self._validate()

    # complexity: one check per Cluster field, each naming the field and value, read top to bottom
    def _validate(self) -> None:
        for name in ("nodes", "gpus_per_node", "spp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Cluster.{name} must be an integer >= 1, got {value!r}")
        if self.num_gpus > MAX_GPUS:
            raise ValueError(f"a cluster of {self.nodes} nodes x {self.gpus_per_node} GPUs = {self.num_gpus:,} GPUs is "
                             f"more than the {MAX_GPUS:,} this simulator takes (benchmarked up to 8,192)")
        if not isinstance(self.plan, ParallelConfig):
            raise TypeError(f"Cluster.plan must be a ParallelConfig, got {type(self.plan).__name__}")
        if self.spp > 1 and self.plan.pp > 1:
            raise ValueError(f"Cluster.spp = {self.spp} with pp = {self.plan.pp}: a replica's stages are either "
                             f"plain pipeline stages (pp) or sequence-pipeline stages (spp), not both")
        if isinstance(self.util, bool) or not isinstance(self.util, (int, float)) or not 0 < self.util <= 1:
            raise ValueError(f"Cluster.util must be in (0, 1], got {self.util!r}")
        if self.net_gbps is not None and (isinstance(self.net_gbps, bool)
                                          or not isinstance(self.net_gbps, (int, float))
                                          or not math.isfinite(self.net_gbps) or self.net_gbps <= 0):
            raise ValueError(f"Cluster.net_gbps must be a finite number > 0, got {self.net_gbps!r}")
        g, per_node = self.replica_gpus, self.gpus_per_node
        if g <= per_node and per_node % g:
            raise ValueError(f"a replica of {g} GPUs ({self.cost_plan.to_text()}) does not tile a node of "
                             f"{per_node} GPUs: gpus_per_node must be a multiple of {g}")
        if g > per_node and g % per_node:
            raise ValueError(f"a replica of {g} GPUs ({self.cost_plan.to_text()}) spans nodes of {per_node} GPUs "
                             f"unevenly: use whole nodes (a multiple of {per_node} GPUs)")
        if g > self.num_gpus:
            raise ValueError(f"a replica needs {g} GPUs ({self.cost_plan.to_text()}) but the cluster has "
                             f"{self.num_gpus} ({self.nodes} nodes x {per_node})")
        _ = self.replicas   # fail now, with the capacity's message, if the weights do not fit

    # --- parsing ---------------------------------------------------------------------------
    # complexity: one branch per key of the cluster spec string, each refused by name
    @classmethod
    def from_spec(cls, text: "str | Cluster") -> "Cluster":
        """``"a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3,tp=1"`` (see the module doc)."""
        if isinstance(text, Cluster):
            return text
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"cluster spec must be a non-empty string like 'a100:nodes=4,model=mistral-7b', "
                             f"got {text!r}")
        gpu, _, rest = text.strip().partition(":")
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, sep, raw = part.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not raw:
                raise ValueError(f"cluster spec {text!r}: {part!r} is not key=value")
            if key not in _KEYS:
                from difflib import get_close_matches
                near = get_close_matches(key, _KEYS, n=1)
                hint = f" (did you mean {near[0]}?)" if near else f" (known: {', '.join(_KEYS)})"
                raise ValueError(f"cluster spec {text!r}: unknown key {key!r}{hint}")
            if key in values:
                raise ValueError(f"cluster spec {text!r}: {key} is given twice")
            try:
                values[key] = int(raw) if key in _INT_KEYS else float(raw) if key in ("util", "net_gbps") else raw
            except ValueError:
                kind = "an integer" if key in _INT_KEYS else "a number"
                raise ValueError(f"cluster spec {text!r}: {key} must be {kind}, got {raw!r}") from None
        plan = ParallelConfig(**{k: values.pop(k) for k in ("tp", "pp", "sp", "kvp", "sp_kind") if k in values})
        if "spp" in values and values["spp"] < 1:
            raise ValueError(f"cluster spec {text!r}: spp must be an integer >= 1, got {values['spp']!r}")
        return cls(gpu=gpu.strip(), model=values.pop("model", "llama2-7b"), plan=plan, **values)

    def to_spec(self) -> str:
        """The inverse of :meth:`from_spec`."""
        parts = [f"nodes={self.nodes}", f"gpus_per_node={self.gpus_per_node}", f"model={self.model.name}",
                 *(f"{k}={getattr(self.plan, k)}" for k in ("tp", "pp", "sp", "kvp") if getattr(self.plan, k) > 1)]
        if self.spp > 1:
            parts.append(f"spp={self.spp}")
        if self.plan.sp > 1:
            parts.append(f"sp_kind={self.plan.sp_kind}")
        if self.util != 0.9:
            parts.append(f"util={self.util:g}")
        if self.net_gbps is not None:
            parts.append(f"net_gbps={self.net_gbps:g}")
        return f"{self.gpu.name}:" + ",".join(parts)

    # --- shape -----------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def replica_gpus(self) -> int:
        return self.cost_plan.num_gpus

    @property
    def cost_plan(self) -> ParallelConfig:
        """The plan the cost model prices: ``spp`` stages are pipeline stages (``pp``) to it."""
        return self.plan if self.spp == 1 else dataclasses.replace(self.plan, pp=self.spp)

    @property
    def executes_plan(self) -> bool:
        """Is the replica's timing executed stage by stage and KVP group by group (spp or kvp above 1)?"""
        return self.spp > 1 or self.plan.kvp > 1

    @cached_property
    def replica_kv_capacity_tokens(self) -> int:
        """M of every replica (they are identical): GPU memory minus weights, in KV tokens."""
        try:
            return parallel_kv_capacity_tokens(self.model, self.gpu, self.cost_plan, self.util)
        except ValueError as exc:
            raise ValueError(f"cluster {self.to_spec_safe()}: {exc}") from None

    @cached_property
    def replicas(self) -> tuple[Replica, ...]:
        """Replicas in GPU order; a replica never straddles a node unless it takes whole nodes."""
        g, m = self.replica_gpus, self.replica_kv_capacity_tokens
        return tuple(Replica(index=i, node=(i * g) // self.gpus_per_node, gpus=tuple(range(i * g, (i + 1) * g)),
                             kv_capacity_tokens=m) for i in range(self.num_gpus // g))

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    @cached_property
    def replica_nodes(self) -> np.ndarray:
        """Per replica, its node (read-only)."""
        out = np.array([r.node for r in self.replicas], dtype=np.int64)
        out.setflags(write=False)
        return out

    def to_spec_safe(self) -> str:
        return f"{self.gpu.name}:nodes={self.nodes},gpus_per_node={self.gpus_per_node},model={self.model.name}," \
               f"{self.plan.to_text()}" + (f",spp={self.spp}" if self.spp > 1 else "")

    def same_node(self, a: int, b: int) -> bool:
        """Do replicas ``a`` and ``b`` share a node (all of a multi-node replica counts as its first node)?"""
        reps = self.replicas
        return reps[a].node == reps[b].node and self.replica_gpus <= self.gpus_per_node

    # --- links -----------------------------------------------------------------------------
    def gpu_bandwidth(self, intra_node: bool) -> float:
        """Bytes/s one GPU sends over the link class (NVLink inside a node, its network share across)."""
        if intra_node:
            return self.gpu.nvlink_bandwidth
        if self.net_gbps is not None:
            return self.net_gbps * 1e9 / 8 / self.gpus_per_node
        return self.gpu.network_bandwidth

    def transfer_s(self, num_bytes: float, src: int, dst: int) -> float:
        """Time to move ``num_bytes`` from replica ``src`` to replica ``dst`` (0 to itself)."""
        if not math.isfinite(num_bytes) or num_bytes < 0:
            raise ValueError(f"transfer num_bytes must be a finite number >= 0, got {num_bytes!r}")
        if src == dst or num_bytes == 0:
            return 0.0
        intra = self.same_node(src, dst)
        per_gpu = num_bytes / self.replica_gpus
        if intra or self.net_gbps is None:
            measured = comm_model(self.gpu.name).fitted.get(("send_recv", 2, 2 if intra else 1))
            if measured is not None:
                return float(measured.time_s(per_gpu))
        return DEFAULT_LATENCY_S + per_gpu / self.gpu_bandwidth(intra)

    def kv_bytes(self, num_tokens: float) -> float:
        """Bytes of KV cache of ``num_tokens`` tokens of this model (all layers, all KV heads)."""
        return float(num_tokens) * self.model.kv_bytes_per_token

    def cost_model_name(self) -> str:
        """The replica's batch-time model: fitted where Vidur measured this GPU and model, else
        ``scaled:`` (the roofline at the nearest measured model's efficiency); with the plan."""
        from infermax.costmodel.catalog import fitted_names
        name = f"{self.gpu.name}/{self.model.name}"
        base = name if name in fitted_names() else f"scaled:{name}"
        return base if self.cost_plan.is_single_gpu else f"{base}@{self.cost_plan.to_text()}"

    def cost_model(self) -> Any:
        """The replica's batch-time model (:meth:`cost_model_name`), built once per cluster: fast SP prices
        every gang's prefill with it, and building a scaled model reads and refits profiles."""
        return self._cost_model

    @cached_property
    def _cost_model(self) -> Any:
        from infermax.costmodel import get_cost_model
        return get_cost_model(self.cost_model_name())

    def describe(self) -> dict[str, Any]:
        return {"spec": self.to_spec(), "cost_model": self.cost_model_name(), "gpu": self.gpu.name,
                "model": self.model.name, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "num_gpus": self.num_gpus,
                "plan": self.plan.to_text() + (f",spp={self.spp}" if self.spp > 1 else ""),
                "num_replicas": self.num_replicas, "replica_kv_capacity_tokens": self.replica_kv_capacity_tokens,
                "nvlink_Bps_per_gpu": self.gpu_bandwidth(True), "network_Bps_per_gpu": self.gpu_bandwidth(False)}
