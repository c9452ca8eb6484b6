"""The on-disk response store: a zarr v3 group holding one dense response matrix.

Layout of a store directory ``out/`` (``layout`` "dense")::

    out/zarr.json        group metadata; attributes["irt_engine"] is the metadata below
    out/responses/       (S, N) array, chunked + sharded (zstd): int8 with -1 missing for
                         binary stores, float32 with NaN missing for unit / nonnegative ones
    out/subjects/        string array (S,), subject ids in row order
    out/items/           string array (N,), item ids in column order

A very sparse matrix (density below ``SPARSE_DENSITY``) is stored as observations instead
(``layout`` "sparse"), sorted by (subject, item), with no dense matrix anywhere::

    out/subject_idx/     int32 (M,) row of each observation
    out/item_idx/        int32 (M,) column of each observation
    out/response/        int8 or float32 (M,) the observed responses

The response kind (:data:`KINDS`) is ``binary`` (0/1), ``unit`` (scores in [0, 1]) or
``nonnegative`` (errors >= 0). ``attributes["irt_engine"]`` holds ``format_version`` (1 for
binary stores, 2 for float ones, so older readers refuse those), ``kind``, ``dtype``, ``missing``,
``layout``, ``num_subjects``, ``num_items``, ``num_observed``, ``source`` (input file
names), ``input_format``, ``checksum`` (see :func:`store_checksum` and
:func:`sparse_checksum`), ``created`` (ISO 8601), ``integrity`` and, for float kinds, ``boundary`` (counts
of observed values exactly 0 and exactly 1, and the first such cell).

Integrity (``integrity`` "crc32c-chunks", :mod:`engine.data.integrity`): every array chunk
ends with a CRC-32C of its encoded bytes (zarr's ``crc32c`` codec) and every chunk file is
written, even one holding only missing cells. :func:`open_store` checks the attributes, every array's shape and dtype
against them and that every chunk file is present (a ``stat`` per shard file, no data
read); each read checks the CRCs of the chunks it decodes and names a damaged file. Stores
written before this marker have no chunk CRCs: opening one recomputes the whole checksum.
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

import numpy as np
import zarr

from engine.data.integrity import (INTEGRITY, REPAIR as _REPAIR, CheckedArray, array_options,
                                   brief as _brief, open_checked as _open_checked)
from engine.data.remote import (STORE_HINT, URL, as_location, filesystem, is_file, list_files,
                                 no_store, zarr_store)
from engine.data.tally import count_observed, observed
from engine.errors import DataFormatError, SettingsError, StoreExistsError, StoreNotFoundError
from engine.memory import ID_BYTES, default_memory_budget

__all__ = ["FORMAT_VERSION", "INTEGRITY", "KINDS", "LAYOUTS", "SPARSE_DENSITY", "ResponseKind", "Store",
           "CheckedArray", "array_options",
           "open_store", "write_store", "store_checksum", "sparse_checksum", "check_writable",
           "resolve_layout", "format_version", "observed", "check_values", "Boundary"]

# The newest store format this version reads: 1 (binary int8) and 2 (float32 kinds).
FORMAT_VERSION = 2
_ATTR = "irt_engine"
LAYOUTS = ("auto", "dense", "sparse")
# Below this share of observed cells a store holds (subject, item, response) observations:
# 9 bytes per observation against 1 byte per cell, so about where COO becomes smaller.
SPARSE_DENSITY = 0.1
COO_FIELDS = ("subject_idx", "item_idx", "response")
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
    version: int = 1  # store format version of this kind

    @property
    def fill(self) -> int | float:
        """The missing value as a number of ``dtype`` (NaN for float kinds)."""
        return np.nan if self.missing == "nan" else self.missing

    @property
    def is_float(self) -> bool:
        return np.dtype(self.dtype).kind == "f"


KINDS: dict[str, ResponseKind] = {
    "binary": ResponseKind("binary", "int8", -1, "0 or 1 (also 0.0/1.0, true/false)"),
    "unit": ResponseKind("unit", "float32", "nan", "a score in [0, 1]", version=2),
    "nonnegative": ResponseKind("nonnegative", "float32", "nan", "an error >= 0", version=2),
}


def format_version(kind: str) -> int:
    """The store format version written for ``kind`` (binary stores stay at 1)."""
    return KINDS[kind].version


def check_values(values: np.ndarray, kind: str) -> str | None:
    """What is wrong with the observed ``values`` stored as ``kind`` (None when all is well)."""
    obs = values[observed(values)]
    if kind == "binary":
        return None if np.isin(obs, (0, 1)).all() else "binary responses must be 0, 1 or -1 (missing)"
    if not np.isfinite(obs).all():
        return f"{kind} responses must be finite (NaN = missing)"
    if (obs < 0).any() or (kind == "unit" and (obs > 1).any()):
        return f"{kind} responses must each be {KINDS[kind].support} (NaN = missing)"
    return None


@dataclass
class Boundary:
    """Running count of observed values exactly 0 and exactly 1, with the first cell of each."""

    zeros: int = 0
    ones: int = 0
    first_zero: list[int] | None = None
    first_one: list[int] | None = None

    def add(self, subject_idx: np.ndarray, item_idx: np.ndarray, values: np.ndarray) -> None:
        """Count observations given in (subject, item) order."""
        for point, name in ((0, "zero"), (1, "one")):
            hit = np.flatnonzero(values == point)
            if hit.size:
                setattr(self, name + "s", getattr(self, name + "s") + int(hit.size))
                first = [int(subject_idx[hit[0]]), int(item_idx[hit[0]])]
                old = getattr(self, "first_" + name)
                if old is None or first < old:
                    setattr(self, "first_" + name, first)

    def add_rows(self, rows: np.ndarray, row0: int) -> None:
        """Count a dense band of rows starting at subject ``row0``."""
        r, c = np.nonzero((rows == 0) | (rows == 1))
        self.add(r + row0, c, rows[r, c])

    def to_dict(self) -> dict:
        return {"zeros": self.zeros, "ones": self.ones, "first_zero": self.first_zero,
                "first_one": self.first_one}


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
        Response kind, a key of ``KINDS``: "binary" (int8, -1 missing), "unit" or
        "nonnegative" (float32, NaN missing).
    meta : dict
        The ``irt_engine`` group attributes.
    """

    path: Path
    subjects: np.ndarray = field(repr=False)
    items: np.ndarray = field(repr=False)
    kind: str
    meta: dict[str, Any] = field(repr=False)
    arrays: dict[str, CheckedArray] = field(default_factory=dict, repr=False)
    stamp: tuple = field(default=(), repr=False)
    notes: tuple[str, ...] = field(default=(), repr=False)  # what ingest noticed (not stored)

    @cached_property
    def _array(self) -> CheckedArray:
        if self.layout == "sparse":
            raise DataFormatError(f"{self.path}: a sparse store has no dense response array; "
                                  f"use Store.observations()")
        return self.arrays["responses"]

    @property
    def layout(self) -> str:
        """``dense`` (an S x N matrix) or ``sparse`` (COO observations)."""
        return str(self.meta.get("layout", "dense"))

    @property
    def chunks(self) -> tuple[int, ...]:
        """Inner chunk shape: (rows, items) for dense stores, (observations,) for sparse ones."""
        name = "responses" if self.layout == "dense" else "response"
        return tuple(self.arrays[name].chunks)

    def _dask(self, name: str) -> da.Array:
        import dask.array as da  # here: opening a store for a small fit needs no Dask

        array = self.arrays[name]
        token = f"irt-store-{name}-{self.meta.get('checksum')}-{self.path.resolve()}"
        return da.from_array(array, chunks=array.chunks, name=token, lock=False, asarray=True,
                             fancy=False, meta=np.empty((0,) * array.ndim, array.dtype))

    @property
    def responses(self) -> da.Array:
        """Lazy ``(S, N)`` dask array of responses in the stored dtype (int8 with -1 missing, or
        float32 with NaN missing; see ``meta["missing"]``).

        For a sparse store this densifies on compute (one task): meant for small stores.
        """
        if self.layout == "sparse":
            import dask
            import dask.array as da

            return da.from_delayed(dask.delayed(self.load)(), self.shape, dtype=self.dtype)
        return self._dask("responses")

    def observations(self) -> tuple[da.Array, da.Array, da.Array]:
        """Lazy COO arrays ``(subject_idx int32, item_idx int32, response)`` of a sparse
        store, sorted by (subject, item); ``response`` is int8 or float32 by kind."""
        if self.layout != "sparse":
            raise DataFormatError(f"{self.path}: a dense store has no observation arrays; use "
                                  f"Store.responses, or ingest with --layout sparse")
        return tuple(self._dask(name) for name in COO_FIELDS)

    @property
    def dtype(self) -> np.dtype:
        """The stored responses' dtype: int8 (-1 missing) or float32 (NaN missing)."""
        return np.dtype(KINDS[self.kind].dtype)

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

    @property
    def nbytes(self) -> int:
        """Bytes the responses take in memory: the dense matrix, or the observations."""
        if self.layout == "sparse":
            return self.num_observed * (8 + np.dtype(KINDS[self.kind].dtype).itemsize)
        return self.num_subjects * self.num_items * np.dtype(KINDS[self.kind].dtype).itemsize

    def load(self) -> np.ndarray:
        """Read the whole response matrix into memory in the stored dtype (see ``responses``);
        checks the observed count against the metadata."""
        if self.layout == "sparse":
            s, i, v = (self.arrays[name][...] for name in COO_FIELDS)
            if len(s) and (s.min() < 0 or s.max() >= self.num_subjects or i.min() < 0
                           or i.max() >= self.num_items):
                raise DataFormatError(f"{self.path / 'subject_idx'}: an observation index is out "
                                      f"of range for {self.num_subjects} x {self.num_items}; "
                                      f"{_REPAIR}")
            y = np.full(self.shape, KINDS[self.kind].fill, self.dtype)
            y[s, i] = v
        else:
            y = np.asarray(self._array[...])
        self.check_observed(count_observed(y))
        return y

    def check_observed(self, count: int) -> None:
        """Raise unless ``count`` observed cells (read from the data) match the metadata."""
        if count != self.num_observed:
            raise DataFormatError(f"{self.path}: the data holds {count} observed responses but "
                                  f"the store's attributes ({self.path / 'zarr.json'}) say "
                                  f"{self.num_observed}; {_REPAIR}")

    def check_unchanged(self) -> None:
        """Raise if the store's metadata file was replaced or rewritten since it was opened."""
        if self.stamp and _stamp(self.path) != self.stamp:
            raise DataFormatError(f"{self.path}: the store changed while it was being read "
                                  f"(zarr.json replaced or rewritten); do not rewrite a store "
                                  f"during a fit, then run the fit again")

    @property
    def boundary(self) -> dict | None:
        """Observed values exactly 0 and 1 of a float store: ``{"zeros", "ones", "first_zero",
        "first_one"}`` (first cells as [row, column]); None for binary stores."""
        return self.meta.get("boundary")


