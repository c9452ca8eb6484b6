"""Installed versions, read from the distributions' metadata: importing a package for its
``__version__`` costs its import (Dask's cost a small fit 0.14 s), which ``--version`` and a
run's record need not pay."""
from __future__ import annotations


def installed(name: str) -> str | None:
    """The installed version of distribution ``name``, or None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
