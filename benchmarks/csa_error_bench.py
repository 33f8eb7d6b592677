"""CSA's attention-output error against dense causal attention, by drop ratio and level count.

    python benchmarks/csa_error_bench.py [--tokens 2048] [--segment 256] [--backend torch|triton]

The accuracy stand-in of issue 21: the executor's random-weight model cannot
measure answer quality, so this prints, for random Gaussian q, k, v (4 query
heads, 2 KV heads, head_dim 64), the share of causal (query, key) pairs CSA
attends and the relative L2 / max-abs error of its output against dense causal
attention, with keys ranked by the attention they receive (oracle, this layer's
own scores) or at random. ``sharp`` multiplies q by 3 (score std 3 instead of 1),
so attention concentrates on few keys, as in trained models. The table in
``kernels/csa.py`` was printed by this script; the kernel equals the reference
within 2e-5, so the backend does not change it.
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--segment", type=int, default=256)
    parser.add_argument("--backend", choices=["torch", "triton"], default="torch")
    args = parser.parse_args()
    if args.backend == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules import triton
    import torch

    from infermax.kernels.csa import attention_importance, csa_error_vs_dense

    gen = torch.Generator().manual_seed(0)
    n = args.tokens
    q = torch.randn(n, 4, 64, generator=gen)
    k, v = torch.randn(n, 2, 64, generator=gen), torch.randn(n, 2, 64, generator=gen)
    random_rank = torch.rand(4, n, generator=gen)
    print(f"n={n} segment={args.segment} ({-(-n // args.segment)} segments) Hq=4 Hkv=2 D=64 backend={args.backend}")
    print("| levels | p | attended | rel L2 (flat, oracle) | rel L2 (flat, random) | rel L2 (sharp, oracle) "
          "| max abs (sharp, oracle) |")
    print("|---|---|---|---|---|---|---|")
    for levels in (2, 3, 4):
        for p in (0.0, 0.25, 0.5, 0.75, 1.0):
            row = []
            for sharp, rank in ((1.0, None), (1.0, random_rank), (3.0, None)):
                qs = q * sharp
                importance = attention_importance(qs, k) if rank is None else rank
                row.append(csa_error_vs_dense(qs, k, v, importance, args.segment, levels, p, backend=args.backend))
            print(f"| {levels} | {p:.2f} | {row[0].attended:.3f} | {row[0].rel_l2:.3f} | {row[1].rel_l2:.3f} "
                  f"| {row[2].rel_l2:.3f} | {row[2].max_abs:.3f} |")


if __name__ == "__main__":
    main()
