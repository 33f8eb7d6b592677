"""Run Vidur 0.0.26 (``pip install vidur==0.0.26``) offline on a workload and record its batches.

What it takes to run the released wheel here (issue 39):

- profiling data: Vidur downloads it from the Hugging Face hub into its cache folder; the
  folder is laid out by hand (:func:`lay_out_cache`) from :data:`DATA` (``INFERMAX_VIDUR_DATA``: the
  A100 Llama-3-8B MLP profile and the attention *sample*) and read with ``HF_HUB_OFFLINE=1``;
- two runtime patches (:func:`patch_vidur`): the linear-regression predictor cannot be built
  as shipped (``_get_kv_parallel_communication_time`` is implemented but still marked abstract),
  and ``Request.restart()`` leaves the per-stage counters set, so the first preemption trips an
  assertion in ``Request.on_batch_end``;
- the linear-regression grid limited to interaction-only terms: the default polynomial fit
  predicts negative batch times past the 16K-token profile;
- the scheduler type is ``ReplicaSchedulerType.MNEMOSYNE_LRS`` (and ``_FCFS``, ``_EDF``).

One predictor is built per process (training on first use takes minutes; later runs load it
from the cache folder) and shared by every simulation: :class:`VidurCost` prices a batch with
it in infermax's terms, so infermax can be given Vidur's own per-batch times.
"""
from __future__ import annotations

import lzma
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from infermax import Workload
from infermax.costmodel import CostModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
#: Vidur's measurements laid out as compute/<gpu>/<model>/{mlp,attention_sample}.csv and network/<node>/*.csv
#: (the folder the tests read; INFERMAX_VIDUR_DATA names another)
DATA = os.environ.get("INFERMAX_VIDUR_DATA", "/work/shared/data/vidur")
MODEL, GPU, MODEL_DIR, NODE = "meta-llama/Llama-3-8B", "a100", "Meta-Llama-3-8B", "a100_dgx"
_SNAPSHOT = "0" * 40
MAX_CHUNK = 4096               # Vidur's prediction_max_prefill_chunk_size


def vidur_available() -> bool:
    try:
        import vidur  # noqa: F401
    except ImportError:
        return False
    return True


def lay_out_cache(cache_dir: str) -> tuple[str, str]:
    """Vidur's Hugging Face cache of the profiling data, built from the shared CSVs (xz-compressed, as
    the hub's copies are); returns the (compute, network) dataset names to configure."""
    def repo(kind: str, name: str, files: dict[str, str], config: dict) -> None:
        base = f"{cache_dir}/profiling_data/{kind}/datasets--local--{name}"
        snap = f"{base}/snapshots/{_SNAPSHOT}"
        os.makedirs(snap, exist_ok=True)
        os.makedirs(f"{base}/refs", exist_ok=True)
        with open(f"{base}/refs/main", "w") as f:
            f.write(_SNAPSHOT)
        import json
        with open(f"{snap}/config.json", "w") as f:
            json.dump(config, f)
        for dst, src in files.items():
            if not os.path.exists(f"{snap}/{dst}"):
                with open(src, "rb") as fin, lzma.open(f"{snap}/{dst}", "wb") as fout:
                    shutil.copyfileobj(fin, fout)

    compute = f"{GPU}-{MODEL_DIR.lower()}"
    repo("compute", compute, {"mlp.csv.xz": f"{DATA}/compute/{GPU}/{MODEL_DIR}/mlp.csv",
                              "attention.csv.xz": f"{DATA}/compute/{GPU}/{MODEL_DIR}/attention_sample.csv"},
         {"model": MODEL, "device_sku": GPU})
    repo("network", NODE, {"all_reduce.csv.xz": f"{DATA}/network/{NODE}/all_reduce.csv",
                           "send_recv.csv.xz": f"{DATA}/network/{NODE}/send_recv.csv"}, {"sku": NODE})
    return f"local/{compute}", f"local/{NODE}"


def order_batches(on: bool) -> None:
    """Make ``KVParallelBatch`` keep its requests in the order they joined the batch (``on``), or in the
    ``set`` order the wheel ships (object addresses: it decides which decode an eviction picks next)."""
    from vidur.entities import kv_parallel_batch as kvb

    cls = kvb.KVParallelBatch
    shipped = getattr(cls, "_infermax_shipped_init", cls.__init__)
    cls._infermax_shipped_init = shipped
    if not on:
        cls.__init__ = shipped
        return

    def init(self, replica_id, batch_mapping):
        shipped(self, replica_id, batch_mapping)
        self._requests = list(dict.fromkeys(sum([b.requests for b in batch_mapping.values()], [])))

    cls.__init__ = init


