"""Streaming tiles of a dense store through Dask, read ahead on a background thread."""

from __future__ import annotations

import queue
import threading
import zlib
from typing import Hashable, Iterable, Iterator, TypeVar

import dask.array as da
import numpy as np

from engine.data.blocks import Block, aligned_tile, empty_tile, tile_block
from engine.errors import DataFormatError

__all__ = ["StreamingSource", "ReadGuard", "prefetch"]

T = TypeVar("T")


class ReadGuard:
    """Checks the blocks a streaming fit reads from a store, pass after pass.

    The first read of each block records its observed count and a CRC-32 of its bytes; once
    every block was read, the counts must add up to the store's ``num_observed`` (the ELBO
    scale), and every later read must give the same bytes. Each read also checks that the
    store's metadata file was not replaced. A store changed under a fit is an error, never
    a quietly different fit.
    """

    def __init__(self, store, num_keys: int):
        self.store, self.num_keys = store, num_keys
        self.seen: dict[Hashable, tuple[int, int]] = {}
        self.total, self.lock = 0, threading.Lock()

    def check(self, key: Hashable, values: np.ndarray) -> None:
        self.store.check_unchanged()
        count = int((values >= 0).sum())  # -1 and NaN are missing
        crc = zlib.crc32(np.ascontiguousarray(values).view(np.uint8))
        with self.lock:
            before = self.seen.get(key)
            if before is None:
                self.seen[key] = (count, crc)
                self.total += count
                if len(self.seen) == self.num_keys:
                    self.store.check_observed(self.total)
            elif before != (count, crc):
                raise DataFormatError(
                    f"{self.store.path}: the store changed while the fit was reading it (block "
                    f"{key} differs from its first read); do not rewrite a store during a fit, "
                    f"then run the fit again")


class StreamingSource:
    """Tiles of a dense ``(S, N)`` dask array, computed only when the fit asks for them.

    Tiles are aligned with the stored chunks (:func:`aligned_tile`) so each chunk is
    decoded once per pass. Nothing is cached: memory is a few tiles, whatever ``S x N``.

    Parameters
    ----------
    responses : dask array ``(S, N)`` (e.g. ``Store.responses``): int8 with -1 missing, or
        float32 with NaN missing (tiles keep that dtype).
    num_observed : observed cells in the whole matrix (the ELBO scale).
    max_block_cells : cells per tile at most.
    tile : an explicit tile shape (overrides the chunk-aligned default).
    store : the ``Store`` read, whose reads are then checked (:class:`ReadGuard`).
    """

    layout = "dense"
    resident = False

    def __init__(self, responses: da.Array, *, num_observed: int, max_block_cells: int = 1 << 22,
                 tile: tuple[int, int] | None = None, store=None):
        if responses.ndim != 2:
            raise ValueError(f"responses must be 2-D (subjects x items), got {responses.shape}")
        self.responses = responses
        self.dtype = np.dtype(np.float32 if responses.dtype.kind == "f" else np.int8)
        self.shape = tuple(int(n) for n in responses.shape)
        self.num_subjects, self.num_items = self.shape
        self.num_observed = int(num_observed)
        chunks = (responses.chunks[0][0], responses.chunks[1][0])
        self.tile = tuple(min(int(t), n) for t, n in zip(
            tile or aligned_tile(self.shape, chunks, max_block_cells), self.shape))
        self.guard = ReadGuard(store, len(self.keys())) if store is not None else None

    @classmethod
    def from_store(cls, store, max_block_cells: int = 1 << 22) -> "StreamingSource":
        """A streaming source over a dense ``Store``; its reads are checked (:class:`ReadGuard`)."""
        return cls(store.responses, num_observed=store.num_observed,
                   max_block_cells=max_block_cells, store=store)

    def keys(self) -> list[tuple[int, int]]:
        rows, cols = self.tile
        return [(r, c) for r in range(0, self.shape[0], rows) for c in range(0, self.shape[1], cols)]

    def block(self, origin: tuple[int, int]) -> Block:
        r, c = origin
        rows, cols = self.tile
        # The synchronous scheduler: this runs on the prefetch thread, beside the devices.
        part = self.responses[r : r + rows, c : c + cols].compute(scheduler="synchronous")
        part = np.asarray(part, self.dtype)
        if self.guard is not None:
            self.guard.check(origin, part)
        return tile_block(part, origin, self.tile)

    def empty_block(self) -> Block:
        return empty_tile(self.tile, self.dtype)


_DONE = object()


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` with up to ``depth`` of them produced ahead on a background thread.

    Exceptions raised while producing an item are re-raised here; closing the iterator
    early stops the thread.
    """
    if depth < 1:
        yield from items
        return
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_DONE, None))
        except BaseException as err:  # handed to the consumer
            put((_DONE, err))

    thread = threading.Thread(target=work, name="irt-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, err = slots.get()
            if item is _DONE:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        stop.set()
        thread.join()
