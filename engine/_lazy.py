"""Package attributes imported on first use (PEP 562): a command pays only for what it uses."""

from __future__ import annotations

from importlib import import_module
from typing import Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: name -> attribute of module ``homes[name]``,
    imported on first access and then cached in the package's ``namespace``."""

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(homes[name]), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