def _stamp(path: Path) -> tuple:
    if isinstance(path, URL):  # an object's identity: its size and ETag / modification time
        try:
            info = filesystem(path).info((path / "zarr.json").key, refresh=True)
        except Exception:
            return ("missing",)
        return (info.get("size"), str(info.get("ETag") or info.get("LastModified")))
    try:
        st = os.stat(path / "zarr.json")
    except OSError:
        return ("missing",)
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def _check_meta(path: Path, meta: Any) -> dict:
    """The ``irt_engine`` attributes, each required one present and of the right type."""
    where = path / "zarr.json"
    if not isinstance(meta, dict):
        raise DataFormatError(f"{where}: attribute {_ATTR!r} is not an object; {_REPAIR}")
    if int(meta.get("format_version", 0) or 0) > FORMAT_VERSION:
        raise DataFormatError(f"{path}: store format_version {meta['format_version']} is "
                              f"newer than this irt-engine supports ({FORMAT_VERSION}); "
                              f"upgrade irt-engine")
    if meta.get("kind") not in KINDS:
        raise DataFormatError(f"{path}: store response kind {meta.get('kind')!r} is not known "
                              f"to this irt-engine (known: {', '.join(KINDS)}); upgrade irt-engine")
    for key in ("num_subjects", "num_items", "num_observed"):
        value = meta.get(key)
        if type(value) is not int or value < 0:
            raise DataFormatError(f"{where}: attribute {key!r} is {value!r}, not a count; "
                                  f"{_REPAIR}")
    if meta.get("layout", "dense") not in ("dense", "sparse"):
        raise DataFormatError(f"{where}: attribute 'layout' is {meta.get('layout')!r}; {_REPAIR}")
    if not isinstance(meta.get("checksum"), str):
        raise DataFormatError(f"{where}: attribute 'checksum' is missing; {_REPAIR}")
    if meta["num_observed"] > meta["num_subjects"] * meta["num_items"]:
        raise DataFormatError(f"{where}: num_observed {meta['num_observed']} exceeds "
                              f"{meta['num_subjects']} x {meta['num_items']} cells; {_REPAIR}")
    return meta


