"""The per-operator linear batch-time model (InferMax §3.2), in seconds.

For a batch of R requests with N = Σc tokens, decode KV read K = Σ_decode (m + c)
and causal prefill attention work W = Σ_prefill (c·m + c(c + 1)/2):

    t = max_k (a_k + b_k · N)                         non-attention  (nonattn_lines = ((a_k, b_k), ...))
      + request_s · R                                 per request (its logits row, its query row)
      + [any decode]  (decode_bias_s  + decode_kv_s    · K)            decode attention
      + [any prefill] (prefill_bias_s + prefill_attn_s · W
                                      + prefill_token_s · Σ_prefill c) prefill attention

``[any decode]`` is 1 when the batch holds a decode-phase request (a per-batch
indicator bias). W counts the (query, key) pairs causal attention computes: a
chunk of c new tokens after m cached ones attends each query to the m cached
keys and to the new keys up to itself, c·m + c(c + 1)/2 = c·(2m + c + 1)/2
(:func:`prefill_attention_work`). Over any chunking of a prompt of L tokens the
pairs add up to L(L + 1)/2, so a one-shot prefill never costs more attention
than the same prompt in chunks (chunks pay their per-batch biases on top), as
on a GPU, where FlashAttention skips the masked half and chunks re-read the
cached KV. The non-attention term is convex piecewise-linear in N (a max
of a few lines: small batches are bound by reading the weights, large ones by
FLOPs), which an LP/MILP encodes exactly with one epigraph variable t_na ≥
a_k + b_k·N per line. ``prefill_token_s`` is an optional extra feature (a
per-prefill-token attention cost); the default model leaves it 0 so that the
model depends only on (N, K, W) and the two indicators. ``request_s`` is the
other optional term: seconds per request in the batch (R = Σ over the batch's
requests of 1, the batch size, whatever each request's chunk c). Fitted to a
profile with an ``lm_head`` column (the CPU profiler's), it is the LM head +
sampling's slope per logits row (one per request) plus decode attention's
slope per request (its query row, mask row and output scatter); the constant
part of the LM head sits in the non-attention lines' biases. Fits to profiles
without an ``lm_head`` column (Vidur's GPU profiles) leave it 0.

The default coefficients are the fit to Vidur's A100 + Llama-2-7B
measurements (`infermax.costmodel.catalog`, ``data/fitted/a100_llama2-7b.json``;
a test re-fits them from the packaged profile).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .base import CostModel
from .jsonfile import load_json

_sum = np.add.reduce    # ndarray.sum's reduction without the method's per-call overhead

FORMULA = ("t = max_k(a_k + b_k*N) + [any decode](decode_bias_s + decode_kv_s*K) + "
           "[any prefill](prefill_bias_s + prefill_attn_s*W + prefill_token_s*P) + request_s*R; N = sum c, "
           "K = sum_decode (m+c), W = sum_prefill c*m + c*(c+1)/2 (causal), P = sum_prefill c, "
           "R = number of requests in the batch; (a_k, b_k) = nonattn_lines; seconds")
#: the formula of cost files written before W became causal (their prefill_attn_s prices c*(m+c))
SQUARE_W_FORMULA_PART = "W = sum_prefill c*(m+c)"


def prefill_attention_work(tokens: "np.ndarray | float", kv_before: "np.ndarray | float") -> np.ndarray:
    """Causal (query, key) pairs of prefill chunks: c·m + c(c + 1)/2 per chunk of c tokens after m cached.

    Elementwise over aligned arrays (floats; exact for counts below 2**53). Summed over any chunking of
    a prompt of L tokens it is L(L + 1)/2.
    """
    c = np.asarray(tokens, dtype=np.float64)
    return c * (2.0 * np.asarray(kv_before, dtype=np.float64) + c + 1.0) * 0.5


# A100-80G + Llama-2-7B, TP 1, fitted from the packaged Vidur profile (see catalog.py);
# tests/costmodel check these equal data/fitted/a100_llama2-7b.json and a fresh re-fit.
_DEFAULT = dict(
    nonattn_lines=((0.00815913397054937, 4.5066001464618484e-05), (0.0015818111517996265, 6.45465410475073e-05)),
    decode_bias_s=0.0008306901462512684, decode_kv_s=2.825203028720072e-07,
    prefill_bias_s=0.0007798290974683059, prefill_attn_s=7.120044787862065e-09, prefill_token_s=0.0,
)


_OPTIONAL = ("prefill_token_s", "request_s")


def _is_real(value: Any) -> bool:
    """A number: int or float (NumPy's too), not bool, not str."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class LinearCoefficients:
    """Coefficients of the linear model: biases in s, slopes in s per token (or per token²).

    ``nonattn_lines`` may be given as any sequence of (bias_s, per_token_s) pairs of numbers (lists
    from JSON, NumPy floats from a fit); ``__init__`` converts it to a tuple of float pairs before any
    field is set, so every field is assigned once, to its final value.
    """

    nonattn_lines: tuple[tuple[float, float], ...]
    decode_bias_s: float
    decode_kv_s: float
    prefill_bias_s: float
    prefill_attn_s: float
    prefill_token_s: float
    request_s: float

    # complexity: one check per coefficient, each naming the field and value, read top to bottom
    def __init__(self, *, nonattn_lines: Any = _DEFAULT["nonattn_lines"],
                 decode_bias_s: float = _DEFAULT["decode_bias_s"], decode_kv_s: float = _DEFAULT["decode_kv_s"],
                 prefill_bias_s: float = _DEFAULT["prefill_bias_s"],
                 prefill_attn_s: float = _DEFAULT["prefill_attn_s"], prefill_token_s: float = 0.0,
                 request_s: float = 0.0) -> None:
        lines = nonattn_lines
        if not isinstance(lines, (tuple, list)) or not lines:
            raise ValueError(f"LinearCoefficients.nonattn_lines must be a non-empty sequence of (bias_s, per_token_s), "
                             f"got {lines!r}")
        if not all(isinstance(line, (tuple, list)) and len(line) == 2 and all(map(_is_real, line)) for line in lines):
            raise ValueError(f"LinearCoefficients.nonattn_lines must hold (bias_s, per_token_s) pairs of numbers, "
                             f"got {lines!r}")
        normalised = tuple((float(a), float(b)) for a, b in lines)
        values = {"nonattn_lines": normalised, "decode_bias_s": decode_bias_s, "decode_kv_s": decode_kv_s,
                  "prefill_bias_s": prefill_bias_s, "prefill_attn_s": prefill_attn_s,
                  "prefill_token_s": prefill_token_s, "request_s": request_s}
        checked = [("nonattn_lines", v) for line in normalised for v in line]
        checked += [(name, value) for name, value in values.items() if name != "nonattn_lines"]
        for name, value in checked:
            if not _is_real(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"LinearCoefficients.{name} must be a finite number >= 0, got {value!r}")
        for name, value in values.items():
            object.__setattr__(self, name, value)     # what a frozen dataclass's generated __init__ does

    @classmethod
    def default(cls) -> "LinearCoefficients":
        """A100-80G + Llama-2-7B, fitted from Vidur's measurements (see module docstring)."""
        return cls()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LinearCoefficients":
        """Build from a dict (a cost JSON's ``coefficients``); the older (floor, bias, token) form maps
        to two lines. Every coefficient but the optional ``prefill_token_s`` and ``request_s`` (0 when
        absent: files written before those terms existed) must be given: a missing one is an error,
        never a silent default."""
        if not isinstance(data, dict):
            raise ValueError(f"LinearCoefficients must be an object of coefficients, got {data!r}")
        data = dict(data)
        legacy = ("nonattn_floor_s", "nonattn_bias_s", "nonattn_token_s")
        if any(k in data for k in legacy):
            missing = [k for k in legacy if k not in data]
            if missing:
                raise ValueError(f"LinearCoefficients.{missing[0]} is missing (the legacy form needs "
                                 f"{', '.join(legacy)})")
            floor, bias, tok = (data.pop(k) for k in legacy)
            data["nonattn_lines"] = ((floor, 0.0), (bias, tok))
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"LinearCoefficients: unknown field(s) {', '.join(sorted(unknown))}")
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in _OPTIONAL]
        if missing:
            raise ValueError(f"LinearCoefficients: missing coefficient(s) {', '.join(missing)}")
        return cls(**data)

    def zero_time_batch(self) -> str | None:
        """The kind of one-token batch ("decode" or "prefill") that would take 0 s, or None.

        Such a model makes time stand still (infinite throughput), so cost files must not give one.
        """
        floor = max(a + b for a, b in self.nonattn_lines) + self.request_s
        if floor + self.decode_bias_s + 2 * self.decode_kv_s == 0:
            return "decode"
        if floor + self.prefill_bias_s + self.prefill_attn_s + self.prefill_token_s == 0:
            return "prefill"
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nonattn_lines"] = [list(line) for line in self.nonattn_lines]
        return out

    # --- the three terms, vectorised (used by fitting, evaluation and bounds) ---------
    def nonattention_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        n = np.asarray(num_tokens, dtype=np.float64)
        return np.max([a + b * n for a, b in self.nonattn_lines], axis=0)

    def decode_s(self, kv_read: np.ndarray | float) -> np.ndarray:
        """Decode attention of a batch (> 0 decode requests) reading ``kv_read`` KV tokens."""
        return self.decode_bias_s + self.decode_kv_s * np.asarray(kv_read, dtype=np.float64)

    def prefill_s(self, work: np.ndarray | float, prefill_tokens: np.ndarray | float = 0.0) -> np.ndarray:
        """Prefill attention of a batch (> 0 prefill requests) with causal work W = ``work``
        (:func:`prefill_attention_work` summed over its prefill chunks)."""
        return (self.prefill_bias_s + self.prefill_attn_s * np.asarray(work, dtype=np.float64)
                + self.prefill_token_s * np.asarray(prefill_tokens, dtype=np.float64))


