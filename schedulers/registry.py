"""Registered schedulers: a plain dict of name -> factory.

``register_scheduler("my-policy")`` decorates a Scheduler subclass or a factory
function; outside packages can also expose factories through the
``infermax.schedulers`` entry-point group. Names may carry options:
``get_scheduler("vllm:R_max=128")`` equals ``get_scheduler("vllm", R_max=128)``.
"""
from __future__ import annotations

import importlib
from importlib import metadata
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


def _parse_options(text: str, name: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"scheduler {name!r}: option {part!r} must look like KEY=VALUE")
        k, v = (s.strip() for s in part.split("=", 1))
        if v.lower() in ("none", "unlimited", "inf"):
            opts[k] = None
        elif v.lower() in ("true", "false"):
            opts[k] = v.lower() == "true"
        else:
            try:
                opts[k] = int(v)
            except ValueError:
                raise ValueError(f"scheduler {name!r}: option {k} must be an integer, got {v!r}") from None
    return opts


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


def get_scheduler(spec: "str | Scheduler", **options: Any) -> Scheduler:
    """A scheduler instance from a registered name (``"vllm"``, ``"sarathi-ef:R_max=64"``),
    an import path (``"my_pkg.mod:MyScheduler"``) or an instance (returned as is)."""
    if isinstance(spec, Scheduler):
        if options:
            raise ValueError("options cannot be applied to a Scheduler instance")
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"scheduler must be a name or a Scheduler, got {spec!r}")
    _load_entry_points()
    name, _, rest = spec.partition(":")
    if name in _REGISTRY:
        factory = _REGISTRY[name]
        options = {**_parse_options(rest, name), **options}
    elif rest.isidentifier():
        factory = load_scheduler_class(spec)
    else:
        raise ValueError(f"unknown scheduler {name!r}; available: {', '.join(available())}")
    try:
        sched = factory(**options)
    except TypeError as exc:
        raise ValueError(f"scheduler {spec!r}: bad options {options}: {exc}") from None
    if not isinstance(sched, Scheduler):
        raise ValueError(f"scheduler {spec!r} did not produce a Scheduler (got {type(sched).__name__})")
    return sched
