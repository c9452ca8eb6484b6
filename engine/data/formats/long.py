"""Streaming ingest of long-format files (subject, item, response), in bounded memory.

Three passes, none holding the input: (1) read record batches (pyarrow; Parquet row
groups with dictionary-encoded ids, CSV blocks), validate them, collect the subject
and item ids in first-appearance order and detect the response kind; (2) read again and
spill each observation as a record (subject, item, response, input row: 17 bytes for
binary, 20 for float kinds) to a scratch file per band of
subject rows; (3) per band, build the band (a dense row band, or sorted observations),
detect conflicting duplicates and write it to the store. Memory is a batch plus a
band, each within half of ``memory_budget``, whatever the number of cells; memory freed by a
pass is given back to the system before the next (``release_memory``), so the peak is one
phase on top of the id maps, not the sum of the phases.
"""

from __future__ import annotations

import ctypes
import secrets
import shutil
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from engine.data.formats.validate import (LONG_COLS, BadCell, as_stored, bad_value, cannot_read,
                                          check_id_column_type, check_id_text, check_support,
                                          is_text_type,
                                          container_of, csv_rows, delimiter_of, expand_inputs,
                                          fmt_value, long_column, no_response_error, open_text,
                                          read_header, to_float, to_numbers,
                                          where_row)
from engine.data.store import KINDS, Store, check_writable, resolve_layout
from engine.data.writer import DenseWriter, SparseWriter
from engine.errors import DataFormatError

__all__ = ["DEFAULT_BUDGET", "LongTable", "append_by_band", "band_file", "ingest_long",
           "release_memory"]

DEFAULT_BUDGET = 512 << 20


def _spill_dtype(kind: str) -> np.dtype:
    """A scratch record: subject, item, the response (int8 for binary, float64 for float
    kinds: duplicates are compared exactly, before the narrowing to float32), input row."""
    value = "i1" if KINDS[kind].dtype == "int8" else "<f8"
    return np.dtype([("s", "<i4"), ("i", "<i4"), ("v", value), ("g", "<i8")])


def _value_bytes(kind: str) -> int:
    return _spill_dtype(kind)["v"].itemsize


_MAX_BANDS = 256
_PER_BATCH_ROW = 128  # a batch's Arrow columns, codes, values and their temporaries, per row
_MIN_BATCH = 1 << 16


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, AttributeError):  # another C library: nothing to trim
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Give memory freed by a pass back to the system before the next one: Arrow's pool keeps
    freed blocks, and glibc's heap keeps the freed NumPy buffers of a pass (130-200 MiB after
    pass 1 of 50 M rows), which the next pass's peak would otherwise come on top of."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


class LongTable:
    """Reader of long tables: CSV/TSV/Parquet files with subject, item and response columns."""

    name = "long"
    options = frozenset({"columns"})

    def detect(self, path: Path) -> bool:
        """Whether ``path`` is a table whose header has subject, item and response columns;
        a header with subject and item but no response column is an error naming it."""
        if not path.is_file() or container_of(path) not in ("csv", "tsv", "parquet"):
            return False
        lower = {c.strip().lower() for c in read_header(path)}
        has = {role: bool(lower & set(names)) for role, names in LONG_COLS.items()}
        if has["subject"] and has["item"] and not has["response"]:
            long_column(path, sorted(lower), "response")  # raises: long format needs it
        return all(has.values())

    def ingest(self, inputs, out, **options) -> Store:
        """``ingest_long`` of ``inputs`` (files or folders)."""
        return ingest_long(expand_inputs(inputs), out, **options)


class _Ids:
    """Ids in first-appearance order with the input row where each first appeared."""

    def __init__(self, what: str):
        self.what, self.code, self.first = what, {}, []

    def encode(self, col: pa.Array, row0: int, where: Callable[[int], str],
               learn: bool) -> np.ndarray:
        """Global codes of a batch column; with ``learn``, new ids are added (else all known)."""
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(pc.cast(col, pa.large_string()))
        if col.null_count:
            row = int(np.argmax(to_numbers(col.is_null(), bool)))
            raise DataFormatError(f"{where(row)}: empty {self.what} id; give every row a "
                                  f"{self.what} id or drop the row")
        raw = [v if isinstance(v, str) else str(v) for v in col.dictionary.to_pylist()]
        values = [v.strip() for v in raw]
        idx = to_numbers(col.indices, np.int64)
        if learn:
            used, first = np.unique(idx, return_index=True)
            order = np.argsort(first, kind="stable")  # new ids in order of first appearance
            for u, f in zip(used[order].tolist(), first[order].tolist()):
                value = values[u]
                if value not in self.code:  # checked once, where it first appears
                    if not value or not value.isascii():  # the location only when needed
                        check_id_text(raw[u], self.what, where(f))
                    self.code[value] = len(self.first)
                    self.first.append(row0 + f)
        return np.asarray([self.code.get(v, -1) for v in values], np.int64)[idx]

    @property
    def ids(self) -> list[str]:
        return list(self.code)


