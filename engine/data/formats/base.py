"""The interface every evaluation-log reader implements, and the helpers they share.

A reader turns one input file into chunks of ``Records``: per response its subject (the
model), item, item group (the evaluation or task) and value, with the file line it came
from, so every later error (a bad value, a duplicate) names file and line. Readers only
parse and check their own fields; ``engine.data.formats.logs`` checks values, resolves
duplicates and feeds the records to the long-format store path.
"""

from __future__ import annotations

import gzip
import io
import json
import mmap
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from engine.data.formats.validate import cannot_read as _cannot_read
from engine.data.formats.validate import check_id_text
from engine.errors import DataFormatError

if TYPE_CHECKING:
    from engine.data.store import Store

__all__ = ["CHUNK_ROWS", "InputFormat", "LogFormat", "LogReader", "RecordBuffer", "Records",
           "cannot_read", "first_json", "is_jsonl", "json_at_lines", "json_lines", "pick_metric",
           "plain_lines", "text_id", "walk_files"]

CHUNK_ROWS = 1 << 16


@dataclass
class Records:
    """Responses read from one file, ids dictionary-coded: response ``r`` is subject
    ``subject_ids[subject[r]]`` on item ``item_ids[item[r]]`` (of group ``item_groups[...]``)
    with value ``values[r]`` from line ``lines[r]`` of ``path``."""

    path: Path
    field: str  # the field the values came from, for error messages
    subject_ids: list[str]
    subject: np.ndarray  # int64 codes
    item_ids: list[str]
    item_groups: list[str]
    item: np.ndarray  # int64 codes
    values: np.ndarray  # float64
    lines: np.ndarray  # int64, 1-based line (or ``unit``) in ``path``
    unit: str = "line"

    def where(self, r: int) -> str:
        return f'{self.path} {self.unit} {int(self.lines[r])}, field "{self.field}"'


@dataclass
class RecordBuffer:
    """Collects responses of one file line by line and hands them out as ``Records``."""

    path: Path
    field: str
    subjects: dict = field(default_factory=dict)
    items: dict = field(default_factory=dict)
    groups: list = field(default_factory=list)
    s: list = field(default_factory=list)
    i: list = field(default_factory=list)
    values: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    unit: str = "line"

    def add(self, subject: str, item: str, group: str, value: float, line: int) -> None:
        self.s.append(self.subjects.setdefault(subject, len(self.subjects)))
        code = self.items.setdefault(item, len(self.items))
        if code == len(self.groups):
            self.groups.append(group)
        self.i.append(code)
        self.values.append(value)
        self.lines.append(line)

    def full(self) -> bool:
        return len(self.values) >= CHUNK_ROWS

    def take(self) -> Records | None:
        if not self.values:
            return None
        out = Records(self.path, self.field, list(self.subjects), np.asarray(self.s, np.int64),
                      list(self.items), self.groups, np.asarray(self.i, np.int64),
                      np.asarray(self.values, np.float64), np.asarray(self.lines, np.int64),
                      self.unit)
        self.subjects, self.items, self.groups = {}, {}, []
        self.s, self.i, self.values, self.lines = [], [], [], []
        return out


class InputFormat(Protocol):
    """One input format, table or log: what ``ingest --format NAME`` picks.

    ``name`` is its ``--format`` name and ``options`` the format-specific ingest options it
    takes (``id_column``, ``metric``, ``keep``); ``detect`` says whether a path holds it and
    ``ingest`` writes a store from input paths with the common options (``kind``,
    ``chunks``, ``overwrite``, ``layout``, ``memory_budget``) and its own.
    """

    name: str
    options: frozenset[str]

    def detect(self, path: Path) -> bool:
        """Whether ``path`` (a file, or a folder for logs) holds input of this format."""

    def ingest(self, inputs: Sequence[Path], out: Path, **options) -> Store:
        """Read ``inputs`` and write the store ``out``; raises ``DataFormatError``."""


