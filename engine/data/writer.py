"""Write a response store piece by piece, so no input has to fit in memory.

``DenseWriter`` takes row bands in order; ``SparseWriter`` takes observation batches in
(subject, item) order. Both write into a temporary directory beside ``out``, hash what
they write as it passes (the checksum equals :func:`store_checksum` /
:func:`sparse_checksum` of the finished store) and rename into place on ``commit``; on
an error, or ``abort``, nothing is left behind.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zarr

from engine.data.integrity import INTEGRITY, array_options
from engine.data.remote import URL, _check_store_target, as_location, list_files, publish_store
from engine.data.store import (COO_FIELDS, KINDS, Boundary, Store, _ATTR, _chunking,
                               _move_into_place, canonical_bytes, check_id_list, check_values,
                               check_writable, checksum_header, coo_bytes, format_version,
                               hash_ids, open_store)
from engine.data.tally import count_observed
from engine.errors import DataFormatError, SettingsError

__all__ = ["DenseWriter", "SparseWriter", "check_ids"]


def check_ids(subjects: Sequence[str], items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Ids as lists of str; raises ``DataFormatError`` on a duplicate."""
    subjects, items = [str(s) for s in subjects], [str(i) for i in items]
    check_id_list(subjects, items)
    return subjects, items


class _Writer:
    layout = ""

    def __init__(self, out: str | Path, subjects: Sequence[str], items: Sequence[str], *,
                 kind: str = "binary", source: Sequence[str] = (), input_format: str | None = None,
                 overwrite: bool = False, item_groups: Sequence[str] | None = None):
        if kind not in KINDS:
            raise DataFormatError(f"kind {kind!r} is not supported by this version; "
                                  f"supported kinds: {sorted(KINDS)}")
        self.kind, self.spec = kind, KINDS[kind]
        self.subjects, self.items = check_ids(subjects, items)
        self.shape = (len(self.subjects), len(self.items))
        self.remote, self.staging = as_location(out), None
        if isinstance(self.remote, URL):  # written locally, uploaded on commit
            _check_store_target(self.remote, list_files(self.remote), overwrite)
            self.staging = Path(tempfile.mkdtemp(prefix="irt-store-"))
            out, overwrite = self.staging / (self.remote.name or "store"), False
        else:
            self.remote = None
        self.out, self.overwrite = check_writable(out, overwrite), overwrite
        self.source, self.input_format = [str(s) for s in source], input_format
        # each item's group (evaluation / task), from evaluation logs: meta "item_groups"
        self.item_groups = None if item_groups is None else [str(g) for g in item_groups]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{secrets.token_hex(6)}"
        self.num_observed, self.done = 0, False
        self.boundary = Boundary() if self.spec.is_float else None
        try:
            self.group = zarr.open_group(self.tmp, mode="w-", zarr_format=3)
            for name, ids in (("subjects", self.subjects), ("items", self.items)):
                arr = self.group.create_array(name, shape=(len(ids),), dtype=str,
                                              chunks=(max(1, len(ids)),), **array_options())
                arr[...] = np.array(ids, dtype=object)
        except BaseException:
            self.abort()
            raise
        self.digest = checksum_header(kind, *self.shape, layout=self.layout)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            self.abort()
        return False

    def abort(self) -> None:
        """Remove the temporary directory; ``out`` is untouched."""
        self.done = True
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def _flush(self, final: bool) -> None:
        raise NotImplementedError

    def commit(self) -> Store:
        """Finish the store, rename it into place and open it."""
        if self.done:
            raise RuntimeError("writer already committed or aborted")
        try:
            self._flush(final=True)
            meta = {
                "format_version": format_version(self.kind), "kind": self.kind,
                "dtype": self.spec.dtype,
                "missing": self.spec.missing, "layout": self.layout,
                "num_subjects": self.shape[0], "num_items": self.shape[1],
                "num_observed": int(self.num_observed), "source": self.source,
                "input_format": self.input_format,
                "checksum": hash_ids(self.digest, self.subjects, self.items),
                "integrity": INTEGRITY,
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            }
            if self.boundary is not None:
                meta["boundary"] = self.boundary.to_dict()
            if self.item_groups is not None:
                meta["item_groups"] = self.item_groups
            self.group.attrs[_ATTR] = meta
            _move_into_place(self.tmp, self.out, self.overwrite)
            if self.remote is not None:
                publish_store(self.out, self.remote)
        except BaseException:
            self.abort()
            raise
        self.done = True
        if self.remote is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return open_store(self.remote)
        return open_store(self.out)


