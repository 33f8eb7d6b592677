"""Traces: what happened in each batch and to each request, as NumPy arrays.

Both the simulator and `replay` build a Trace through a `TraceRecorder`; the
invariant "replay(simulate(w, s)) reproduces the simulator" is `Trace.__eq__`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .state import BatchRecord, DecodeSegment, HybridSegment, ServingState

BATCH_FIELDS = ("start_s", "duration_s", *BatchRecord._fields)
REQUEST_FIELDS = ("id", "input_len", "output_len", "arrival_s", "first_scheduled_s",
                  "first_token_s", "completion_s", "num_evictions", "refill_tokens", "num_suspensions",
                  "ttft_slo_s", "tpot_slo_s", "tag")


@dataclass(frozen=True, eq=False)
class Trace:
    """Per-batch arrays (``batches``) and per-request arrays (``requests``).

    Batch fields: start/duration (s); requests and tokens in the batch; prefill
    tokens; decode requests; ``kv_tokens`` held during the batch; ``num_running``
    requests holding KV during the batch; evictions before it. Every time (the batches' starts, the
    requests' arrivals, first tokens and completions) is in seconds since the workload's first arrival
    (:mod:`infermax.clock`).
    """

    batches: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    M: int
    cost_name: str

    @property
    def num_batches(self) -> int:
        return int(self.batches["start_s"].size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return not self.diff(other) and self.M == other.M

    def diff(self, other: "Trace") -> list[str]:
        """Names of the fields that differ (empty when equal)."""
        out = [f"batches.{k}" for k in BATCH_FIELDS
               if not np.array_equal(self.batches[k], other.batches[k])]
        return out + [f"requests.{k}" for k in REQUEST_FIELDS
                      if not np.array_equal(self.requests[k], other.requests[k], equal_nan=k != "tag")]

    def batch_frame(self):
        import pandas as pd

        df = pd.DataFrame(self.batches)
        df.index.name = "batch"
        df["end_s"] = df["start_s"] + df["duration_s"]
        df["kv_utilization"] = df["kv_tokens"] / self.M
        return df

    def request_frame(self):
        import pandas as pd

        df = pd.DataFrame(self.requests)
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["e2e_s"] = df["completion_s"] - df["arrival_s"]
        df["queueing_s"] = df["first_scheduled_s"] - df["arrival_s"]
        gaps = (df["output_len"] - 1).where(df["output_len"] > 1)
        df["tpot_s"] = (df["completion_s"] - df["first_token_s"]) / gaps
        return df.set_index("id")


class TraceRecorder:
    """Accumulates batch records and builds the Trace at the end.

    Records go into Python lists (cheap appends) that are moved every
    ``CHUNK_BATCHES`` batches into one NumPy array per field, so a run of millions
    of batches holds 72 bytes per batch, not a tuple of Python ints per batch.
    """

    CHUNK_BATCHES = 8192

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._durations: list[float] = []
        self._records: list[int] = []          # the integer fields of each batch, flattened
        self._columns: list[list[np.ndarray]] = [[] for _ in BATCH_FIELDS]   # per field, its chunks

    def add(self, start_s: float, duration_s: float, record: BatchRecord) -> None:
        self._starts.append(start_s)
        self._durations.append(duration_s)
        self._records.extend(record)
        if len(self._starts) >= self.CHUNK_BATCHES:
            self._flush()

    def add_decode_segment(self, segment: DecodeSegment) -> None:
        """The batches of a fast-forwarded decode run (:meth:`ServingState.apply_decode_run`)."""
        self._starts.extend(segment.starts_s)
        self._durations.extend(segment.durations_s)
        n = int(segment.idx.size)
        # a BatchRecord's fields, in order, per batch: all the same but kv_tokens (field 4), filled in after
        records = [n, n, 0, n, 0, segment.num_running, 0] * segment.num_batches
        records[4::7] = segment.kv_tokens
        self._records.extend(records)
        if len(self._starts) >= self.CHUNK_BATCHES:
            self._flush()

    def add_hybrid_segment(self, segment: HybridSegment) -> None:
        """The batches of a fast-forwarded hybrid run (:meth:`ServingState.apply_hybrid_run`): the decodes and
        one (re)fill chunk each, so the BatchRecord of each is the same but its kv_tokens (field 4)."""
        k = segment.num_batches
        self._starts.extend(segment.starts_s)
        self._durations.extend(segment.durations_s)
        n, c = int(segment.idx.size), int(segment.tokens[-1])
        records = [n, n - 1 + c, c, n - 1, 0, segment.num_running, 0] * k
        records[4::7] = segment.kv_tokens
        self._records.extend(records)
        if len(self._starts) >= self.CHUNK_BATCHES:
            self._flush()

    def add_columns(self, starts_s: np.ndarray, durations_s: np.ndarray, records: np.ndarray) -> None:
        """Batches already in columns (the compiled loop's chunk, :mod:`infermax.fastloop`): their starts, their
        durations and their BatchRecords as the rows of ``records``; the arrays are kept, not copied."""
        self._flush()
        cols = self._columns
        cols[0].append(starts_s)
        cols[1].append(durations_s)
        for k in range(records.shape[1]):
            cols[2 + k].append(records[:, k])

    def _flush(self) -> None:
        if not self._starts:
            return
        cols = self._columns
        cols[0].append(np.asarray(self._starts, dtype=np.float64))
        cols[1].append(np.asarray(self._durations, dtype=np.float64))
        rec = np.asarray(self._records, dtype=np.int64).reshape(-1, len(BATCH_FIELDS) - 2)
        for k in range(rec.shape[1]):
            cols[2 + k].append(rec[:, k].copy())
        self._starts, self._durations, self._records = [], [], []

    def finish_batches(self) -> dict[str, np.ndarray]:
        """The batch arrays recorded so far (the recorder is spent: call once)."""
        self._flush()
        batches: dict[str, Any] = {}
        for name, chunks in zip(BATCH_FIELDS, self._columns):
            dtype = np.float64 if name in ("start_s", "duration_s") else np.int64
            batches[name] = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
            chunks.clear()     # one field at a time: the chunks and the result coexist for one field only
        return batches

    def finish(self, state: ServingState) -> Trace:
        batches = self.finish_batches()
        requests = request_arrays(state.workload, state.first_scheduled_s, state.first_token_s, state.completion_s,
                                  state.num_evictions, state.refill_tokens, state.num_suspensions)
        return Trace(batches=batches, requests=requests, M=state.limits.M, cost_name=state.cost.name)


def request_arrays(w: Any, first_scheduled_s: np.ndarray, first_token_s: np.ndarray, completion_s: np.ndarray,
                   num_evictions: np.ndarray, refill_tokens: np.ndarray, num_suspensions: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """A trace's per-request arrays (``REQUEST_FIELDS``): the workload's own fields and copies of the given ones."""
    return {"id": w.ids.copy(), "input_len": w.input_lens.copy(), "output_len": w.output_lens.copy(),
            "arrival_s": w.arrivals_s.copy(), "first_scheduled_s": first_scheduled_s.copy(),
            "first_token_s": first_token_s.copy(), "completion_s": completion_s.copy(),
            "num_evictions": num_evictions.copy(), "refill_tokens": refill_tokens.copy(),
            "num_suspensions": num_suspensions.copy(),
            "ttft_slo_s": np.array([np.nan if r.ttft_slo_s is None else r.ttft_slo_s for r in w.requests]),
            "tpot_slo_s": np.array([np.nan if r.tpot_slo_s is None else r.tpot_slo_s for r in w.requests]),
            "tag": np.array([r.tag or "" for r in w.requests], dtype=object)}