class LogFormat:
    """The ``InputFormat.ingest`` of every evaluation-log reader: ``logs.ingest_logs``."""

    options = frozenset({"metric", "keep"})

    def ingest(self, inputs: Sequence[Path], out: Path, **options) -> Store:
        from engine.data.formats.logs import ingest_logs

        return ingest_logs(self, inputs, out, **options)

    def one_metric(self, group: str, name: str, where: str) -> None:
        """Every response of an item group (a task) is read from one metric: the first
        response read sets it, and one read from another (``--metric``'s first choice
        missing or null there, so a later one was taken) is refused naming both places.
        Mixed, a task's cells would compare one model's ``acc_norm`` with another's ``acc``."""
        chosen = self.__dict__.setdefault("_metric_of_group", {})
        first, at = chosen.setdefault(group, (name, where))
        if first != name:
            raise DataFormatError(
                f"{where}: task {group!r} reads metric {name!r} here, but {first!r} at {at}; "
                f"a task's responses come from one metric: give this response a {first!r} "
                f"value, or pass --metric with one metric every response of the task holds")


class LogReader(InputFormat, Protocol):
    """One evaluation-log format.

    ``name`` is its ``--format`` name; ``metrics`` the value fields ``--metric`` may pick
    (``None``: any name the files carry).
    """

    name: str
    default_metric: tuple[str, ...]

    def detect(self, path: Path) -> bool:
        """Whether ``path`` (a file or a folder) holds logs of this format."""

    def files(self, paths: Sequence[Path]) -> list[Path]:
        """The files to read under ``paths``, in run order (earliest first: ``--keep``)."""

    def read(self, path: Path, metric: tuple[str, ...]) -> Iterator[Records]:
        """Records of one file, in chunks; raises ``DataFormatError`` naming file and line."""

    # Optional: ``item_info(path, lines) -> {line: item_info.describe_sample(...)}``, what
    # the format carries about the samples first seen at those lines of ``path`` (read only
    # for files that bring new items).


def _open(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def cannot_read(path: Path, err: Exception) -> DataFormatError:
    """``validate.cannot_read`` for a log file: the fix is to check or remove it."""
    return _cannot_read(path, err, "check the file, or remove it from the input folder")


def json_lines(path: Path, skip: int = 0) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file (``.gz`` too),
    after the first ``skip`` lines (not parsed)."""
    try:
        with _open(path) as f:
            for n, raw in enumerate(f, 1):
                if n <= skip:
                    continue
                try:
                    text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError:
                    raise DataFormatError(f"{path} line {n}: not UTF-8 text; the file is not "
                                          f"a JSON-lines log (remove it or re-encode it)") from None
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except ValueError as err:
                    msg = getattr(err, "msg", str(err))
                    col = getattr(err, "colno", None)
                    at = f" at column {col}" if col else ""
                    raise DataFormatError(f"{path} line {n}: not valid JSON ({msg}{at}); fix the "
                                          f"line or remove it") from None
                if not isinstance(obj, dict):
                    raise DataFormatError(f"{path} line {n}: expected a JSON object per line, got "
                                          f"{type(obj).__name__}; fix the line")
                yield n, obj
    except (OSError, EOFError, zlib.error) as err:
        raise cannot_read(path, err) from None


def json_at_lines(path: Path, lines) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for the given line numbers of a JSON-lines file (``.gz``
    too), parsing only those lines; lines that are not a JSON object are skipped (the reader
    has already named any problem there)."""
    wanted = set(int(n) for n in lines)
    last = max(wanted, default=0)
    try:
        with _open(path) as f:
            for n, raw in enumerate(f, 1):
                if n > last:
                    return
                if n in wanted:
                    try:
                        obj = json.loads(raw.decode("utf-8-sig" if n == 1 else "utf-8"))
                    except ValueError:
                        continue
                    if isinstance(obj, dict):
                        yield n, obj
    except (OSError, EOFError, zlib.error) as err:
        raise cannot_read(path, err) from None


def first_json(path: Path) -> dict | None:
    """The first non-blank line of a JSON-lines file as an object, or None (for detection)."""
    try:
        with _open(path) as f:
            for raw in f:
                if raw.strip():
                    obj = json.loads(raw.decode("utf-8-sig"))
                    return obj if isinstance(obj, dict) else None
    except (OSError, EOFError, zlib.error, ValueError):
        return None
    return None


def text_id(obj: dict, key: str, what: str, path: Path, line: int, *,
            numbers: bool = False, unit: str = "line") -> str:
    """A required id field as text (integers too when ``numbers``), checked as ids are."""
    where = f'{path} {unit} {line}, field "{key}"'
    if key not in obj or obj[key] is None:
        raise DataFormatError(f"{where}: missing; every line needs the {what} in \"{key}\"")
    value = obj[key]
    if numbers and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: got {value!r}; expected the {what} as a string")
    return check_id_text(value, what, where)


def walk_files(root: Path, keep) -> list[Path]:
    """Files under ``root`` (recursively, sorted, hidden and ``_`` names skipped) for which
    ``keep(path)`` is true. Linked folders are followed (each real folder read once); a
    link ``keep`` would take whose target is missing is an error naming it."""
    if root.is_file():
        return [root] if keep(root) else []
    found, seen = [], set()
    for folder, dirs, names in os.walk(root, followlinks=True):  # a linked run folder is read
        here = Path(folder)
        real = os.path.realpath(folder)
        if real in seen:  # a link back up the tree: each folder once
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))  # one order anywhere
        for name in names:
            p = here / name
            if name.startswith((".", "_")):
                continue
            if p.is_symlink() and not p.exists():
                if keep(p):
                    raise DataFormatError(f"{p}: a link to {os.readlink(p)}, which does not "
                                          f"exist; restore its target or remove the link")
                continue
            if p.is_file() and keep(p):
                found.append(p)
    return sorted(found)


