"""Counts over a response matrix held in memory, in row bands across threads.

A fit of a matrix in memory counts its observed cells and each row's and column's observed
responses and their sums before it starts. Done as whole-matrix numpy expressions, a
1,000,000,000-cell int8 matrix took 23 s on 2 cores (a float64 copy of 8 GB, and ``sum`` of a
bool array, which widens every cell to int64). Here each band of rows is reduced with
``np.count_nonzero`` and int64 / float64 accumulators, never a full-size temporary, and the
bands run on a thread pool (numpy releases the interpreter lock in these loops).

Missing is ``-1`` in int8 matrices and NaN in float32 ones (:mod:`engine.data.blocks`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from engine.memory import usable_cores

__all__ = ["Tally", "count_observed", "map_row_bands", "observed", "tally"]

_BAND_CELLS = 1 << 24  # cells per band: temporaries of a few tens of MB per thread
_SERIAL_CELLS = 1 << 22  # below this, one band in the calling thread


class Tally(NamedTuple):
    """Observed counts and sums of observed values per row and per column."""

    row_n: np.ndarray  # int64 (S,)
    row_sum: np.ndarray  # int64 (int8 data) or float64 (S,)
    col_n: np.ndarray  # int64 (N,)
    col_sum: np.ndarray  # int64 or float64 (N,)


def observed(values: np.ndarray) -> np.ndarray:
    """Observed cells: not -1 (int8) and not NaN (float32)."""
    return ~np.isnan(values) if values.dtype.kind == "f" else values >= 0


def _bands(y: np.ndarray) -> list[slice]:
    rows = max(1, _BAND_CELLS // max(1, y.shape[1]))
    return [slice(r, min(r + rows, y.shape[0])) for r in range(0, y.shape[0], rows)]


def map_row_bands(fn, y: np.ndarray) -> list:
    """``[fn(band) for band in row bands of y]``, the bands on a thread pool when ``y`` is large."""
    bands = _bands(y)
    if y.size <= _SERIAL_CELLS or len(bands) == 1:
        return [fn(y[b]) for b in bands]
    workers = min(len(bands), usable_cores())
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="irt-engine-tally") as pool:
        return list(pool.map(lambda b: fn(y[b]), bands))


def count_observed(y: np.ndarray) -> int:
    """The number of observed cells of a 2-D response matrix."""
    y = np.asarray(y)
    if y.ndim != 2:
        return int(np.count_nonzero(observed(y)))
    return int(sum(map_row_bands(lambda band: np.count_nonzero(observed(band)), y)))


def _band_tally(band: np.ndarray) -> Tally:
    obs = observed(band)
    floating = band.dtype.kind == "f"
    values = np.where(obs, band, 0)
    acc = np.float64 if floating else np.int64
    return Tally(np.count_nonzero(obs, axis=1).astype(np.int64), values.sum(axis=1, dtype=acc),
                 np.count_nonzero(obs, axis=0).astype(np.int64), values.sum(axis=0, dtype=acc))


def tally(y: np.ndarray) -> Tally:
    """Per-row and per-column observed counts and sums of a 2-D response matrix, in one
    threaded pass (sums exact in int64 for int8 data, float64 otherwise)."""
    y = np.asarray(y)
    if y.ndim != 2:
        raise ValueError(f"tally needs a 2-D (subjects x items) matrix, got shape {y.shape}")
    parts = map_row_bands(_band_tally, y) or [_band_tally(y)]  # no rows: one empty band
    return Tally(np.concatenate([p.row_n for p in parts]),
                 np.concatenate([p.row_sum for p in parts]),
                 np.sum([p.col_n for p in parts], axis=0),
                 np.sum([p.col_sum for p in parts], axis=0))
