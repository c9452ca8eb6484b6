"""Trial data larger than a memory budget: the store by reference, read a few items at a time.

Below the budget a trial context carries the whole response matrix (shipped once through
Ray's object store). Above it, the context carries a :class:`StoreColumns` instead: the
store's location (a local path on a shared filesystem, or an ``s3://`` / ``gs://`` URL),
shape and checksum. Each trial task then reads only the item columns it samples, straight
from the store (zarr reads just the chunks holding them), so neither the driver nor the
object store nor any worker holds the whole matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from engine.errors import DataFormatError

__all__ = ["StoreColumns", "columns", "trial_responses"]


@dataclass(frozen=True)
class StoreColumns:
    """A dense store's ``(subjects, items)`` responses, by reference."""

    location: str
    shape: tuple[int, int]
    checksum: str
    dtype: str = "int8"

    @property
    def ndim(self) -> int:
        return 2

    def columns(self, cols) -> np.ndarray:
        """Responses of items ``cols`` (any order, repeats allowed) as ``(S, len(cols))``."""
        cols = np.asarray(cols, dtype=np.int64)
        unique, inverse = np.unique(cols, return_inverse=True)
        array = _responses(self.location, self.checksum)
        block = np.asarray(array[:, unique]) if unique.size else \
            np.empty((self.shape[0], 0), np.dtype(self.dtype))
        return block[:, inverse.reshape(-1)]


@lru_cache(maxsize=4)
def _responses(location: str, checksum: str):
    """The checked response array of the store at ``location`` (one open per process)."""
    from engine.data.store import open_store

    store = open_store(location)
    if store.meta.get("checksum") != checksum:
        raise DataFormatError(f"{location}: the store changed since the analysis started "
                              f"(checksum {store.meta.get('checksum')}, expected {checksum}); "
                              f"do not rewrite a store during a run, then run it again")
    return store.arrays["responses"]


def columns(y, cols) -> np.ndarray:
    """``y[:, cols]`` of an in-memory matrix or a :class:`StoreColumns`."""
    return y.columns(cols) if isinstance(y, StoreColumns) else y[:, cols]


def trial_responses(data, memory_budget: int | None = None):
    """The responses a trial context carries, and their provenance.

    Returns ``(y, info)``: ``y`` is the matrix in memory, or a :class:`StoreColumns` when
    ``data`` is a dense store (path, URL or ``Store``) larger than ``memory_budget`` (default:
    the fit's default budget) held ``IN_MEMORY_FACTOR`` times.
    """
    from engine.api import IN_MEMORY_FACTOR, default_memory_budget, load_responses
    from engine.data.store import KINDS, Store, open_store

    if isinstance(data, (str, Path)):
        data = open_store(data)
    budget = memory_budget or default_memory_budget()
    if isinstance(data, Store) and data.layout == "dense" and \
            data.nbytes * IN_MEMORY_FACTOR > budget:
        info = {"store": str(data.path), "checksum": data.meta.get("checksum"),
                "kind": data.kind, "trial_data": "read from the store per trial"}
        return StoreColumns(str(data.path), data.shape, data.meta["checksum"],
                            KINDS[data.kind].dtype), info
    y, _, _, info = load_responses(data)
    return y, info
