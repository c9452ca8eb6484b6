"""Wide tables (CSV, TSV, Parquet): a row per subject, a column per item.

A wide table's first column holds subject ids when its name is a known id name
(``ID_NAMES``) or empty (a pandas index) or every cell in it is text, unless it is a
pandas index of row numbers beside an id column (by name, or ``id_column``), which is then
dropped; a numeric first column under another name is ambiguous and an error until
``id_column`` names the id column (or ``"none"``: every column is an item, subjects
numbered by row). Several files are merged by subject and item id; a (subject, item)
answered differently in two files is an error.

Memory: the table is held; before reading, the size the file claims (CSV header width,
Parquet footer) is compared with the memory budget and a larger table is refused with an
error naming its size and the streaming long format.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from engine.data.formats.validate import (BadCell, as_stored, bad_value, cannot_read,
                                          check_id_column_type, check_id_text, check_support,
                                          check_unique, container_of, csv_rows, default_budget,
                                          delimiter_of, expand_inputs, fmt_value, header_width,
                                          no_response_error, open_text, over_budget, parse_cell,
                                          parse_cells, read_header, table_need, to_float,
                                          where_row)
from engine.data.kinds import detect_kind, kind_note
from engine.data.store import Store, write_store
from engine.errors import DataFormatError, SettingsError

__all__ = ["ID_NAMES", "NO_ID_COLUMN", "Parsed", "WideTable", "check_nonempty", "merge_tables",
           "write_tables"]

ID_NAMES = {"subject", "subject_id", "system", "model", "id", "name"}
NO_ID_COLUMN = "none"  # id_column value: a wide table without an id column (rows are numbered)


class WideTable:
    """Reader of wide tables (see the module doc)."""

    name = "wide"
    options = frozenset({"id_column"})

    def detect(self, path: Path) -> bool:
        """A CSV/TSV/Parquet file that is not in long format (tried after ``LongTable``)."""
        return path.is_file() and container_of(path) in ("csv", "tsv", "parquet")

    def ingest(self, inputs, out, *, kind: str | None = None,
               chunks: Sequence[int] = (1024, 8192), overwrite: bool = False,
               layout: str = "auto", memory_budget: int | None = None,
               id_column: str | None = None) -> Store:
        """Read wide ``inputs`` (files or folders) and write one store."""
        files = expand_inputs(inputs)
        budget = int(memory_budget or default_budget())
        check_widths(files, budget)
        parts = [_read_wide(path, kind, budget, id_column) for path in files]
        return write_tables(parts, files, out, kind=kind, chunks=chunks, overwrite=overwrite,
                            layout=layout, input_format=self.name)


def check_widths(files: list[Path], budget: int) -> None:
    """Refuse a CSV/TSV whose header alone is over ``budget``, before any header is parsed
    (a 10M-column header is 10M strings)."""
    for path in files:
        if container_of(path) in ("csv", "tsv"):
            width = header_width(path)
            if table_need(1, width) > budget:
                raise over_budget(path, f"a wide table of {width:,} columns",
                                  table_need(1, width), budget)


def write_tables(parts: list[Parsed], files: list[Path], out, *, kind: str | None, chunks,
                 overwrite: bool, layout: str, input_format: str) -> Store:
    """Merge parsed tables, check that every subject and item has a response, detect the kind
    and write the store."""
    parsed = merge_tables(parts)
    check_nonempty(parsed)
    kind = kind or detect_kind(parsed.responses)
    note = kind_note(parsed.responses, parsed.items, kind)  # before anything is written
    store = write_store(as_stored(parsed.responses, kind), parsed.subjects, parsed.items, out,
                        kind=kind, source=[str(p) for p in files], input_format=input_format,
                        chunks=chunks, overwrite=overwrite, layout=layout)
    return dataclasses.replace(store, notes=(note,)) if note else store


@dataclass
class Parsed:
    """One file (or all files, merged): float64 responses with NaN missing, ids, locators."""

    responses: np.ndarray
    subjects: list[str]
    items: list[str]
    where_subject: Callable[[int], str]
    where_item: Callable[[int], str]
    row_ids: bool = False  # wide files without an id column: subjects are row numbers


def _read_table(path: Path, columns: list[str] | None, string_cols: list[str]) -> pa.Table:
    try:
        if container_of(path) == "parquet":  # one file: not pq.read_table, whose dataset
            with pq.ParquetFile(path) as f:   # layer imports pandas (0.3 s of an ingest)
                return f.read(columns=columns)
        return pacsv.read_csv(
            path, parse_options=pacsv.ParseOptions(delimiter=delimiter_of(path)),
            convert_options=pacsv.ConvertOptions(
                include_columns=columns, strings_can_be_null=True,
                column_types={c: pa.string() for c in string_cols}))
    except pa.ArrowInvalid as err:
        if container_of(path) != "parquet":
            with open_text(path) as f:
                for _ in csv_rows(path, f):  # raises with the line number of a ragged row
                    pass
        raise DataFormatError(f"{path}: cannot parse it ({err}); check the file") from err
    except (OSError, pa.ArrowException) as err:
        raise cannot_read(path, err) from err


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


def _wide_parquet(path: Path, budget: int, idc: int, drop: Sequence[str] = ()
                  ) -> tuple[list[str], list, np.ndarray, Callable]:
    """``(header, ids, values, where)`` of a wide Parquet table whose column ``idc`` holds
    the ids, without the columns ``drop`` (a pandas index the ids are not read from)."""
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowException) as err:
        raise cannot_read(path, err) from None
    need = table_need(meta.num_rows, meta.num_columns)
    if need > budget:
        raise over_budget(path, f"a wide table of {meta.num_rows:,} rows x {meta.num_columns:,} "
                           f"columns (its Parquet footer)", need, budget)
    table = _read_table(path, None, [])
    if drop:
        table = table.drop(list(drop))
    header, where = [str(n) for n in table.column_names], (lambda r: where_row(path, r))
    values = np.empty((table.num_rows, len(header) - 1), np.float64, order="F")
    for j in range(len(header)):
        if j == idc:
            continue
        try:
            values[:, j - (j > idc)] = to_float(table.column(j))
        except BadCell as bad:
            raise bad_value(f'{where(bad.index)}, column "{header[j]}"', bad.value) from None
    check_id_column_type(path, header[idc], table.column(idc).type)
    raw = table.column(idc).to_pylist() if table.num_columns else []
    return header, raw, values, where


def _wide_csv(path: Path, budget: int, idc: int, skip_first: bool = False
              ) -> tuple[list[str], list, np.ndarray, Callable]:
    """``(header, ids, values, where)`` of a wide CSV whose column ``idc`` holds the ids;
    ``skip_first``: without its first column (a pandas index the ids are not read from;
    ``idc`` counts after it)."""
    raw, rows, lines = [], [], []
    try:
        with open_text(path) as f:
            records = csv_rows(path, f)
            if skip_first:
                records = ((line, cells[1:]) for line, cells in records)
            header = next(records, (0, None))[1]
            if not header:
                raise DataFormatError(f"{path}: file is empty; expected a header line")
            for line, cells in records:
                if table_need(len(rows) + 1, len(header)) > budget:
                    raise over_budget(path, f"a wide table of over {len(rows):,} rows x "
                                       f"{len(header):,} columns",
                                       table_need(len(rows) + 1, len(header)), budget)
                value_cells = cells[:idc] + cells[idc + 1:]
                try:
                    rows.append(parse_cells(value_cells))
                except BadCell as bad:
                    name = header[bad.index + (bad.index >= idc)]
                    raise bad_value(f'{path} line {line}, column "{name}"', bad.value) from None
                raw.append(cells[idc])
                lines.append(line)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise cannot_read(path, err) from None
    values = np.stack(rows) if rows else np.empty((0, len(header) - 1), np.float64)
    where = lambda r: f"{path} line {lines[r]}"  # noqa: E731
    return header, raw, values, where


def _csv_pandas_index(path: Path, header: list, id_column: str | None) -> bool:
    """Whether a wide CSV's first column is a pandas index (``DataFrame.to_csv``'s default:
    an unnamed first column of row numbers) that the ids are not read from: it is unnamed,
    every cell in it is a whole number, and ``--id-column`` names another column or,
    unnamed, the second column has an id name (``subject_id``). An unnamed first column of
    text holds the ids, whatever follows it."""
    names = [str(h).strip() for h in header]
    if len(names) < 2 or names[0] != "" or id_column == NO_ID_COLUMN:
        return False
    if id_column is not None and id_column.strip() == "":
        return False
    if id_column is None and names[1].lower() not in ID_NAMES:
        return False
    try:
        with open_text(path) as f:
            rows = csv_rows(path, f)
            next(rows, None)  # the header
            return all(cells and cells[0].strip().isdigit() for _, cells in rows)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise cannot_read(path, err) from None


def _id_index(path: Path, header: list[str], id_column: str | None) -> int:
    """Index of the (tentative) id column: the named one, else the first."""
    if id_column is None or id_column == NO_ID_COLUMN:
        return 0
    names = [str(h).strip() for h in header]
    if id_column.strip() not in names:
        raise SettingsError(f"{path}: no column {id_column!r} (--id-column); the header has "
                            f"{names[:10]}{' ...' if len(names) > 10 else ''}")
    return names.index(id_column.strip())


def _pandas_index(path: Path) -> tuple[list[str], list[str] | None]:
    """What a Parquet file written by pandas with its index (``DataFrame.to_parquet``'s
    default) says of it: ``(columns, None)`` where the index is stored as columns (pyarrow
    puts them last: ``model``, or ``__index_level_0__`` unnamed), ``([], ids)`` where a
    named integer range index is kept only in the file's metadata (``set_index("id")`` of
    consecutive numbers), ``([], None)`` otherwise (no pandas metadata, or the default
    unnamed range index: rows without ids)."""
    try:
        meta = pq.read_schema(path).pandas_metadata or {}
    except (OSError, pa.ArrowException, ValueError):
        return [], None
    index = meta.get("index_columns") or []
    columns = [c for c in index if isinstance(c, str)]
    if columns:
        return columns, None
    if len(index) == 1 and isinstance(index[0], dict) and index[0].get("kind") == "range" \
            and index[0].get("name") is not None:
        try:
            return [], [str(i) for i in range(int(index[0]["start"]), int(index[0]["stop"]),
                                              int(index[0]["step"]))]
        except (KeyError, TypeError, ValueError):
            return [], None
    return [], None


def _first_column_ids(path: Path, header: list[str]) -> bool:
    """Whether a wide Parquet table's first column holds the subject ids by the rule for any
    wide table: an id name, or every cell text (read alone)."""
    if header[0].strip().lower() in ID_NAMES | {""}:
        return True
    return _all_text(_read_table(path, [header[0]], []).column(0).to_pylist())


def _index_reading(path: Path, header: list[str]) -> tuple[str | None, list[str],
                                                           list[str] | None]:
    """How a wide Parquet table written by pandas reads its index, where ``--id-column``
    is not given: ``(id column, columns to drop, ids)``. The first column holds the ids
    where it would without the index (an id name, or all text), and stored index columns
    are then dropped (``__index_level_0__`` of a filtered frame is no item); otherwise the
    index is the ids: its column, or a named range kept in the metadata whose length is
    the table's."""
    columns, ids = _pandas_index(path)
    columns = [c for c in columns if c in header and c != header[0]]
    if (not columns and ids is None) or _first_column_ids(path, header):
        return None, columns, None
    if len(columns) > 1:
        raise DataFormatError(f"{path}: its pandas index has {len(columns)} levels "
                              f"({', '.join(columns)}); write one id column "
                              "(df.reset_index()) and pass --id-column")
    if columns:
        return columns[0], [], None
    try:
        rows = pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException) as err:
        raise cannot_read(path, err) from None
    return (NO_ID_COLUMN, [], ids) if len(ids) == rows else (None, [], None)