def _batches(files: list[Path], batch_rows: int, columns: Mapping[str, str] | None = None
             ) -> Iterator[tuple[int, int, pa.RecordBatch, str]]:
    """``(file index, first row in file, batch of [subject, item, response], response name)``;
    ``columns`` names a role's column where its name is not a known one."""
    for k, path in enumerate(files):
        header = read_header(path)
        names = [long_column(path, header, role, (columns or {}).get(role)) for role in LONG_COLS]
        if container_of(path) == "parquet":
            schema = pq.read_schema(path)
            for name in names[:2]:
                check_id_column_type(path, name, schema.field(name).type)
        offset = 0
        try:
            for batch in _read(path, names, batch_rows):
                yield k, offset, batch, names[2]
                offset += batch.num_rows
        except pa.ArrowInvalid as err:
            if container_of(path) != "parquet":
                try:
                    with open_text(path) as f:
                        for _ in csv_rows(path, f):  # raises naming a ragged line
                            pass
                except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err2:
                    raise cannot_read(path, err2) from None
            raise cannot_read(path, err) from None
        except (OSError, EOFError, zlib.error, pa.ArrowException) as err:
            raise cannot_read(path, err) from None


def _read(path: Path, names: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    if container_of(path) == "parquet":
        schema = pq.read_schema(path)
        text = [n for n in names[:2] if is_text_type(schema.field(n).type)]
        with pq.ParquetFile(path, read_dictionary=text) as f:
            for group in range(f.num_row_groups):  # a reader per row group: one reader across
                # row groups holds on to Arrow memory that grows with the file (137 MiB at 50 M rows)
                yield from f.iter_batches(batch_size=batch_rows, row_groups=[group], columns=names)
        return
    reader = pacsv.open_csv(
        path, read_options=pacsv.ReadOptions(block_size=16 << 20),
        parse_options=pacsv.ParseOptions(delimiter=delimiter_of(path)),
        convert_options=pacsv.ConvertOptions(
            include_columns=names, strings_can_be_null=True, null_values=[""],
            column_types={n: pa.string() for n in names}))  # "NA", "null": ids, not missing
    for batch in reader:
        yield batch.select(names)


def _values(col: pa.Array, kind: str | None, at: Callable[[int], str], name: str) -> np.ndarray:
    """Checked float64 responses of a batch (NaN missing); see ``check_support``."""
    try:
        values = to_float(pa.chunked_array([col]))
    except BadCell as bad:
        raise bad_value(f'{at(bad.index)}, column "{name}"', bad.value) from None
    return check_support(values, kind,
                          lambda r: f'{at(r)}, column "{name}"')


class _KindSeen:
    """The smallest kind holding every value seen so far (``kinds.detect_kind``, batch by batch)."""

    def __init__(self):
        self.binary, self.unit = True, True

    def add(self, values: np.ndarray) -> None:
        seen = values[~np.isnan(values)]
        self.binary = self.binary and bool(np.isin(seen, (0, 1)).all())
        self.unit = self.unit and not bool((seen > 1).any())

    @property
    def kind(self) -> str:
        return "binary" if self.binary else "unit" if self.unit else "nonnegative"


def ingest_long(files: Sequence[Path], out: str | Path, *, kind: str | None = None,
                chunks: Sequence[int] = (1024, 8192), overwrite: bool = False,
                layout: str = "auto", memory_budget: int | None = None,
                batch_rows: int = 1 << 20, source: Sequence[str] | None = None,
                input_format: str = "long", item_groups: dict[str, str] | None = None,
                side_files: dict[str, Path] | None = None,
                columns: Mapping[str, str] | None = None) -> Store:
    """Ingest long-format files (CSV/Parquet) into a store, streaming; see the module doc.

    ``columns`` (role -> column name, roles ``subject``, ``item``, ``response``) names the
    columns whose names are not the known ones (``LONG_COLS``).

    ``side_files`` (store file name -> path) are moved into the store before it is committed,
    so they appear with it or not at all (``item_info.parquet`` from evaluation logs).

    Raises
    ------
    DataFormatError
        Malformed input, naming the file, row and column.
    """
    files = [Path(f) for f in files]
    out = check_writable(out, overwrite)
    budget = memory_budget or DEFAULT_BUDGET
    # half the budget for a phase's own arrays (a batch, a band), half for what stays between
    # phases (id maps, the store writer's chunk band) and what the allocators keep
    batch_rows = max(_MIN_BATCH, min(batch_rows, budget // 2 // _PER_BATCH_ROW))
    subjects, items = _Ids("subject"), _Ids("item")
    file_rows, num_observed, detected = [0] * len(files), 0, _KindSeen()

    # pass 1: validate, collect ids, count
    for k, offset, batch, name in _batches(files, batch_rows, columns):
        at = lambda r, k=k, offset=offset: where_row(files[k], offset + r)  # noqa: E731
        row0 = sum(file_rows[:k]) + offset
        subjects.encode(batch.column(0), row0, at, learn=True)
        items.encode(batch.column(1), row0, at, learn=True)
        values = _values(batch.column(2), kind, at, name)
        num_observed += int((~np.isnan(values)).sum())
        detected.add(values)
        file_rows[k] = offset + batch.num_rows
    starts = [0, *np.cumsum(file_rows).tolist()]
    if starts[-1] == 0:
        raise DataFormatError(f"{', '.join(map(str, files))}: no rows; expected one row per "
                              f"(subject, item, response)")
    kind = kind or detected.kind
    release_memory()

    def where(g: int) -> str:
        k = int(np.searchsorted(starts, g, side="right")) - 1
        return where_row(files[k], g - starts[k])

    S, N = len(subjects.first), len(items.first)
    layout = resolve_layout(layout, num_observed, S, N)
    band_rows = _band_rows(layout, S, N, num_observed, budget // 2, chunks, _value_bytes(kind))
    scratch = out.parent / f".{out.name}.spill-{secrets.token_hex(6)}"
    scratch.mkdir(parents=True)
    try:
        _spill(files, batch_rows, subjects, items, starts, band_rows, scratch, kind, columns)
        release_memory()
        common = dict(kind=kind, source=[str(p) for p in (source or files)],
                      input_format=input_format, overwrite=overwrite,
                      item_groups=None if item_groups is None else [item_groups[i]
                                                                    for i in items.ids])
        if layout == "dense":
            writer = DenseWriter(out, subjects.ids, items.ids, chunks=chunks, **common)
        else:
            writer = SparseWriter(out, subjects.ids, items.ids, expected=num_observed, **common)
        with writer:
            n_s, n_i = _write_bands(writer, layout, scratch, S, N, band_rows, subjects, items,
                                    where)
            _check_nonempty(n_s, subjects, where)
            _check_nonempty(n_i, items, where)
            for name, path in (side_files or {}).items():
                shutil.move(path, writer.tmp / name)
            return writer.commit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _band_rows(layout: str, S: int, N: int, num_observed: int, budget: int,
               chunks: Sequence[int], itemsize: int = 1) -> int:
    """Subject rows per band, so that a band's records, their sorting temporaries and (for
    dense stores) its rows stay within the budget; the dense writer itself buffers one
    chunk row band (``chunks[0] x N`` cells of ``itemsize`` bytes) beside it."""
    per_obs = 64  # a 17- or 20-byte record read back, plus index and sorting temporaries
    per_row = per_obs * max(1.0, num_observed / max(1, S)) + (N * itemsize if layout == "dense" else 0)
    if layout == "dense":
        budget = max(1, budget - min(int(chunks[0]), S) * N * itemsize)
    rows = max(1, int(budget // per_row))
    return int(max(rows, -(-S // _MAX_BANDS)))


def _spill(files, batch_rows, subjects: _Ids, items: _Ids, starts, band_rows: int,
           scratch: Path, kind, columns: Mapping[str, str] | None = None) -> None:
    """Pass 2: append each observation to its band's scratch file."""
    handles: dict[int, object] = {}
    spill = _spill_dtype(kind)
    try:
        for k, offset, batch, name in _batches(files, batch_rows, columns):
            at = lambda r, k=k, offset=offset: where_row(files[k], offset + r)  # noqa: E731
            s = subjects.encode(batch.column(0), 0, at, learn=False)
            i = items.encode(batch.column(1), 0, at, learn=False)
            v = _values(batch.column(2), kind, at, name)
            v = as_stored(v, kind) if kind == "binary" else v  # float kinds: float64 until written
            seen = np.flatnonzero(v >= 0)  # -1 and NaN are missing
            rec = np.empty(len(seen), spill)
            rec["s"], rec["i"], rec["v"] = s[seen], i[seen], v[seen]
            rec["g"] = starts[k] + offset + seen
            append_by_band(rec, rec["s"] // band_rows, scratch, handles)
    finally:
        for f in handles.values():
            f.close()


def band_file(scratch: Path, band: int) -> Path:
    """The scratch file that holds band ``band``'s spilled records."""
    return scratch / f"band-{band:06d}.bin"


def append_by_band(rec: np.ndarray, band: np.ndarray, scratch: Path, handles: dict) -> None:
    """Append each record to its band's scratch file (``band_file``), opening files on first
    use into ``handles`` (the caller closes them)."""
    if not len(rec):
        return
    order = np.argsort(band, kind="stable")
    rec, band = rec[order], band[order]
    starts = np.r_[0, np.flatnonzero(np.diff(band)) + 1]
    for part, b in zip(np.split(rec, starts[1:]), band[starts].tolist()):
        if b not in handles:
            handles[b] = open(band_file(scratch, b), "ab")
        handles[b].write(part.tobytes())


def _conflict(where, subjects: _Ids, items: _Ids, rec: np.ndarray, clash: np.ndarray,
              same_key: Callable[[int], np.ndarray]) -> DataFormatError:
    g = int(np.argmax(clash))
    h = int(np.argmax(same_key(g) & ~clash))
    return DataFormatError(
        f"{where(int(rec['g'][g]))}: conflicting duplicate for subject "
        f"{subjects.ids[rec['s'][g]]!r}, item {items.ids[rec['i'][g]]!r}: {fmt_value(rec['v'][g])} "
        f"here but {fmt_value(rec['v'][h])} at {where(int(rec['g'][h]))}; keep one response per "
        f"(subject, item)")


def _write_bands(writer, layout: str, scratch: Path, S: int, N: int, band_rows: int,
                 subjects: _Ids, items: _Ids, where) -> tuple[np.ndarray, np.ndarray]:
    """Pass 3: each band in subject order into the store; returns observed counts."""
    n_s, n_i = np.zeros(S, np.int64), np.zeros(N, np.int64)
    spill, spec = _spill_dtype(writer.kind), KINDS[writer.kind]
    for b, r0 in enumerate(range(0, S, band_rows)):
        rows = min(band_rows, S - r0)
        if b:
            release_memory()  # the last band's arrays, before this one's
        path = band_file(scratch, b)
        rec = np.fromfile(path, spill) if path.exists() else np.empty(0, spill)
        path.unlink(missing_ok=True)
        local = rec["s"].astype(np.int64) - r0
        if layout == "dense":
            band = np.full((rows, N), spec.fill, rec["v"].dtype)
            band[local, rec["i"]] = rec["v"]
            clash = band[local, rec["i"]] != rec["v"]  # exact: float64 for float kinds
            if clash.any():
                raise _conflict(where, subjects, items, rec, clash,
                                lambda g: (rec["s"] == rec["s"][g]) & (rec["i"] == rec["i"][g]))
            seen = band >= 0
            n_s[r0:r0 + rows] = seen.sum(axis=1)
            n_i += seen.sum(axis=0)
            writer.write_rows(band.astype(spec.dtype, copy=False))
            continue
        key = local * N + rec["i"]
        order = np.argsort(key, kind="stable")
        rec, key = rec[order], key[order]
        last = np.r_[key[1:] != key[:-1], True] if len(key) else np.empty(0, bool)
        group_end = np.flatnonzero(last)
        winner = np.repeat(rec["v"][group_end], np.diff(np.r_[-1, group_end]))
        clash = rec["v"] != winner
        if clash.any():
            by_row = np.argsort(rec["g"], kind="stable")  # report the earliest input row
            rec, key, clash = rec[by_row], key[by_row], clash[by_row]
            raise _conflict(where, subjects, items, rec, clash, lambda g: key == key[g])
        keep = rec[last]
        n_s += np.bincount(keep["s"], minlength=S)
        n_i += np.bincount(keep["i"], minlength=N)
        writer.append(keep["s"], keep["i"], keep["v"])
    return n_s, n_i


def _check_nonempty(counts: np.ndarray, ids: _Ids, where) -> None:
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        k = int(empty[0])
        raise no_response_error(where(ids.first[k]), ids.what, ids.ids[k], empty.size)
