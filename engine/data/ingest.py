"""Read response files of any input format, validate them, and write one response store.

``ingest`` picks the reader (``engine.data.formats``: one module per format behind
``InputFormat``, sharing ``formats.validate`` for values, ids and errors), detecting the
format when it is not given. Formats: "wide" (CSV/Parquet, a row per subject, a column per
item), "long" (CSV/Parquet or a folder of them, columns subject, item, response; streamed
in bounded memory by ``engine.data.formats.long``), "jsonl" (py-irt lines
``{"subject_id": ..., "responses": {item: value}}``) and the evaluation logs
(``every-eval-ever``, ``lm-eval``, ``helm``, ``inspect``). Locations in error messages are
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
name is a known id name (``formats.wide.ID_NAMES``) or empty (a pandas index) or every cell in it is
text; a numeric first column under another name is ambiguous and an error until
``id_column`` names the id column (or ``"none"``: every column is an item).

Memory: the wide and jsonl readers hold the table; before reading they compare the size
the file (Parquet footer, CSV header) claims with ``memory_budget`` and refuse with an error
naming the size; long input and logs are streamed (``engine.data.formats.long``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.data.formats import FORMATS, LOG_FORMATS, detect_format, input_format
from engine.data.formats.validate import check_id_text, default_budget
from engine.data.formats.wide import NO_ID_COLUMN, check_widths
from engine.data.store import KINDS, LAYOUTS, Store, check_writable
from engine.errors import DataFormatError, SettingsError

__all__ = ["FORMATS", "NO_ID_COLUMN", "check_id_text", "default_budget", "ingest"]


def ingest(inputs: str | Path | Sequence[str | Path], out: str | Path, *, fmt: str | None = None,
           kind: str | None = None, chunks: Sequence[int] = (1024, 8192),
           overwrite: bool = False, layout: str = "auto",
           memory_budget: int | None = None, id_column: str | None = None,
           metric: Sequence[str] | None = None, keep: str | None = None,
           filters: str | Sequence[str] | None = None,
           columns: dict[str, str] | None = None) -> Store:
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
    filters : optional
        lm-eval logs only: the filters to keep (e.g. ``"strict-match"``); by default each
        filter's scoring of a document is its own item.
    columns : dict, optional
        Long input: the columns that hold the roles whose columns are not named ``subject``
        / ``subject_id``, ``item`` / ``item_id`` and ``response``, e.g.
        ``{"subject": "system", "item": "seg_id", "response": "score"}``; given, the input
        is read as long.

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
    if columns is not None:
        columns = check_long_columns(columns)
        fmt = fmt or "long"  # naming a long table's columns says it is one
    inputs = _paths(inputs)
    check_writable(out, overwrite)
    given = {"id_column": id_column, "metric": metric, "keep": keep, "filters": filters,
             "columns": columns}
    given = {k: v for k, v in given.items() if v is not None and v != [] and v != ()}
    if fmt not in LOG_FORMATS:  # before any header is parsed: 10M columns are 10M strings
        check_widths(_table_files(inputs), int(memory_budget or default_budget()))
    reader = input_format(fmt or detect_format(inputs))
    extra = sorted(set(given) - reader.options)
    if extra:
        raise _option_error(extra, reader.name)
    return reader.ingest(inputs, out, kind=kind, chunks=chunks, overwrite=overwrite,
                         layout=layout, memory_budget=memory_budget, **given)


def _paths(inputs) -> list:
    """``inputs`` as a list of paths (str or path-like): one path, or any iterable of them. A
    matrix in memory (a DataFrame, a numeric array) is refused with what to call instead."""
    if isinstance(inputs, (str, os.PathLike)):
        return [inputs]
    matrix = (type(inputs).__module__.startswith("pandas") or
              (isinstance(inputs, np.ndarray) and inputs.dtype.kind not in "USO"))
    items = None if matrix else list(inputs) if hasattr(inputs, "__iter__") else None
    if items is None or not all(isinstance(i, (str, os.PathLike)) for i in items):
        raise SettingsError(f"inputs: file or folder paths; got {type(inputs).__name__}. A matrix "
                            f"in memory is fitted as it is (engine.fit(array or DataFrame)), or "
                            f"stored with engine.write_store(y, subjects, items, path)")
    return items


def _table_files(inputs: list) -> list[Path]:
    """The table files among ``inputs`` (folders of logs hold none that matter here)."""
    files = []
    for path in map(Path, inputs):
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in sorted(path.iterdir()) if p.is_file()
                      and not p.name.startswith((".", "_"))]
    return files


def check_long_columns(columns) -> dict[str, str]:
    """``columns`` (role -> column name) checked: roles among subject, item and response,
    each a non-empty name, no column named for two roles."""
    roles = ("subject", "item", "response")
    if not isinstance(columns, dict):
        raise SettingsError(f"columns={columns!r}: give a dict of role -> column name, roles "
                            f"{', '.join(roles)} (--columns subject=NAME,item=NAME,...)")
    unknown = sorted(set(columns) - set(roles))
    if unknown:
        raise SettingsError(f"--columns: unknown role(s) {unknown}; the roles are "
                            f"{', '.join(roles)}, e.g. --columns subject=system,item=seg_id")
    out = {}
    for role, name in columns.items():
        if not isinstance(name, str) or not name.strip():
            raise SettingsError(f"--columns {role}=: give the name of the column that holds "
                                f"the {role}s")
        out[role] = name.strip()
    twice = sorted({n for n in out.values() if list(out.values()).count(n) > 1})
    if twice:
        raise SettingsError(f"--columns: column {twice[0]!r} is named for two roles; each "
                            f"role needs its own column")
    return out


def _option_error(extra: list[str], name: str) -> SettingsError:
    if "columns" in extra:
        return SettingsError(f"columns (--columns) applies to long input only; this input is "
                             f"{name}: drop the option, or pass --format long if it is a long "
                             f"table")
    if "id_column" in extra:
        return SettingsError(f"id_column (--id-column) applies to wide input only; this input "
                             f"is {name}: drop the option")
    if "filters" in extra:
        return SettingsError(f"--filter applies to lm-eval logs only; this input is {name}: "
                             f"drop it")
    return SettingsError(f"--metric and --keep apply to evaluation logs (formats "
                         f"{', '.join(LOG_FORMATS)}) only; this input is {name}: drop them")


