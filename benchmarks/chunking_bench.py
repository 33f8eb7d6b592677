"""One-shot vs chunked prefill under the cost models (issue 19 §1).

    python benchmarks/chunking_bench.py [--models default,roofline:a100/llama2-7b]

For each prompt length L and chunk size, the time of one batch that prefills
the whole prompt against the summed time of the batches that prefill it in
chunks (one request, nothing else in the batch), split into the attention part
and the rest (non-attention, per-request and per-batch terms). Causal attention
does c·m + c(c+1)/2 (query, key) pairs for a chunk of c tokens after m cached,
L(L+1)/2 in total however the prompt is cut, so a one-shot prefill should never
cost more than the chunked one. Nothing here asserts (tests hold the property).
"""
from __future__ import annotations

import argparse

import numpy as np

CASES = ((4096, 512), (16384, 512), (100_000, 4096))


def _nonattention_s(model, num_tokens: int, num_requests: int) -> float:
    """The batch time that is not attention: the model's non-attention lines plus its per-request term."""
    if hasattr(model, "coefficients"):
        k = model.coefficients
        return float(k.nonattention_s(num_tokens)) + getattr(k, "request_s", 0.0) * num_requests
    return float(model.terms.nonattention_s(num_tokens))


def prefill_times(model, length: int, chunk: int) -> dict[str, float]:
    """One-shot and chunked prefill of ``length`` tokens: total and attention seconds of each."""
    out = {"one_shot_s": 0.0, "one_shot_attn_s": 0.0, "chunked_s": 0.0, "chunked_attn_s": 0.0}
    for key, size in (("one_shot", length), ("chunked", chunk)):
        done = 0
        while done < length:
            c = min(size, length - done)
            t = model.batch_time(np.array([c]), np.array([done]), np.array([False]))
            out[f"{key}_s"] += t
            out[f"{key}_attn_s"] += t - _nonattention_s(model, c, 1)
            done += c
    return out


def main() -> None:
    from infermax.costmodel import get_cost_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,roofline:a100/llama2-7b")
    args = ap.parse_args()
    print(f"{'model':<26}{'L':>7}{'chunks':>10}{'one-shot s':>12}{'chunked s':>11}{'one/chunked':>12}"
          f"{'attn one/chunked':>18}")
    for name in args.models.split(","):
        model = get_cost_model(name)
        for length, chunk in CASES:
            r = prefill_times(model, length, chunk)
            n = -(-length // chunk)
            print(f"{name:<26}{length:>7}{f'{n}x{chunk}':>10}{r['one_shot_s']:>12.4f}{r['chunked_s']:>11.4f}"
                  f"{r['one_shot_s'] / r['chunked_s']:>12.4f}{r['one_shot_attn_s'] / r['chunked_attn_s']:>18.4f}")


if __name__ == "__main__":
    main()
