"""The judge's rule checks: every rule of docs/rules.md that :class:`~infermax.state.ServingState` refuses a
batch for, and the error it raises (``ScheduleError``, naming the batch, the request and the rule).

:class:`JudgeRules` is a mixin of ``ServingState`` (which owns every attribute these methods read): the
transitions (:mod:`infermax.state_transitions`) and the closed-form runs (:mod:`infermax.state_runs`) call
its checks in the order a batch meets its rules — its requests (``finished``, ``arrival``, ``duplicate``,
``tokens``), their chunks (``decode-chunk``, ``prefill-chunk``), the batch's limits (``C``, ``P``, ``M``,
``M-blocks``, ``R_max``), evictions (``evict``) — and the runs' own preconditions (``decode-run``,
``hybrid-run``). Checks that sit on the simulator's hot path are split in two: the transition tests the
rule inline, on Python ints, and calls a ``_refuse_*`` method, which finds and names the first offender,
only when it fails (a refusal costs a call; an accepted batch none).
"""
from __future__ import annotations

import numpy as np

from .status import DONE, FUTURE, RUNNING, WAITING

# the reductions behind ndarray.sum/min/max, called directly: the methods' per-call overhead shows on the
# small arrays of the hot paths (the same reduction, so the same results); shared with the transitions and runs
_sum, _min, _max = np.add.reduce, np.minimum.reduce, np.maximum.reduce
try:        # np.count_nonzero without its Python-level wrapper (the same count, a quarter of the call's cost)
    from numpy._core._multiarray_umath import count_nonzero as _count_nonzero
except ImportError:     # pragma: no cover - another NumPy layout
    _count_nonzero = np.count_nonzero

_STATUS = {FUTURE: "not arrived", WAITING: "waiting", RUNNING: "running", DONE: "finished"}


class ScheduleError(ValueError):
    """A schedule broke a rule; names the batch, the request and the rule."""

    __module__ = "infermax.state"       # (where users import it from)

    def __init__(self, batch: int, rule: str, message: str, request_id: int | None = None) -> None:
        self.batch, self.rule, self.request_id = batch, rule, request_id
        who = f", request {request_id}" if request_id is not None else ""
        super().__init__(f"batch {batch}{who}: [{rule}] {message}")


