"""Cost-model speed and accuracy in one place.

    python benchmarks/costmodel_bench.py [--calls 20000]

Times ``batch_time`` (the simulator calls it once per simulated batch, ~20k
times per run) for the default fitted model, a parallel one, ring SP and the
roofline, on random mixed batches; then prints the held-out accuracy of the
fit to every packaged profile. Nothing here asserts.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _batches(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        num_decode = int(rng.integers(0, 128))
        num_prefill = int(rng.integers(0 if num_decode else 1, 3))
        tokens = np.r_[np.ones(num_decode, np.int64), rng.integers(1, 2048, num_prefill)]
        kv = np.r_[rng.integers(1, 4096, num_decode), rng.integers(0, 4096, num_prefill)]
        out.append((tokens, kv, np.r_[np.ones(num_decode, bool), np.zeros(num_prefill, bool)]))
    return out


def main() -> None:
    from infermax.costmodel import get_cost_model
    from infermax.costmodel.accuracy import accuracy_report
    from infermax.costmodel.profiles import available_profiles

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    batches = _batches(1000)
    print(f"{'model':<36}{'us/call':>10}")
    for name in ("default", "a100/llama2-7b@tp=4,pp=2", "a100/llama2-7b@sp=4,sp_kind=ring", "roofline:a100/llama2-7b"):
        model = get_cost_model(name)
        start = time.perf_counter()
        for i in range(args.calls):
            model.batch_time(*batches[i % len(batches)])
        print(f"{name:<36}{(time.perf_counter() - start) / args.calls * 1e6:>10.1f}")
    print(f"\n{'profile':<24}{'operator':<20}{'median':>8}{'p90':>8}{'n':>6}")
    for profile in available_profiles():
        report, _ = accuracy_report(profile)
        for key in ("non_attention", "attention", "batch"):
            st = report[key]
            if st["n"]:
                print(f"{profile:<24}{key:<20}{st['median_ape']:>8.1%}{st['p90_ape']:>8.1%}{st['n']:>6}")


if __name__ == "__main__":
    main()
