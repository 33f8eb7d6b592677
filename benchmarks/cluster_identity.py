"""Cluster engine identity check: digests of a set of cluster runs, to compare two versions of the engine.

A refactoring or speed-up of :mod:`infermax.cluster` must not change what a run does. This script runs
a fixed set of cases and writes, per case, a SHA-256 digest of each part of the result: the cluster
schedule's JSON (per-replica batches, events, gangs with their steps, migrations — floats as ``repr``,
so bit for bit), every trace array (raw bytes), the dispatch arrays, the busy times and the metrics. The
dispatcher's CPU time per decision (``decision_s`` and the metrics made of it) is a measurement, not a
result, and is left out.

    python benchmarks/cluster_identity.py --write before.json [--cases tests,nb08,scale,bench]
    python benchmarks/cluster_identity.py --check before.json       # exit 1 and the differing parts if any

Cases: ``sim`` (the single-replica simulator, whose replica runner the cluster shares: a few
workloads and schedulers, with and without fast-forward), ``tests`` (the runs of tests/cluster),
``nb08`` (notebook 08's SMALL mode: capacity, eight policies, the 8- and 16-GPU scalability runs),
``scale`` (benchmarks/cluster_bench.py ``--scale 256,1024``),
``bench`` (benchmarks/cluster_bench.py's defaults: the hour on 32 GPUs, FIFO and PecSched), ``registry``
(every registered scheduler on four small single-replica cases and every registered cluster policy on a
small cluster: a refusal is digested as its exception type and message, so it must stay the same too).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import Any, Callable, Iterator

import numpy as np

from infermax import Limits, Workload, simulate
from infermax.cluster import Cluster, at_load, capacity_rps, simulate_cluster
from infermax.cluster.policies import POLICIES as CLUSTER_POLICIES
from infermax.schedulers import available

TIMED = ("scheduling_decision_p99_s", "decision_share_p99_short", "decision_share_p99_long")
POLICIES = ("fifo", "reservation", "priority", "pecsched", "pecsched-pe", "pecsched-dis", "pecsched-col",
            "pecsched-fsp")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _array(a: np.ndarray) -> str:
    a = np.asarray(a)
    return _sha(f"{a.dtype}{a.shape}".encode() + (a.tobytes() if a.dtype != object else repr(a.tolist()).encode()))


def digest(result: Any) -> dict[str, str]:
    """Part name -> digest of one :class:`~infermax.cluster.ClusterResult` (timings left out)."""
    doc = result.cluster_schedule().to_dict()
    out = {f"schedule.{k}": _sha(json.dumps(v, sort_keys=True).encode()) for k, v in doc.items()}
    out.update({f"trace.batches.{k}": _array(v) for k, v in result.trace.batches.items()})
    out.update({f"trace.requests.{k}": _array(v) for k, v in result.trace.requests.items()})
    for k in ("replica_of", "dispatch_s", "replica_busy_s", "decode_replica_of"):
        out[k] = _array(getattr(result, k))
    out["num_decisions"] = str(len(result.decision_s))
    out["metrics"] = _sha(repr(sorted((k, v) for k, v in result.metrics.items() if k not in TIMED)).encode())
    out["by_tag"] = _sha(repr(sorted((t, sorted(m.items())) for t, m in result.by_tag.items())).encode())
    return out


def sim_digest(result: Any) -> dict[str, str]:
    """Part name -> digest of one simulator run: its schedule's JSON and its trace arrays."""
    out = {"schedule": _sha(result.schedule.to_json().encode())}
    out.update({f"trace.batches.{k}": _array(v) for k, v in result.trace.batches.items()})
    out.update({f"trace.requests.{k}": _array(v) for k, v in result.trace.requests.items()})
    return out


