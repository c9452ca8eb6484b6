"""The on-disk response store: a zarr v3 group holding one dense response matrix.

Layout of a store directory ``out/`` (``layout`` "dense")::

    out/zarr.json        group metadata; attributes["irt_engine"] is the metadata below
    out/responses/       int8 array (S, N), -1 = missing, chunked + sharded (zstd)
    out/subjects/        string array (S,), subject ids in row order
    out/items/           string array (N,), item ids in column order

A very sparse matrix (density below ``SPARSE_DENSITY``) is stored as observations instead
(``layout`` "sparse"), sorted by (subject, item), with no dense matrix anywhere::

    out/subject_idx/     int32 (M,) row of each observation
    out/item_idx/        int32 (M,) column of each observation
    out/response/        int8 (M,) the observed responses

``attributes["irt_engine"]`` holds ``format_version`` (1), ``kind``, ``dtype``, ``missing``,
``layout``, ``num_subjects``, ``num_items``, ``num_observed``, ``source`` (input file
names), ``input_format``, ``checksum`` (see :func:`store_checksum` and
:func:`sparse_checksum`) and ``created`` (ISO 8601).
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

__all__ = ["FORMAT_VERSION", "KINDS", "LAYOUTS", "SPARSE_DENSITY", "ResponseKind", "Store",
           "open_store", "write_store", "store_checksum", "sparse_checksum", "check_writable",
           "resolve_layout"]

FORMAT_VERSION = 1
_ATTR = "irt_engine"
LAYOUTS = ("auto", "dense", "sparse")
# Below this share of observed cells a store holds (subject, item, response) observations:
# 9 bytes per observation against 1 byte per cell, so about where COO becomes smaller.
SPARSE_DENSITY = 0.1
COO_FIELDS = ("subject_idx", "item_idx", "response")
_COO_RECORD = np.dtype([("s", "<i4"), ("i", "<i4"), ("v", "i1")])


def resolve_layout(layout: str, num_observed: int, num_subjects: int, num_items: int) -> str:
    """``dense`` or ``sparse`` for a requested ``layout`` (``auto`` picks by density)."""
    if layout not in LAYOUTS:
        raise SettingsError(f"layout={layout!r}; use one of {', '.join(LAYOUTS)}")
    if layout != "auto":
        return layout
    density = num_observed / max(1, num_subjects * num_items)
    return "sparse" if density < SPARSE_DENSITY else "dense"


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
        if self.layout == "sparse":
            raise DataFormatError(f"{self.path}: a sparse store has no dense response array; "
                                  f"use Store.observations()")
        return zarr.open_array(self.path / "responses", mode="r", zarr_format=3)

    @property
    def layout(self) -> str:
        """``dense`` (an S x N matrix) or ``sparse`` (COO observations)."""
        return str(self.meta.get("layout", "dense"))

    @property
    def chunks(self) -> tuple[int, ...]:
        """Inner chunk shape: (rows, items) for dense stores, (observations,) for sparse ones."""
        name = "responses" if self.layout == "dense" else "response"
        return tuple(zarr.open_array(self.path / name, mode="r", zarr_format=3).chunks)

    @property
    def responses(self) -> da.Array:
        """Lazy ``Int8[Array, "s n"]`` dask array of responses; ``meta["missing"]`` = missing.

        For a sparse store this densifies on compute (one task): meant for small stores.
        """
        if self.layout == "sparse":
            import dask

            return da.from_delayed(dask.delayed(self.load)(), self.shape,
                                   dtype=np.dtype(KINDS[self.kind].dtype))
        return da.from_zarr(self._array)

    def observations(self) -> tuple[da.Array, da.Array, da.Array]:
        """Lazy COO arrays ``(subject_idx int32, item_idx int32, response int8)`` of a sparse
        store, sorted by (subject, item)."""
        if self.layout != "sparse":
            raise DataFormatError(f"{self.path}: a dense store has no observation arrays; use "
                                  f"Store.responses, or ingest with --layout sparse")
        return tuple(da.from_zarr(zarr.open_array(self.path / name, mode="r", zarr_format=3))
                     for name in COO_FIELDS)

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
        if self.layout == "sparse":
            s, i, v = (np.asarray(a) for a in self.observations())
            y = np.full(self.shape, KINDS[self.kind].missing, np.dtype(KINDS[self.kind].dtype))
            y[s, i] = v
            return y
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
        if store.layout == "sparse":
            got = sparse_checksum(*store.observations(), subjects, items, kind=store.kind,
                                  shape=store.shape)
        else:
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
    digest = checksum_header(kind, num_subjects, num_items)
    rows_per_block = max(1, min(rows_per_block, (1 << 26) // max(1, num_items)))
    for start in range(0, num_subjects, rows_per_block):
        block = np.asarray(responses[start:start + rows_per_block], dtype=dtype)
        digest.update(np.ascontiguousarray(block).tobytes())
    return hash_ids(digest, subjects, items)


def checksum_header(kind: str, num_subjects: int, num_items: int, layout: str = "dense"):
    """A SHA-256 object primed with the header of :func:`store_checksum` (or the sparse one)."""
    dtype = np.dtype(KINDS[kind].dtype)
    tail = "" if layout == "dense" else " sparse"
    return hashlib.sha256(f"irt-engine/{FORMAT_VERSION} {kind} {dtype.name} {num_subjects} "
                          f"{num_items}{tail}\n".encode())


def hash_ids(digest, subjects: Sequence[str], items: Sequence[str]) -> str:
    """Finish a checksum with the ids; return the hex digest."""
    for ids in (subjects, items):
        text = json.dumps([str(i) for i in ids], ensure_ascii=False, separators=(",", ":"))
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()


def coo_bytes(subject_idx: np.ndarray, item_idx: np.ndarray, response: np.ndarray) -> bytes:
    """Observations packed as 9-byte records (<i4 subject, <i4 item, i1 response)."""
    rec = np.empty(len(response), _COO_RECORD)
    rec["s"], rec["i"], rec["v"] = subject_idx, item_idx, response
    return rec.tobytes()


def sparse_checksum(subject_idx: Any, item_idx: Any, response: Any, subjects: Sequence[str],
                    items: Sequence[str], *, kind: str = "binary",
                    shape: tuple[int, int] | None = None, per_block: int = 1 << 22) -> str:
    """SHA-256 hex digest of a sparse store: header ``f"irt-engine/{FORMAT_VERSION} {kind}
    {dtype} {S} {N} sparse\\n"``, the observations in stored (subject, item) order as
    :func:`coo_bytes` records read ``per_block`` at a time, then the ids as in
    :func:`store_checksum`."""
    shape = shape or (len(subjects), len(items))
    digest = checksum_header(kind, *shape, layout="sparse")
    for start in range(0, len(response), per_block):
        part = [np.asarray(a[start:start + per_block]) for a in (subject_idx, item_idx, response)]
        digest.update(coo_bytes(*part))
    return hash_ids(digest, subjects, items)


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
                overwrite: bool = False, layout: str = "dense") -> Store:
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
    layout : {"dense", "sparse", "auto"}
        "sparse" stores the observed cells as (subject, item, response) observations;
        "auto" picks sparse below ``SPARSE_DENSITY``.

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
    num_observed = int((responses != spec.missing).sum())
    if resolve_layout(layout, num_observed, *responses.shape) == "sparse":
        from engine.data.writer import SparseWriter

        rows, cols = np.nonzero(responses != spec.missing)  # row-major: (subject, item) order
        with SparseWriter(out, subjects, items, kind=kind, source=source, overwrite=overwrite,
                          input_format=input_format, expected=len(rows)) as writer:
            writer.append(rows, cols, responses[rows, cols])
            return writer.commit()
    out = check_writable(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(6)}"
    try:
        _write_group(tmp, responses, subjects, items, spec, chunks, {
            "format_version": FORMAT_VERSION, "kind": kind, "dtype": spec.dtype,
            "missing": spec.missing, "layout": "dense", "num_subjects": len(subjects),
            "num_items": len(items), "num_observed": num_observed,
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
