"""Fuzz of DESIGN invariant 6 (issue 36 §4): every scheduler and cluster policy finishes what it accepts.

Single replica: every registered scheduler on random small instances drawn where schedulers used to get
stuck — tiny C and P (1-4), KV in blocks, one-token prompts, Poisson arrivals, M just above the largest
peak. Each run either is refused before it starts (a ValueError naming a limit and a request) or finishes,
and ``replay`` accepts its schedule and recomputes its trace exactly.

Cluster: every cluster policy on random clusters (2-4 replicas; tp = 1 with kvp = 2, spp = 2, a small
``util`` that makes long requests need gangs) and workloads of 1-6 requests — two-request instances, all
requests on gangs — with random local schedulers and options. Each run is refused (a ValueError when the
engine is built: ``refused``; once it runs: ``refused-late``) or finishes, and the cluster judge accepts
its schedule read back from JSON, with the engine's completion times.

    nice -n 5 python benchmarks/finish_fuzz.py [--single 40] [--cluster 1500] [--seed 0] [--policies a,b]

``--single`` is per scheduler. Prints the counts (runs, refused, stuck, crashed, judge-rejected) and the
first examples of each failure; exit status 1 if any run got stuck, crashed or was rejected by its judge.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
import time
import traceback

import numpy as np

from infermax import Limits, Request, Workload, replay, simulate
from infermax.cluster import Cluster, ClusterSchedule
from infermax.cluster.engine import ClusterEngine
from infermax.cluster.judge import replay_cluster
from infermax.cluster.policies import POLICIES, get_policy
from infermax.costmodel import get_cost_model
from infermax.engine import SchedulerStuckError
from infermax.schedulers import available, get_scheduler
from infermax.state import ServingState

LIMIT_NAMED = re.compile(r"\b(C|P|M|R_max|block_size|kvp|spp|sp_replicas|decode_replicas)\b")
FAILURES = ("stuck", "crashed", "judge-rejected")


# --- single replica ------------------------------------------------------------------------------------
def single_instance(rng: np.random.Generator, block_preset: int | None) -> tuple[Workload, Limits]:
    n = int(rng.integers(1, 17))
    ones = rng.random() < 0.3                     # one-token prompts (the vllm deadlock of issue 36)
    ins = np.ones(n, dtype=int) if ones else rng.integers(1, 13, n)
    outs = rng.integers(1, 19, n)
    arrivals = None
    if rng.random() < 0.6:
        arrivals = np.cumsum(rng.exponential(1 / rng.uniform(0.5, 20.0), n)).tolist()
    block = block_preset or (int(rng.choice([2, 3, 4, 16])) if rng.random() < 0.4 else 1)
    peak = int((ins + outs - 1).max())
    M = peak + int(rng.integers(0, 3 * block + 8))
    M = -(-M // block) * block
    C = int(rng.integers(1, 5)) if rng.random() < 0.5 else int(ins.max()) + int(rng.integers(0, 6))
    P = None if rng.random() < 0.6 else int(rng.integers(1, C + 1))
    R_max = None if rng.random() < 0.7 else int(rng.integers(1, n + 1))
    w = Workload.from_lengths(ins.tolist(), outs.tolist(), arrivals, name="fuzz")
    return w, Limits(M=M, C=C, P=P, R_max=R_max, block_size=block)


def single_run(name: str, w: Workload, lim: Limits) -> str:
    try:
        get_scheduler(name).reset(ServingState(w, lim, get_cost_model(None)))
    except ValueError as exc:
        return "refused" if LIMIT_NAMED.search(str(exc)) else "refused-unnamed"
    try:
        result = simulate(w, name, lim)
    except SchedulerStuckError:
        return "stuck"
    except ValueError:
        return "refused-late"
    except Exception:            # noqa: BLE001 (a crash is what this counts)
        return "crashed"
    try:
        trace = replay(result.schedule, w, lim)
    except Exception:            # noqa: BLE001
        return "judge-rejected"
    return "ok" if trace == result.trace else "judge-rejected"


def fuzz_single(per_scheduler: int, seed: int, out: collections.Counter, examples: dict) -> None:
    for s, name in enumerate(available()):
        preset = get_scheduler(name).block_size
        for k in range(per_scheduler):
            rng = np.random.default_rng([seed, s, k])
            w, lim = single_instance(rng, preset)
            verdict = single_run(name, w, lim)
            out[verdict] += 1
            if verdict not in ("ok", "refused"):
                examples.setdefault(("single", verdict, name), (w.to_dict(), lim.to_dict()))


# --- cluster ---------------------------------------------------------------------------------------------
SPECS = ("a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3", "a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3",
         "a100:nodes=2,gpus_per_node=2,model=mistral-7b-v0.3", "a100:nodes=1,gpus_per_node=3,model=llama2-7b,util=0.25",
         "a100:nodes=1,gpus_per_node=4,tp=1,kvp=2,model=mistral-7b-v0.3",
         "a100:nodes=1,gpus_per_node=4,tp=2,kvp=2,model=mistral-7b-v0.3",
         "a100:nodes=1,gpus_per_node=4,spp=2,model=mistral-7b-v0.3",
         "a100:nodes=1,gpus_per_node=2,tp=1,kvp=2,model=llama2-7b")
LOCALS = (None, "vllm", "sarathi", "vllm-hy", "sarathi-nocp", "vllm-ef", "rank-i", "medha")
CLUSTER_POLICIES = tuple(p for p in POLICIES if get_policy(p).name == p)       # (no aliases)


def cluster_instance(rng: np.random.Generator, cluster: Cluster) -> Workload:
    n = 2 if rng.random() < 0.3 else int(rng.integers(1, 7))
    all_gang = rng.random() < 0.25
    plan = cluster.executes_plan and rng.random() < 0.8       # (executed plans take no gangs)
    scale = float(rng.choice([0.0, 1e-3, 0.05, 0.5]))
    t, reqs = 0.0, []
    for i in range(n):
        long = not plan and (all_gang or rng.random() < 0.3)
        top = 3000 if rng.random() < 0.75 else 12000          # (long short prompts: a gang's share beside them)
        I = int(rng.integers(2000, 40000)) if long else int(np.exp(rng.uniform(0, np.log(top))))
        t += float(rng.exponential(scale)) if scale else 0.0
        reqs.append(Request(id=i, input_len=I, output_len=int(rng.integers(1, 12)), arrival_s=t,
                            tag="long" if long else "short"))
    return Workload(requests=tuple(reqs), name="fuzz")


def cluster_run(w: Workload, cluster: Cluster, policy: str, local, options: dict) -> str:
    try:
        engine = ClusterEngine(w, cluster, policy, local, None, None, **options)
    except ValueError as exc:
        return "refused" if str(exc) else "refused-unnamed"
    try:
        res = engine.run()
    except SchedulerStuckError:
        return "stuck"
    except ValueError:           # a refusal, but once the run had started (a replica built on first use)
        return "refused-late"
    except Exception:            # noqa: BLE001
        return "crashed"
    try:
        out = replay_cluster(ClusterSchedule.from_json(res.cluster_schedule().to_json()), w)
        out.metrics()
    except Exception:            # noqa: BLE001
        return "judge-rejected"
    same = np.array_equal(out.requests["completion_s"], res.trace.requests["completion_s"])
    return "ok" if same else "judge-disagrees"


def fuzz_cluster(num: int, seed: int, out: collections.Counter, examples: dict, by_policy: collections.Counter,
                 policies: tuple[str, ...] = CLUSTER_POLICIES) -> None:
    clusters = [Cluster.from_spec(s) for s in SPECS]
    for k in range(num):
        rng = np.random.default_rng([seed, 1 << 20, k])
        cluster = clusters[int(rng.integers(len(clusters)))]
        policy = policies[k % len(policies)]
        w = cluster_instance(rng, cluster)
        R = cluster.num_replicas
        options = {}
        if rng.random() < 0.7:
            options["sp_replicas"] = int(rng.integers(1, R + 1))
        if get_policy(policy).disaggregate and R > 1 and rng.random() < 0.7:
            options["decode_replicas"] = int(rng.integers(1, R))
        local = LOCALS[int(rng.integers(len(LOCALS)))]
        try:
            verdict = cluster_run(w, cluster, policy, local, options)
        except Exception:        # noqa: BLE001 (the judge's own crash)
            verdict = "crashed"
            traceback.print_exc()
        out[verdict] += 1
        by_policy[policy, verdict] += 1
        if verdict not in ("ok", "refused"):
            examples.setdefault(("cluster", verdict, policy), (cluster.to_spec(), local, options, w.to_dict()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--single", type=int, default=40, help="runs per registered scheduler (default 40)")
    ap.add_argument("--cluster", type=int, default=1500, help="cluster runs, the policies in turn (default 1500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(CLUSTER_POLICIES), help="cluster policies (default: all)")
    args = ap.parse_args()
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    for p in policies:
        get_policy(p)
    examples: dict = {}
    t0 = time.process_time()
    single: collections.Counter = collections.Counter()
    fuzz_single(args.single, args.seed, single, examples)
    t1 = time.process_time()
    cluster: collections.Counter = collections.Counter()
    by_policy: collections.Counter = collections.Counter()
    fuzz_cluster(args.cluster, args.seed, cluster, examples, by_policy, policies)
    t2 = time.process_time()
    print(f"single replica: {sum(single.values())} runs over {len(available())} schedulers, {t1 - t0:.0f} CPU s: "
          f"{dict(sorted(single.items()))}")
    print(f"cluster: {sum(cluster.values())} runs over {len(policies)} policies, {t2 - t1:.0f} CPU s: "
          f"{dict(sorted(cluster.items()))}")
    ran = collections.Counter(p for (p, v), c in by_policy.items() if v != "refused" for _ in range(c))
    print("cluster runs that ran, per policy:", dict(sorted(ran.items())))
    for key, example in examples.items():
        print("example", key, str(example)[:600])
    bad = sum(single[f] + cluster[f] for f in FAILURES + ("judge-disagrees", "refused-unnamed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
