"""Cluster engine speed: an hour of the Splitwise conversation trace on pecsched.txt §6.2's 32 A100s.

The workload is PecSched's construction over the whole trace (19,366 requests in 3,502 s;
inputs above the 95th percentile replaced by 100K-``hi`` tokens), Mistral-7B-v0.3 on
4 nodes x 8 A100-80GB, one replica per GPU, vLLM as each replica's scheduler. Per policy:
CPU seconds, batches simulated per CPU second (the engine's events: batches plus
dispatch decisions), decisions, the p99 CPU time of one dispatch decision, and the
simulated makespan. Target (issue 20): the hour in <= 60 s on this machine.

    python benchmarks/cluster_bench.py [--policies fifo,priority,reservation] [--n 19366] [--hi 400000]
"""
from __future__ import annotations

import argparse
import time

from infermax import Workload
from infermax.cluster import Cluster, simulate_cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fifo")
    ap.add_argument("--n", type=int, default=19366, help="requests from the trace (default: all, one hour)")
    ap.add_argument("--hi", type=int, default=400_000, help="longest long input (one replica holds 479K tokens)")
    ap.add_argument("--cluster", default="a100:nodes=4,gpus_per_node=8,model=mistral-7b-v0.3,net_gbps=400")
    args = ap.parse_args()
    w = Workload.from_spec(f"pecsched:splitwise_conv,n={args.n},hi={args.hi}")
    cluster = Cluster.from_spec(args.cluster)
    print(f"{len(w)} requests over {w.arrivals_s.max():.0f} s on {cluster.to_spec()} ({cluster.num_replicas} replicas)")
    print(f"{'policy':>12} {'CPU s':>8} {'batches':>9} {'decisions':>9} {'events/CPU s':>12} "
          f"{'decision p99':>12} {'makespan s':>10}")
    for policy in args.policies.split(","):
        t0 = time.process_time()
        r = simulate_cluster(w, cluster, policy.strip(), "vllm")
        cpu = time.process_time() - t0
        batches = sum(len(s.batches) for s in r.schedules)
        events = batches + len(r.decision_s)
        print(f"{policy:>12} {cpu:8.1f} {batches:9d} {len(r.decision_s):9d} {events / cpu:12.0f} "
              f"{r.metrics['scheduling_decision_p99_s'] * 1e6:10.0f}us {r.metrics['latency_s']:10.0f}")


if __name__ == "__main__":
    main()
