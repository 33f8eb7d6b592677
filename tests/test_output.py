"""The front ends' leaf output module: one valid JSON document, an aligned table."""
from __future__ import annotations

import json

import numpy as np

from infermax.output import dumps_json, format_table


def test_dumps_json_nulls_what_json_cannot_hold_and_says_why():
    doc = json.loads(dumps_json({"a": float("nan"), "b": [1.0, float("inf")], "c": np.float64(2.5),
                                 "d": {"e": -float("inf")}}))
    assert doc["a"] is None and doc["b"] == [1.0, None] and doc["c"] == 2.5 and doc["d"] == {"e": None}
    assert set(doc["null_values"]) == {"a", "b[1]", "d.e"}
    assert doc["null_values"]["a"].startswith("NaN") and doc["null_values"]["b[1]"].startswith("inf")
    assert "null_values" not in json.loads(dumps_json({"a": 1}))
    assert json.loads(dumps_json([float("nan")])) == [None]     # not a dict: nothing to put the reasons in


def test_format_table_aligns_and_formats():
    lines = format_table([{"name": "vllm", "x": 0.123456, "y": float("nan")}, {"name": "sarathi", "x": 123456.7}],
                         ("name", "x", "y")).splitlines()
    assert lines == ["   name       x  y", "   vllm  0.1235  -", "sarathi  123457   "]
