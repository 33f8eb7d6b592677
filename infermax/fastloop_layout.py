"""The layout of the compiled loop's arrays (:mod:`infermax.fastloop`, :mod:`infermax.fastloop_kernel`): the
positions of the scheduler's and the state's numbers in them and the codes a chunk ends with; and
:class:`LoopSpec`, what a scheduler gives the loop. A leaf: the schedulers import it, the loop itself sits with
the simulator."""
from typing import NamedTuple

# the groups' kinds (GetNextBatch's DECODE_GROUP, PREFILL_GROUP, WAITING_GROUP) and the batch phases
_DEC, _PF, _WAIT = 0, 1, 2
_NO_PHASE, _PREFILL, _DECODE = 0, 1, 2
# cfg: the scheduler's and the limits' numbers
(_PREFILL_FIRST, _HYBRID, _CHUNKED, _C, _P, _R, _BLOCKS, _WM, _BS, _LIM_C, _LIM_P, _LIM_M, _LIM_RUN,
 _LIM_BLOCKS, _SHIFT) = range(15)
# sc: the state's integers (in and out) and the chunk's counters (out)
(_KV, _BLK_USED, _NRUN, _NDONE, _NB, _NEXT, _NQ, _PF_LEFT, _DEC_LEFT, _VERSION, _NA, _UPTO, _CODE, _ND, _NT,
 _NF, _NEV, _ERR_BATCH) = range(18)
_NUM_SC = 18
# what a chunk ended with (sc[_CODE])
FINISHED, FULL, STUCK, EVICTED_NONE, BROKE_C, BROKE_P, BROKE_M, BROKE_BLOCKS, BROKE_RUN = range(9)
_BROKEN = {BROKE_C: "C", BROKE_P: "P", BROKE_M: "M", BROKE_BLOCKS: "M-blocks", BROKE_RUN: "R_max"}
# the budgets of the batch under construction (bud)
_BC, _BP, _BMEM, _BRUN, _BPHASE, _BPN, _BNE = range(7)


class LoopSpec(NamedTuple):
    """What the compiled loop needs of a scheduler (:meth:`GetNextBatch.loop_spec`): its groups' order
    (prefills first, as vLLM, or decodes, as Sarathi), hybrid batches, chunked prefill, its C, P and
    running budgets, its KV budget in blocks and the admission watermark (blocks), and the block size."""

    prefill_first: bool
    hybrid: bool
    chunked: bool
    C: int
    P: int
    R: int
    blocks: int
    watermark: int
    block_size: int
