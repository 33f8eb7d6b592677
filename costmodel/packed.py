"""One packed batch as the forward pass reads it: the layout the executor runs and the profiler times.

It lives in the cost model's package (which imports nothing of the core) so that
:mod:`.profiler` times the very layout :mod:`infermax.execute.forward` packs and
runs. Plain fields, no torch: the tensors are whatever the caller built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Packed:
    """Tensors of one packed batch (rows are tokens, chunk after chunk).

    ``write_slots`` int64 [N]: flat cache slot of each new token. ``last_rows``
    int64 [S]: the row whose logits pick each chunk's next token. Decode group:
    ``decode_rows`` [B] rows, ``decode_blocks`` [B * nb] their KV blocks (row-major,
    padded to the longest), ``decode_mask`` bool [B, 1, 1, nb * block_size].
    ``prefills``: (first row, end row, blocks [nb], causal mask bool
    [c, nb * block_size]) per prefill-phase chunk. Whole blocks are gathered
    (``index_select``, 5x faster than a gather per slot) and the mask hides the
    slots past a sequence's end. The paged path reads ``cu_seqlens``,
    ``context_lens`` and ``block_table`` instead.
    """

    input_ids: Any
    positions: Any
    write_slots: Any
    last_rows: Any
    decode_rows: Any
    decode_blocks: Any
    decode_mask: Any
    prefills: tuple[tuple[int, int, Any, Any], ...]
    cu_seqlens: Any
    context_lens: Any
    block_table: Any
