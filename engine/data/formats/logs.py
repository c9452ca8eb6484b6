"""Evaluation logs -> response store, through the long-format path, streaming.

Pass 1 reads each file with its reader, checks each value (``validate.check_support``: finite,
storable, inside ``kind``; the error names file, line and field), codes subjects and items
and appends ``(subject, item, value, file, line)`` records to scratch files, a band of
subjects per file. Pass 2 loads one band at a time, finds the same model answering the same
item more than once (an error naming both lines, unless ``keep`` is ``first``, ``latest``
or ``mean``; runs are in the reader's run order) and writes the resolved observations to a
scratch long-format Parquet file, which ``ingest_long`` validates and writes as the store.
Items are described as they first appear (``item_info``: file, line, sample hash, a hash
of the input, metadata), streamed to a side table that goes into the store with it.
Memory is a chunk of records plus one band (within half of ``memory_budget``), whatever the
number of files; what each phase frees goes back to the system before the next.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.data.formats.base import LogReader
from engine.data.formats.item_info import ITEM_INFO, ItemTable
from engine.data.formats.long import (DEFAULT_BUDGET, append_by_band, band_file, ingest_long,
                                      release_memory)
from engine.data.formats.validate import check_support, fmt_value
from engine.data.store import Store, check_writable
from engine.errors import DataFormatError, SettingsError

__all__ = ["KEEP", "ingest_logs"]

KEEP = ("first", "latest", "mean")
_REC = np.dtype([("s", "<i4"), ("i", "<i4"), ("v", "<f8"), ("f", "<i4"), ("r", "<i8")])
_PER_RECORD = 96  # a record read back plus sorting temporaries and the Parquet batch
_MAX_BANDS = 256


def ingest_logs(reader: LogReader, inputs: Sequence[str | Path], out: str | Path, *,
                kind: str | None = None, chunks: Sequence[int] = (1024, 8192),
                overwrite: bool = False, layout: str = "auto",
                memory_budget: int | None = None, metric: Sequence[str] | None = None,
                keep: str | None = None) -> Store:
    """Read evaluation logs with ``reader`` and write one response store (see the module doc).

    Raises
    ------
    DataFormatError
        A malformed line, a missing metric, a bad value or an unresolved duplicate, naming the
        file, line and field.
    SettingsError
        ``keep`` is not one of ``KEEP``.
    """
    if keep is not None and keep not in KEEP:
        raise SettingsError(f"keep={keep!r}; use one of {', '.join(KEEP)} (--keep)")
    if isinstance(metric, str):
        metric = metric.split(",")
    metric = tuple(m.strip() for m in (metric or ()) if m.strip()) or reader.default_metric
    out = check_writable(out, overwrite)
    files = reader.files([Path(p) for p in inputs])
    budget = int(memory_budget or DEFAULT_BUDGET)
    total = sum(p.stat().st_size * (8 if p.suffix.lower() == ".gz" else 1) for p in files)
    # a band within half the budget: the other half for the id maps and what a pass leaves
    bands = int(min(_MAX_BANDS, max(1, -(-(total // 64) * _PER_RECORD // (budget // 2)))))
    scratch = out.parent / f".{out.name}.logs-{secrets.token_hex(6)}"
    scratch.mkdir(parents=True)
    try:
        table = ItemTable(scratch / ITEM_INFO)
        try:
            subjects, items, groups = _spill(reader, files, metric, kind, bands, scratch, table)
            if hasattr(reader, "finish"):  # checks that need every file read
                reader.finish(files)
        finally:
            item_table = table.close()
        release_memory()  # what reading the logs freed, before the bands
        long_file = scratch / "responses.parquet"
        _resolve(files, subjects, items, bands, scratch, long_file, keep, kind,
                 getattr(reader, "unit", "line"))
        release_memory()
        return ingest_long([long_file], out, kind=kind, chunks=chunks, overwrite=overwrite,
                           layout=layout, memory_budget=memory_budget,
                           source=[str(p) for p in files], input_format=reader.name,
                           item_groups=dict(zip(items, groups)),
                           side_files={ITEM_INFO: item_table} if item_table else None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _spill(reader: LogReader, files: list[Path], metric: tuple[str, ...], kind: str | None,
           bands: int, scratch: Path, table: ItemTable) -> tuple[dict, dict, list]:
    subjects: dict[str, int] = {}
    items: dict[str, int] = {}
    groups: list[str] = []
    handles: dict[int, object] = {}
    try:
        for k, path in enumerate(files):
            new_items: list[tuple[str, str, int]] = []  # (item, group, line) first seen here
            for rec in reader.read(path, metric):
                if np.isnan(rec.values).any():  # JSON NaN: a log holds no missing responses
                    r = int(np.argmax(np.isnan(rec.values)))
                    raise DataFormatError(f"{rec.where(r)}: got NaN; expected a number (leave "
                                          f"the sample out of the log if it has no score)")
                values = check_support(rec.values, kind, rec.where)
                s = _codes(subjects, rec.subject_ids)[rec.subject]
                before = len(items)
                codes = _codes(items, rec.item_ids, rec.item_groups, groups)
                if codes.size and codes.max() >= before:
                    new_items += _first_seen(rec, codes, before)
                i = codes[rec.item]
                out = np.empty(len(values), _REC)
                out["s"], out["i"], out["v"], out["f"], out["r"] = s, i, values, k, rec.lines
                append_by_band(out, out["s"] % bands, scratch, handles)
            if new_items:
                table.add(_item_rows(reader, path, new_items))
    finally:
        for f in handles.values():
            f.close()
    if not subjects:
        raise DataFormatError(f"{', '.join(map(str, files))}: no responses in these files; "
                              f"expected one line per (model, sample)")
    return subjects, items, groups


def _first_seen(rec, codes: np.ndarray, before: int) -> list[tuple[str, str, int]]:
    """``(item id, group, line)`` of the chunk's items that are new (code >= ``before``), at
    the first line that shows each."""
    distinct, first = np.unique(rec.item, return_index=True)
    return [(rec.item_ids[j], rec.item_groups[j], int(rec.lines[r]))
            for j, r in zip(distinct.tolist(), first.tolist()) if codes[j] >= before]


def _item_rows(reader, path: Path, new_items: list[tuple[str, str, int]]) -> list[dict]:
    """Side-table rows (``item_info``) of the items first seen in ``path``."""
    info = getattr(reader, "item_info", None)
    found = info(path, [line for _, _, line in new_items]) if info else {}
    return [{"item": item, "group": group, "file": str(path), "line": line,
             **found.get(line, {})} for item, group, line in new_items]


def _codes(codes: dict, ids: list[str], new_groups: list[str] | None = None,
           groups: list[str] | None = None) -> np.ndarray:
    """Global int32 codes of a chunk's ids, adding new ones (and their groups)."""
    out = np.empty(len(ids), np.int32)
    for k, x in enumerate(ids):
        code = codes.setdefault(x, len(codes))
        if groups is not None and code == len(groups):
            groups.append(new_groups[k])
        out[k] = code
    return out


