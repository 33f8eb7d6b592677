"""Time every attention kernel against its PyTorch reference, in one process.

    python benchmarks/kernels_bench.py [--repeats 3] [--device cpu|cuda]

For each shape the reference runs first and is the baseline; the Triton kernel's
time is printed as a ratio to it (< 1 = faster than the reference). On CPU the
kernels run in the Triton interpreter (TRITON_INTERPRET=1, set here before triton
is imported), which measures nothing about GPU speed: it only shows the harness
works and how much slower interpretation is. On CUDA the ratios are meaningful.
The ``csa/dense`` line times the CSA kernel against itself with one level (dense
causal attention through the same code path): the share of work CSA keeps.
Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _time_ms(fn, repeats: int, device: str) -> float:
    """Median wall time of fn() in milliseconds, after one warm-up call."""
    import torch

    fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _paged_batch(context_lens, query_lens, num_q_heads, num_kv_heads, head_dim, page_size, device, dtype):
    """A paged cache with random KV for the given (m, c) per sequence, blocks shuffled."""
    import torch

    from infermax.kernels.paged import write_kv

    gen = torch.Generator().manual_seed(0)
    seq_lens = [m + c for m, c in zip(context_lens, query_lens)]
    blocks = [-(-n // page_size) for n in seq_lens]
    perm = torch.randperm(sum(blocks), generator=gen)
    table = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    start = 0
    for i, nb in enumerate(blocks):
        table[i, :nb] = perm[start:start + nb]
        start += nb
    shape = (sum(blocks), page_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
    cu_all = torch.tensor([0] + seq_lens).cumsum(0).to(torch.int32)
    total = sum(seq_lens)
    write_kv(k_cache, v_cache, table, cu_all, torch.zeros(len(seq_lens), dtype=torch.int32),
             torch.randn(total, num_kv_heads, head_dim, generator=gen),
             torch.randn(total, num_kv_heads, head_dim, generator=gen))
    q = torch.randn(sum(query_lens), num_q_heads, head_dim, generator=gen).to(dtype)
    cu = torch.tensor([0] + list(query_lens)).cumsum(0).to(torch.int32)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    return [t.to(device) for t in (q, k_cache, v_cache, table, cu, ctx, torch.tensor(seq_lens, dtype=torch.int32))]


def _cases(device: str):
    """(name, shape text, reference fn, kernel fn) for a few shapes; small under the interpreter."""
    import torch

    from infermax.kernels.decode_attention import decode_attention
    from infermax.kernels.merge import merge_states_multi
    from infermax.kernels.prefill_attention import prefill_attention

    dtype = torch.float16 if device == "cuda" else torch.float32
    scale = 16 if device == "cuda" else 1
    for m, c, hq, hkv, d in [(0, 64 * scale, 8, 2, 64), (256 * scale, 32 * scale, 8, 1, 128)]:
        q, kc, vc, bt, cu, ctx, _ = _paged_batch([m, m // 2], [c, c // 2], hq, hkv, d, 16, device, dtype)
        run = lambda be: lambda: prefill_attention(q, kc, vc, bt, cu, ctx, backend=be, max_query_len=c)
        yield "prefill", f"m={m} c={c} Hq={hq} Hkv={hkv} D={d} x2 seqs", run("torch"), run("triton")
    for n, splits in [(512 * scale, 1), (512 * scale, 8)]:
        q, kc, vc, bt, _, _, lens = _paged_batch([n - 1] * 4, [1] * 4, 8, 2, 128, 16, device, dtype)
        run = lambda be, s=splits: lambda: decode_attention(q, kc, vc, bt, lens, num_splits=s, backend=be)
        yield "decode", f"n={n} splits={splits} Hq=8 Hkv=2 D=128 x4 seqs", run("torch"), run("triton")
    num_tokens = 4096 if device == "cuda" else 8
    o = torch.randn(num_tokens, 8, 32, 128, device=device, dtype=dtype)
    lse = torch.randn(num_tokens, 8, 32, device=device)
    run = lambda be: lambda: merge_states_multi(o, lse, backend=be)
    yield "merge", f"T={num_tokens} states=8 H=32 D=128", run("torch"), run("triton")
    yield from _csa_cases(device, dtype, scale)


def _csa_cases(device: str, dtype, scale: int):
    """CSA kernel vs its PyTorch reference, and vs the same kernel with one level (dense causal).

    The second ratio is the work CSA saves: with ``num_levels=1`` the kernel reads
    every causal key through the same code path.
    """
    import torch

    from infermax.kernels.csa import csa_attention

    gen = torch.Generator().manual_seed(0)
    n, seg, levels, p = 256 * scale, 32 * scale, 4, 0.5
    q = torch.randn(n, 4, 64, generator=gen).to(device, dtype)
    k, v = (torch.randn(n, 2, 64, generator=gen).to(device, dtype) for _ in range(2))
    importance = torch.rand(4, n, generator=gen).to(device)
    run = lambda be, lv=levels: lambda: csa_attention(q, k, v, importance, seg, lv, p, backend=be)
    shape = f"n={n} seg={seg} levels={levels} p={p} Hq=4 Hkv=2 D=64"
    yield "csa", shape, run("torch"), run("triton")
    yield "csa/dense", shape, run("triton", 1), run("triton")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    args = parser.parse_args()
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules import triton
    from infermax.kernels import _triton

    if not _triton.HAS_TRITON:
        raise SystemExit("triton is not installed: pip install triton")
    mode = "interpreter" if device == "cpu" else "compiled"
    print(f"device={device} triton={mode} repeats={args.repeats}; ratio = kernel / reference (same process)")
    print(f"{'op':<9} {'shape':<44} {'reference ms':>13} {'kernel ms':>11} {'ratio':>7}")
    for name, shape, reference, kernel in _cases(device):
        ref_ms = _time_ms(reference, args.repeats, device)
        ker_ms = _time_ms(kernel, args.repeats, device)
        print(f"{name:<9} {shape:<44} {ref_ms:>13.2f} {ker_ms:>11.2f} {ker_ms / ref_ms:>7.2f}")


if __name__ == "__main__":
    main()
