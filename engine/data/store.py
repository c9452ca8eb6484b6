"""The on-disk response store: a zarr v3 group holding one dense response matrix.

Layout of a store directory ``out/``::

    out/zarr.json        group metadata; attributes["irt_engine"] is the metadata below
    out/responses/       int8 array (S, N), -1 = missing, chunked + sharded (zstd)
    out/subjects/        string array (S,), subject ids in row order
    out/items/           string array (N,), item ids in column order

``attributes["irt_engine"]`` holds ``format_version`` (1), ``kind``, ``dtype``, ``missing``,
``layout`` ("dense"), ``num_subjects``, ``num_items``, ``num_observed``, ``source`` (input file
names), ``input_format``, ``checksum`` (see :func:`store_checksum`) and ``created`` (ISO 8601).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import secrets
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import zarr

from engine.errors import DataFormatError, SettingsError, StoreExistsError, StoreNotFoundError

__all__ = ["FORMAT_VERSION", "KINDS", "ResponseKind", "Store", "open_store", "write_store",
           "store_checksum", "check_writable"]

FORMAT_VERSION = 1
_ATTR = "irt_engine"


@dataclass(frozen=True)
class ResponseKind:
    """How one kind of response is stored: dtype, missing sentinel and allowed values."""

    name: str
    dtype: str
    missing: int | str  # a sentinel value, or "nan" for float kinds
    support: str  # human-readable, used in error messages


# Future kinds: "unit" -> ResponseKind("unit", "float32", "nan", "a number in [0, 1]"),
# "nonnegative" -> ResponseKind("nonnegative", "float32", "nan", "a number >= 0").
KINDS: dict[str, ResponseKind] = {
    "binary": ResponseKind("binary", "int8", -1, "0 or 1 (also 0.0/1.0, true/false)"),
}


@dataclass(frozen=True, eq=False)
class Store:
    """An opened response store (read-only view).

    Attributes
    ----------
    path : Path
        The store directory.
    subjects, items : np.ndarray
        Subject ids (S,) and item ids (N,) as numpy string arrays.
    kind : str
        Response kind, a key of ``KINDS`` (only "binary" for now).
    meta : dict
        The ``irt_engine`` group attributes.
    """

    path: Path
    subjects: np.ndarray = field(repr=False)
    items: np.ndarray = field(repr=False)
    kind: str
    meta: dict[str, Any] = field(repr=False)

    @cached_property
    def _array(self) -> zarr.Array:
        return zarr.open_array(self.path / "responses", mode="r", zarr_format=3)

    @property
    def responses(self) -> da.Array:
        """Lazy ``Int8[Array, "s n"]`` dask array of responses; ``meta["missing"]`` = missing."""
        return da.from_zarr(self._array)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_subjects, self.num_items)

    @property
    def num_subjects(self) -> int:
        return int(self.meta["num_subjects"])

    @property
    def num_items(self) -> int:
        return int(self.meta["num_items"])

    @property
    def num_observed(self) -> int:
        return int(self.meta["num_observed"])

    @property
    def density(self) -> float:
        """Fraction of observed cells."""
        return self.num_observed / max(1, self.num_subjects * self.num_items)

    def load(self) -> np.ndarray:
        """Read the whole response matrix into memory as ``Int8[ndarray, "s n"]``."""
        return np.asarray(self._array[...])


def open_store(path: str | Path, *, verify: bool = False) -> Store:
    """Open a response store written by ``ingest`` or ``write_store``.

    Parameters
    ----------
    path : str or Path
        The store directory.
    verify : bool
        Recompute the checksum and compare it with the stored one.

    Raises
    ------
    StoreNotFoundError
        If ``path`` does not exist or is not an irt-engine store.
    DataFormatError
        If the store is from a newer format version or fails verification.
    """
    path = Path(path)
    hint = "run `irt-engine ingest INPUT --out STORE` to create one"
    if not path.exists():
        raise StoreNotFoundError(f"{path}: no such response store; {hint}")
    try:
        group = zarr.open_group(path, mode="r", zarr_format=3)
        meta = dict(group.attrs[_ATTR])
        subjects, items = group["subjects"][...], group["items"][...]
    except Exception as err:  # zarr raises several types for "not a group"
        raise StoreNotFoundError(f"{path}: not an irt-engine response store ({err}); "
                                 f"{hint}") from err
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise DataFormatError(f"{path}: store format_version {meta['format_version']} is "
                              f"newer than this irt-engine supports ({FORMAT_VERSION}); "
                              f"upgrade irt-engine")
    store = Store(path=path, subjects=subjects, items=items, kind=meta["kind"], meta=meta)
    if verify:
        got = store_checksum(store._array, subjects, items, kind=store.kind)
        if got != meta["checksum"]:
            raise DataFormatError(f"{path}: checksum mismatch (stored {meta['checksum']}, "
                                  f"computed {got}); the store is corrupt, re-run ingest")
    return store


def store_checksum(responses: Any, subjects: Sequence[str], items: Sequence[str], *,
                   kind: str = "binary", rows_per_block: int = 4096) -> str:
    """SHA-256 hex digest of the response matrix and ids, independent of chunking.

    The digest covers, in order: the header ``f"irt-engine/{FORMAT_VERSION} {kind} {dtype}
    {S} {N}\\n"``; the response bytes in row-major (C) order in the stored dtype, read in
    row blocks so the matrix never has to fit in memory; then ``json.dumps(ids,
    ensure_ascii=False, separators=(",", ":"))`` + ``"\\n"`` in UTF-8, for subjects then items.

    Parameters
    ----------
    responses : array-like
        ``(S, N)`` numpy, zarr or dask array.
    subjects, items : sequence of str
        Row and column ids.
    kind : str
        Response kind (part of the header).
    rows_per_block : int
        Rows hashed per read.
    """
    num_subjects, num_items = responses.shape
    dtype = np.dtype(KINDS[kind].dtype)
    digest = hashlib.sha256(
        f"irt-engine/{FORMAT_VERSION} {kind} {dtype.name} {num_subjects} {num_items}\n".encode())
    for start in range(0, num_subjects, rows_per_block):
        block = np.asarray(responses[start:start + rows_per_block], dtype=dtype)
        digest.update(np.ascontiguousarray(block).tobytes())
    for ids in (subjects, items):
        text = json.dumps([str(i) for i in ids], ensure_ascii=False, separators=(",", ":"))
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()


def _is_store(path: Path) -> bool:
    try:
        meta = json.loads((path / "zarr.json").read_text())
        return _ATTR in meta.get("attributes", {})
    except (OSError, ValueError):
        return False


def check_writable(out: str | Path, overwrite: bool) -> Path:
    """Raise ``StoreExistsError`` unless ``out`` may be (over)written; return it as a Path."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise StoreExistsError(f"{out}: already exists; pass overwrite=True (--overwrite) "
                                   f"to replace it or choose another output path")
        if not (_is_store(out) or (out.is_dir() and not any(out.iterdir()))):
            raise StoreExistsError(f"{out}: exists and is not an irt-engine store; refusing to "
                                   f"overwrite it, choose another output path")
    return out


