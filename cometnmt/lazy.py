"""Package exports imported on first use (PEP 562), so importing a package stays light."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, namespace: dict, exports: dict[str, str]) -> tuple[Callable, Callable]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` (its ``globals()`` as
    ``namespace``) that import each name of ``exports`` (name -> module) on first use and keep it."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value  # later look-ups skip this function
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(list(namespace) + list(exports))

    return __getattr__, __dir__