class _Sim:
    """A simulator run, digested as such."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __call__(self) -> dict[str, str]:
        return sim_digest(simulate(*self.args, **self.kwargs))


def _sim() -> Iterator[tuple[str, Callable[[], Any]]]:
    for spec, sched, lim in [("fixed:I=512,O=128,B=200,rate=4,seed=1", "vllm", "M=20000,C=4096"),
                             ("fixed:I=512,O=128,B=300,rate=40,seed=2", "sarathi", "M=8000,C=512"),
                             ("trace:splitwise_code,n=300", "vllm:watermark=0.01", "M=30000,C=8192,block=16"),
                             ("fixed:I=64,O=32,B=150", "vllm-hy", "M=2000,C=1024"),
                             ("fixed:I=300,O=300,B=200,rate=10,seed=4", "sarathi-ef", "M=20000,C=4096"),
                             ("fixed:I=1024,O=1024,B=1024", "vllm", "M=100000,C=4096"),
                             ("trace:splitwise_conv,n=500", "medha", "M=50000,C=4096")]:
        for ff in (True, False):
            yield f"sim/{spec}/{sched}/ff={ff}", _Sim(spec, sched, lim, fast_forward=ff)


def _tests() -> Iterator[tuple[str, Callable[[], Any]]]:
    one = Cluster.from_spec("a100:nodes=1,gpus_per_node=1,model=llama2-7b")
    for spec, limits, sched in [("fixed:I=512,O=128,B=200,rate=4,seed=1", "C=4096", "vllm"),
                                ("fixed:I=512,O=128,B=200,rate=4,seed=1", "C=512", "sarathi"),
                                ("fixed:I=64,O=32,B=150", "C=1024", "vllm-hy"),
                                ("trace:splitwise_code,n=150", "C=8192,block=16", "vllm:watermark=0.01"),
                                ("pecsched:splitwise_conv,n=120,lo=50000,hi=100000", "C=100000", "sarathi")]:
        lim = Limits.from_spec(limits).replace(M=one.replica_kv_capacity_tokens)
        yield f"one/{spec}/{sched}", lambda s=spec, lim=lim, sc=sched: simulate_cluster(s, one, "fifo", sc, lim)
    four = Cluster.from_spec("a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3")
    w160 = Workload.from_spec("pecsched:splitwise_conv,n=160,hi=300000")
    for p in ("fifo", "reservation", "priority"):
        yield f"four/{p}", lambda p=p: simulate_cluster(w160, four, p, "vllm", sp_replicas=2)
    eight = Cluster.from_spec("a100:nodes=2,gpus_per_node=4,model=mistral-7b-v0.3")
    for n in (60, 160):
        w = Workload.from_spec(f"pecsched:splitwise_conv,n={n},hi=300000")
        for p in POLICIES:
            opts = {"sp_replicas": 2, **({"decode_replicas": 2} if p.startswith("pecsched") and p != "pecsched-dis"
                                         else {})}
            yield f"judge/n={n}/{p}", lambda w=w, p=p, o=opts: simulate_cluster(w, eight, p, "vllm", **o)
    busy = Workload.from_spec("pecsched:splitwise_conv,n=120,lo=100000,hi=200000,pct=90,time_scale=4")
    for p in ("pecsched", "pecsched-pe", "pecsched-col"):
        yield f"busy/{p}", lambda p=p: simulate_cluster(busy, eight, p, "sarathi", decode_replicas=2, sp_replicas=3)
        yield f"busy/{p}/no-ff", lambda p=p: simulate_cluster(busy, eight, p, "sarathi", fast_forward=False,
                                                              decode_replicas=2, sp_replicas=3)


def _nb08() -> Iterator[tuple[str, Callable[[], Any]]]:
    base = Workload.from_spec("pecsched:splitwise_conv,n=150")
    cluster = Cluster.from_spec("a100:nodes=2,gpus_per_node=4,model=mistral-7b-v0.3,tp=1,net_gbps=400")
    cap = capacity_rps(base, cluster, "fifo", "sarathi", decode_replicas=1)
    w = at_load(base, 1.0, cap)
    for p in POLICIES:
        yield f"nb08/{p}", lambda p=p: simulate_cluster(w, cluster, p, "sarathi", decode_replicas=1)
    for gpus in (8, 16):
        c = Cluster.from_spec(f"a100:nodes={max(1, gpus // 8)},gpus_per_node={min(gpus, 8)},"
                              f"model=mistral-7b-v0.3,net_gbps=400")
        ws = at_load(Workload.from_spec(f"pecsched:splitwise_conv,n={25 * gpus}"), 1.0, cap * gpus / 8)
        yield f"nb08/scale/{gpus}", lambda c=c, ws=ws, g=gpus: simulate_cluster(ws, c, "pecsched", "sarathi",
                                                                              decode_replicas=max(1, g // 8))


def _scale() -> Iterator[tuple[str, Callable[[], Any]]]:
    base = Workload.from_spec("pecsched:splitwise_conv,n=2000,hi=400000")
    c32 = Cluster.from_spec("a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3,net_gbps=400")
    cap32 = capacity_rps(base, c32, "fifo", "sarathi")
    for gpus in (256, 1024):
        c = Cluster.from_spec(f"a100:nodes={gpus // 8},gpus_per_node=8,model=mistral-7b-v0.3,net_gbps=400")
        w = at_load(base, 1.0, cap32 * gpus / 32)
        yield f"scale/{gpus}", lambda c=c, w=w, g=gpus: simulate_cluster(w, c, "pecsched", "sarathi",
                                                                         decode_replicas=g // 8)


def _bench() -> Iterator[tuple[str, Callable[[], Any]]]:
    w = Workload.from_spec("pecsched:splitwise_conv,n=19366,hi=400000")
    c = Cluster.from_spec("a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3,net_gbps=400")
    for p in ("fifo", "pecsched"):
        yield f"bench/{p}", lambda p=p: simulate_cluster(w, c, p, "sarathi")


class _Refusal:
    """A run that may refuse: digested as its result, or as the refusal's type and message."""

    def __init__(self, run: Callable[[], Any], digester: Callable[[Any], dict[str, str]]) -> None:
        self.run, self.digester = run, digester

    def __call__(self) -> dict[str, str]:
        try:
            out = self.run()
        except (ValueError, RuntimeError) as e:
            return {"refused": _sha(f"{type(e).__name__}: {e}".encode())}
        return self.digester(out)