def _check_id_memory(path, shape: tuple[int, int]) -> None:
    """Refuse, before reading them, ids whose claimed count needs more memory than the budget
    (a damaged or hand-edited zarr.json can claim any size)."""
    need, budget = (shape[0] + shape[1]) * ID_BYTES, default_memory_budget()
    if need > budget:
        raise DataFormatError(
            f"{path}: the store's attributes claim {shape[0]:,} subjects and {shape[1]:,} items, "
            f"whose ids alone need about {need / 2 ** 30:.1f} GiB, more than the memory budget "
            f"({budget / 2 ** 30:.1f} GiB, half the available memory); a damaged zarr.json can "
            f"claim any size: re-run `irt-engine ingest` to rebuild it, or, if the store is "
            f"that large, use a machine with more memory")


def _not_a_store(path, err: Exception, remote: bool) -> Exception:
    """Why ``path`` could not be opened as a zarr group, in a user's terms: a file, a folder
    without ``zarr.json``, a zarr array (one of a store's own, say), or a ``zarr.json`` that
    does not parse (refused as damaged). Anything else keeps zarr's reason."""
    from zarr.errors import ContainsArrayError

    if not remote and Path(path).is_file():
        return StoreNotFoundError(f"{path}: a file, not an irt-engine response store (a folder "
                                  f"that ingest writes); {STORE_HINT}")
    if not remote and not (Path(path) / "zarr.json").exists():
        return StoreNotFoundError(f"{path}: a folder without zarr.json, not an irt-engine "
                                  f"response store; {STORE_HINT}")
    if isinstance(err, ContainsArrayError):
        return StoreNotFoundError(f"{path}: a zarr array, not an irt-engine response store; "
                                  f"pass the store's own folder (the one holding subjects/, "
                                  f"items/ and responses/)")
    if isinstance(err, (ValueError, TypeError, KeyError)):  # JSON or metadata that does not parse
        return DataFormatError(f"{path / 'zarr.json'}: damaged, not readable zarr metadata "
                               f"({_brief(err)}); restore the store from a copy, or remove "
                               f"the folder and ingest the responses again")
    return StoreNotFoundError(f"{path}: cannot be opened as an irt-engine response store "
                              f"({_brief(err)}); {STORE_HINT}")


