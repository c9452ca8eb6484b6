"""Block sources: fixed-shape blocks ``(subject_idx, item_idx, y)`` of the response data.

Every source yields blocks padded to one shape, so the fit step compiles once. A padded
cell holds the missing sentinel (``-1`` in int8 blocks, NaN in float32 ones) and contributes nothing. A source knows the
total observed cell count, so a step that sees part of the matrix scales correctly.

A dense block is a tile: ``y`` is ``(bs, bn)`` and cell ``(r, c)`` is subject
``subject_idx[r]``, item ``item_idx[c]``. A sparse block is an observation batch:
``subject_idx``, ``item_idx`` and ``y`` are all ``(b,)``. Sources: ``InMemorySource``
(a matrix in memory), ``StreamingSource`` (tiles of a dense store read through Dask,
prefetched; ``engine.data.streaming``) and ``SparseSource`` (COO observations, in memory
or streamed; ``engine.data.sparse``). The fit loop only sees the ``BlockSource`` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterator, NamedTuple, Protocol, Sequence

import numpy as np

__all__ = ["Block", "BlockSource", "InMemorySource", "block_shape", "aligned_tile", "tile_block",
           "empty_tile", "missing_of", "MISSING"]

MISSING = -1


class Block(NamedTuple):
    """One tile: ``y[i, j]`` is the response of subject ``subject_idx[i]`` to item ``item_idx[j]``."""

    subject_idx: np.ndarray  # int32 (bs,)
    item_idx: np.ndarray  # int32 (bn,)
    y: np.ndarray  # int8 (bs, bn) with -1 missing, or float32 with NaN missing


class BlockSource(Protocol):
    """What the fit loop needs from a source of blocks.

    ``layout`` is ``dense`` (tiles) or ``sparse`` (observation batches); ``resident``
    says the data is in memory, so the fit may keep every block on the devices;
    otherwise it reads blocks anew each pass, prefetching ahead of the computation.
    """

    layout: str
    resident: bool
    num_subjects: int
    num_items: int
    num_observed: int

    def keys(self) -> Sequence[Hashable]: ...

    def block(self, key: Hashable) -> Block: ...

    def empty_block(self) -> Block: ...


def block_shape(num_subjects: int, num_items: int, max_cells: int) -> tuple[int, int]:
    """Tile shape: all subjects in a tile when they fit, items filling the cell budget.

    The tiles split each axis evenly (1,000 x 10,000 under 4M cells: three tiles of 3,334
    items, not two of 4,194 and a third padded from 1,612), so no pass computes padding
    beyond a few rows or columns.
    """
    rows = min(num_subjects, max(1, max_cells // max(1, min(num_items, 256))))
    cols = min(num_items, max(1, max_cells // rows))
    rows = -(-num_subjects // -(-num_subjects // rows))
    cols = -(-num_items // -(-num_items // cols))
    return rows, cols


def aligned_tile(shape: tuple[int, int], chunks: tuple[int, int],
                 max_cells: int) -> tuple[int, int]:
    """Tile shape for streaming, aligned with the stored chunks.

    Whole chunks (as many as fit in ``max_cells``, along items first) when a chunk fits,
    else a whole number of chunk columns by as many rows as fit, so each stored chunk is
    decoded as few times per pass as possible.
    """
    rows, cols = (max(1, min(int(c), n)) for c, n in zip(chunks, shape))
    if rows * cols <= max_cells:
        cols = min(shape[1], cols * max(1, max_cells // (rows * cols)))
        rows = min(shape[0], rows * max(1, max_cells // (rows * cols)))
        return rows, cols
    if cols <= max_cells:
        return max(1, max_cells // cols), cols
    return 1, max_cells


def _pad(idx: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, np.int32)
    out[: idx.size] = idx
    return out


def missing_of(dtype) -> int | float:
    """The missing sentinel of a block dtype: NaN for floats, ``MISSING`` (-1) otherwise."""
    return np.nan if np.dtype(dtype).kind == "f" else MISSING


def tile_block(part: np.ndarray, origin: tuple[int, int], tile: tuple[int, int]) -> Block:
    """The tile at ``origin`` holding ``part`` (clipped at the matrix edge), padded to ``tile``
    with the missing value of ``part``'s dtype (int8 or float32)."""
    r, c = origin
    rows, cols = tile
    if part.shape == (rows, cols):  # a whole tile: no padding, no copy (consumers copy)
        y = part
    else:
        y = np.full((rows, cols), missing_of(part.dtype), part.dtype)
        y[: part.shape[0], : part.shape[1]] = part
    return Block(
        _pad(np.arange(r, r + part.shape[0], dtype=np.int32), rows),
        _pad(np.arange(c, c + part.shape[1], dtype=np.int32), cols),
        y,
    )


def empty_tile(tile: tuple[int, int], dtype=np.int8) -> Block:
    """A tile with every cell missing (pads a group of blocks to the device count)."""
    rows, cols = tile
    return Block(np.zeros(rows, np.int32), np.zeros(cols, np.int32),
                 np.full((rows, cols), missing_of(dtype), dtype))


@dataclass
class InMemorySource:
    """Tiles of a response matrix held in host memory (int8, ``-1`` missing).

    ``tile`` overrides the tile shape (default :func:`block_shape`). A block may be a view
    of ``responses``: the fit copies it to the devices.
    """

    responses: np.ndarray
    max_block_cells: int = 1 << 22
    tile: tuple[int, int] | None = None

    layout = "dense"
    resident = True
    dtype = np.int8  # the stored dtype (float32 in engine.data.kinds.FloatInMemorySource)

    def __post_init__(self):
        from engine.data.tally import count_observed

        y = np.asarray(self.responses)
        if y.ndim != 2:
            raise ValueError(f"responses must be 2-D (subjects x items), got shape {y.shape}")
        self.responses = y.astype(self.dtype, copy=False)
        self.shape = self.responses.shape
        tile = self.tile or block_shape(*self.shape, self.max_block_cells)
        self.tile = tuple(max(1, min(int(t), n)) for t, n in zip(tile, self.shape))
        self.num_observed = count_observed(self.responses)

    @property
    def num_subjects(self) -> int:
        return self.shape[0]

    @property
    def num_items(self) -> int:
        return self.shape[1]

    def tile_origins(self) -> list[tuple[int, int]]:
        rows, cols = self.tile
        return [(r, c) for r in range(0, self.shape[0], rows) for c in range(0, self.shape[1], cols)]

    def keys(self) -> list[tuple[int, int]]:
        return self.tile_origins()

    def block(self, origin: tuple[int, int]) -> Block:
        r, c = origin
        rows, cols = self.tile
        return tile_block(self.responses[r : r + rows, c : c + cols], origin, self.tile)

    def blocks(self) -> Iterator[Block]:
        for origin in self.tile_origins():
            yield self.block(origin)

    def empty_block(self) -> Block:
        return empty_tile(self.tile, self.dtype)
