"""Validation and error helpers every input reader shares (tables and evaluation logs).

Values are parsed to float64 and checked against the response kind before the one
narrowing cast (``check_support``, ``as_stored``); ids are stripped text, never empty, valid
UTF-8 (``check_id_text``); every error is a ``DataFormatError`` naming file, line/row,
column or field, the value and the fix. Locations are ``line N`` for CSV/jsonl (the CSV
header is line 1) and ``row index N`` (0-based) for Parquet. The memory helpers
(``table_need``, ``over_budget``) let a reader refuse a table before allocating it.
"""

from __future__ import annotations

import csv
import decimal
import gzip
import io
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.data.arrow import to_numbers
from engine.errors import DataFormatError
from engine.memory import size_text

__all__ = ["BadCell", "CELL_BYTES", "ID_BYTES", "LONG_COLS", "as_stored", "bad_value",
           "cannot_read", "cell_text", "check_id_column_type", "is_text_type", "check_id_text", "check_support",
           "check_unique", "container_of", "csv_rows", "default_budget", "delimiter_of",
           "expand_inputs", "fmt_value", "header_width", "long_column", "no_response_error",
           "open_text", "over_budget", "parse_cell", "parse_cells", "read_header", "size_text",
           "table_need", "to_float", "to_numbers", "where_row"]

LONG_COLS = {"subject": ("subject", "subject_id"), "item": ("item", "item_id"),
             "response": ("response",)}
_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet",
             ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_EXPECTED = "a number (0/1, a score in [0, 1] or an error >= 0), or empty for missing"
_SUPPORT = {"binary": "0 or 1", "unit": "a score in [0, 1]", "nonnegative": "an error >= 0"}
_NULLS = {"", "na", "n/a", "nan", "null", "none"}
# Bytes a table costs in memory while it is read and written: a float64 cell parsed, a
# copy while stacking; each id about 300 bytes (Python strings, lists, the store's id array:
# measured 295 bytes per item ingesting a 1 x 1,000,000 wide CSV).
CELL_BYTES, ID_BYTES = 16, 300
_F32_MAX = float(np.finfo(np.float32).max)


class BadCell(Exception):
    """A cell that is not a number: its index in the parsed list and its raw value."""

    def __init__(self, index: int, value: object):
        super().__init__(index, value)
        self.index, self.value = index, value