def open_store(path: str | Path, *, verify: bool = False) -> Store:
    """Open a response store written by ``ingest`` or ``write_store``.

    Checks the attributes, each array's shape and dtype against them and (stores with
    per-chunk CRCs) that every chunk file exists; reads then check each chunk's CRC. A
    store without per-chunk CRCs (written by an older version) has its whole checksum
    recomputed here.

    Parameters
    ----------
    path : str or Path
        The store directory.
    verify : bool
        Also recompute the whole checksum and compare it with the stored one.

    Raises
    ------
    StoreNotFoundError
        If ``path`` does not exist or is not an irt-engine store.
    DataFormatError
        If the store is from a newer format version, or is damaged (the message names the
        missing or damaged file or attribute).
    """
    path = as_location(path)
    remote = isinstance(path, URL)
    if not (is_file(path / "zarr.json") if remote else path.exists()):
        if remote:
            list_files(path)  # a missing bucket, or credentials, is named as such
        raise no_store(path)
    stamp = _stamp(path)
    try:
        group = zarr.open_group(zarr_store(path) if remote else path, mode="r", zarr_format=3)
    except Exception as err:  # zarr raises several types for "not a group"
        raise _not_a_store(path, err, remote) from None
    try:
        meta = group.attrs[_ATTR]
    except KeyError:  # a zarr group without the store's attributes: damaged where it holds
        # the store's arrays (its zarr.json rewritten), else a group of something else
        if not remote and all((Path(path) / n).is_dir() for n in ("subjects", "items",
                                                                   "responses")):
            raise DataFormatError(f"{path / 'zarr.json'}: damaged, the store's attributes are "
                                  f"gone; restore the store from a copy, or remove the folder "
                                  f"and ingest the responses again") from None
        raise StoreNotFoundError(f"{path}: a zarr group, not an irt-engine response store (no "
                                 f"{_ATTR!r} attribute); {STORE_HINT}") from None
    meta = _check_meta(path, dict(meta) if isinstance(meta, dict) else meta)
    integrity = meta.get("integrity") == INTEGRITY
    shape = (meta["num_subjects"], meta["num_items"])
    _check_id_memory(path, shape)
    dtype = KINDS[meta["kind"]].dtype
    arrays = {"subjects": _open_checked(path, "subjects", shape[:1], "str", integrity),
              "items": _open_checked(path, "items", shape[1:], "str", integrity)}
    if meta.get("layout", "dense") == "sparse":
        for name, dt in zip(COO_FIELDS, ("int32", "int32", dtype)):
            arrays[name] = _open_checked(path, name, (meta["num_observed"],), dt, integrity)
    else:
        arrays["responses"] = _open_checked(path, "responses", shape, dtype, integrity)
    subjects, items = arrays["subjects"][...], arrays["items"][...]
    store = Store(path=path, subjects=subjects, items=items, kind=meta["kind"], meta=meta,
                  arrays=arrays, stamp=stamp)
    if verify or not integrity:
        if store.layout == "sparse":
            got = sparse_checksum(*(arrays[name] for name in COO_FIELDS), subjects, items,
                                  kind=store.kind, shape=store.shape)
        else:
            got = store_checksum(arrays["responses"], subjects, items, kind=store.kind)
        if got != meta["checksum"]:
            raise DataFormatError(f"{path}: checksum mismatch (stored {meta['checksum']}, "
                                  f"computed {got}); {_REPAIR}")
    return store


