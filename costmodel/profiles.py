"""Loaders for operator profiles in Vidur's CSV format.

A *profile* is a directory ``<gpu>/<model>`` holding ``mlp.csv`` (the
non-attention operators vs ``num_tokens``) and ``attention.csv`` or
``attention_sample.csv`` (attention vs batch size, chunk and KV size); network
profiles are ``all_reduce.csv`` / ``send_recv.csv`` (collective time vs bytes and
workers). All times in those files are milliseconds *per layer* (the embedding
per model); the loaders return seconds. ``mlp.csv`` may also hold ``lm_head``
(our CPU profiler writes it; Vidur's files have none): final norm + LM head +
greedy sampling, per model, on ``num_tokens`` logits rows — one row per request
of a batch, so it is kept apart from the per-token operators.

The Vidur measurements (MIT licence, ``data/vidur/LICENSE``) ship inside the
package and are the default source: ``load_mlp_profile("a100/llama2-7b")``
reads ``data/vidur/compute/a100/Llama-2-7b-hf/mlp.csv``. Any argument that is
an existing path is read instead. Columns are selected by name (their order
differs between files); duplicate configurations are averaged; malformed files
raise :class:`ProfileFormatError` naming the file, column and row.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .specs import VIDUR_MODEL_DIRS, get_gpu_spec, get_model_spec

MS = 1e-3
STATS = ("min", "max", "mean", "median", "std")
#: attention-profile operators that run per token beside the attention kernel itself
ATTENTION_SIDE_OPS = ("attn_input_reshape", "attn_output_reshape", "attn_kv_cache_save")
#: mlp-profile operators timed once per model, not per layer
PER_MODEL_OPS = ("emb", "lm_head")


class ProfileFormatError(ValueError):
    """A profile file is missing, empty, or has missing/non-numeric columns."""


class MissingProfileError(ProfileFormatError):
    """The profile (or the file asked for) does not exist."""


# --- locating files ------------------------------------------------------------

def data_root() -> Any:
    """The packaged data directory (a Traversable)."""
    return resources.files(__package__).joinpath("data")


def _packaged_compute_dir(profile: str) -> Any:
    gpu_name, _, model_name = profile.strip().partition("/")
    if not model_name:
        raise ProfileFormatError(f"profile {profile!r} is neither a path nor '<gpu>/<model>'")
    gpu = get_gpu_spec(gpu_name).name
    model = get_model_spec(model_name).name
    folder = data_root().joinpath("vidur", "compute", gpu, VIDUR_MODEL_DIRS.get(model, model))
    if not folder.is_dir():
        raise MissingProfileError(f"no packaged profile for {profile!r}; available: {', '.join(available_profiles())}")
    return folder


def available_profiles() -> list[str]:
    """Packaged compute profiles as ``<gpu>/<vidur model dir>``."""
    root = data_root().joinpath("vidur", "compute")
    return sorted(f"{g.name}/{m.name}" for g in root.iterdir() if g.is_dir() for m in g.iterdir() if m.is_dir())


def profile_dir(profile: "str | Path") -> Path:
    """The directory of a profile's CSVs: ``profile`` itself when it holds ``mlp.csv``, else the one
    ``<device>/<model>/`` folder under it that does (``infermax profile --out DIR`` writes that layout)."""
    path = Path(profile)
    if not path.is_dir() or (path / "mlp.csv").is_file():
        return path
    found = sorted(p.parent for p in path.glob("*/*/mlp.csv"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise MissingProfileError(f"profile {str(profile)!r} has no mlp.csv, neither in it nor in "
                                  f"<device>/<model>/ below it")
    raise ProfileFormatError(f"profile {str(profile)!r} holds several profiles; pick one: "
                             f"{', '.join(str(p) for p in found)}")


def profile_file(profile: "str | Path", names: tuple[str, ...]) -> Any:
    """The first of ``names`` in a profile directory (a path, or a packaged ``<gpu>/<model>``)."""
    path = profile_dir(profile)
    if path.is_file():
        return path
    folder: Any = path if path.is_dir() else _packaged_compute_dir(str(profile))
    for name in names:
        candidate = folder.joinpath(name)
        if candidate.is_file():
            return candidate
    raise MissingProfileError(f"profile {str(profile)!r} has none of {', '.join(names)}")


def network_file(node: "str | Path", collective: str) -> Any:
    """``all_reduce.csv`` / ``send_recv.csv`` for a node type (``a100`` → packaged ``a100_dgx``) or a path."""
    path = Path(node)
    if path.is_file():
        return path
    if path.is_dir():
        return path / f"{collective}.csv"
    name = str(node).lower()
    name = name if name.endswith("_dgx") else f"{get_gpu_spec(name).name}_dgx"
    candidate = data_root().joinpath("vidur", "network", name, f"{collective}.csv")
    if not candidate.is_file():
        raise MissingProfileError(f"no packaged network profile for {str(node)!r}")
    return candidate


# --- reading and validating -------------------------------------------------------

@dataclass(frozen=True)
class Table:
    """A CSV file as named string columns, with typed accessors that validate."""

    source: str
    columns: dict[str, list[str]]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def number(self, name: str, *, allow_empty: bool = False) -> np.ndarray:
        values = np.empty(len(self), dtype=np.float64)
        for i, raw in enumerate(self.columns[name]):
            if raw.strip() == "" and allow_empty:
                values[i] = np.nan
                continue
            try:
                values[i] = float(raw)
            except ValueError:
                raise ProfileFormatError(
                    f"{self.source}: column {name!r}, data row {i + 1}: not a number: {raw!r}") from None
            if not np.isfinite(values[i]) or values[i] < 0:
                raise ProfileFormatError(
                    f"{self.source}: column {name!r}, data row {i + 1}: must be finite and >= 0, got {raw!r}")
        return values

    def integer(self, name: str) -> np.ndarray:
        values = self.number(name)
        if np.any(values != np.round(values)):
            i = int(np.flatnonzero(values != np.round(values))[0])
            raise ProfileFormatError(f"{self.source}: column {name!r}, data row {i + 1}: not an integer")
        return values.astype(np.int64)

    def boolean(self, name: str) -> np.ndarray:
        out = np.empty(len(self), dtype=bool)
        for i, raw in enumerate(self.columns[name]):
            text = raw.strip().lower()
            if text not in ("true", "false", "1", "0"):
                raise ProfileFormatError(f"{self.source}: column {name!r}, data row {i + 1}: not a boolean: {raw!r}")
            out[i] = text in ("true", "1")
        return out

    def filter(self, mask: np.ndarray) -> "Table":
        idx = np.flatnonzero(mask)
        return Table(self.source, {k: [v[i] for i in idx] for k, v in self.columns.items()})


def read_table(source: Any, required: tuple[str, ...]) -> Table:
    """Read a CSV (path or Traversable) and check the ``required`` columns exist."""
    name = str(source)
    try:
        text = source.read_text() if hasattr(source, "read_text") else Path(source).read_text()
    except OSError as exc:
        raise ProfileFormatError(f"cannot read profile {name}: {exc}") from None
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) < 2:
        raise ProfileFormatError(f"{name}: needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in required if c not in header]
    if missing:
        raise ProfileFormatError(f"{name}: missing column(s) {', '.join(missing)}")
    for i, row in enumerate(rows[1:], start=1):
        if len(row) != len(header):
            raise ProfileFormatError(f"{name}: data row {i} has {len(row)} fields, the header has {len(header)}")
    return Table(name, {h: [row[j] for row in rows[1:]] for j, h in enumerate(header) if h})


def _select_tp(table: Table, column: str, tp: int) -> Table:
    degrees = table.integer(column)
    if not np.any(degrees == tp):
        present = sorted(set(degrees.tolist()))
        raise MissingProfileError(f"{table.source}: no rows with {column} == {tp}; present: {present}")
    return table.filter(degrees == tp)


def _average_duplicates(keys: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, ...]:
    """Unique rows of ``keys`` (first-seen order) with each value averaged over duplicates."""
    uniq, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse)
    order = np.argsort(first)
    averaged = [np.bincount(inverse, weights=v) / counts for v in values]
    return (uniq[order], *(a[order] for a in averaged), first[order])


# --- the three profile kinds ----------------------------------------------------------

@dataclass(frozen=True)
class MlpProfile:
    """Non-attention operators of one model on one GPU at one TP degree.

    ``num_tokens`` is sorted and unique; ``op_times_s[op]`` is seconds per layer
    (``emb`` and ``lm_head``: per model) at each token count (``lm_head``: at
    that many logits rows).
    """

    source: str
    tp: int
    num_tokens: np.ndarray
    op_times_s: dict[str, np.ndarray]

    def total_s(self, num_layers: int) -> np.ndarray:
        """Whole-model per-token non-attention time: embedding + num_layers x (every layer op); no LM head."""
        layer = sum(t for op, t in self.op_times_s.items() if op not in PER_MODEL_OPS)
        return self.op_times_s.get("emb", 0.0) + num_layers * layer

    def lm_head_s(self) -> np.ndarray | None:
        """LM head + sampling at ``num_tokens`` logits rows (s), or None when the profile has no ``lm_head``."""
        return self.op_times_s.get("lm_head")


@dataclass(frozen=True)
class AttentionProfile:
    """Attention of one model on one GPU at one TP degree, split by phase.

    Decode rows: ``decode_batch`` requests each with ``decode_kv`` cached tokens,
    one new token each. Prefill rows: one request with a chunk of
    ``prefill_chunk`` tokens after ``prefill_kv`` cached ones. Times are seconds
    per layer of every operator in the row (the kernel plus reshapes and KV-cache
    writes). ``*_group`` numbers the clumps of consecutive rows in the file (the
    unit to hold out together when testing a fit).
    """

    source: str
    tp: int
    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_time_s: np.ndarray
    decode_group: np.ndarray
    prefill_chunk: np.ndarray
    prefill_kv: np.ndarray
    prefill_time_s: np.ndarray
    prefill_group: np.ndarray


@dataclass(frozen=True)
class NetworkProfile:
    """One collective: seconds to move ``size_bytes`` among ``num_workers`` GPUs."""

    source: str
    collective: str
    size_bytes: np.ndarray
    num_workers: np.ndarray
    devices_per_node: np.ndarray
    time_s: np.ndarray

    def select(self, num_workers: int, devices_per_node: int) -> tuple[np.ndarray, np.ndarray]:
        mask = (self.num_workers == num_workers) & (self.devices_per_node == devices_per_node)
        return self.size_bytes[mask], self.time_s[mask]

    def configurations(self) -> list[tuple[int, int]]:
        """The (num_workers, devices_per_node) pairs measured."""
        pairs = set(zip(self.num_workers.tolist(), self.devices_per_node.tolist()))
        return sorted(pairs)


def _check_stat(stat: str) -> None:
    if stat not in STATS:
        raise ValueError(f"stat must be one of {', '.join(STATS)}, got {stat!r}")


def load_mlp_profile(profile: "str | Path", tp: int = 1, stat: str = "median") -> MlpProfile:
    """Read ``mlp.csv``: every ``time_stats.<op>.<stat>`` column vs ``num_tokens``.

    ``stat`` picks the summary of repeated runs: Vidur's fits use the median;
    ``"min"`` resists slow-downs from other load on a shared machine.
    """
    _check_stat(stat)
    table = read_table(profile_file(profile, ("mlp.csv",)), ("num_tokens", "num_tensor_parallel_workers"))
    ops = [c.split(".")[1] for c in table.columns if c.startswith("time_stats.") and c.endswith(f".{stat}")]
    if not ops:
        raise ProfileFormatError(f"{table.source}: no time_stats.<op>.{stat} columns")
    table = _select_tp(table, "num_tensor_parallel_workers", tp)
    tokens = table.integer("num_tokens")
    if np.any(tokens < 1):
        raise ProfileFormatError(f"{table.source}: num_tokens must be >= 1")
    times = [table.number(f"time_stats.{op}.{stat}", allow_empty=True) for op in ops]
    times = [np.nan_to_num(t) * MS for t in times]
    keys, *averaged, _ = _average_duplicates(tokens[:, None], *times)
    order = np.argsort(keys[:, 0])
    return MlpProfile(table.source, tp, keys[order, 0], {op: t[order] for op, t in zip(ops, averaged)})


def _clumps(phase: np.ndarray, outer: np.ndarray, inner: np.ndarray, inner_start: np.ndarray) -> np.ndarray:
    """Number the runs of consecutive rows that continue one sweep of the profiler.

    Within a sweep the inner key (batch size, or KV size) rises under a fixed
    outer key, or the outer key rises and the inner key restarts; anything else
    starts a new clump (the sample jumped to another stretch of the file).
    """
    same_outer = outer[1:] == outer[:-1]
    continues = np.where(same_outer, inner[1:] >= inner[:-1],
                         (outer[1:] > outer[:-1]) & (inner[1:] == inner_start[1:]))
    new = np.r_[True, ~continues | (phase[1:] != phase[:-1])]
    return np.cumsum(new) - 1


def load_attention_profile(profile: "str | Path", tp: int = 1, stat: str = "median") -> AttentionProfile:
    """Read ``attention.csv`` / ``attention_sample.csv`` and split decode and prefill rows."""
    _check_stat(stat)
    required = ("batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", "num_tensor_parallel_workers",
                f"time_stats.attn_prefill.{stat}", f"time_stats.attn_decode.{stat}")
    table = read_table(profile_file(profile, ("attention.csv", "attention_sample.csv")), required)
    table = _select_tp(table, "num_tensor_parallel_workers", tp)
    is_prefill = table.boolean("is_prefill")
    batch, chunk, kv = (table.integer(c) for c in ("batch_size", "prefill_chunk_size", "kv_cache_size"))
    side = sum((np.nan_to_num(table.number(f"time_stats.{op}.{stat}", allow_empty=True))
                for op in ATTENTION_SIDE_OPS if f"time_stats.{op}.{stat}" in table.columns), np.zeros(len(table)))
    kernel = np.where(is_prefill, table.number(f"time_stats.attn_prefill.{stat}", allow_empty=True),
                      table.number(f"time_stats.attn_decode.{stat}", allow_empty=True))
    if np.any(np.isnan(kernel)):
        i = int(np.flatnonzero(np.isnan(kernel))[0])
        raise ProfileFormatError(f"{table.source}: data row {i + 1}: empty attention time for its phase")
    bad = np.flatnonzero(np.where(is_prefill, chunk < 1, batch < 1))
    if bad.size:
        raise ProfileFormatError(f"{table.source}: data row {bad[0] + 1}: batch_size / prefill_chunk_size must be >= 1")
    total = (kernel + side) * MS
    group = _clumps(is_prefill, np.where(is_prefill, chunk, kv), np.where(is_prefill, kv, batch),
                    np.where(is_prefill, 0, 1))
    parts = {}
    for phase, (a, b) in (("decode", (batch, kv)), ("prefill", (chunk, kv))):
        mask = is_prefill == (phase == "prefill")
        keys, t, g, _ = _average_duplicates(np.c_[a[mask], b[mask]], total[mask], group[mask].astype(float))
        parts[phase] = (keys[:, 0], keys[:, 1], t, g.astype(np.int64))
    if parts["decode"][0].size == 0 and parts["prefill"][0].size == 0:
        raise ProfileFormatError(f"{table.source}: no attention rows")
    return AttentionProfile(table.source, tp, *parts["decode"], *parts["prefill"])


def load_network_profile(node: "str | Path", collective: str) -> NetworkProfile:
    """Read ``all_reduce.csv`` or ``send_recv.csv`` (time vs ``size`` bytes, ``num_workers``)."""
    if collective not in ("all_reduce", "send_recv"):
        raise ValueError(f"collective must be 'all_reduce' or 'send_recv', got {collective!r}")
    column = f"time_stats.{collective}.median"
    table = read_table(network_file(node, collective), (column, "size", "num_workers", "devices_per_node"))
    size, workers, per_node = (table.integer(c) for c in ("size", "num_workers", "devices_per_node"))
    keys, t, _ = _average_duplicates(np.c_[size, workers, per_node], table.number(column) * MS)
    return NetworkProfile(table.source, collective, keys[:, 0], keys[:, 1], keys[:, 2], t)
