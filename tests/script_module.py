"""Load one of ``scripts/*.py`` as a module for a test (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str, *, register: bool = False):
    """``scripts/<name>.py`` executed as a fresh module named ``name``; ``register``: also put it in
    ``sys.modules`` first (a script whose dataclasses or pickles look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