def store_checksum(responses: Any, subjects: Sequence[str], items: Sequence[str], *,
                   kind: str = "binary", rows_per_block: int = 4096) -> str:
    """SHA-256 hex digest of the response matrix and ids, independent of chunking.

    The digest covers, in order: the header ``f"irt-engine/{version} {kind} {dtype}
    {S} {N}\\n"`` (``version`` is :func:`format_version` of ``kind``: 1 for binary, 2 for
    float kinds); the response bytes in row-major (C) order in the stored dtype (every NaN
    as one quiet NaN), read in
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
        digest.update(canonical_bytes(block))
    return hash_ids(digest, subjects, items)


def checksum_header(kind: str, num_subjects: int, num_items: int, layout: str = "dense"):
    """A SHA-256 object primed with the header of :func:`store_checksum` (or the sparse one)."""
    dtype = np.dtype(KINDS[kind].dtype)
    tail = "" if layout == "dense" else " sparse"
    return hashlib.sha256(f"irt-engine/{format_version(kind)} {kind} {dtype.name} {num_subjects} "
                          f"{num_items}{tail}\n".encode())


def hash_ids(digest, subjects: Sequence[str], items: Sequence[str]) -> str:
    """Finish a checksum with the ids; return the hex digest."""
    for ids in (subjects, items):
        text = json.dumps([str(i) for i in ids], ensure_ascii=False, separators=(",", ":"))
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()


def canonical_bytes(values: np.ndarray) -> bytes:
    """C-order bytes of ``values``; floats with every NaN as one quiet NaN and -0 as +0."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind == "f":
        values = np.where(np.isnan(values), values.dtype.type(np.nan), values + 0)  # -0 -> +0
    return values.tobytes()


def coo_bytes(subject_idx: np.ndarray, item_idx: np.ndarray, response: np.ndarray) -> bytes:
    """Observations packed as records (<i4 subject, <i4 item, response): 9 bytes for int8
    responses, 12 for (little-endian) float32."""
    response = np.asarray(response)
    value = response.dtype.newbyteorder("<")
    rec = np.empty(len(response), [("s", "<i4"), ("i", "<i4"), ("v", value)])
    rec["s"], rec["i"], rec["v"] = subject_idx, item_idx, response
    return rec.tobytes()