class JudgeRules:
    """The rule checks of a :class:`~infermax.state.ServingState` (``apply``'s steps 1-3, and the runs')."""

    # --- a batch's requests and chunks (apply, step 2) --------------------------------------------------
    def _check_requests(self, j: int, idx: np.ndarray, tokens: np.ndarray, st: np.ndarray) -> int:
        """Batch ``j``'s requests ``idx`` (statuses ``st``) are arrived, unfinished and distinct, and each
        processes >= 1 token (``apply``, step 2); returns how many of them are new (WAITING)."""
        n = int(idx.size)
        codes = st.tobytes()       # the statuses, a byte each: counted without a NumPy call
        num_new = codes.count(WAITING)
        if num_new + codes.count(RUNNING) != n:   # some are finished or not arrived
            k = int(idx[(st == DONE) | (st == FUTURE)][0])
            done = self.status[k] == DONE
            raise ScheduleError(j, "finished" if done else "arrival",
                                "request is finished" if done else "request has not arrived",
                                int(self.workload.ids[k]))
        if n > 1:  # duplicates: the last write of a repeated index wins, so an earlier slot reads back a later one
            slots = self._arange[:n] if n <= self._arange.size else np.arange(n)
            self._slot[idx] = slots
            back = self._slot[idx]
            if back.tobytes() != slots.tobytes():     # (compared as bytes: no NumPy call)
                k = int(idx[np.argmax(back != slots)])
                raise ScheduleError(j, "duplicate", "request appears twice in the batch", int(self.workload.ids[k]))
        if 1 in (tokens < 1).tobytes():       # (a flag byte searched: no reduction)
            k = int(np.argmin(tokens))
            raise ScheduleError(j, "tokens", f"c = {int(tokens[k])} < 1", int(self.workload.ids[idx[k]]))
        return num_new

    def _check_chunks(self, j: int, idx: np.ndarray, tokens: np.ndarray, m0: np.ndarray, inp0: np.ndarray,
                      m1: np.ndarray, is_decode: np.ndarray, num_tokens: int, num_decode: int, one: int) -> None:
        """Each decode of batch ``j`` processes exactly 1 token and each (re)fill at most the input tokens
        it has left (``apply``, step 2). When all decode, or all but request ``one``, the sums settle it
        without an array operation: the decodes' tokens (each >= 1) are all 1 exactly when they add up to
        their count; otherwise the first offender is found and named."""
        if num_decode == idx.size:
            if num_tokens == num_decode:
                return
        elif one >= 0:
            c = int(tokens[one])
            if num_tokens - c == num_decode and int(m0[one]) + c <= int(inp0[one]):
                return
        over = m1 > np.maximum(inp0, m0 + 1)
        if np.count_nonzero(over):
            k = int(np.argmax(over))
            ids = self.workload.ids
            if is_decode[k]:
                raise ScheduleError(j, "decode-chunk", f"decode phase processes exactly 1 token, "
                                    f"got c = {int(tokens[k])}", int(ids[idx[k]]))
            raise ScheduleError(j, "prefill-chunk", f"chunk c = {int(tokens[k])} exceeds the "
                                f"{int(inp0[k] - m0[k])} input tokens left", int(ids[idx[k]]))

    def _refuse_one(self, j: int, i: int, c: int, status: int, m0: int, inp0: int) -> None:
        """Raise for batch ``j`` of the one request ``i`` (status ``status``, ``m0`` of ``inp0`` tokens cached)
        processing ``c`` tokens: the first of its step-2 rules it breaks (``_apply_one`` calls this only when
        one is broken), in ``_check_requests``' and ``_check_chunks``' order."""
        ids = self.workload.ids
        if status != WAITING and status != RUNNING:
            done = status == DONE
            raise ScheduleError(j, "finished" if done else "arrival",
                                "request is finished" if done else "request has not arrived", int(ids[i]))
        if c < 1:
            raise ScheduleError(j, "tokens", f"c = {c} < 1", int(ids[i]))
        if m0 >= inp0:
            raise ScheduleError(j, "decode-chunk", f"decode phase processes exactly 1 token, got c = {c}",
                                int(ids[i]))
        raise ScheduleError(j, "prefill-chunk", f"chunk c = {c} exceeds the {inp0 - m0} input tokens left",
                            int(ids[i]))

    # --- the batch's limits (apply, step 3) -------------------------------------------------------------
    def _check_limits(self, j: int, num_tokens: int, num_prefill_tokens: int, kv: int, running: int,
                      m0: np.ndarray, tokens: np.ndarray, new_blocks: int | None = None) -> int:
        """Batch ``j`` keeps C, P, M (and M in blocks) and R_max (``apply``, step 3); returns the blocks in
        use after it (0 when block_size is 1). ``new_blocks``: the blocks the batch adds, when the caller
        has them (:meth:`~infermax.state_transitions.Transitions._new_blocks`); else counted from ``m0`` and
        ``tokens``."""
        lim = self.limits
        if num_tokens > self._lim_C:
            raise ScheduleError(j, "C", f"{num_tokens} tokens > C = {lim.C}")
        if num_prefill_tokens > self._lim_P:
            raise ScheduleError(j, "P", f"{num_prefill_tokens} prefill tokens > P = {lim.P}")
        if kv + self.external_kv > self._lim_M:
            raise ScheduleError(j, "M", f"KV cache would hold {kv} tokens{self._held()} > M = {lim.M}")
        blocks = 0
        if self._block > 1:
            if new_blocks is None:
                new_blocks = int(_sum(lim.kv_blocks(m0 + tokens) - lim.kv_blocks(m0)))
            blocks = self.blocks_used + new_blocks
            if blocks + (self._external_blocks() if self.external_kv else 0) > self._num_blocks:
                raise ScheduleError(j, "M-blocks", f"KV cache would hold {blocks + self._external_blocks()} "
                                    f"blocks of block_size = "
                                    f"{lim.block_size} tokens > M // block_size = {lim.num_blocks} "
                                    f"({kv} tokens, M = {lim.M})")
        if running > self._max_running:
            raise ScheduleError(j, "R_max", f"{running} running requests > R_max = {lim.R_max}")
        return blocks

    def _held(self) -> str:
        """The M error's note on the KV held for work scheduled elsewhere (empty when there is none)."""
        return f" (+ {self.external_kv} held for work scheduled elsewhere)" if self.external_kv else ""

    # --- evictions (apply, step 1) ----------------------------------------------------------------------
    def _check_evictions(self, j: int, evict: np.ndarray) -> None:
        """Batch ``j`` evicts only running requests (they hold KV), each once."""
        status = self.status
        bad = status[evict] != RUNNING
        if bad.any():
            k = int(evict[bad][0])
            raise ScheduleError(j, "evict", f"cannot evict a request that holds no KV "
                                f"(status {_STATUS[status[k]]})", int(self.workload.ids[k]))
        if evict.size > 1 and np.unique(evict).size != evict.size:
            raise ScheduleError(j, "evict", "a request is evicted twice")

    # --- the closed-form runs (infermax.state_runs) -----------------------------------------------------
    def _check_decode_run(self, idx: np.ndarray, m0: np.ndarray) -> None:
        """A decode run holds only running decode-phase requests (``m0`` cached), none leaving this replica
        after its first token (``decode-run``)."""
        # (the statuses and the flags as bytes: counted and searched without a NumPy call)
        if self.status[idx].tobytes().count(RUNNING) != idx.size or 1 in (m0 < self.inp[idx]).tobytes():
            raise ScheduleError(self.num_batches, "decode-run",
                                "a decode run may hold only running decode-phase requests")
        if self._stop is not None and np.count_nonzero(self._stop[idx] < self.output_lens[idx]):
            raise ScheduleError(self.num_batches, "decode-run", "a decode run may not hold a request that "
                                "leaves this replica after its first token (hand_off)")

    def _refuse_decode_segment(self, j: int, n: int, m0: np.ndarray, kv: range, bad_step: int | None) -> None:
        """Raise for the decode batches from ``j`` on of ``n`` requests holding ``m0`` (``kv``: the KV held
        during each): the rule that the first failing batch breaks, M or M-blocks (``bad_step``: the first
        step over M // block_size, or None), C first (each batch holds ``n`` tokens), as ``apply`` would name it.
        Called only when one fails."""
        lim = self.limits
        if n > lim.C:               # every batch of the run holds n tokens: the first breaks C, checked first
            raise ScheduleError(j, "C", f"{n} tokens > C = {lim.C}")
        if kv[-1] + self.external_kv > lim.M:
            s = max(0, (lim.M - self.external_kv - self.kv_used) // n)     # the first batch over M
            if bad_step is None or s <= bad_step:    # the step that breaks a rule first, as apply would
                raise ScheduleError(j + s, "M", f"KV cache would hold {kv[s]} tokens{self._held()} > M = {lim.M}")
        if bad_step is not None:
            held = int(self.blocks_used + (lim.kv_blocks(m0 + bad_step + 1) - lim.kv_blocks(m0)).sum()
                       + self._external_blocks())
            raise ScheduleError(j + bad_step, "M-blocks", f"KV cache would hold {held} blocks of block_size = "
                                f"{lim.block_size} tokens > M // block_size = {lim.num_blocks} (M = {lim.M})")
        raise AssertionError(f"batch {j}: a decode run refused without a broken rule (n = {n}, KV {kv[-1]})")

    def _check_hybrid_run(self, j: int, idx: np.ndarray, chunk: int, num_steps: int, m0: np.ndarray,
                          inp0: np.ndarray, mx: int, ix: int) -> tuple[np.ndarray, int]:
        """The rules of ``num_steps`` hybrid batches from ``j`` on: the decodes ``idx[:-1]`` (``m0``, ``inp0``)
        and the (re)fill ``idx[-1]`` (``mx`` of ``ix`` cached) processing ``chunk`` tokens a batch.

        Raises (``hybrid-run``) when they make no hybrid run: not running decodes and one running (re)fill,
        an empty chunk, a (re)fill reaching its input or a request completing before the last batch, a request
        leaving this replica (hand_off). Returns the decodes' batches left and the first completion."""
        n = int(idx.size) - 1
        # (the statuses and the flags as bytes: counted and searched without a NumPy call)
        if (n < 1 or chunk < 1 or self.status[idx].tobytes().count(RUNNING) != n + 1
                or 1 in (m0[:n] < inp0[:n]).tobytes() or mx >= ix):
            raise ScheduleError(j, "hybrid-run", "a hybrid run holds running decode-phase requests and, last, one "
                                "running request in (re)fill, and processes at least one token of it")
        dec = idx[:n]
        if mx + num_steps * chunk >= ix:
            raise ScheduleError(j, "hybrid-run", f"the (re)fill of request {int(self.workload.ids[idx[n]])} "
                                f"would reach its input within the run")
        left = self.output_lens[dec] - self.gen[dec]      # batches until each decode completes (>= 1)
        first_done = int(_min(left))
        if num_steps > first_done:
            raise ScheduleError(j, "hybrid-run", "a request would complete before the last batch of a hybrid run")
        if self._stop is not None and np.count_nonzero(self._stop[idx] < self.output_lens[idx]):
            raise ScheduleError(j, "hybrid-run", "a hybrid run may not hold a request that leaves this replica "
                                "after its first token (hand_off)")
        return left, first_done

    def _repeats(self, idx: np.ndarray) -> bool:
        """Whether a request appears twice in ``idx`` (``_check_requests``' test: the last write of a repeated
        index wins, so an earlier slot reads back a later one)."""
        n = int(idx.size)
        slots = self._arange[:n] if n <= self._arange.size else np.arange(n)
        self._slot[idx] = slots
        return self._slot[idx].tobytes() != slots.tobytes()
