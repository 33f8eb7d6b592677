"""``unit``: every batch costs one round (1 s), whatever it holds — the unit-time rounds of the scheduling
theory papers (Jaillet et al. 2025, arXiv 2502.07115: one worker, one token per running request a round).

It is a :class:`~.linear.LinearCostModel` with one non-attention line of bias 1 s and slope 0 and every
other coefficient 0, so the MILP, the class-state search and the bounds read it like any linear model:
a schedule's mean end-to-end latency is the mean number of rounds from arrival to completion (with
arrivals in rounds, i.e. integer seconds). C and P of the Limits still cap a round's tokens; give them
large values for the papers' model, where a prompt is processed whole in the round it starts.
"""
from __future__ import annotations

from .linear import LinearCoefficients, LinearCostModel
from .registry import register_cost_model

UNIT_NAME = "unit"
#: seconds per batch: one round
ROUND_S = 1.0


def unit_cost_model() -> LinearCostModel:
    """The unit-time model: ``batch_time`` is :data:`ROUND_S` for every batch."""
    coefficients = LinearCoefficients(nonattn_lines=((ROUND_S, 0.0),), decode_bias_s=0.0, decode_kv_s=0.0,
                                      prefill_bias_s=0.0, prefill_attn_s=0.0)
    return LinearCostModel(coefficients, name=UNIT_NAME,
                           description="unit time: every batch costs one round (1 s), whatever it holds")


def register_unit() -> None:
    def factory(spec: str) -> LinearCostModel:
        if spec != UNIT_NAME:
            raise ValueError(f"cost model {spec!r}: 'unit' takes no options or parallel suffix")
        return unit_cost_model()

    register_cost_model(UNIT_NAME, factory)
