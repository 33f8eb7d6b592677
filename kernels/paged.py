"""A paged KV cache: fixed-size blocks of KV slots, mapped to sequences by block tables.

Layouts (one layer; a multi-layer cache stacks a leading ``num_layers`` axis):

- ``k_cache``, ``v_cache``: [num_blocks, block_size, num_kv_heads, head_dim]. Slot
  ``s`` of block ``b`` holds the key/value of one token.
- ``block_table``: int32 [num_seqs, max_blocks]. Token at absolute position ``p`` of
  sequence ``i`` lives in block ``block_table[i, p // block_size]``, slot
  ``p % block_size``. Entries past a sequence's last block are padding (0) and are
  never read, because every reader stops at the sequence's length.
- A batch of new tokens is packed token-major: ``cu_seqlens`` int32 [num_seqs + 1]
  gives sequence i's new tokens as rows ``cu_seqlens[i]:cu_seqlens[i+1]``, and
  ``context_lens`` int32 [num_seqs] gives ``m``, the number of tokens already cached;
  new token t of sequence i has absolute position ``m_i + t``.

:class:`PagedKVCache` owns the tensors and which blocks belong to which sequence
(nano-vllm's block manager); the functions below are stateless views and writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

import torch


class OutOfBlocksError(RuntimeError):
    """Raised when a sequence needs more KV blocks than are free."""


def token_positions(cu_seqlens: torch.Tensor, context_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed new token: (sequence index, absolute position), both int64 [num_tokens]."""
    query_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seq_idx = torch.repeat_interleave(torch.arange(len(query_lens), device=cu_seqlens.device), query_lens)
    offset_in_seq = torch.arange(int(cu_seqlens[-1]), device=cu_seqlens.device) - cu_seqlens[:-1].long()[seq_idx]
    return seq_idx, context_lens.long()[seq_idx] + offset_in_seq


def slot_mapping(block_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Flat slot index (block * block_size + offset), int64 [num_tokens]."""
    blocks = block_table.long()[seq_idx, positions // block_size]
    return blocks * block_size + positions % block_size


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens: torch.Tensor,
    context_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
) -> None:
    """Store the keys/values of the new tokens (k_new, v_new: [num_tokens, num_kv_heads, head_dim]) in place."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    seq_idx, positions = token_positions(cu_seqlens, context_lens)
    slots = slot_mapping(block_table, seq_idx, positions, block_size)
    k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = k_new.to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = v_new.to(v_cache.dtype)


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table_row: torch.Tensor,
              length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous copies of one sequence's first ``length`` keys and values: [length, num_kv_heads, head_dim] each."""
    block_size = k_cache.shape[1]
    positions = torch.arange(length, device=k_cache.device)
    blocks = block_table_row.long()[positions // block_size]
    offsets = positions % block_size
    return k_cache[blocks, offsets], v_cache[blocks, offsets]


class PagedKVCache:
    """KV tensors of every layer plus the block allocator that hands blocks to sequences.

    ``k``/``v``: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]; ``k[l]``
    is the one-layer cache the attention kernels read. Blocks are handed out from a
    free list and returned whole when a sequence is freed (finished or evicted).
    """

    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._blocks: dict[Hashable, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_of(self, seq_id: Hashable) -> list[int]:
        """Block ids of a sequence, in position order (empty if it holds none)."""
        return list(self._blocks.get(seq_id, []))

    def reserve(self, seq_id: Hashable, num_tokens: int) -> None:
        """Make sure ``seq_id`` owns enough blocks for ``num_tokens`` tokens in total."""
        blocks = self._blocks.setdefault(seq_id, [])
        missing = -(-num_tokens // self.block_size) - len(blocks)
        if missing > len(self._free):
            raise OutOfBlocksError(f"sequence {seq_id!r} needs {missing} more blocks, {len(self._free)} free")
        blocks.extend(self._free.popleft() for _ in range(max(0, missing)))

    def free(self, seq_id: Hashable) -> None:
        """Return every block of ``seq_id`` to the free list (completion or eviction)."""
        self._free.extend(self._blocks.pop(seq_id, []))

    def block_table(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """int32 [len(seq_ids), max_blocks] block table, rows padded with 0."""
        rows = [self._blocks.get(s, []) for s in seq_ids]
        table = torch.zeros(len(rows), max([len(r) for r in rows] + [1]), dtype=torch.int32)
        for i, row in enumerate(rows):
            table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return table.to(self.k.device)
