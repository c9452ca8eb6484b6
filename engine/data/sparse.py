"""Sparse block source: batches of (subject, item, response) observations, padded."""

from __future__ import annotations

import numpy as np

from engine.data.blocks import Block, missing_of
from engine.errors import DataFormatError

__all__ = ["SparseSource"]


class SparseSource:
    """Observation batches of fixed size; no dense matrix anywhere.

    Parameters
    ----------
    subject_idx, item_idx, response : equal-length 1-D arrays (numpy, or dask/zarr for
        data larger than memory: then batches are read as the fit asks for them); responses
        int8 (-1 missing) or float (NaN missing; batches are then float32).
    num_subjects, num_items : the matrix shape.
    batch_size : observations per block (the last batch is padded with missing).
    """

    layout = "sparse"

    def __init__(self, subject_idx, item_idx, response, num_subjects: int, num_items: int, *,
                 batch_size: int = 1 << 20, store=None):
        if not (len(subject_idx) == len(item_idx) == len(response)):
            raise ValueError("subject_idx, item_idx and response must have equal lengths")
        self.arrays = (subject_idx, item_idx, response)
        dtype = np.dtype(getattr(response, "dtype", None) or np.asarray(response).dtype)
        self.dtype = np.dtype(np.float32 if dtype.kind == "f" else np.int8)
        self.resident = all(isinstance(a, np.ndarray) for a in self.arrays)
        self.num_subjects, self.num_items = int(num_subjects), int(num_items)
        self.length = len(response)
        self.batch_size = max(1, min(int(batch_size), self.length))
        if self.resident:
            self.arrays = (np.asarray(subject_idx, np.int32), np.asarray(item_idx, np.int32),
                           np.asarray(response, self.dtype))
            self.num_observed = int((self.arrays[2] >= 0).sum())
        else:
            self.num_observed = self.length  # stored observations are all observed
        self.guard = None
        if store is not None:
            if self.resident:
                store.check_observed(self.num_observed)
            else:
                from engine.data.streaming import ReadGuard

                self.guard = ReadGuard(store, len(self.keys()))

    @classmethod
    def from_store(cls, store, batch_size: int = 1 << 20, *, in_memory: bool = True) -> "SparseSource":
        """A source over a sparse ``Store``: loaded into memory, or streamed batch by batch
        (batches then hold whole stored chunks)."""
        arrays = store.observations()
        if in_memory:
            arrays = tuple(np.asarray(a) for a in arrays)
        else:
            chunk = arrays[2].chunks[0][0]
            batch_size = max(chunk, batch_size // chunk * chunk)
        return cls(*arrays, store.num_subjects, store.num_items, batch_size=batch_size,
                   store=store)

    @classmethod
    def from_dense(cls, responses: np.ndarray, batch_size: int = 1 << 20) -> "SparseSource":
        """The observed cells of a dense matrix as a sparse source (row-major order)."""
        rows, cols = np.nonzero(np.asarray(responses) >= 0)  # NaN and -1 are missing
        return cls(rows, cols, np.asarray(responses)[rows, cols], *np.shape(responses),
                   batch_size=batch_size)

    def keys(self) -> list[int]:
        return list(range(0, self.length, self.batch_size))

    def block(self, start: int) -> Block:
        parts = [a[start:start + self.batch_size] for a in self.arrays]
        if not self.resident:
            import dask

            parts = dask.compute(*parts, scheduler="synchronous")
        s, i, v = (np.asarray(p) for p in parts)
        if self.guard is not None:
            self.guard.check(start, v)
            if len(s) and (s.min() < 0 or s.max() >= self.num_subjects or i.min() < 0
                           or i.max() >= self.num_items):
                raise DataFormatError(f"{self.guard.store.path}: an observation index is out of "
                                      f"range in the batch at {start}; the store is damaged, "
                                      f"re-run `irt-engine ingest`")
        out = self.empty_block()
        out.subject_idx[: len(s)], out.item_idx[: len(i)], out.y[: len(v)] = s, i, v
        return out

    def empty_block(self) -> Block:
        b = self.batch_size
        return Block(np.zeros(b, np.int32), np.zeros(b, np.int32),
                     np.full(b, missing_of(self.dtype), self.dtype))
