"""The layout of the compiled loop's arrays (:mod:`infermax.fastloop`, :mod:`infermax.fastloop_kernel`): the
positions of the scheduler's and the state's numbers in them and the codes a chunk ends with; and
:class:`LoopSpec`, what a scheduler gives the loop. A leaf: the schedulers import it, the loop itself sits with
the simulator."""
from typing import NamedTuple

# the groups' kinds (GetNextBatch's DECODE_GROUP, PREFILL_GROUP, WAITING_GROUP) and the batch phases
DEC, PF, WAIT = 0, 1, 2
NO_PHASE, PREFILL, DECODE = 0, 1, 2
# cfg: the scheduler's and the limits' numbers
(PREFILL_FIRST, HYBRID, CHUNKED, C, P, R, BLOCKS, WM, BS, LIM_C, LIM_P, LIM_M, LIM_RUN,
 LIM_BLOCKS, SHIFT) = range(15)
# sc: the state's integers (in and out) and the chunk's counters (out)
(KV, BLK_USED, NRUN, NDONE, NB, NEXT, NQ, PF_LEFT, DEC_LEFT, VERSION, NA, UPTO, CODE, ND, NT,
 NF, NEV, ERR_BATCH) = range(18)
NUM_SC = 18
# what a chunk ended with (sc[CODE])
FINISHED, FULL, STUCK, EVICTED_NONE, BROKE_C, BROKE_P, BROKE_M, BROKE_BLOCKS, BROKE_RUN = range(9)
BROKEN = {BROKE_C: "C", BROKE_P: "P", BROKE_M: "M", BROKE_BLOCKS: "M-blocks", BROKE_RUN: "R_max"}
# the budgets of the batch under construction (bud)
BC, BP, BMEM, BRUN, BPHASE, BPN, BNE = range(7)


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
