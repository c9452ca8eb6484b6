"""Block sources: fixed-shape tiles ``(subject_idx, item_idx, y)`` of the response matrix.

Every source yields tiles padded to one shape, so the fit step compiles once. A padded
cell holds the missing sentinel ``-1`` and contributes nothing. A source knows the
total observed cell count, so a step that sees part of the matrix scales correctly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np

__all__ = ["Block", "InMemorySource", "block_shape", "MISSING"]

MISSING = -1


class Block(NamedTuple):
    """One tile: ``y[i, j]`` is the response of subject ``subject_idx[i]`` to item ``item_idx[j]``."""

    subject_idx: np.ndarray  # int32 (bs,)
    item_idx: np.ndarray  # int32 (bn,)
    y: np.ndarray  # int8 (bs, bn), -1 missing


def block_shape(num_subjects: int, num_items: int, max_cells: int) -> tuple[int, int]:
    """Tile shape: all subjects in a tile when they fit, items filling the cell budget."""
    rows = min(num_subjects, max(1, max_cells // max(1, min(num_items, 256))))
    cols = min(num_items, max(1, max_cells // rows))
    return rows, cols


def _pad(idx: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, np.int32)
    out[: idx.size] = idx
    return out


@dataclass
class InMemorySource:
    """Tiles of a response matrix held in host memory (int8, ``-1`` missing)."""

    responses: np.ndarray
    max_block_cells: int = 1 << 22

    def __post_init__(self):
        y = np.asarray(self.responses)
        if y.ndim != 2:
            raise ValueError(f"responses must be 2-D (subjects x items), got shape {y.shape}")
        self.responses = y.astype(np.int8, copy=False)
        self.shape = self.responses.shape
        self.tile = block_shape(*self.shape, self.max_block_cells)
        self.num_observed = int((self.responses >= 0).sum())

    @property
    def num_subjects(self) -> int:
        return self.shape[0]

    @property
    def num_items(self) -> int:
        return self.shape[1]

    def tile_origins(self) -> list[tuple[int, int]]:
        rows, cols = self.tile
        return [(r, c) for r in range(0, self.shape[0], rows) for c in range(0, self.shape[1], cols)]

    def block(self, origin: tuple[int, int]) -> Block:
        r, c = origin
        rows, cols = self.tile
        part = self.responses[r : r + rows, c : c + cols]
        y = np.full((rows, cols), MISSING, np.int8)
        y[: part.shape[0], : part.shape[1]] = part
        return Block(
            _pad(np.arange(r, r + part.shape[0], dtype=np.int32), rows),
            _pad(np.arange(c, c + part.shape[1], dtype=np.int32), cols),
            y,
        )

    def blocks(self) -> Iterator[Block]:
        for origin in self.tile_origins():
            yield self.block(origin)

    def empty_block(self) -> Block:
        rows, cols = self.tile
        return Block(np.zeros(rows, np.int32), np.zeros(cols, np.int32),
                     np.full((rows, cols), MISSING, np.int8))