def _read_wide(path: Path, kind: str | None, budget: int, id_column: str | None) -> Parsed:
    parquet = container_of(path) == "parquet"
    header = [str(h) for h in read_header(path)] if parquet else None
    drop, index_ids, skip = [], None, False
    if parquet and id_column is None and header:  # pandas' index: the ids, or dropped
        id_column, drop, index_ids = _index_reading(path, header)
    elif parquet and header:  # the ids named (or none): an index stored as a column (a
        drop = [c for c in _pandas_index(path)[0]  # filtered frame's) is no item
                if c in header and (id_column == NO_ID_COLUMN or c != id_column.strip())]
    if parquet:
        idc = _id_index(path, [h for h in header if h not in drop], id_column)
        header, raw, values, where = _wide_parquet(path, budget, idc, drop)
    else:
        with_header = read_header(path)
        skip = _csv_pandas_index(path, with_header, id_column)
        if skip and id_column is None:  # pandas' index, then an id column: the ids are there
            id_column = str(with_header[1]).strip()
        idc = _id_index(path, with_header[1:] if skip else with_header, id_column)
        header, raw, values, where = _wide_csv(path, budget, idc, skip_first=skip)
    if not raw:
        raise DataFormatError(f"{path}: no rows; expected a header and one row per subject")
    header = [str(name).strip() for name in header]
    if id_column == NO_ID_COLUMN:
        has_ids = False
    elif id_column is not None:
        has_ids = True
    else:
        has_ids = header[0].lower() in ID_NAMES | {""} or _all_text(raw)  # "": pandas index
        if not has_ids:
            raise DataFormatError(
                f'{path} column 1 "{header[0]}": cannot tell subject ids from responses (it '
                f"holds numbers and its name is not one of {sorted(ID_NAMES)}); pass --id-column "
                f"{header[0]!r} if it holds subject ids, or --id-column {NO_ID_COLUMN} if every "
                f"column is an item (subjects are then numbered by row)")
    if has_ids:
        subjects = _id_list(raw, "subject", where)
        check_unique(subjects, "subject", where,
                     hint=" (a table of one row per response is long format: pass --format "
                          "long, and --columns subject=NAME,item=NAME,response=NAME where its "
                          "columns have other names)")
        names = header[:idc] + header[idc + 1:]
    else:
        try:
            first = parse_cells([c if isinstance(c, str) or c is None else float(c)
                                  for c in raw])
        except BadCell as bad:
            raise bad_value(f'{where(bad.index)}, column "{header[0]}"', bad.value) from None
        values = np.column_stack([first, values])
        subjects = [str(r) for r in range(len(raw))]  # renumbered in merge_tables
        names = header
        if index_ids is not None:  # a named pandas range index (of the table's length)
            subjects = index_ids
    if not names:
        raise DataFormatError(f"{path}: no item columns; expected one column per item")
    position = [k + skip for k in range(len(header)) if not (has_ids and k == idc)]
    column = lambda c: f"{path} column {position[c] + 1}"  # noqa: E731
    if "" in names:
        raise DataFormatError(f"{column(names.index(''))}: empty column name; name every item "
                              f"column (or remove trailing delimiters)")
    for c, name in enumerate(names):
        if not name.isascii():  # ASCII names are valid text; the location only when needed
            check_id_text(name, "item", column(c))
    check_unique(names, "item column", column)
    n = len(names)
    matrix = check_support(values, kind, lambda k: f'{where(k // n)}, column "{names[k % n]}"')
    return Parsed(matrix, subjects, names, where, lambda c: f'{path} column "{names[c]}"',
                   row_ids=not has_ids and index_ids is None)