def _chunking(shape: tuple[int, int], chunks: Sequence[int]) -> tuple[tuple, tuple]:
    rows, cols = (max(1, min(int(c), max(1, n))) for c, n in zip(chunks, shape))
    per_shard = max(1, min(8, -(-shape[1] // cols)))
    return (rows, cols), (rows, cols * per_shard)


def write_store(responses: np.ndarray, subjects: Sequence[str], items: Sequence[str],
                out: str | Path, *, kind: str = "binary", source: Sequence[str] = (),
                input_format: str | None = None, chunks: Sequence[int] = (1024, 8192),
                overwrite: bool = False) -> Store:
    """Write an in-memory response matrix as a store, atomically.

    The store is written to ``.{name}.tmp-<random>`` next to ``out`` and renamed into
    place; on any error the temporary directory is removed and ``out`` is untouched.

    Parameters
    ----------
    responses : np.ndarray
        ``Int8[ndarray, "s n"]`` with values in {0, 1} and -1 for missing (binary kind).
    subjects, items : sequence of str
        Row ids (S,) and column ids (N,); each must be unique.
    out : str or Path
        Store directory to create.
    kind : str
        Response kind; only "binary" is supported by this version.
    source, input_format : optional
        Provenance recorded in the metadata.
    chunks : (int, int)
        Chunk shape (clipped to the matrix); shards hold up to 8 chunks along items.
    overwrite : bool
        Replace an existing store at ``out``.

    Returns
    -------
    Store

    Raises
    ------
    DataFormatError
        Bad kind, shape, dtype, values or ids.
    SettingsError
        ``chunks`` is not two positive integers.
    StoreExistsError
        ``out`` exists and ``overwrite`` is False (or it is not a store).
    """
    if kind not in KINDS:
        raise DataFormatError(f"kind {kind!r} is not supported by this version; "
                              f"supported kinds: {sorted(KINDS)}")
    if len(chunks) != 2 or min(int(c) for c in chunks) < 1:
        raise SettingsError(f"chunks must be two positive integers (rows, items), got {chunks}")
    spec = KINDS[kind]
    responses = np.asarray(responses)
    subjects, items = [str(s) for s in subjects], [str(i) for i in items]
    if responses.ndim != 2 or responses.shape != (len(subjects), len(items)):
        raise DataFormatError(f"responses shape {responses.shape} does not match "
                              f"{len(subjects)} subjects x {len(items)} items")
    if responses.dtype != np.dtype(spec.dtype):
        raise DataFormatError(f"responses dtype {responses.dtype}; expected {spec.dtype}")
    if kind == "binary" and not np.isin(responses, (-1, 0, 1)).all():
        raise DataFormatError("binary responses must be 0, 1 or -1 (missing)")
    for what, ids in (("subject", subjects), ("item", items)):
        if len(set(ids)) != len(ids):
            dup = next(i for i, c in Counter(ids).items() if c > 1)
            raise DataFormatError(f"duplicate {what} id {dup!r}; ids must be unique")
    out = check_writable(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(6)}"
    try:
        _write_group(tmp, responses, subjects, items, spec, chunks, {
            "format_version": FORMAT_VERSION, "kind": kind, "dtype": spec.dtype,
            "missing": spec.missing, "layout": "dense", "num_subjects": len(subjects),
            "num_items": len(items), "num_observed": int((responses != spec.missing).sum()),
            "source": [str(s) for s in source], "input_format": input_format,
            "checksum": store_checksum(responses, subjects, items, kind=kind),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        })
        _move_into_place(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_store(out)


def _write_group(tmp: Path, responses: np.ndarray, subjects: list[str], items: list[str],
                 spec: ResponseKind, chunks: Sequence[int], meta: dict) -> None:
    group = zarr.open_group(tmp, mode="w-", zarr_format=3)
    inner, shards = _chunking(responses.shape, chunks)
    array = group.create_array("responses", shape=responses.shape, dtype=spec.dtype,
                               chunks=inner, shards=shards, fill_value=spec.missing)
    array[...] = responses
    for name, ids in (("subjects", subjects), ("items", items)):
        ids_array = group.create_array(name, shape=(len(ids),), dtype=str,
                                       chunks=(max(1, len(ids)),))
        ids_array[...] = np.array(ids, dtype=object)
    group.attrs[_ATTR] = meta


def _move_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)  # fails if a concurrent writer created out meanwhile
        return
    check_writable(out, overwrite)
    old = out.parent / f".{out.name}.old-{secrets.token_hex(6)}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()