def is_jsonl(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"))


def pick_metric(obj: dict, metric: Sequence[str], path: Path, line: int,
                present: Sequence[str], prefix: str = "") -> tuple[str, float]:
    """The first of ``metric`` that ``obj`` holds, as ``(name, float64 value)``; booleans are
    0/1. Raises naming the metrics ``present`` on the line when none is there."""
    for name in metric:
        if name in obj and obj[name] is not None:
            value = obj[name]
            if isinstance(value, bool):
                return name, float(value)
            if isinstance(value, (int, float)):
                try:
                    return name, float(value)
                except OverflowError:  # an integer past float64's range
                    raise DataFormatError(f'{path} line {line}, field "{prefix}{name}": got an '
                                          f"integer of {len(str(value))} digits; expected a "
                                          f"finite per-sample score (fix the value)") from None
            raise DataFormatError(f'{path} line {line}, field "{prefix}{name}": got {_short(value)}; '
                                  f"expected a per-sample number or true/false (a list or text "
                                  f"is a corpus-level or unscored metric: pick another with "
                                  f"--metric)")
    listed = ", ".join(name + (" (null)" if name in obj and obj[name] is None else "")
                       for name in present) if present else "none"
    raise DataFormatError(f"{path} line {line}: no metric {' or '.join(metric)} on this line "
                          f"(metrics present: {listed}); pick one with --metric NAME (several, "
                          f"comma-separated, are tried in order)")


def choose_named(present: Sequence[str], wanted: Sequence[str], where: str, noun: str) -> str:
    """The first of ``wanted`` among ``present`` (names of stats, scorers, ...); raises naming
    those present and ``--metric`` when none is there."""
    pick = next((m for m in wanted if m in present), None)
    if pick is None:
        raise DataFormatError(f"{where}: no {noun} {' or '.join(wanted)} ({noun}s present: "
                              f"{', '.join(sorted(present)) or 'none'}); pick one with --metric NAME")
    return pick


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


_NOT_OBJECT = re.compile(rb"\n(?!\{|\Z)")  # a line not starting with "{" (pyarrow 26's
# JSON reader crashes on a top-level null/array/scalar line under an explicit schema)


def plain_lines(path: Path) -> bool:
    """Whether ``path`` is uncompressed, has no blank line before its last record and every
    line starts with ``{``, so that Arrow's JSON reader (which skips blank lines) numbers rows
    as the file numbers lines and sees only objects."""
    if path.suffix.lower() == ".gz":
        return False
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return True
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                head = data[:64]
                # a blank line or a BOM is a line not starting with "{" too: one scan
                return head[:1] == b"{" and _NOT_OBJECT.search(data) is None
    except OSError:
        return False
    return True
