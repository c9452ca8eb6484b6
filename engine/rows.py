"""Identical rows of an array, found once for the whole engine (no JAX: the leaderboard
and the readers use it too)."""
from __future__ import annotations

import numpy as np


def identical_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(first (U,), inverse (rows,), counts (U,))`` for the distinct rows of the 2-D array
    ``a``: the index of each distinct row's first occurrence, every row's distinct-row index
    and how many rows each stands for. Rows are compared byte for byte, so NaN matches NaN
    and -0.0 does not match 0.0; the distinct rows come in the order of their bytes."""
    a = np.ascontiguousarray(a)
    if a.ndim != 2:
        raise ValueError(f"identical_rows needs a 2-D array, got shape {a.shape}")
    keys = a.view(np.dtype((np.void, a.shape[1] * a.itemsize))).reshape(-1) if a.shape[1] \
        else np.zeros(a.shape[0], np.int8)  # no columns: every row is the same
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True,
                                          return_counts=True)
    return first, np.asarray(inverse).reshape(-1), counts
