"""NumPy columns to and from Arrow arrays through their buffers, without pandas.

Arrow's own conversions (``pa.array`` on a NumPy array or on Python values, ``to_numpy``)
import pandas to ask whether a value is a pandas object: 0.15-0.3 s of a process that
never uses it (an ingest, a fit writing its run tables, a leaderboard reading one).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

__all__ = ["to_numbers", "arrow_table"]

_NUMERIC = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
            pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32,
            pa.uint64(): np.uint64, pa.float16(): np.float16, pa.float32(): np.float32,
            pa.float64(): np.float64}


def _bits(buf, offset: int, n: int) -> np.ndarray:
    """``n`` bits of an Arrow bitmap from bit ``offset``, as bool."""
    raw = np.frombuffer(buf, np.uint8, count=(offset + n + 7) // 8)
    return np.unpackbits(raw, bitorder="little", count=offset + n)[offset:].astype(bool)


def to_numbers(col: pa.Array | pa.ChunkedArray, dtype=np.float64) -> np.ndarray:
    """The values of an integer, floating or boolean Arrow column as ``dtype``, NaN where
    missing (a column with missing values needs a floating ``dtype``: ValueError otherwise).

    Read from the Arrow buffers: Arrow's own ``to_numpy`` imports pandas, 0.3 s of a small
    ingest that never uses it.
    """
    out = np.empty(len(col), dtype)
    at = 0
    for ch in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]):
        n = len(ch)
        if n == 0:
            continue
        buffers = ch.buffers()
        if pa.types.is_null(ch.type):
            values, valid = np.zeros(n, dtype), np.zeros(n, bool)
        else:
            if pa.types.is_boolean(ch.type):
                values = _bits(buffers[1], ch.offset, n)
            elif ch.type in _NUMERIC:
                values = np.frombuffer(buffers[1], _NUMERIC[ch.type],
                                       count=ch.offset + n)[ch.offset:]
            else:
                raise TypeError(f"to_numbers: an Arrow column of type {ch.type}")
            valid = _bits(buffers[0], ch.offset, n) if ch.null_count else None
        out[at:at + n] = values
        if valid is not None and not valid.all():
            if not np.issubdtype(out.dtype, np.floating):
                raise ValueError(f"to_numbers: missing values cannot be {np.dtype(dtype)}")
            out[at:at + n][~valid] = np.nan
        at += n
    return out


def arrow_table(columns: Mapping[str, np.ndarray]) -> pa.Table:
    """A pyarrow Table of 1-D NumPy columns, built from their buffers: ``pa.array`` on a
    NumPy array (or on Python values) imports pandas, 0.15-0.3 s of a fit process, to ask
    whether it is a pandas object. Numbers and booleans keep their dtype; anything else
    (strings, object arrays of str) becomes UTF-8 strings. No nulls: NaN stays a float."""
    arrays, length = [], None
    for name, values in columns.items():
        v = np.asarray(values)
        if v.ndim != 1 or (length is not None and len(v) != length):
            want = "one dimension" if length is None else f"({length},)"
            raise ValueError(f"column {name!r}: shape {v.shape}, expected {want}")
        length = len(v)
        arrays.append(_arrow_array(v))
    return pa.Table.from_arrays(arrays, names=list(columns))


def _arrow_array(v: np.ndarray) -> pa.Array:
    n = len(v)
    if v.dtype == np.bool_:
        bits = np.packbits(v, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bits)])
    if v.dtype.kind in "iuf":
        v = np.ascontiguousarray(v)
        return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), n, [None, pa.py_buffer(v)])
    encoded = [str(x).encode("utf-8") for x in v]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    data = np.frombuffer(b"".join(encoded), np.uint8)
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                      pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])