class DenseWriter(_Writer):
    """Write an ``(S, N)`` matrix as consecutive row bands (``write_rows``), then ``commit``.

    Rows are buffered to whole chunk rows, so each band is written once as full shards.
    """

    layout = "dense"

    def __init__(self, out, subjects, items, *, chunks: Sequence[int] = (1024, 8192), **kw):
        if len(chunks) != 2 or min(int(c) for c in chunks) < 1:
            raise SettingsError(f"chunks must be two positive integers (rows, items), got {chunks}")
        super().__init__(out, subjects, items, **kw)
        inner, shards = _chunking(self.shape, chunks)
        try:
            self.array = self.group.create_array(
                "responses", shape=self.shape, dtype=self.spec.dtype, chunks=inner,
                shards=shards, fill_value=self.spec.fill, **array_options())
        except BaseException:
            self.abort()
            raise
        self.band_rows = inner[0]
        self.written, self.pending, self.pending_rows = 0, [], 0

    def write_rows(self, rows: np.ndarray) -> None:
        """Append the next rows in order, in the kind's dtype (int8 with -1 missing, or float32
        with NaN missing)."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.shape[1]:
            raise DataFormatError(f"row band shape {rows.shape}; expected (rows, {self.shape[1]})")
        if rows.dtype != np.dtype(self.spec.dtype):
            raise DataFormatError(f"responses dtype {rows.dtype}; expected {self.spec.dtype}")
        if self.written + self.pending_rows + rows.shape[0] > self.shape[0]:
            raise DataFormatError(f"more than {self.shape[0]} rows written")
        if self.kind == "binary" and ((rows < -1) | (rows > 1)).any():
            raise DataFormatError("binary responses must be 0, 1 or -1 (missing)")
        if self.boundary is not None:
            problem = check_values(rows, self.kind)
            if problem:
                raise DataFormatError(problem)
            rows = rows + np.float32(0)  # -0.0 stored as 0.0
            self.boundary.add_rows(rows, self.written + self.pending_rows)
        self.digest.update(canonical_bytes(rows))
        self.num_observed += count_observed(rows)
        self.pending.append(rows)
        self.pending_rows += rows.shape[0]
        if self.pending_rows >= self.band_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self.pending:
            if final and self.written != self.shape[0]:
                raise DataFormatError(f"{self.written} rows written; expected {self.shape[0]}")
            return
        data = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        whole = data.shape[0] if final else data.shape[0] // self.band_rows * self.band_rows
        if whole:
            self.array[self.written:self.written + whole] = data[:whole]
            self.written += whole
        rest = data[whole:]
        self.pending, self.pending_rows = ([rest] if len(rest) else []), len(rest)
        if final and self.written != self.shape[0]:
            raise DataFormatError(f"{self.written} rows written; expected {self.shape[0]}")


class SparseWriter(_Writer):
    """Write observations ``(subject_idx, item_idx, response)`` in strictly increasing
    (subject, item) order (``append``), then ``commit``; no dense matrix is ever built."""

    layout = "sparse"

    def __init__(self, out, subjects, items, *, chunk: int = 1 << 20,
                 expected: int | None = None, **kw):
        super().__init__(out, subjects, items, **kw)
        chunk = max(1, min(int(chunk), int(expected) if expected else int(chunk)))
        self.shard = chunk * 8
        try:
            self.arrays = [self.group.create_array(name, shape=(0,), dtype=dtype, chunks=(chunk,),
                                                   shards=(self.shard,), **array_options())
                           for name, dtype in zip(COO_FIELDS, ("int32", "int32", self.spec.dtype))]
        except BaseException:
            self.abort()
            raise
        self.written, self.pending, self.pending_count = 0, [], 0
        self.last_key = -1

    def append(self, subject_idx: np.ndarray, item_idx: np.ndarray, response: np.ndarray) -> None:
        """Append a batch of observations (missing responses are not observations)."""
        s = np.asarray(subject_idx, np.int64)
        i = np.asarray(item_idx, np.int64)
        v = np.asarray(response)
        if not (s.shape == i.shape == v.shape and s.ndim == 1):
            raise DataFormatError("subject_idx, item_idx and response must be 1-D of equal length")
        if not len(v):
            return
        if s.min() < 0 or s.max() >= self.shape[0] or i.min() < 0 or i.max() >= self.shape[1]:
            raise DataFormatError(f"observation index out of range for {self.shape[0]} subjects "
                                  f"x {self.shape[1]} items")
        if self.kind == "binary" and not np.isin(v, (0, 1)).all():
            raise DataFormatError("binary observations must be 0 or 1")
        if self.boundary is not None:
            v = v.astype(self.spec.dtype)
            problem = check_values(v, self.kind) or (
                "observations must not be NaN (missing cells are not observations)"
                if np.isnan(v).any() else None)
            if problem:
                raise DataFormatError(problem)
        key = s * self.shape[1] + i
        if key[0] <= self.last_key or (np.diff(key) <= 0).any():
            raise DataFormatError("observations must be unique and sorted by (subject, item)")
        self.last_key = int(key[-1])
        parts = (s.astype(np.int32), i.astype(np.int32), v.astype(self.spec.dtype))
        if self.boundary is not None:
            parts = (*parts[:2], parts[2] + np.float32(0))  # -0.0 stored as 0.0
            self.boundary.add(s, i, parts[2])
        self.digest.update(coo_bytes(*parts))
        self.num_observed += len(v)
        self.pending.append(parts)
        self.pending_count += len(v)
        if self.pending_count >= self.shard:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self.pending:
            return
        data = [np.concatenate(col) for col in zip(*self.pending)]
        count = len(data[0]) if final else len(data[0]) // self.shard * self.shard
        if count:
            end = self.written + count
            for arr, col in zip(self.arrays, data):
                arr.resize((end,))
                arr[self.written:end] = col[:count]
            self.written = end
        rest = [col[count:] for col in data]
        self.pending = [tuple(rest)] if len(rest[0]) else []
        self.pending_count = len(rest[0])