def _resolve(files: list[Path], subjects: dict, items: dict, bands: int, scratch: Path,
             long_file: Path, keep: str | None, kind: str | None, unit: str) -> None:
    subject_ids = pa.array(list(subjects), pa.string())
    item_ids = pa.array(list(items), pa.string())
    N = len(items)
    schema = pa.schema([("subject", pa.string()), ("item", pa.string()),
                        ("response", pa.float64())])
    with pq.ParquetWriter(long_file, schema) as writer:
        for b in range(bands):
            path = band_file(scratch, b)
            if not path.exists():
                continue
            release_memory()  # the last band's arrays, before this one's
            rec = np.fromfile(path, _REC)
            path.unlink()
            key = rec["s"].astype(np.int64) * N + rec["i"]
            order = np.lexsort((rec["r"], rec["f"], key))  # by key, then run order
            rec, key = rec[order], key[order]
            start = np.r_[True, key[1:] != key[:-1]]
            end = np.r_[key[1:] != key[:-1], True]
            if not start.all():
                if keep is None:
                    raise _duplicate(files, subject_ids, item_ids, rec, start, unit)
                if keep == "first":
                    values, rows = rec["v"][start], rec[start]
                elif keep == "latest":
                    values, rows = rec["v"][end], rec[end]
                else:
                    group = np.cumsum(start) - 1
                    values = np.bincount(group, rec["v"]) / np.bincount(group)
                    rows = rec[start]
                    if kind == "binary" and not np.isin(values, (0, 1)).all():
                        g = int(np.argmax(~np.isin(values, (0, 1))))
                        raise DataFormatError(
                            f"--keep mean: model {subject_ids[int(rows['s'][g])].as_py()!r}, item "
                            f"{item_ids[int(rows['i'][g])].as_py()!r} averages to "
                            f"{fmt_value(values[g])}, not binary; drop --kind binary (the mean "
                            f"is a unit score) or use --keep first|latest")
            else:
                values, rows = rec["v"], rec
            writer.write_table(pa.table({
                "subject": subject_ids.take(pa.array(rows["s"])),
                "item": item_ids.take(pa.array(rows["i"])),
                "response": pa.array(values, pa.float64())}, schema=schema))


def _duplicate(files, subject_ids, item_ids, rec, start, unit) -> DataFormatError:
    g = int(np.argmin(start))  # the second record of the first duplicated key
    first, again = rec[g - 1], rec[g]
    return DataFormatError(
        f"{files[again['f']]} {unit} {again['r']}: model {subject_ids[int(again['s'])].as_py()!r} "
        f"answered item {item_ids[int(again['i'])].as_py()!r} again ({fmt_value(again['v'])} "
        f"here, {fmt_value(first['v'])} at {files[first['f']]} {unit} {first['r']}); the same "
        f"model evaluated twice on a sample: pass --keep first|latest|mean to say which to use, "
        f"or remove one run")
