"""Cost-model speed and accuracy in one place.

    python benchmarks/costmodel_bench.py [--calls 20000]

Times ``batch_time`` (the simulator calls it once per simulated batch, ~20k
times per run) for the default fitted model, a parallel one, ring SP and the
roofline, on random mixed batches, each also as a ratio to a baseline timed in
the same process on the same batches (two NumPy reductions per batch, the least
any batch-time evaluation does), so numbers from different machines compare;
then prints the held-out accuracy of the fit to every packaged profile. Nothing
here asserts (tests never time anything). For scale: the default model at
~50 us/call keeps the ~20k calls of a simulated run under a second.
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


def _baseline(tokens: np.ndarray, kv: np.ndarray, is_decode: np.ndarray) -> float:
    return float(tokens.sum()) + float(kv.sum())


def _per_call_s(fn, batches: list, calls: int) -> float:
    """Seconds per call of ``fn(*batch)`` over ``calls`` calls cycling through ``batches``."""
    start = time.perf_counter()
    for i in range(calls):
        fn(*batches[i % len(batches)])
    return (time.perf_counter() - start) / calls


def main() -> None:
    from infermax.costmodel import get_cost_model
    from infermax.costmodel.accuracy import accuracy_report
    from infermax.costmodel.profiles import available_profiles

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    batches = _batches(1000)
    base = _per_call_s(_baseline, batches, args.calls)
    print(f"{'model':<36}{'us/call':>10}{'x baseline':>12}")
    print(f"{'baseline (2 numpy reductions)':<36}{base * 1e6:>10.1f}{1.0:>12.1f}")
    for name in ("default", "a100/llama2-7b@tp=4,pp=2", "a100/llama2-7b@sp=4,sp_kind=ring", "roofline:a100/llama2-7b"):
        per_call = _per_call_s(get_cost_model(name).batch_time, batches, args.calls)
        print(f"{name:<36}{per_call * 1e6:>10.1f}{per_call / base:>12.1f}")
    print(f"\n{'profile':<24}{'operator':<20}{'median':>8}{'p90':>8}{'n':>6}")
    for profile in available_profiles():
        report, _ = accuracy_report(profile)
        for key in ("non_attention", "attention", "batch"):
            st = report[key]
            if st["n"]:
                print(f"{profile:<24}{key:<20}{st['median_ape']:>8.1%}{st['p90_ape']:>8.1%}{st['n']:>6}")


if __name__ == "__main__":
    main()