def default_budget() -> int:
    """Half the memory the machine has available now (at least 256 MiB)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return max(256 << 20, available // 2)


def over_budget(path: Path, what: str, need: float, budget: int) -> DataFormatError:
    return DataFormatError(
        f"{path}: {what} needs about {size_text(need)} in memory to ingest, over the memory budget "
        f"of {size_text(budget)}; write it in long format (subject,item,response rows, which ingest "
        f"streams in bounded memory) or raise --memory-budget")


def table_need(rows: int, cols: int) -> float:
    """Bytes a rows x cols table takes while read and written (``CELL_BYTES``, ``ID_BYTES``)."""
    return float(rows) * cols * CELL_BYTES + (float(rows) + cols) * ID_BYTES


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


def container_of(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return _SUFFIXES.get(suffixes[-1]) if suffixes else None


def expand_inputs(inputs: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    files: list[Path] = []
    for path in map(Path, items):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
            if not found:
                raise DataFormatError(f"{path}: folder has no input files")
            for p in found:
                if p.is_dir() or container_of(p) is None:
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


def open_text(path: Path) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def read_header(path: Path) -> list[str]:
    try:
        if container_of(path) == "parquet":
            return pq.read_schema(path).names
        with open_text(path) as f:
            header = next(csv.reader(f, delimiter=delimiter_of(path)), None)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pa.ArrowException) as err:
        raise cannot_read(path, err) from None
    if not header:
        raise DataFormatError(f"{path}: file is empty; expected a header line")
    return header


def cannot_read(path: Path, err: Exception,
                fix: str = "check the file and its format") -> DataFormatError:
    """The error for a file that cannot be read or decoded (``err`` shortened)."""
    text = " ".join(str(err).split())[:200] or type(err).__name__
    return DataFormatError(f"{path}: cannot read it ({text}); {fix}")


def delimiter_of(path: Path) -> str:
    return "\t" if container_of(path) == "tsv" else ","


def where_row(path: Path, row: int) -> str:
    return f"{path} row index {row}" if container_of(path) == "parquet" else f"{path} line {row + 2}"


def csv_rows(path: Path, f: io.TextIOBase):
    """Yield ``(line_number, cells)`` for the header and each non-blank record, checking widths."""
    reader, width = csv.reader(f, delimiter=delimiter_of(path)), None
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


def parse_cell(value: object) -> float:
    if value is None:
        return np.nan
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _NULLS:
            return np.nan
        return float(text == "true") if text in ("true", "false") else float(text)
    if isinstance(value, (bool, int, float, np.number, decimal.Decimal)):
        return float(value)  # a Decimal as its nearest float, as text is read
    raise TypeError(f"not a number: {value!r}")


def parse_cells(cells: list) -> np.ndarray:
    """float64 values (NaN for missing); raises ``BadCell`` at the first non-number."""
    try:
        table = {value: parse_cell(value) for value in set(cells)}  # few distinct values: fast
        return np.fromiter(map(table.__getitem__, cells), np.float64, count=len(cells))
    except (ValueError, TypeError, KeyError, OverflowError):
        for k, value in enumerate(cells):
            try:
                parse_cell(value)
            except (ValueError, TypeError, OverflowError):
                raise BadCell(k, value) from None
        return np.array([parse_cell(value) for value in cells], np.float64)  # NaN keys


def to_float(col: pa.ChunkedArray) -> np.ndarray:
    """float64 values of an Arrow column, NaN for missing; raises ``BadCell``."""
    kind = col.type
    if pa.types.is_null(kind):
        return np.full(len(col), np.nan, np.float64)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return to_numbers(col)  # nulls -> NaN
    if is_text_type(kind) or pa.types.is_decimal(kind):  # text, or Parquet's DECIMAL
        return parse_cells(col.to_pylist())
    if pa.types.is_dictionary(kind):  # pandas' categoricals: their values, cell by cell
        return to_float(col.cast(kind.value_type))
    values = col.to_pylist()  # another type (a date, a list): its first cell as the file holds it
    first = next((k for k, v in enumerate(values) if v is not None), 0)
    raise BadCell(first, values[first] if values else f"<column of type {kind}>")


def no_response_error(where: str, what: str, ident, count: int) -> DataFormatError:
    """The error for a subject or item with no observed response (``count`` such ids)."""
    more = f" (and {count - 1} more)" if count > 1 else ""
    return DataFormatError(f"{where}: {what} {ident!r} has no observed response{more}; drop that "
                           f"{what} from the input, it carries no information")


def check_support(values: np.ndarray, kind: str | None,
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


def cell_text(value: object) -> str:
    """A table cell as an error message shows it: text quoted, a number as written (a NumPy
    scalar's repr, ``np.float64(1.5)``, is not what the file holds)."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return fmt_value(value)
    return repr(value)


def bad_value(where: str, value: object) -> DataFormatError:
    return DataFormatError(f"{where}: got {value!r}; expected {_EXPECTED}")


def is_text_type(kind: pa.DataType) -> bool:
    """Whether an Arrow type holds text: string, large_string or string_view."""
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        pa.types.is_string_view(kind)


def check_id_column_type(path: Path, name: str, kind: pa.DataType) -> None:
    """Raise unless an Arrow id column holds text or integers."""
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (is_text_type(value) or pa.types.is_integer(value) or pa.types.is_null(value)):
        raise DataFormatError(f'{path} column "{name}": ids of type {kind}; store ids as text '
                              f"(or integers), one per row")


def check_unique(ids: list[str], what: str, where: Callable[[int], str], hint: str = "") -> None:
    """Refuse a repeated id, naming both places; ``hint`` ends the message."""
    seen: dict[str, int] = {}
    for k, key in enumerate(ids):
        if key in seen:
            raise DataFormatError(f"{where(k)}: duplicate {what} {key!r} (first at "
                                  f"{where(seen[key])}); ids must be unique, merge or rename "
                                  f"them{hint}")
        seen[key] = k


def long_column(path: Path, header: list[str], role: str, named: str | None = None) -> str:
    """The column of ``header`` that holds ``role`` (subject, item or response) in a long
    table: ``named`` where given (``--columns``), else the first with a known name."""
    if named is not None:
        for name in header:
            if name.strip() == named.strip():
                return name
        raise DataFormatError(f"{path}: no column {named!r} (--columns {role}={named}); its "
                              f"header has {[str(h) for h in header[:10]]}"
                              f"{' ...' if len(header) > 10 else ''}")
    for name in header:
        if name.strip().lower() in LONG_COLS[role]:
            return name
    raise DataFormatError(f"{path}: no {role} column (looked for {list(LONG_COLS[role])}, "
                          f"found {header[:10]}); long format needs subject, item and response "
                          f"columns: name the ones that hold them with --columns "
                          f"subject=NAME,item=NAME,response=NAME (library: columns={{...}})")


def header_width(path: Path) -> int:
    """Fields in the first line, counted on the raw bytes (an upper bound: quoted delimiters
    count too), without building the header in memory."""
    sep, width = delimiter_of(path).encode(), 1
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
        raise cannot_read(path, err) from None