def patch_vidur() -> None:
    """The two runtime fixes the wheel needs (module docstring)."""
    from vidur.entities.request import Request
    from vidur.execution_time_predictor.linear_regression_execution_time_predictor import (
        LinearRegressionExecutionTimePredictor,
    )
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import SklearnExecutionTimePredictor

    for cls in (SklearnExecutionTimePredictor, LinearRegressionExecutionTimePredictor):
        cls.__abstractmethods__ = frozenset()
    if getattr(Request.restart, "_infermax_patched", False):
        return
    shipped = Request.restart

    def restart(self):
        shipped(self)
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False

    restart._infermax_patched = True
    Request.restart = restart


@dataclass
class VidurSetup:
    """Vidur's configuration pieces shared by every run of a side-by-side."""

    cache_dir: str
    num_blocks: int = 24_960            # M = 399,360 tokens in blocks of 16
    block_size: int = 16
    batch_size_cap: int = 128
    target_batch_time_s: float = 0.05
    max_tokens: int = 136 * 1024        # the request generator's bound (Vidur sizes its tables by it)
    watermark: float = 0.01
    ordered_batches: bool = False       # keep a batch's requests in the order they joined (a third patch)
    max_batch_size: int = 128           # the predictor's tables: most requests in a batch (its default) ...
    max_chunk: int = MAX_CHUNK          # ... and the longest prefill chunk

    def configs(self):
        from vidur.config import CacheConfig, LinearRegressionExecutionTimePredictorConfig, ReplicaConfig
        compute, network = lay_out_cache(self.cache_dir)
        replica = ReplicaConfig(model_name=MODEL, num_pipeline_stages=1, tensor_parallel_size=1, device=GPU,
                                network_device=NODE)
        cache = CacheConfig(block_size=self.block_size, num_blocks=self.num_blocks,
                            watermark_blocks_fraction=self.watermark)
        predictor = LinearRegressionExecutionTimePredictorConfig(
            model_profiling_dataset=compute, network_profiling_dataset=network, cache_dir=self.cache_dir,
            polynomial_interaction_only=[True], prediction_max_tokens_per_request=self.max_tokens,
            prediction_max_batch_size=self.max_batch_size, prediction_max_prefill_chunk_size=self.max_chunk,
            num_training_job_threads=1)
        return replica, cache, predictor


_PREDICTOR = {}


def shared_predictor(setup: VidurSetup):
    """One linear-regression predictor per process (Vidur builds one per simulation)."""
    key = (setup.cache_dir, setup.max_tokens, setup.num_blocks, setup.max_batch_size, setup.max_chunk)
    if key not in _PREDICTOR:
        from vidur.execution_time_predictor.linear_regression_execution_time_predictor import (
            LinearRegressionExecutionTimePredictor,
        )
        patch_vidur()
        replica, cache, predictor = setup.configs()
        _PREDICTOR[key] = LinearRegressionExecutionTimePredictor(predictor, replica, cache)
    return _PREDICTOR[key]


class VidurCost(CostModel):
    """Vidur's predicted batch time (``total_time``, seconds) as an infermax cost model.

    Vidur's batch lists every request's query tokens and its processed tokens: a prefill chunk's KV
    before it (infermax's ``m``), a decode's KV *including* the token it writes (``m + 1``). Vidur
    predicts chunks of at most 4096 tokens (``prediction_max_prefill_chunk_size``); a longer one
    (infermax's ``medha`` prices a whole remaining prompt for its slack) is priced as that many
    consecutive 4096-token pieces of the request in the same batch."""

    name = "vidur-lr"

    def __init__(self, predictor) -> None:
        from vidur.entities import Batch
        self._predictor, self._Batch = predictor, Batch

    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        q, kv = [], []
        for c, m, d in zip(tokens.tolist(), kv_before.tolist(), is_decode.tolist()):
            if d:
                q.append(1)
                kv.append(m + 1)
                continue
            while c > MAX_CHUNK:        # past Vidur's profiled chunks: consecutive pieces of one request
                q.append(MAX_CHUNK)
                kv.append(m)
                c, m = c - MAX_CHUNK, m + MAX_CHUNK
            q.append(c)
            kv.append(m)
        batch = self._Batch(0, [None] * len(q), q, kv)
        return float(self._predictor.get_execution_time(batch, 0).total_time)

    def describe(self) -> dict:
        return {"name": self.name, "model": MODEL, "gpu": GPU}