def _all_text(cells: list) -> bool:
    """Whether every non-empty cell is text that is not a number (then the column holds
    subject ids)."""
    text = [c for c in cells if c is not None and str(c).strip()]
    return bool(text) and all(isinstance(c, str) and not _is_number(c) for c in text)


def _is_number(text: str) -> bool:
    try:
        return not np.isnan(parse_cell(text))
    except (ValueError, OverflowError):
        return False


def merge_tables(parts: list[Parsed]) -> Parsed:
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
    source = np.full(matrix.shape, -1, np.int16 if len(parts) < 2 ** 15 else np.int32)
    for p, part in enumerate(parts):
        rows = np.array([s_index[s] for s in part.subjects])[:, None]
        cols = np.array([i_index[i] for i in part.items])[None, :]
        block, new = matrix[rows, cols], part.responses
        clash = ~np.isnan(block) & ~np.isnan(new) & (block != new)
        if clash.any():
            r, c = np.argwhere(clash)[0]
            first = parts[source[rows[r, 0], cols[0, c]]]  # the file that gave the other value
            raise DataFormatError(
                f'{part.where_subject(r)}, column "{part.items[c]}": got {fmt_value(new[r, c])} for '
                f"subject {part.subjects[r]!r}, but an earlier input file has "
                f"{fmt_value(block[r, c])} ({first.where_subject(first.subjects.index(part.subjects[r]))}"
                f'); keep one response per (subject, item)')
        matrix[rows, cols] = np.where(np.isnan(new), block, new)
        source[rows, cols] = np.where(np.isnan(new), source[rows, cols], p)
    s_at, i_at = list(subjects.values()), list(items.values())
    return Parsed(matrix, list(subjects), list(items),
                   lambda s: parts[s_at[s][0]].where_subject(s_at[s][1]),
                   lambda i: parts[i_at[i][0]].where_item(i_at[i][1]))


def check_nonempty(parsed: Parsed) -> None:
    """Raise if a subject (row) or an item (column) has no observed response."""
    observed = ~np.isnan(parsed.responses)
    for axis, what, ids, where in ((1, "subject", parsed.subjects, parsed.where_subject),
                                   (0, "item", parsed.items, parsed.where_item)):
        empty = np.flatnonzero(~observed.any(axis=axis))
        if empty.size:
            raise no_response_error(where(int(empty[0])), what, ids[int(empty[0])], empty.size)
