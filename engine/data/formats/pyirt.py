"""py-irt JSON lines: one subject per line, ``{"subject_id": ..., "responses": {item: value}}``.

Ids are JSON strings (a number, list or object is an error); a key repeated inside one
object, an item repeated after trimming spaces and a repeated subject are errors naming the
line. The table is held in memory: its size is compared with the memory budget once the
ids are known, before the matrix is allocated.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.data.formats.validate import (BadCell, bad_value, cannot_read, check_id_text,
                                          check_support, check_unique, container_of,
                                          default_budget, expand_inputs, open_text, over_budget,
                                          parse_cells, table_need)
from engine.data.formats.wide import Parsed, write_tables
from engine.data.store import Store
from engine.errors import DataFormatError

__all__ = ["PyIrtJsonl"]


class PyIrtJsonl:
    """Reader of py-irt ``.jsonl`` files (see the module doc)."""

    name = "jsonl"
    options = frozenset()

    def detect(self, path: Path) -> bool:
        return path.is_file() and container_of(path) == "jsonl"

    def ingest(self, inputs, out, *, kind: str | None = None,
               chunks: Sequence[int] = (1024, 8192), overwrite: bool = False,
               layout: str = "auto", memory_budget: int | None = None) -> Store:
        """Read py-irt ``inputs`` (files or folders) and write one store."""
        files = expand_inputs(inputs)
        budget = int(memory_budget or default_budget())
        parts = [_read_jsonl(path, kind, budget) for path in files]
        return write_tables(parts, files, out, kind=kind, chunks=chunks, overwrite=overwrite,
                            layout=layout, input_format=self.name)


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


def _read_jsonl(path: Path, kind: str | None, budget: int) -> Parsed:
    subjects, lines, rows, items = [], [], [], {}
    example = '{"subject_id": "model-a", "responses": {"q1": 1, "q2": 0}}'
    try:
        with open_text(path) as f:
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
                    values = parse_cells(list(responses.values()))
                except BadCell as bad:
                    raise bad_value(f'{where}, item "{keys[bad.index]}"', bad.value) from None
                rows.append((np.array([items.setdefault(k, len(items)) for k in keys], np.int64),
                             values))
                subjects.append(subject)
                lines.append(lineno)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise cannot_read(path, err) from None
    if not subjects:
        raise DataFormatError(f"{path}: no records; expected one JSON object per line")
    names = list(items)
    where = lambda r: f"{path} line {lines[r]}"  # noqa: E731
    check_unique(subjects, "subject_id", where)
    need = table_need(len(subjects), len(names))
    if need > budget:
        raise over_budget(path, f"a table of {len(subjects):,} subjects x {len(names):,} items",
                           need, budget)
    values = np.full((len(subjects), len(names)), np.nan, np.float64)
    for r, (cols, vals) in enumerate(rows):
        values[r, cols] = vals
    n = len(names)
    matrix = check_support(values, kind, lambda k: f'{where(k // n)}, item "{names[k % n]}"')
    return Parsed(matrix, subjects, names, where, lambda c: f'{path} item "{names[c]}"')