@dataclass
class VidurRun:
    """What Vidur did: per batch the workload indices and tokens (in Vidur's batch order), its start and
    duration; per request the first token and completion times; evictions (restarts)."""

    batches: list[tuple[np.ndarray, np.ndarray]]
    starts_s: np.ndarray
    durations_s: np.ndarray
    first_token_s: np.ndarray
    completion_s: np.ndarray
    num_restarts: np.ndarray


def make_simulator(setup: VidurSetup, predictor, replica, sched_config, cache, pred_config, out: str):
    """One replica (``replica``) of Vidur's ``Simulator`` under ``sched_config`` and ``cache``, pricing batches with the
    process's shared ``predictor`` (not a fresh one: training takes minutes), its metrics and traces off and
    ``out`` its output folder; entity ids start from 0, as in a fresh process."""
    from vidur import config as vc
    from vidur.entities import Batch, Cluster, KVParallelBatch, Replica, Request
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry
    from vidur.simulator import Simulator

    config = vc.SimulationConfig(
        cluster_config=vc.ClusterConfig(num_replicas=1, replica_config=replica, cache_config=cache,
                                        replica_scheduler_config=sched_config),
        request_generator_config=vc.SyntheticRequestGeneratorConfig(    # (its max_tokens is the length generator's)
            num_requests=1, length_generator_config=vc.FixedRequestLengthGeneratorConfig(
                prefill_tokens=16, decode_tokens=16, max_tokens=setup.max_tokens)),
        execution_time_predictor_config=pred_config,
        metrics_config=vc.MetricsConfig(write_metrics=False, store_plots=False, enable_chrome_trace=False,
                                        output_dir=out))
    for entity in (Cluster, Replica, Request, Batch, KVParallelBatch):   # ids from 0 in every run (replica 0 is
        entity._id = -1                                                    # the one the global scheduler names)
    shipped_get = ExecutionTimePredictorRegistry.get
    ExecutionTimePredictorRegistry.get = classmethod(lambda cls, *a, **k: predictor)
    try:
        return Simulator(config)
    finally:
        ExecutionTimePredictorRegistry.get = shipped_get


def run_vidur(workload: Workload, scheduler: str, setup: VidurSetup) -> VidurRun:
    """Simulate ``workload`` (offline or online, ids in order) with Vidur's ``mnemosyne_<scheduler>``."""
    from vidur import config as vc
    from vidur.entities import Request
    from vidur.events import RequestArrivalEvent
    from vidur.scheduler.replica_stage_scheduler.replica_stage_schduler import ReplicaStageScheduler

    patch_vidur()
    order_batches(setup.ordered_batches)
    predictor = shared_predictor(setup)
    kinds = {"lrs": vc.MnemosyneLRSSchedulerConfig, "fcfs": vc.MnemosyneFCFSSchedulerConfig,
             "edf": vc.MnemosyneEDFSchedulerConfig}
    sched_config = kinds[scheduler](batch_size_cap=setup.batch_size_cap, target_batch_time=setup.target_batch_time_s)
    replica, cache, pred_config = setup.configs()
    out = tempfile.mkdtemp(prefix="vidur_out_")
    sim = make_simulator(setup, predictor, replica, sched_config, cache, pred_config, out)
    requests = [Request(arrived_at=float(t), num_prefill_tokens=int(i), num_decode_tokens=int(o))
                for t, i, o in zip(workload.arrivals_s, workload.input_lens, workload.output_lens)]
    index = {id(r): k for k, r in enumerate(requests)}
    sim._event_queue = []
    for r in requests:
        sim._add_event(RequestArrivalEvent(r.arrived_at, r))
    batches, durations = [], []
    shipped_on_schedule = ReplicaStageScheduler.on_schedule

    def on_schedule(self):
        batch, stage, execution_time = shipped_on_schedule(self)
        if batch is not None:
            batches.append((np.array([index[id(r)] for r in batch.requests], dtype=np.int64),
                            np.array([batch.get_num_q_tokens_for_request(r.id) for r in batch.requests],
                                     dtype=np.int64)))
            durations.append(float(stage.execution_time))
        return batch, stage, execution_time

    ReplicaStageScheduler.on_schedule = on_schedule
    try:
        sim.run()
    finally:
        ReplicaStageScheduler.on_schedule = shipped_on_schedule
        shutil.rmtree(out, ignore_errors=True)
    return VidurRun(batches=batches, starts_s=np.zeros(0), durations_s=np.array(durations),
                    first_token_s=np.array([r._prefill_completed_at for r in requests]),
                    completion_s=np.array([r._completed_at for r in requests]),
                    num_restarts=np.array([r._num_restarts for r in requests]))
