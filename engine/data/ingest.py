"""Read wide / long / jsonl response files, validate them, and write one response store.

Formats (see ``ingest``): "wide" (CSV/Parquet, a row per subject, a column per item), "long"
(CSV/Parquet or a folder of them, columns subject, item, response; streamed in bounded
memory by ``engine.data.long``) and "jsonl" (py-irt lines
``{"subject_id": ..., "responses": {item: value}}``). Locations in error messages are
``line N`` for CSV/jsonl (the CSV header is line 1) and ``row index N`` (0-based) for Parquet.

Response kinds (``engine.data.store.KINDS``): ``binary`` (0/1, stored int8), ``unit`` (scores in
[0, 1]) and ``nonnegative`` (errors >= 0), both stored float32 with NaN missing. Values are
parsed to float64 and checked against the kind before any narrowing cast, so ``1.00000001``
is not binary and ``-1e-50`` is negative; the kind is the smallest one holding every
observed value unless given; a value outside it, a negative, a non-finite value or one too
large for float32 is an error naming its file, row and column. Nothing is clipped.

Ids are text in every reader, kept as written but for surrounding whitespace: ``NA``,
``null`` and ``nan`` are ids. An empty id, a duplicate id or JSON key, a non-string id in
JSON, a Parquet id column that is not text or integers, and an id that is not valid UTF-8
text (a lone surrogate) are errors. A wide table's first column holds subject ids when its
name is a known id name (``_ID_NAMES``) or empty (a pandas index) or every cell in it is
text; a numeric first column under another name is ambiguous and an error until
``id_column`` names the id column (or ``"none"``: every column is an item).

Memory: the wide and jsonl readers hold the table; before reading they compare the size
the file (Parquet footer, CSV header) claims with ``memory_budget`` and refuse with an error
naming the size; long input is streamed (``engine.data.long``).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from engine.data.kinds import detect_kind
from engine.data.store import KINDS, LAYOUTS, Store, check_writable, write_store
from engine.errors import DataFormatError, SettingsError

__all__ = ["FORMATS", "ingest"]

FORMATS = ("wide", "long", "jsonl", "every-eval-ever", "lm-eval", "helm",
           "inspect")  # logs: engine.data.formats
_ID_NAMES = {"subject", "subject_id", "system", "model", "id", "name"}
_LONG_COLS = {"subject": ("subject", "subject_id"), "item": ("item", "item_id"),
              "response": ("response",)}
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_EXPECTED = "a number (0/1, a score in [0, 1] or an error >= 0), or empty for missing"
_SUPPORT = {"binary": "0 or 1", "unit": "a score in [0, 1]", "nonnegative": "an error >= 0"}
_NULLS = {"", "na", "n/a", "nan", "null", "none"}
NO_ID_COLUMN = "none"  # id_column value: a wide table without an id column (rows are numbered)
# Bytes a wide table costs in memory while it is read and written: a float64 cell parsed, a
# copy while stacking; each id about 300 bytes (Python strings, lists, the store's id array:
# measured 295 bytes per item ingesting a 1 x 1,000,000 wide CSV).
_CELL_BYTES, _ID_BYTES = 16, 300
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass
class _Parsed:
    """One file (or all files, merged): float64 responses with NaN missing, ids, locators."""

    responses: np.ndarray
    subjects: list[str]
    items: list[str]
    where_subject: Callable[[int], str]
    where_item: Callable[[int], str]
    row_ids: bool = False  # wide files without an id column: subjects are row numbers


class _BadCell(Exception):
    def __init__(self, index: int, value: object):
        super().__init__(index, value)
        self.index, self.value = index, value


def ingest(inputs: str | Path | Sequence[str | Path], out: str | Path, *, fmt: str | None = None,
           kind: str | None = None, chunks: Sequence[int] = (1024, 8192),
           overwrite: bool = False, layout: str = "auto",
           memory_budget: int | None = None, id_column: str | None = None,
           metric: Sequence[str] | None = None, keep: str | None = None) -> Store:
    """Read response files of one format and write them as a zarr v3 response store.

    Parameters
    ----------
    inputs : path or list of paths
        Files (CSV, TSV, Parquet, jsonl; ``.gz`` for text) or folders of them (sorted).
    out : path
        Store directory to create (atomically).
    fmt : {"wide", "long", "jsonl", "every-eval-ever", "lm-eval", "helm", "inspect"}, optional
        Input format; detected from extension and columns (evaluation logs: from their
        layout, ``engine.data.formats``) when None.
    kind : {"binary", "unit", "nonnegative"}, optional
        Response kind; when None, the smallest kind holding every value (0/1 -> binary,
        within [0, 1] -> unit, >= 0 -> nonnegative). Binary is stored int8 (-1 missing), the
        others float32 (NaN missing).
    chunks : (int, int)
        Chunk shape of the stored matrix (clipped to its shape).
    overwrite : bool
        Replace an existing store at ``out``.
    layout : {"auto", "dense", "sparse"}
        Store a dense matrix or (subject, item, response) observations; "auto" picks
        sparse below ``SPARSE_DENSITY`` observed.
    memory_budget : int, optional
        Bytes for buffering long input (default 512 MiB; streamed, its peak memory does not
        grow with the number of rows), and the most a wide or jsonl table may take in memory
        (default half the memory available); a larger table is refused before it is read.
    id_column : str, optional
        Wide input: the column holding subject ids, or ``"none"`` when every column is an
        item (subjects are then numbered by row). Needed when the first column holds numbers
        under a name that is not a known id name; by default the first column is detected.
    metric, keep : optional
        Evaluation logs only (``engine.data.formats``): the metric(s) to read, tried in
        order, and what to do when a model answered a sample twice (first, latest, mean).

    Returns
    -------
    Store

    Raises
    ------
    DataFormatError
        Unreadable or malformed input, or a value outside the kind (negative, non-finite, or
        outside ``kind`` when given); the message names file, line/row, column and value.
    SettingsError
        ``chunks`` is not two positive integers.
    StoreExistsError
        ``out`` exists and ``overwrite`` is False.

    Examples
    --------
    >>> store = ingest("lsat7.csv", "lsat7.zarr")  # doctest: +SKIP
    >>> store.shape  # doctest: +SKIP
    (1000, 5)
    """
    if kind is not None and kind not in KINDS:
        raise DataFormatError(f"kind {kind!r} is not supported; use one of {', '.join(KINDS)} "
                              f"or leave it unset to detect it from the data")
    if fmt is not None and fmt not in FORMATS:
        raise DataFormatError(f"unknown input format {fmt!r}; use one of {list(FORMATS)}")
    if layout not in LAYOUTS:
        raise SettingsError(f"layout={layout!r}; use one of {', '.join(LAYOUTS)}")
    if len(chunks) != 2 or min(int(c) for c in chunks) < 1:
        raise SettingsError(f"chunks must be two positive integers (rows, items), got {chunks}")
    if memory_budget is not None and int(memory_budget) < 1:
        raise SettingsError(f"memory_budget={memory_budget!r}: give a positive number of bytes")
    check_writable(out, overwrite)
    from engine.data.formats import LOG_FORMATS, detect_log_format, ingest_logs

    log_fmt = fmt if fmt in LOG_FORMATS else detect_log_format(inputs) if fmt is None else None
    if log_fmt is not None:
        if id_column is not None:
            raise SettingsError(f"--id-column applies to wide input only; this input is "
                                f"{log_fmt}: drop the option")
        return ingest_logs(inputs, out, fmt=log_fmt, kind=kind, chunks=chunks,
                           overwrite=overwrite, layout=layout, memory_budget=memory_budget,
                           metric=metric, keep=keep)
    if metric or keep:
        raise SettingsError("--metric and --keep apply to evaluation logs (formats "
                            "every-eval-ever, lm-eval, helm, inspect) only; drop them for tables")
    files = _expand(inputs)
    budget = int(memory_budget or default_budget())
    for path in files:  # before any header is parsed: a 10M-column header is 10M strings
        if _container(path) in ("csv", "tsv"):
            width = _header_width(path)
            if _wide_need(1, width) > budget:
                raise _over_budget(path, f"a wide table of {width:,} columns",
                                   _wide_need(1, width), budget)
    fmt = fmt or _detect(files)
    if id_column is not None and fmt != "wide":
        raise SettingsError(f"id_column (--id-column) applies to wide input only; this input is "
                            f"{fmt}: drop the option")
    if fmt == "long":
        from engine.data.long import ingest_long

        return ingest_long(files, out, kind=kind, chunks=chunks, overwrite=overwrite,
                           layout=layout, memory_budget=memory_budget)
    if fmt == "jsonl":
        parts = [_read_jsonl(path, kind, budget) for path in files]
    else:
        parts = [_read_wide(path, kind, budget, id_column) for path in files]
    parsed = _merge(parts)
    _check_nonempty(parsed)
    kind = kind or detect_kind(parsed.responses)
    return write_store(as_stored(parsed.responses, kind), parsed.subjects, parsed.items, out,
                       kind=kind,
                       source=[str(p) for p in files], input_format=fmt, chunks=chunks,
                       overwrite=overwrite, layout=layout)


def default_budget() -> int:
    """Half the memory the machine has available now (at least 256 MiB)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return max(256 << 20, available // 2)


def _over_budget(path: Path, what: str, need: float, budget: int) -> DataFormatError:
    return DataFormatError(
        f"{path}: {what} needs about {_size(need)} in memory to ingest, over the memory budget "
        f"of {_size(budget)}; write it in long format (subject,item,response rows, which ingest "
        f"streams in bounded memory) or raise --memory-budget")


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.3g}"