def _registry() -> Iterator[tuple[str, Callable[[], Any]]]:
    for spec, lim in [("fixed:I=300,O=60,B=80", "M=6000,C=1024"),
                      ("fixed:I=200,O=50,B=120,rate=20,seed=3", "M=8000,C=512"),
                      ("mix:LILO+SISO,B=64,seed=1", "M=12000,C=2048,block=16"),
                      ("trace:splitwise_conv,n=150", "M=60000,C=8192")]:
        for name in available():
            yield f"registry/{spec}/{name}", _Refusal(lambda s=spec, n=name, l=lim: simulate(s, n, l), sim_digest)
    eight = Cluster.from_spec("a100:nodes=2,gpus_per_node=4,model=mistral-7b-v0.3")
    w = Workload.from_spec("pecsched:splitwise_conv,n=80,hi=300000")
    for p in CLUSTER_POLICIES:
        yield f"registry/cluster/{p}", _Refusal(lambda p=p: simulate_cluster(w, eight, p, "sarathi"), digest)


CASES = {"sim": _sim, "tests": _tests, "nb08": _nb08, "scale": _scale, "bench": _bench, "registry": _registry}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", help="write the digests to this JSON file")
    ap.add_argument("--check", help="compare with the digests in this JSON file")
    ap.add_argument("--cases", default="tests,nb08", help=f"comma separated, of {', '.join(CASES)}")
    args = ap.parse_args()
    old = json.loads(open(args.check).read()) if args.check else {}
    new: dict[str, dict[str, str]] = {}
    bad = 0
    for group in args.cases.split(","):
        for name, run in CASES[group.strip()]():
            t0 = time.process_time()
            out = run()
            new[name] = out if isinstance(run, (_Sim, _Refusal)) else digest(out)
            cpu = time.process_time() - t0
            if name in old:
                diff = [k for k in sorted(set(old[name]) | set(new[name])) if old[name].get(k) != new[name].get(k)]
                bad += bool(diff)
                print(f"{name:48s} {cpu:7.1f} s CPU  {'DIFFERS: ' + ', '.join(diff) if diff else 'identical'}",
                      flush=True)
            else:
                print(f"{name:48s} {cpu:7.1f} s CPU  {'(not in ' + args.check + ')' if args.check else ''}",
                      flush=True)
    if args.write:
        with open(args.write, "w") as f:
            json.dump(new, f, indent=1, sort_keys=True)
    if args.check:
        print(f"{len(new)} runs, {sum(n in old for n in new)} compared, {bad} differ")
        sys.exit(1 if bad or any(n not in old for n in new) else 0)


if __name__ == "__main__":
    main()
