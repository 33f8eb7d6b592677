"""Reading a JSON file strictly: one loader for every JSON input (schedules, workloads, cost models).

It lives in the cost model package because that package is the base layer (it imports nothing of
the core, and the core imports it). Every failure is a ValueError naming the file and what is
wrong with it: no such file, a directory, not UTF-8, empty, a CSV trace, a duplicate key, or the
line and column of a syntax error. A UTF-8 byte-order mark is accepted.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json keeps the last one silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        out[key] = value
    return out


def is_json_text(source: Any) -> bool:
    """True when ``source`` is a str holding JSON text (an object or array), not a path."""
    return isinstance(source, str) and source.lstrip("\ufeff \t\r\n").startswith(("{", "["))


def _looks_like_csv(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return "," in first and not first.lstrip().startswith(("{", "[", '"'))


def load_json(source: "str | Path", what: str) -> tuple[Any, str | None]:
    """Parse ``source`` — JSON text, or the path of a JSON file — into Python values.

    Returns ``(data, path)``; ``path`` is None when ``source`` was text. Duplicate
    keys in an object are refused; a UTF-8 byte-order mark is accepted. Every
    failure is a ValueError saying ``"<what> file '<path>'"`` and what is wrong:
    no such file, a directory, not UTF-8, a CSV trace, or the line and column of
    a JSON syntax error.
    """
    path: str | None = None
    if isinstance(source, Path) or not is_json_text(source):
        path = str(source)
        label = f"{what} file {path!r}"
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise ValueError(f"{label} does not exist (no such file)") from None
        except IsADirectoryError:
            raise ValueError(f"{label} is a directory, not a {what} JSON file") from None
        except OSError as exc:
            if Path(path).is_dir():
                raise ValueError(f"{label} is a directory, not a {what} JSON file") from None
            raise ValueError(f"{label}: cannot read it ({exc.strerror or exc})") from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValueError(f"{label} is not a text file (not UTF-8; a binary file?), so not a {what} JSON") from None
    else:
        label, text = f"{what} JSON", source.lstrip("\ufeff")
    if not text.strip():
        raise ValueError(f"{label} is empty, so not a {what} JSON")
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys), path
    except json.JSONDecodeError as exc:
        if _looks_like_csv(text):
            raise ValueError(f"{label} is not a {what} JSON (it looks like a CSV trace)") from None
        raise ValueError(f"{label}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise ValueError(f"{label}: JSON nested too deeply") from None
    except ValueError as exc:   # a duplicate key
        raise ValueError(f"{label}: {exc}") from None