def _wide_need(rows: int, cols: int) -> float:
    return float(rows) * cols * _CELL_BYTES + (float(rows) + cols) * _ID_BYTES


def check_id_text(value: str, what: str, where: str) -> str:
    """``value`` stripped; raises on an empty id or one that is not valid Unicode text."""
    text = value.strip()
    if not text:
        raise DataFormatError(f"{where}: empty {what} id; give every {what} an id or drop it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DataFormatError(f"{where}: {what} id {text!r} is not valid text (a lone UTF-16 "
                              f"surrogate); fix the id") from None
    return text


def _container(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return _SUFFIXES.get(suffixes[-1]) if suffixes else None


def _expand(inputs: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    files: list[Path] = []
    for path in map(Path, items):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
            if not found:
                raise DataFormatError(f"{path}: folder has no input files")
            for p in found:
                if p.is_dir() or _container(p) is None:
                    raise DataFormatError(f"{p}: unknown file type in input folder {path}; "
                                          f"keep only .parquet/.csv/.tsv/.jsonl files there")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise DataFormatError(f"{path}: no such input file or folder")
    if not files:
        raise DataFormatError("no input files given; pass at least one file or folder")
    return files


def _detect(files: list[Path]) -> str:
    found = set()
    for path in files:
        container = _container(path)
        if container is None:
            raise DataFormatError(f"{path}: unknown input format (expected .csv, .tsv, "
                                  f".parquet or .jsonl); rename it or pass fmt=/--format")
        lower = {c.strip().lower() for c in ([] if container == "jsonl" else _header(path))}
        has = {role: bool(lower & set(names)) for role, names in _LONG_COLS.items()}
        if has["subject"] and has["item"] and not has["response"]:
            _long_column(path, sorted(lower), "response")  # raises: long format needs it
        is_long = all(has.values())
        found.add("jsonl" if container == "jsonl" else "long" if is_long else "wide")
    if len(found) > 1:
        raise DataFormatError(f"inputs mix formats {sorted(found)}; ingest one format at a time")
    return found.pop()


def _open_text(path: Path) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def _header(path: Path) -> list[str]:
    try:
        if _container(path) == "parquet":
            return pq.read_schema(path).names
        with _open_text(path) as f:
            header = next(csv.reader(f, delimiter=_delimiter(path)), None)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pa.ArrowException) as err:
        raise _cannot_read(path, err) from None
    if not header:
        raise DataFormatError(f"{path}: file is empty; expected a header line")
    return header


def _cannot_read(path: Path, err: Exception) -> DataFormatError:
    text = " ".join(str(err).split())[:200] or type(err).__name__
    return DataFormatError(f"{path}: cannot read it ({text}); check the file and its format")


def _delimiter(path: Path) -> str:
    return "\t" if _container(path) == "tsv" else ","


def _where_row(path: Path, row: int) -> str:
    return f"{path} row index {row}" if _container(path) == "parquet" else f"{path} line {row + 2}"


def _read_table(path: Path, columns: list[str] | None, string_cols: list[str]) -> pa.Table:
    try:
        if _container(path) == "parquet":
            return pq.read_table(path, columns=columns)
        return pacsv.read_csv(
            path, parse_options=pacsv.ParseOptions(delimiter=_delimiter(path)),
            convert_options=pacsv.ConvertOptions(
                include_columns=columns, strings_can_be_null=True,
                column_types={c: pa.string() for c in string_cols}))
    except pa.ArrowInvalid as err:
        if _container(path) != "parquet":
            with _open_text(path) as f:
                for _ in _csv_rows(path, f):  # raises with the line number of a ragged row
                    pass
        raise DataFormatError(f"{path}: cannot parse it ({err}); check the file") from err
    except (OSError, pa.ArrowException) as err:
        raise _cannot_read(path, err) from err


def _csv_rows(path: Path, f: io.TextIOBase):
    """Yield ``(line_number, cells)`` for the header and each non-blank record, checking widths."""
    reader, width = csv.reader(f, delimiter=_delimiter(path)), None
    try:
        for cells in reader:
            if cells and width is not None and len(cells) != width:
                raise DataFormatError(f"{path} line {reader.line_num}: {len(cells)} fields, but "
                                      f"the header has {width}; fix that line (quote values that "
                                      f"contain the delimiter, leave missing cells empty: a,,b)")
            if cells:
                width = len(cells) if width is None else width
                yield reader.line_num, cells
    except csv.Error as err:
        raise DataFormatError(f"{path} line {reader.line_num}: {err}; fix the CSV quoting") from err


def _parse_cell(value: object) -> float:
    if value is None:
        return np.nan
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _NULLS:
            return np.nan
        return float(text == "true") if text in ("true", "false") else float(text)
    if isinstance(value, (bool, int, float, np.number)):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


def _parse_cells(cells: list) -> np.ndarray:
    """float64 values (NaN for missing); raises ``_BadCell`` at the first non-number."""
    try:
        table = {value: _parse_cell(value) for value in set(cells)}  # few distinct values: fast
        return np.fromiter(map(table.__getitem__, cells), np.float64, count=len(cells))
    except (ValueError, TypeError, KeyError, OverflowError):
        for k, value in enumerate(cells):
            try:
                _parse_cell(value)
            except (ValueError, TypeError, OverflowError):
                raise _BadCell(k, value) from None
        return np.array([_parse_cell(value) for value in cells], np.float64)  # NaN keys


def _to_float(col: pa.ChunkedArray) -> np.ndarray:
    """float64 values of an Arrow column, NaN for missing; raises ``_BadCell``."""
    kind = col.type
    if pa.types.is_null(kind):
        return np.full(len(col), np.nan, np.float64)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return np.asarray(col.to_numpy(), np.float64)  # nulls -> NaN
    if pa.types.is_boolean(kind):
        return pc.cast(col, pa.float64()).fill_null(np.nan).to_numpy()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _parse_cells(col.to_pylist())
    raise _BadCell(0, f"<column of type {kind}>")


def no_response_error(where: str, what: str, ident, count: int) -> DataFormatError:
    """The error for a subject or item with no observed response (``count`` such ids)."""
    more = f" (and {count - 1} more)" if count > 1 else ""
    return DataFormatError(f"{where}: {what} {ident!r} has no observed response{more}; drop that "
                           f"{what} from the input, it carries no information")


def _check_support(values: np.ndarray, kind: str | None,
                   where: Callable[[int], str]) -> np.ndarray:
    """Check float64 values (NaN missing) are finite, storable as float32 and inside ``kind``
    (or >= 0 when no kind is given: some kind must hold them); return them as float64 with
    -0.0 made 0.0. No value is rounded before this check."""
    values = np.asarray(values, np.float64)
    missing = np.isnan(values)
    bad = ~missing & ~np.isfinite(values)
    if bad.any():
        index = int(np.argmax(bad.ravel()))
        raise DataFormatError(f"{where(index)}: got {fmt_value(values.flat[index])}; expected a finite "
                              f"number, or empty for missing; fix the value or leave the cell "
                              f"empty")
    big = ~missing & (np.abs(values) > _F32_MAX)
    if big.any():
        index = int(np.argmax(big.ravel()))
        raise DataFormatError(f"{where(index)}: got {fmt_value(values.flat[index])}; responses are stored "
                              f"as float32, which holds at most {_F32_MAX:.4g}: rescale the "
                              f"values")
    if kind == "binary":
        good = missing | (values == 0) | (values == 1)
    elif kind == "unit":
        good = missing | ((values >= 0) & (values <= 1))
    else:
        good = missing | (values >= 0)
    if not good.all():
        index = int(np.argmin(good.ravel()))
        got = f"{where(index)}: got {fmt_value(values.flat[index])}"
        if kind:
            raise DataFormatError(
                f"{got}; expected {_SUPPORT[kind]} for kind {kind!r}, or empty for missing; fix "
                f"the value, or ingest with another --kind (binary: 0 or 1, unit: [0, 1], "
                f"nonnegative: >= 0) or none to detect it")
        raise DataFormatError(
            f"{got}; expected a response >= 0 (binary 0/1, a unit score in [0, 1] or a "
            f"nonnegative error), or empty for missing; no response kind holds negative values: "
            f"transform them first (e.g. errors = -score, or 1 + score/25 for scores in [-25, 0])")
    return values + 0.0  # -0.0 -> 0.0


def as_stored(values: np.ndarray, kind: str) -> np.ndarray:
    """Checked float64 values (NaN missing) in ``kind``'s storage: int8 with -1 missing for
    binary, float32 with NaN missing otherwise (the one narrowing cast, after the check)."""
    if kind == "binary":
        return np.where(np.isnan(values), -1, values).astype(np.int8)
    return np.asarray(values, np.float32)


def fmt_value(x: float) -> str:
    """A response as its shortest exact decimal: 1, 0.99999999, -1e-50."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _bad_value(where: str, value: object) -> DataFormatError:
    return DataFormatError(f"{where}: got {value!r}; expected {_EXPECTED}")


def _id_column_type(path: Path, name: str, kind: pa.DataType) -> None:
    """Raise unless an Arrow id column holds text or integers."""
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(value) or pa.types.is_large_string(value)
            or pa.types.is_integer(value) or pa.types.is_null(value)):
        raise DataFormatError(f'{path} column "{name}": ids of type {kind}; store ids as text '
                              f"(or integers), one per row")


def _id_list(raw: list, what: str, where: Callable[[int], str]) -> list[str]:
    """Ids from raw cells (str, int or None): stripped, non-empty, valid text."""
    out = []
    for k, value in enumerate(raw):
        if value is None:
            raise DataFormatError(f"{where(k)}: empty {what} id; give every row a {what} id or "
                                  f"drop the row")
        out.append(check_id_text(value if isinstance(value, str) else str(value), what,
                                 where(k)))
    return out


def _wide_parquet(path: Path, budget: int, idc: int) -> tuple[list[str], list, np.ndarray,
                                                              Callable]:
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowException) as err:
        raise _cannot_read(path, err) from None
    need = _wide_need(meta.num_rows, meta.num_columns)
    if need > budget:
        raise _over_budget(path, f"a wide table of {meta.num_rows:,} rows x {meta.num_columns:,} "
                           f"columns (its Parquet footer)", need, budget)
    table = _read_table(path, None, [])
    header, where = [str(n) for n in table.column_names], (lambda r: _where_row(path, r))
    values = np.empty((table.num_rows, len(header) - 1), np.float64, order="F")
    for j in range(len(header)):
        if j == idc:
            continue
        try:
            values[:, j - (j > idc)] = _to_float(table.column(j))
        except _BadCell as bad:
            raise _bad_value(f'{where(bad.index)}, column "{header[j]}"', bad.value) from None
    _id_column_type(path, header[idc], table.column(idc).type)
    raw = table.column(idc).to_pylist() if table.num_columns else []
    return header, raw, values, where


def _header_width(path: Path) -> int:
    """Fields in the first line, counted on the raw bytes (an upper bound: quoted delimiters
    count too), without building the header in memory."""
    sep, width = _delimiter(path).encode(), 1
    try:
        with gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb") as raw:
            while True:
                block = raw.read(1 << 20)
                if not block:
                    return width
                line = block.split(b"\n", 1)
                width += line[0].count(sep)
                if len(line) > 1:
                    return width
    except (OSError, EOFError, zlib.error) as err:
        raise _cannot_read(path, err) from None


def _wide_csv(path: Path, budget: int, idc: int) -> tuple[list[str], list, np.ndarray, Callable]:
    raw, rows, lines = [], [], []
    try:
        with _open_text(path) as f:
            records = _csv_rows(path, f)
            header = next(records, (0, None))[1]
            if not header:
                raise DataFormatError(f"{path}: file is empty; expected a header line")
            for line, cells in records:
                if _wide_need(len(rows) + 1, len(header)) > budget:
                    raise _over_budget(path, f"a wide table of over {len(rows):,} rows x "
                                       f"{len(header):,} columns",
                                       _wide_need(len(rows) + 1, len(header)), budget)
                value_cells = cells[:idc] + cells[idc + 1:]
                try:
                    rows.append(_parse_cells(value_cells))
                except _BadCell as bad:
                    name = header[bad.index + (bad.index >= idc)]
                    raise _bad_value(f'{path} line {line}, column "{name}"', bad.value) from None
                raw.append(cells[idc])
                lines.append(line)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise _cannot_read(path, err) from None
    values = np.stack(rows) if rows else np.empty((0, len(header) - 1), np.float64)
    where = lambda r: f"{path} line {lines[r]}"  # noqa: E731
    return header, raw, values, where


def _id_index(path: Path, header: list[str], id_column: str | None) -> int:
    """Index of the (tentative) id column: the named one, else the first."""
    if id_column is None or id_column == NO_ID_COLUMN:
        return 0
    names = [str(h).strip() for h in header]
    if id_column.strip() not in names:
        raise SettingsError(f"{path}: no column {id_column!r} (--id-column); the header has "
                            f"{names[:10]}{' ...' if len(names) > 10 else ''}")
    return names.index(id_column.strip())


def _read_wide(path: Path, kind: str | None, budget: int, id_column: str | None) -> _Parsed:
    parquet = _container(path) == "parquet"
    header = [str(h) for h in _header(path)] if parquet else None
    if parquet:
        idc = _id_index(path, header, id_column)
        header, raw, values, where = _wide_parquet(path, budget, idc)
    else:
        with_header = _header(path)
        idc = _id_index(path, with_header, id_column)
        header, raw, values, where = _wide_csv(path, budget, idc)
    if not raw:
        raise DataFormatError(f"{path}: no rows; expected a header and one row per subject")
    header = [str(name).strip() for name in header]
    if id_column == NO_ID_COLUMN:
        has_ids = False
    elif id_column is not None:
        has_ids = True
    else:
        has_ids = header[0].lower() in _ID_NAMES | {""} or _all_text(raw)  # "": pandas index
        if not has_ids:
            raise DataFormatError(
                f'{path} column 1 "{header[0]}": cannot tell subject ids from responses (it '
                f"holds numbers and its name is not one of {sorted(_ID_NAMES)}); pass --id-column "
                f"{header[0]!r} if it holds subject ids, or --id-column {NO_ID_COLUMN} if every "
                f"column is an item (subjects are then numbered by row)")
    if has_ids:
        subjects = _id_list(raw, "subject", where)
        _check_unique(subjects, "subject", where)
        names = header[:idc] + header[idc + 1:]
    else:
        try:
            first = _parse_cells([c if isinstance(c, str) or c is None else float(c)
                                  for c in raw])
        except _BadCell as bad:
            raise _bad_value(f'{where(bad.index)}, column "{header[0]}"', bad.value) from None
        values = np.column_stack([first, values])
        subjects = [str(r) for r in range(len(raw))]  # renumbered in _merge
        names = header
    if not names:
        raise DataFormatError(f"{path}: no item columns; expected one column per item")
    position = [k for k in range(len(header)) if not (has_ids and k == idc)]
    column = lambda c: f"{path} column {position[c] + 1}"  # noqa: E731
    if "" in names:
        raise DataFormatError(f"{column(names.index(''))}: empty column name; name every item "
                              f"column (or remove trailing delimiters)")
    for c, name in enumerate(names):
        if not name.isascii():  # ASCII names are valid text; the location only when needed
            check_id_text(name, "item", column(c))
    _check_unique(names, "item column", column)
    n = len(names)
    matrix = _check_support(values, kind, lambda k: f'{where(k // n)}, column "{names[k % n]}"')
    return _Parsed(matrix, subjects, names, where, lambda c: f'{path} column "{names[c]}"',
                   row_ids=not has_ids)


def _all_text(cells: list) -> bool:
    """Whether every non-empty cell is text that is not a number (then the column holds
    subject ids)."""
    text = [c for c in cells if c is not None and str(c).strip()]
    return bool(text) and all(isinstance(c, str) and not _is_number(c) for c in text)


def _is_number(text: str) -> bool:
    try:
        return not np.isnan(_parse_cell(text))
    except (ValueError, OverflowError):
        return False


def _check_unique(ids: list[str], what: str, where: Callable[[int], str]) -> None:
    seen: dict[str, int] = {}
    for k, key in enumerate(ids):
        if key in seen:
            raise DataFormatError(f"{where(k)}: duplicate {what} {key!r} (first at "
                                  f"{where(seen[key])}); ids must be unique, merge or rename them")
        seen[key] = k


class _JsonProblem(Exception):
    """A JSON line that parses but breaks a rule (a duplicate key)."""


def _pairs(pairs: list) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _JsonProblem(f"duplicate key {key!r} in one object; keep one value per key")
        seen.add(key)
    return dict(pairs)


def _json_int(text: str):
    return int(text) if len(text) < 300 else float(text)  # huge: inf, then a clear error


def _read_jsonl(path: Path, kind: str | None, budget: int) -> _Parsed:
    subjects, lines, rows, items = [], [], [], {}
    example = '{"subject_id": "model-a", "responses": {"q1": 1, "q2": 0}}'
    try:
        with _open_text(path) as f:
            for lineno, text in enumerate(f, 1):
                if not text.strip():
                    continue
                where = f"{path} line {lineno}"
                try:
                    record = json.loads(text, object_pairs_hook=_pairs, parse_int=_json_int)
                except json.JSONDecodeError as err:
                    raise DataFormatError(f"{where}: invalid JSON ({err.msg}, "
                                          f"column {err.colno}); each line must be like "
                                          f"{example}") from None
                except (_JsonProblem, ValueError, RecursionError) as err:
                    raise DataFormatError(f"{where}: {' '.join(str(err).split())[:200]}; each "
                                          f"line must be like {example}") from None
                if not (isinstance(record, dict) and "subject_id" in record
                        and isinstance(record.get("responses"), dict)):
                    raise DataFormatError(f"{where}: missing key \"subject_id\" "
                                          f"or \"responses\" (an object); each line must be "
                                          f"like {example}")
                if not isinstance(record["subject_id"], str):
                    raise DataFormatError(f"{where}: subject_id {record['subject_id']!r} is not "
                                          f"a string; write ids as JSON strings "
                                          f"(\"subject_id\": \"101\")")
                subject = check_id_text(record["subject_id"], "subject", where)
                responses = record["responses"]
                keys = [check_id_text(k, "item", f'{where}, item "{k}"') for k in responses]
                if len(set(keys)) != len(keys):
                    dup = next(k for k in keys if keys.count(k) > 1)
                    raise DataFormatError(f"{where}: item {dup!r} appears twice (after trimming "
                                          f"spaces); keep one response per item")
                try:
                    values = _parse_cells(list(responses.values()))
                except _BadCell as bad:
                    raise _bad_value(f'{where}, item "{keys[bad.index]}"', bad.value) from None
                rows.append((np.array([items.setdefault(k, len(items)) for k in keys], np.int64),
                             values))
                subjects.append(subject)
                lines.append(lineno)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise _cannot_read(path, err) from None
    if not subjects:
        raise DataFormatError(f"{path}: no records; expected one JSON object per line")
    names = list(items)
    where = lambda r: f"{path} line {lines[r]}"  # noqa: E731
    _check_unique(subjects, "subject_id", where)
    need = _wide_need(len(subjects), len(names))
    if need > budget:
        raise _over_budget(path, f"a table of {len(subjects):,} subjects x {len(names):,} items",
                           need, budget)
    values = np.full((len(subjects), len(names)), np.nan, np.float64)
    for r, (cols, vals) in enumerate(rows):
        values[r, cols] = vals
    n = len(names)
    matrix = _check_support(values, kind, lambda k: f'{where(k // n)}, item "{names[k % n]}"')
    return _Parsed(matrix, subjects, names, where, lambda c: f'{path} item "{names[c]}"')


def _long_column(path: Path, header: list[str], role: str) -> str:
    for name in header:
        if name.strip().lower() in _LONG_COLS[role]:
            return name
    raise DataFormatError(f"{path}: no {role} column (looked for {list(_LONG_COLS[role])}, "
                          f"found {header[:10]}); long format needs subject, item, response")


def _merge(parts: list[_Parsed]) -> _Parsed:
    """Merge per-file matrices by subject and item id; row-number ids continue across files."""
    offset = 0
    for part in parts:
        if part.row_ids:
            part.subjects = [str(offset + r) for r in range(len(part.subjects))]
            offset += len(part.subjects)
    if len(parts) == 1:
        return parts[0]
    subjects: dict[str, tuple[int, int]] = {}
    items: dict[str, tuple[int, int]] = {}
    for p, part in enumerate(parts):
        for r, sid in enumerate(part.subjects):
            subjects.setdefault(sid, (p, r))
        for c, name in enumerate(part.items):
            items.setdefault(name, (p, c))
    s_index, i_index = {s: k for k, s in enumerate(subjects)}, {i: k for k, i in enumerate(items)}
    matrix = np.full((len(subjects), len(items)), np.nan, np.float64)
    for part in parts:
        rows = np.array([s_index[s] for s in part.subjects])[:, None]
        cols = np.array([i_index[i] for i in part.items])[None, :]
        block, new = matrix[rows, cols], part.responses
        clash = ~np.isnan(block) & ~np.isnan(new) & (block != new)
        if clash.any():
            r, c = np.argwhere(clash)[0]
            raise DataFormatError(
                f'{part.where_subject(r)}, column "{part.items[c]}": got {fmt_value(new[r, c])} for '
                f"subject {part.subjects[r]!r}, but an earlier input file has {fmt_value(block[r, c])}; "
                f"keep one response per (subject, item)")
        matrix[rows, cols] = np.where(np.isnan(new), block, new)
    s_at, i_at = list(subjects.values()), list(items.values())
    return _Parsed(matrix, list(subjects), list(items),
                   lambda s: parts[s_at[s][0]].where_subject(s_at[s][1]),
                   lambda i: parts[i_at[i][0]].where_item(i_at[i][1]))


def _check_nonempty(parsed: _Parsed) -> None:
    """Raise if a subject (row) or an item (column) has no observed response."""
    observed = ~np.isnan(parsed.responses)
    for axis, what, ids, where in ((1, "subject", parsed.subjects, parsed.where_subject),
                                   (0, "item", parsed.items, parsed.where_item)):
        empty = np.flatnonzero(~observed.any(axis=axis))
        if empty.size:
            raise no_response_error(where(int(empty[0])), what, ids[int(empty[0])], empty.size)