class LinearCostModel(CostModel):
    """Batch time from the per-operator linear model; see the module docstring."""

    #: batch_time is exactly the formula of ``coefficients`` (False for ring-SP parallel models)
    is_linear: bool = True

    def __init__(self, coefficients: LinearCoefficients | None = None, name: str = "linear",
                 description: str = "") -> None:
        self.coefficients = coefficients or LinearCoefficients.default()
        self.name = name
        self.description = description
        k = self.coefficients
        # unpacked once: batch_time runs once per simulated batch
        self._k = (k.nonattn_lines, k.decode_bias_s, k.decode_kv_s, k.prefill_bias_s, k.prefill_attn_s,
                   k.prefill_token_s, k.request_s)

    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        num_tokens = _sum(tokens)
        n = tokens.size
        num_decode = int(np.count_nonzero(is_decode))
        if num_decode == n and n:
            return self._time_of_work(n, num_tokens, n, _sum(kv_before + tokens), 0, 0)
        if num_decode == n - 1 and tokens.dtype.kind == kv_before.dtype.kind == "i":
            # one prefill chunk, alone or among decodes: the sums in Python ints, exact as NumPy's integer
            # sums are, with no array operation per term
            k = int(is_decode.argmin())
            c, m = int(tokens[k]), int(kv_before[k])
            return self._time_of_work(n, num_tokens, num_decode, int(num_tokens) + int(_sum(kv_before)) - c - m,
                                      c * (2 * m + c + 1), c)
        lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = self._k
        n_tok = float(num_tokens)
        t = max([a + b * n_tok for a, b in lines]) + req * float(n)
        if num_decode == n:     # (an empty batch)
            t += d_bias + d_kv * float(_sum(kv_before + tokens))
        elif num_decode:
            t += d_bias + d_kv * float(_sum((kv_before + tokens)[is_decode]))
        if num_decode < n:
            pf = ~is_decode
            c = tokens[pf]
            t += p_bias + p_attn * (0.5 * float(np.dot(c, 2 * kv_before[pf] + c + 1)))
            if p_tok:
                t += p_tok * float(_sum(c))
        return float(t)

    def work_timer(self) -> "Callable[[int, int, int, int, int, int], float] | None":
        """:meth:`batch_time` of any batch from its sums: ``timer(num_requests, num_tokens, num_decode,
        decode_kv, work2, prefill_tokens)``, ``decode_kv`` the decodes' Σ (m + c), ``work2`` the prefill chunks'
        Σ c (2 m + c + 1) (twice the causal work W) and ``prefill_tokens`` their Σ c, all Python ints (exact, as
        NumPy's integer sums and dot product are). The same float operations as ``batch_time``, so a scheduler
        that keeps a draft batch's sums prices a probe without building arrays; None when a subclass times
        batches otherwise. The state times each batch with it (a (re)fill chunk ``c`` after ``m`` cached: ``work2``
        = c (2 m + c + 1), ``prefill_tokens`` = c)."""
        return self._time_of_work if type(self).batch_time is LinearCostModel.batch_time else None

    def _time_of_work(self, num_requests: int, num_tokens: int, num_decode: int, decode_kv: int, work2: int,
                      prefill_tokens: int) -> float:
        lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = self._k
        n_tok = float(num_tokens)
        t = max([a + b * n_tok for a, b in lines]) + req * float(num_requests)
        if num_decode == num_requests or num_decode:
            t += d_bias + d_kv * float(decode_kv)
        if num_decode < num_requests:
            t += p_bias + p_attn * (0.5 * float(work2))
            if p_tok:
                t += p_tok * float(prefill_tokens)
        return float(t)

    def work_coefficients(self) -> "tuple | None":
        """The numbers :meth:`work_timer` prices a batch with, ``(lines, decode_bias_s, decode_kv_s,
        prefill_bias_s, prefill_attn_s, prefill_token_s, request_s)`` (``lines``: the (a, b) of each non-attention
        line), for a compiled twin of it (:mod:`infermax.compiled`); None when :meth:`work_timer` is, or when a
        subclass prices the sums otherwise."""
        own = type(self)._time_of_work is LinearCostModel._time_of_work
        return self._k if own and self.work_timer() is not None and self._k[0] else None

    def chunk_bound(self, sums: "tuple[int, int, int, int, int, int]", m: int, target_s: float) -> float | None:
        """The chunk ``c`` (a real number) at which the batch of ``sums`` (:meth:`work_timer`'s arguments) plus a
        prefill chunk of ``c`` tokens after ``m`` cached reaches ``target_s``, solved from the coefficients in
        real arithmetic: an estimate, where a search for the largest chunk within a target may probe first.
        None when the time is not non-decreasing in the chunk (a negative slope), where no search may
        assume it is."""
        lines, d_bias, d_kv, p_bias, p_attn, p_tok, req = self._k
        if p_attn < 0 or p_tok < 0 or any(b < 0 for _, b in lines):
            return None
        n, tokens, num_decode, decode_kv, work2, prefill = sums
        rest = req * (n + 1) + (d_bias + d_kv * decode_kv if num_decode else 0.0) + p_bias \
            + p_attn * 0.5 * work2 + p_tok * prefill - target_s
        qa, lin = 0.5 * p_attn, 0.5 * p_attn * (2 * m + 1) + p_tok
        best = math.inf
        for a, b in lines:      # every line within the target: the smallest root
            qb, qc = lin + b, rest + a + b * tokens
            if qa > 0:
                disc = qb * qb - 4 * qa * qc
                root = (-qb + math.sqrt(disc)) / (2 * qa) if disc >= 0 else -math.inf
            else:
                root = -qc / qb if qb > 0 else (math.inf if qc <= 0 else -math.inf)
            best = min(best, root)
        return best

    def decode_run_times(self, kv_before: np.ndarray, num_steps: int) -> np.ndarray:
        """Closed form of :meth:`batch_time` over a run of identical decode batches (the simulator's
        fast path): the same float operations in the same order, so bit-identical results."""
        if type(self).batch_time is not LinearCostModel.batch_time:
            return super().decode_run_times(kv_before, num_steps)
        lines, d_bias, d_kv, req = self._k[0], self._k[1], self._k[2], self._k[6]
        n = int(kv_before.size)
        base = max([a + b * float(n) for a, b in lines]) + req * float(n)
        first = int(_sum(kv_before)) + n                # Σ (kv_before + 1): KV read by the first step
        if num_steps <= 32:     # a short run: Python floats (the same IEEE operations) cost less than NumPy calls
            return np.array([base + (d_bias + d_kv * kv) for kv in range(first, first + n * num_steps, n)])
        kv_sum = np.arange(first, first + n * num_steps, n, dtype=np.int64)
        return base + (d_bias + d_kv * kv_sum.astype(np.float64))

    def decode_run_starts(self, kv_before: np.ndarray, num_steps: int, start_s: float,
                          stop_s: float | None) -> tuple[list[float], list[float]]:
        """:meth:`CostModel.decode_run_starts`: the same floats, computed only for the batches that run (the
        simulator's fast path usually stops at the next arrival)."""
        timer = self.decode_run_timer()
        if timer is None:       # not the closed form
            return super().decode_run_starts(kv_before, num_steps, start_s, stop_s)
        return timer(int(kv_before.size), int(_sum(kv_before)), num_steps, start_s, stop_s)

    def decode_run_timer(self) -> "Callable[[int, int, int, float, float | None], tuple[list, list]] | None":
        """:meth:`decode_run_starts` of ``n`` requests holding ``kv_sum`` tokens in all, from those two sums
        (the state keeps them across a run): ``timer(n, kv_sum, num_steps, start_s, stop_s)``, the same
        floats; None when a subclass times batches otherwise."""
        cls = type(self)
        if cls.batch_time is LinearCostModel.batch_time and cls.decode_run_times is LinearCostModel.decode_run_times:
            return self._run_starts_of_sums
        return None

    def _run_starts_of_sums(self, n: int, kv_sum: int, num_steps: int, start_s: float, stop_s: float | None
                            ) -> tuple[list[float], list[float]]:
        lines, d_bias, d_kv, req = self._k[0], self._k[1], self._k[2], self._k[6]
        base = max([a + b * float(n) for a, b in lines]) + req * float(n)
        kv = kv_sum + n                                 # KV read by the first batch, as decode_run_times
        stop = math.inf if stop_s is None else stop_s
        durations, starts, t = [], [start_s], start_s
        for _ in range(num_steps):
            if t >= stop:
                break
            d = base + (d_bias + d_kv * kv)             # decode_run_times' expression
            t += d
            durations.append(d)
            starts.append(t)
            kv += n
        return durations, starts

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": "linear", "formula": FORMULA, "coefficients": self.coefficients.to_dict()}
        if self.description:
            out["description"] = self.description
        return out

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.describe(), indent=2)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "LinearCostModel":
        """Read ``{"kind": "linear", "coefficients": {...}, "name"?, "description"?}`` from text or a file.

        Refused, naming the file and the field: a missing or non-object ``coefficients``, a missing,
        non-numeric or negative coefficient, and a model under which some batch takes 0 s.
        """
        data, path = load_json(text_or_path, "cost model")
        try:
            return cls._from_data(data)
        except ValueError as exc:
            raise ValueError(f"cost model file {path!r}: {exc}" if path else str(exc)) from None

    @classmethod
    def _from_data(cls, data: Any) -> "LinearCostModel":
        if not isinstance(data, dict):
            raise ValueError(f"a cost model JSON must be an object with kind and coefficients, got {data!r:.60}")
        if data.get("kind") != "linear":
            raise ValueError(f"cost model JSON kind must be 'linear', got {data.get('kind')!r}")
        if "coefficients" not in data:
            raise ValueError("cost model JSON has no coefficients (an object of the linear model's coefficients)")
        for key in ("name", "description", "formula"):
            if key in data and not isinstance(data[key], str):
                raise ValueError(f"cost model JSON {key} must be a string, got {data[key]!r}")
        if SQUARE_W_FORMULA_PART in data.get("formula", ""):
            raise ValueError("cost model JSON formula prices prefill attention as W = sum c*(m+c) (written before "
                             "W became causal, c*m + c*(c+1)/2); its prefill_attn_s means something else now: "
                             "refit it (infermax costmodel fit)")
        k = LinearCoefficients.from_dict(data["coefficients"])
        zero = k.zero_time_batch()
        if zero is not None:
            raise ValueError(f"cost model coefficients give a one-token {zero} batch 0 s (every coefficient it "
                             f"uses is 0); time would stand still")
        return cls(k, name=data.get("name", "linear"), description=data.get("description", ""))


def linear_coefficients(cost: CostModel, needed_by: str) -> LinearCoefficients:
    """The coefficients whose formula ``cost.batch_time`` follows: the one "is this cost model linear?" check.

    A cost model is linear when it is a :class:`LinearCostModel` that declares ``is_linear`` (ring
    sequence parallelism does not: its attention is not the formula of its coefficients). The MILP,
    the class-state search and the bounds all read the model through this; ``needed_by`` names the
    reader in the ValueError raised for any other model.
    """
    if not isinstance(cost, LinearCostModel) or not cost.is_linear:
        raise ValueError(f"{needed_by} needs a linear cost model (infermax.costmodel.LinearCostModel, batch time "
                         f"exactly the formula of its coefficients); got {type(cost).__name__} "
                         f"{getattr(cost, 'name', cost)!r}")
    return cost.coefficients
