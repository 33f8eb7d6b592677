"""What the front ends print, as text (the printing itself is theirs): an aligned table
(:func:`format_table`) and one valid JSON document (:func:`dumps_json`). A leaf: it imports nothing of
the package, so every command-line module
(``infermax.cli``, ``bounds/cli.py``, ``csp/cli.py``, the sweeps, ...) imports it without loading another."""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

__all__ = ["dumps_json", "format_table"]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def format_table(rows: list[dict[str, Any]], keys: Sequence[str]) -> str:
    """A plain aligned table, a header line then a line a row (the CLI's only output format besides JSON)."""
    cells = [[_fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max([len(k), *(len(c[i]) for c in cells)]) for i, k in enumerate(keys)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(line, widths)) for line in [list(keys), *cells])


def dumps_json(obj: Any) -> str:
    """One valid JSON document: a NaN or infinite number becomes ``null``, and a top-level
    ``null_values`` object maps each such field (a dotted path) to what it was and why."""
    nulls: dict[str, str] = {}

    def clean(value: Any, path: str) -> Any:
        if hasattr(value, "item") and type(value).__module__ == "numpy":
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            nulls[path] = ("NaN: undefined for this run (e.g. a mean over no values)" if math.isnan(value)
                           else f"{value}: no finite value")
            return None
        if isinstance(value, Mapping):
            return {str(k): clean(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(obj, "")
    if nulls and isinstance(out, dict):
        out["null_values"] = nulls
    return json.dumps(out, allow_nan=False, default=str)
