"""Self-checking store arrays: a CRC-32C per chunk, every chunk file present, reads that
name the damaged file.

Each store array is written with zstd then zarr's ``crc32c`` codec, and with chunks that
hold only the fill value written too (:func:`array_options`), so a missing chunk file is
always damage. :func:`open_checked` opens one array, checking its metadata file, shape and
dtype against the store's attributes and that every chunk (shard) file exists: a ``stat``
per file, no data read. :class:`CheckedArray` wraps the array so a decode error (a CRC
mismatch, a garbled or truncated chunk) names the chunk file instead of raising from inside
zarr.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from engine.errors import DataFormatError

__all__ = ["INTEGRITY", "REPAIR", "CheckedArray", "array_options", "brief", "open_checked"]

# Every chunk carries a CRC-32C and every chunk file exists (see the module doc).
INTEGRITY = "crc32c-chunks"
REPAIR = "the store is damaged; re-run `irt-engine ingest` to rebuild it"


def array_options() -> dict:
    """``create_array`` keywords of every store array: zstd then a CRC-32C per chunk, and
    chunks holding only the fill value written too (so a missing file is always damage)."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return {"compressors": [ZstdCodec(level=0), Crc32cCodec()],
            "config": {"write_empty_chunks": True}}


class CheckedArray:
    """A read-only zarr array whose reads name the damaged chunk file on a decode error (a CRC
    mismatch, a garbled or truncated chunk) instead of raising from inside zarr."""

    def __init__(self, array: zarr.Array, path: Path):
        self.array, self.path = array, path if isinstance(path, str) and "://" in path else Path(path)
        self.shape, self.dtype, self.ndim = tuple(array.shape), array.dtype, array.ndim
        self.chunks = tuple(array.chunks)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        try:
            return self.array[key]
        except Exception as err:  # zarr, numcodecs and the codecs raise many types
            raise DataFormatError(f"{self._damaged(key)}: cannot decode it "
                                  f"({brief(err)}); {REPAIR}") from None

    def _damaged(self, key) -> Path:
        """The first chunk (shard) file under ``key`` that fails to decode on its own."""
        outer = tuple(self.array.shards or self.array.chunks)
        key = key if isinstance(key, tuple) else (key,)
        spans = []
        for d, n in enumerate(self.shape):
            part = key[d] if d < len(key) and isinstance(key[d], slice) else slice(None)
            start, stop, _ = part.indices(n)
            spans.append(range(start // outer[d], -(-stop // outer[d])))
        for coords in _product(spans):
            region = tuple(slice(c * o, min((c + 1) * o, n))
                           for c, o, n in zip(coords, outer, self.shape))
            try:
                self.array[region]
            except Exception:
                return self.path / self.array.metadata.encode_chunk_key(coords)
        return self.path


def brief(err: Exception) -> str:
    """One line naming an exception from inside zarr, at most ~120 characters."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"


def _product(spans):
    if not spans:
        yield ()
        return
    for head in spans[0]:
        for tail in _product(spans[1:]):
            yield (head, *tail)


def open_checked(path: Path, name: str, shape: tuple[int, ...], dtype: str,
                  integrity: bool) -> CheckedArray:
    """Open array ``name`` of the store at ``path``, checking its metadata file, shape, dtype
    and (stores with ``integrity``) that each chunk file exists."""
    from engine.data.remote import URL, is_file, list_files, zarr_store

    remote = isinstance(path, URL)
    meta_file = path / name / "zarr.json"
    if not is_file(meta_file):
        raise DataFormatError(f"{meta_file}: missing; {REPAIR}")
    try:
        array = zarr.open_array(zarr_store(path / name) if remote else path / name, mode="r",
                                zarr_format=3)
    except Exception as err:
        raise DataFormatError(f"{meta_file}: unreadable array metadata ({brief(err)}); "
                              f"{REPAIR}") from None
    if tuple(array.shape) != tuple(shape):
        raise DataFormatError(f"{meta_file}: shape {list(array.shape)}, but the store's "
                              f"attributes ({path / 'zarr.json'}) say {list(shape)}; {REPAIR}")
    if dtype != "str" and np.dtype(array.dtype) != np.dtype(dtype):
        raise DataFormatError(f"{meta_file}: dtype {array.dtype}, expected {dtype}; {REPAIR}")
    if integrity:
        outer = tuple(array.shards or array.chunks)
        grid = [range(-(-n // o)) for n, o in zip(array.shape, outer)]
        listed = set(list_files(path / name)) if remote else None  # one listing, no stat each
        for coords in _product(grid):
            key = array.metadata.encode_chunk_key(coords)
            chunk = path / name / key
            if not (key in listed if remote else chunk.is_file()):
                raise DataFormatError(f"{chunk}: chunk file missing; {REPAIR}")
    return CheckedArray(array, path / name)
