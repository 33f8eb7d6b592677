"""Registered schedulers: a plain dict of name -> factory.

``register_scheduler("my-policy")`` decorates a Scheduler subclass or a factory
function; outside packages can also expose factories through the
``infermax.schedulers`` entry-point group. Names may carry options:
``get_scheduler("vllm:R_max=128")`` equals ``get_scheduler("vllm", R_max=128)``.

Option values are typed by the factory's signature (its annotation, else its
default): ``R_max=true`` and ``R_max=1.5`` are refused for an ``int`` option,
``none`` is accepted only where None is; an unknown or repeated key is refused,
naming it and listing the accepted ones. An unknown name suggests the closest.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import math
import typing
from typing import Any, Callable

from .base import Scheduler

_REGISTRY: dict[str, Callable[..., Scheduler]] = {}
_DOCS: dict[str, str] = {}
_entry_points_loaded = False


def register_scheduler(name: str, doc: str = "") -> Callable:
    """Decorator: register a Scheduler subclass or factory under ``name``."""

    def deco(factory: Callable[..., Scheduler]) -> Callable[..., Scheduler]:
        _REGISTRY[name] = factory
        _DOCS[name] = doc or (factory.__doc__ or "").strip().split("\n")[0]
        return factory

    return deco


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib import metadata  # (here: scanning the installed packages is for names not built in)
    for ep in metadata.entry_points(group="infermax.schedulers"):
        if ep.name not in _REGISTRY:
            _REGISTRY[ep.name] = ep.load()
            _DOCS[ep.name] = f"(entry point {ep.value})"


def available() -> list[str]:
    """Names of every registered scheduler."""
    _load_entry_points()
    return sorted(_REGISTRY)


def describe_all() -> dict[str, str]:
    _load_entry_points()
    return {k: _DOCS[k] for k in sorted(_REGISTRY)}


def accepted_options(factory: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """The keyword options ``factory`` takes, by name (None when it hides them behind ``**options``
    and names no return class to look through). Names starting with ``_`` are private."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    out: dict[str, inspect.Parameter] = {}
    for p in params:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            try:
                target = typing.get_type_hints(factory).get("return")
            except Exception:  # noqa: BLE001 - an unresolvable annotation: nothing to look through
                target = None
            inner = accepted_options(target) if inspect.isclass(target) else None
            if inner is None:
                return None
            out.update({k: v for k, v in inner.items() if k not in out})
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) \
                and not p.name.startswith("_") and p.name != "self":
            out[p.name] = p
    return out


def _option_types(param: inspect.Parameter | None) -> set[str]:
    """{"int", "float", "bool", "str", "None"} words of the annotation (or of the default's type)."""
    if param is None:
        return {"int", "bool", "None"}               # unknown factory: the historical parsing
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        default = param.default
        return {"None" if default is None else type(default).__name__} if default is not inspect.Parameter.empty \
            else {"int", "bool", "None"}
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
    words = {w.strip() for w in text.replace("Optional[", "").replace("]", "").replace("|", ",").split(",")}
    return {w for w in words if w in ("int", "float", "bool", "str", "None")} or {"str"}


_NOUNS = {"int": "an integer", "float": "a finite number", "bool": "true or false", "None": "none"}


def _convert(raw: str, types: set[str], where: str) -> Any:
    """``raw`` as the first of ``types`` it parses as (none/unlimited/inf → None where allowed)."""
    low = raw.lower()
    if low in ("none", "unlimited", "inf") and "None" in types:
        return None
    if "bool" in types and low in ("true", "false", "1", "0"):
        return low in ("true", "1")
    if "int" in types:
        try:
            return int(raw)
        except ValueError:
            pass
    if "float" in types:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    if "str" in types:
        return raw
    wanted = " or ".join(_NOUNS[k] for k in _NOUNS if k in types)
    raise ValueError(f"{where} must be {wanted}, got {raw!r}")


def _parse_options(text: str, name: str, accepted: dict[str, inspect.Parameter] | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"scheduler {name!r}: option {part!r} must look like KEY=VALUE")
        k, v = (s.strip() for s in part.split("=", 1))
        if k in opts:
            raise ValueError(f"scheduler {name!r}: option {k} is given twice")
        _check_known(k, name, accepted)
        opts[k] = _convert(v, _option_types(accepted.get(k) if accepted else None),
                           f"scheduler {name!r}: option {k}")
    return opts


def _check_known(key: str, name: str, accepted: dict[str, inspect.Parameter] | None) -> None:
    if accepted is None or key in accepted:
        return
    close = difflib.get_close_matches(key, list(accepted), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    listing = ", ".join(sorted(accepted)) or "no options"
    raise ValueError(f"scheduler {name!r}: unknown option {key!r}{hint}; {name} accepts {listing}")


def load_scheduler_class(path: str) -> Callable[..., Scheduler]:
    """Import ``package.module:ClassName`` (outside code implementing Scheduler)."""
    import os
    import sys

    module_name, _, attr = path.partition(":")
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            if os.getcwd() in sys.path:
                raise
            sys.path.insert(0, os.getcwd())   # the console script does not see the working directory
            module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import scheduler {path!r}: {exc}") from None


def split_specs(text: str) -> list[str]:
    """Split a comma-separated list of scheduler specs, keeping each one's options with it.

    ``"vllm:R_max=4,P=256,sarathi"`` -> ``["vllm:R_max=4,P=256", "sarathi"]``: a ``KEY=VALUE`` item
    belongs to the spec before it (a scheduler name never holds ``=``).
    """
    specs: list[str] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        if "=" in part and ":" not in part.split("=", 1)[0] and specs and ":" in specs[-1]:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def get_scheduler(spec: "str | Scheduler", **options: Any) -> Scheduler:
    """A scheduler instance from a registered name (``"vllm"``, ``"sarathi-ef:R_max=64"``),
    an import path (``"my_pkg.mod:MyScheduler"``) or an instance (returned as is)."""
    if isinstance(spec, Scheduler):
        if options:
            raise ValueError("options cannot be applied to a Scheduler instance")
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"scheduler must be a name or a Scheduler, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in _REGISTRY:       # (an entry point never replaces a registered name: looked for only when needed)
        _load_entry_points()
    if name in _REGISTRY:
        factory = _REGISTRY[name]
        accepted = accepted_options(factory)
        for key in options:
            _check_known(key, name, accepted)
        options = {**_parse_options(rest, name, accepted), **options}
    elif rest.isidentifier():
        factory = load_scheduler_class(spec)
    else:
        close = difflib.get_close_matches(name, available(), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown scheduler {name!r}{hint}; available: {', '.join(available())}")
    try:
        sched = factory(**options)
    except TypeError as exc:
        raise ValueError(f"scheduler {spec!r}: bad options {options}: {exc}") from None
    except ValueError as exc:   # the scheduler's own check of a value (R_max=0, ...)
        raise ValueError(f"scheduler {spec!r}: {exc}") from None
    if not isinstance(sched, Scheduler):
        raise ValueError(f"scheduler {spec!r} did not produce a Scheduler (got {type(sched).__name__})")
    return sched
