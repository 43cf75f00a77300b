"""Lazy public names for the apps' ``__init__`` modules.

An app package is imported while Django loads its apps, before models (and
DRF) may be: its public names are therefore looked up on first use, from
the module that defines them (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[name]`` and returns its ``name``."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's own name
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
