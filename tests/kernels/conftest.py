"""Factories for the kernel tests.

Without a CUDA device the Triton kernels run in the interpreter: TRITON_INTERPRET
must be set before the first ``import triton``, so it is set here at import time.
"""

from types import SimpleNamespace

import pytest
from factories import use_triton_interpreter_without_cuda

HAS_CUDA = use_triton_interpreter_without_cuda()


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core machine
    torch's thread pool spins (a 11x256 matmul went from 0.1 ms to 14 ms)."""
    try:
        import torch
    except ImportError:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def device():
    """Where the kernel tests put their tensors: CUDA if present, else CPU (interpreter)."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(scope="session")
def naive_attention():
    """Causal GQA softmax attention in float64 with torch.softmax, one sequence.

    q [c, Hq, D] are the last c of n = len(k) positions (query t sits at n - c + t),
    k, v [n, Hkv, D]. Returns o float64 [c, Hq, D] and lse float64 [c, Hq] (natural log).
    """
    import torch

    def attend(q, k, v, scale=None, causal=True):
        c, num_q_heads, head_dim = q.shape
        n, group = k.shape[0], num_q_heads // k.shape[1]
        scale = head_dim ** -0.5 if scale is None else scale
        k64 = k.double().repeat_interleave(group, dim=1)
        v64 = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,jhd->htj", q.double(), k64) * scale
        if causal:
            hidden = torch.arange(n)[None, :] > (n - c + torch.arange(c))[:, None]
            scores = scores.masked_fill(hidden.to(scores.device), float("-inf"))
        o = torch.einsum("htj,jhd->thd", torch.softmax(scores, dim=-1), v64)
        return o, torch.logsumexp(scores, dim=-1).transpose(0, 1)

    return attend


@pytest.fixture(scope="session")
def make_paged_batch():
    """Factory: a paged cache holding random KV of several sequences, plus their queries.

    Physical blocks are a random permutation (sequences interleave in memory) and
    every slot no sequence owns holds NaN, so reading an unwritten slot shows up.
    Sequence i has ``context_lens[i]`` cached tokens and ``query_lens[i]`` new ones,
    all ``m + c`` already written. Returns a SimpleNamespace with q, k_cache,
    v_cache, block_table, cu_seqlens, context_lens, seq_lens and the contiguous
    per-sequence ``k_seqs`` / ``v_seqs`` that were written.
    """
    import torch

    from infermax.kernels.paged import write_kv

    def make(context_lens, query_lens, *, num_q_heads, num_kv_heads, head_dim, page_size,
             dtype=torch.float32, device="cpu", seed=0, spare_blocks=2):
        gen = torch.Generator().manual_seed(seed)
        seq_lens = [m + c for m, c in zip(context_lens, query_lens)]
        blocks_per_seq = [-(-n // page_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + spare_blocks
        perm = torch.randperm(num_blocks, generator=gen).tolist()
        table = torch.zeros(len(seq_lens), max(blocks_per_seq + [1]), dtype=torch.int32)
        for i, nb in enumerate(blocks_per_seq):
            table[i, :nb] = torch.tensor(perm[:nb], dtype=torch.int32)
            perm = perm[nb:]
        shape = (num_blocks, page_size, num_kv_heads, head_dim)
        k_cache = torch.full(shape, float("nan"), dtype=dtype)
        v_cache = torch.full(shape, float("nan"), dtype=dtype)
        k_seqs = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in seq_lens]
        v_seqs = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in seq_lens]
        cu_all = torch.tensor([0] + seq_lens).cumsum(0).to(torch.int32)
        write_kv(k_cache, v_cache, table, cu_all, torch.zeros(len(seq_lens), dtype=torch.int32),
                 torch.cat(k_seqs), torch.cat(v_seqs))
        q = torch.randn(sum(query_lens), num_q_heads, head_dim, generator=gen).to(dtype)
        to = lambda t: t.to(device)
        return SimpleNamespace(
            q=to(q), k_cache=to(k_cache), v_cache=to(v_cache), block_table=to(table),
            cu_seqlens=to(torch.tensor([0] + list(query_lens)).cumsum(0).to(torch.int32)),
            context_lens=to(torch.tensor(list(context_lens), dtype=torch.int32)),
            seq_lens=to(torch.tensor(seq_lens, dtype=torch.int32)),
            k_seqs=k_seqs, v_seqs=v_seqs, query_lens=list(query_lens),
        )

    return make
