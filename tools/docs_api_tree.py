"""MkDocs hook: lay the installed package tree out for the API reference.

setup.cfg installs ``csp/`` as ``infermax.csp`` (and ``costmodel``, ``kernels``, ``schedulers``
the same way), so the source folders do not have the installed layout that griffe, mkdocstrings'
reader, expects. Before the pages are read this hook builds ``build/api-tree/infermax``: a copy of
``infermax/__init__.py`` (griffe looks for submodules beside the file it resolves), symbolic links to
the other entries of ``infermax/`` and one link per subpackage that setup.cfg's ``package_dir`` maps.
Nothing is imported and nothing is fetched.
"""
from __future__ import annotations

import configparser
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "api-tree"


def package_dirs(setup_cfg: Path) -> dict[str, Path]:
    """``package_dir`` of setup.cfg: installed name -> source folder."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    out = {}
    for line in cfg.get("options", "package_dir").strip().splitlines():
        name, _, folder = (part.strip() for part in line.partition("="))
        out[name] = ROOT / folder
    return out


def build_tree() -> Path:
    """``build/api-tree/infermax`` with the installed layout; returns ``build/api-tree``."""
    dirs = package_dirs(ROOT / "setup.cfg")
    top = TREE / "infermax"
    if TREE.exists():
        shutil.rmtree(TREE)
    top.mkdir(parents=True)
    mapped = {name.split(".", 1)[1]: path for name, path in dirs.items() if name.startswith("infermax.")}
    for entry in dirs["infermax"].iterdir():
        if entry.name == "__init__.py":        # a copy: griffe finds submodules beside the resolved __init__
            shutil.copyfile(entry, top / entry.name)
        elif entry.name not in mapped and entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for sub, path in mapped.items():
        (top / sub).symlink_to(path)
    return TREE


# Built when MkDocs loads this hook, during config validation: mkdocstrings resolves its ``paths`` (a
# glob: a folder that is not there yet is dropped silently, and griffe then reads the source
# ``infermax/`` without the mapped subpackages) before any ``on_config`` event runs.
build_tree()