def sparse_checksum(subject_idx: Any, item_idx: Any, response: Any, subjects: Sequence[str],
                    items: Sequence[str], *, kind: str = "binary",
                    shape: tuple[int, int] | None = None, per_block: int = 1 << 22) -> str:
    """SHA-256 hex digest of a sparse store: header ``f"irt-engine/{version} {kind}
    {dtype} {S} {N} sparse\\n"``, the observations in stored (subject, item) order as
    :func:`coo_bytes` records read ``per_block`` at a time, then the ids as in
    :func:`store_checksum`."""
    shape = shape or (len(subjects), len(items))
    digest = checksum_header(kind, *shape, layout="sparse")
    for start in range(0, len(response), per_block):
        part = [np.asarray(a[start:start + per_block]) for a in (subject_idx, item_idx, response)]
        digest.update(coo_bytes(*part))
    return hash_ids(digest, subjects, items)


def check_id_list(subjects: Sequence[str], items: Sequence[str]) -> None:
    """Raise ``DataFormatError`` on a duplicate id or one that is not valid text."""
    for what, ids in (("subject", subjects), ("item", items)):
        if len(set(ids)) != len(ids):
            dup = next(i for i, c in Counter(ids).items() if c > 1)
            raise DataFormatError(f"duplicate {what} id {dup!r}; ids must be unique")
        for ident in ids:
            try:
                ident.encode("utf-8")
            except UnicodeEncodeError:
                raise DataFormatError(f"{what} id {ident!r} is not valid text (a lone UTF-16 "
                                      f"surrogate); fix the id") from None


def _is_store(path: Path) -> bool:
    try:
        meta = json.loads((path / "zarr.json").read_text())
        return _ATTR in meta.get("attributes", {})
    except (OSError, ValueError):
        return False


def check_writable(out: str | Path, overwrite: bool) -> Path:
    """Raise ``StoreExistsError`` unless ``out`` may be (over)written; return it as a Path
    (a ``file://`` URL as its local path)."""
    out = as_location(out)
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
        ``(S, N)`` in the kind's dtype: int8 in {0, 1} with -1 missing (binary), float32 with
        NaN missing in [0, 1] (unit) or >= 0 (nonnegative).
    subjects, items : sequence of str
        Row ids (S,) and column ids (N,); each must be unique.
    out : str or Path
        Store directory to create.
    kind : str
        Response kind, a key of ``KINDS``.
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
    if isinstance(as_location(out), URL):  # written locally, then uploaded
        from engine.data.remote import staged_store

        with staged_store(as_location(out), overwrite) as local:
            write_store(responses, subjects, items, local, kind=kind, source=source,
                        input_format=input_format, chunks=chunks, layout=layout)
        return open_store(out)
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
    problem = check_values(responses, kind)
    if problem:
        raise DataFormatError(f"{problem}; `irt-engine ingest` names the row and column of a "
                              f"bad value in a file")
    check_id_list(subjects, items)
    seen = observed(responses)
    num_observed = int(seen.sum())
    if resolve_layout(layout, num_observed, *responses.shape) == "sparse":
        from engine.data.writer import SparseWriter

        rows, cols = np.nonzero(seen)  # row-major: (subject, item) order
        with SparseWriter(out, subjects, items, kind=kind, source=source, overwrite=overwrite,
                          input_format=input_format, expected=len(rows)) as writer:
            writer.append(rows, cols, responses[rows, cols])
            return writer.commit()
    out = check_writable(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(6)}"
    try:
        meta = {
            "format_version": format_version(kind), "kind": kind, "dtype": spec.dtype,
            "missing": spec.missing, "layout": "dense", "num_subjects": len(subjects),
            "num_items": len(items), "num_observed": num_observed,
            "source": [str(s) for s in source], "input_format": input_format,
            "checksum": store_checksum(responses, subjects, items, kind=kind),
            "integrity": INTEGRITY,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        if spec.is_float:
            boundary = Boundary()
            boundary.add_rows(responses, 0)
            meta["boundary"] = boundary.to_dict()
        _write_group(tmp, responses, subjects, items, spec, chunks, meta)
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
                               chunks=inner, shards=shards, fill_value=spec.fill,
                               **array_options())
    array[...] = responses
    for name, ids in (("subjects", subjects), ("items", items)):
        ids_array = group.create_array(name, shape=(len(ids),), dtype=str,
                                       chunks=(max(1, len(ids)),), **array_options())
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
