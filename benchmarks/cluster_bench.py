"""Cluster engine speed: an hour of the Splitwise conversation trace on PecSched §6.2's 32 A100s.

The workload is PecSched's construction over the whole trace (19,366 requests in 3,502 s;
inputs above the 95th percentile replaced by 100K-``hi`` tokens), Mistral-7B-v0.3 on
4 nodes x 8 A100-80GB, one replica per GPU, ``--local`` as each replica's scheduler. Per policy:
CPU seconds, batches simulated per CPU second (the engine's events: batches plus
dispatch decisions), decisions, the p99 CPU time of one dispatch decision, the
simulated makespan, and the CPU time per batch as a ratio to a baseline run in the same
process: the single-replica simulator on one replica's share of the short requests (every
R-th, same arrivals, same local scheduler and limits) — what a batch costs with no cluster
around it. Target (issue 20): the hour in <= 60 s on this machine.

    python benchmarks/cluster_bench.py [--policies fifo,pecsched] [--local sarathi] [--n 19366] [--hi 400000]
    python benchmarks/cluster_bench.py --scale 32,256,1024,8192 [--n 2000]   # PecSched Fig. 15

``--scale``: PecSched on clusters of that many A100s (8 per node, Mistral 7B), ``--n`` requests of the trace
(default 2000) arriving at the 32-GPU cluster's FIFO capacity times the cluster's size over 32 (load 1.0,
§6.6): the dispatcher's decision time (p99, wall clock) and its p99 share of a request's JCT, per class,
the peak RSS of the process so far, and the CPU time per batch as a ratio to the same kind of baseline
(one 32-GPU replica's share of the requests at load 1.0).
"""
from __future__ import annotations

import argparse
import resource
import time

from infermax import Workload, simulate
from infermax.cluster import Cluster, simulate_cluster
from infermax.cluster.roles import local_limits

CLUSTER32 = "a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3,net_gbps=400"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fifo,pecsched")
    ap.add_argument("--local", default="sarathi", help="each replica's scheduler")
    ap.add_argument("--n", type=int, default=19366, help="requests from the trace (default: all, one hour)")
    ap.add_argument("--hi", type=int, default=400_000, help="longest long input (one replica holds 479K tokens)")
    ap.add_argument("--cluster", default=CLUSTER32)
    ap.add_argument("--scale", help="GPU counts, comma separated: Fig. 15's scalability study instead")
    args = ap.parse_args()
    if args.scale:
        return scale(args)
    w = Workload.from_spec(f"pecsched:splitwise_conv,n={args.n},hi={args.hi}")
    cluster = Cluster.from_spec(args.cluster)
    print(f"{len(w)} requests over {w.arrivals_s.max():.0f} s on {cluster.to_spec()} ({cluster.num_replicas} replicas)")
    base = baseline_s_per_batch(w, cluster, args.local)
    print(f"baseline: {base * 1e6:.1f} us CPU per batch (the single-replica simulator on 1/{cluster.num_replicas} "
          f"of the short requests)")
    print(f"{'policy':>12} {'CPU s':>8} {'batches':>9} {'decisions':>9} {'events/CPU s':>12} "
          f"{'decision p99':>12} {'makespan s':>10} {'preemptions':>11} {'CPU/batch x base':>16}")
    for policy in args.policies.split(","):
        t0 = time.process_time()
        r = simulate_cluster(w, cluster, policy.strip(), args.local)
        cpu = time.process_time() - t0
        batches = sum(len(s.batches) for s in r.schedules)
        events = batches + len(r.decision_s) + sum(len(g.steps) for g in r.gangs) + len(r.migrations)
        print(f"{policy:>12} {cpu:8.1f} {batches:9d} {len(r.decision_s):9d} {events / cpu:12.0f} "
              f"{r.metrics['scheduling_decision_p99_s'] * 1e6:10.0f}us {r.metrics['latency_s']:10.0f} "
              f"{r.num_preemptions:11d} {cpu / batches / base:16.2f}", flush=True)


def baseline_s_per_batch(w: Workload, cluster: Cluster, local: str, repeat: int = 3) -> float:
    """CPU seconds per batch of the single-replica simulator on every R-th short request of ``w`` (arrivals
    kept), under the cluster's replica limits and cost model: a batch's cost with no cluster around it
    (the best of ``repeat`` runs)."""
    short = [r for r in w.requests if r.tag != "long"]
    share = Workload(requests=tuple(short[::cluster.num_replicas]), name=f"{w.name} (one replica's share)")
    lim = local_limits(cluster, share, None, share.input_lens > 0)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        res = simulate(share, local, lim, cluster.cost_model_name())
        best = min(best, (time.process_time() - t0) / res.metrics["num_batches"])
    return best


def scale(args: argparse.Namespace) -> None:
    from infermax.cluster import at_load, capacity_rps
    n = args.n if args.n != 19366 else 2000
    base = Workload.from_spec(f"pecsched:splitwise_conv,n={n},hi={args.hi}")
    c32 = Cluster.from_spec(CLUSTER32)
    cap32 = capacity_rps(base, c32, "fifo", args.local)
    per_batch = baseline_s_per_batch(at_load(base, 1.0, cap32), c32, args.local)
    print(f"{n} requests; 32-GPU FIFO capacity {cap32:.3f} requests/s; baseline {per_batch * 1e6:.1f} us CPU per "
          f"batch (the single-replica simulator on 1/32 of the short requests at load 1.0)")
    print(f"{'GPUs':>6} {'CPU s':>8} {'decisions':>9} {'decision p99':>12} {'share p99 short':>15} "
          f"{'share p99 long':>14} {'peak RSS GB':>11} {'CPU/batch x base':>16}")
    for gpus in (int(x) for x in args.scale.split(",")):
        cluster = Cluster.from_spec(f"a100:nodes={max(1, gpus // 8)},gpus_per_node={min(gpus, 8)},"
                                    f"model=mistral-7b-v0.3,net_gbps=400")
        w = at_load(base, 1.0, cap32 * gpus / 32)
        t0 = time.process_time()
        r = simulate_cluster(w, cluster, "pecsched", args.local, decode_replicas=max(1, gpus // 8))
        cpu = time.process_time() - t0
        batches = sum(len(s.batches) for s in r.schedules)
        print(f"{gpus:6d} {cpu:8.1f} {len(r.decision_s):9d} {r.metrics['scheduling_decision_p99_s'] * 1e3:10.2f}ms "
              f"{100 * r.metrics['decision_share_p99_short']:14.3f}% "
              f"{100 * r.metrics['decision_share_p99_long']:13.3f}% "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:11.2f} {cpu / batches / per_batch:16.2f}",
              flush=True)


if __name__ == "__main__":
    main()
