"""Input formats: one reader per format behind ``base.InputFormat``.

Tables (``wide``, ``long``, py-irt ``jsonl``) and evaluation logs (``every-eval-ever``,
``lm-eval``, ``helm``, ``inspect``; ``base.LogReader``, written through ``logs.ingest_logs``)
all share ``validate`` for values, ids and errors. ``FORMATS`` names them
(``ingest --format NAME``), ``input_format`` returns one, and ``detect_format`` picks one for
inputs (logs first, from their layout; then tables, from extension and header) and says
which when the inputs mix formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

from engine.errors import DataFormatError

__all__ = ["FORMATS", "ITEM_COLUMNS", "KEEP", "LOG_FORMATS", "TABLE_FORMATS", "detect_format",
           "detect_log_format", "input_format", "ingest_logs", "log_reader", "q_matrix_from"]

LOG_FORMATS = ("every-eval-ever", "lm-eval", "helm", "inspect")
TABLE_FORMATS = ("wide", "long", "jsonl")
FORMATS = TABLE_FORMATS + LOG_FORMATS
KEEP = ("first", "latest", "mean")
ITEM_COLUMNS = ("group",)  # the store's per-item columns from logs (meta "item_groups")
_READERS = {"wide": ("wide", "WideTable"), "long": ("long", "LongTable"),
            "jsonl": ("pyirt", "PyIrtJsonl"),
            "every-eval-ever": ("every_eval_ever", "EveryEvalEver"),
            "lm-eval": ("lm_eval", "LMEvalHarness"), "helm": ("helm", "HelmRuns"),
            "inspect": ("inspect_ai", "InspectLogs")}
_TABLE_ORDER = ("jsonl", "long", "wide")  # detection: the first whose ``detect`` holds


def input_format(name: str):
    """A fresh reader (``base.InputFormat``) for format ``name`` (one of ``FORMATS``)."""
    if name not in _READERS:
        raise DataFormatError(f"unknown input format {name!r}; use one of {list(FORMATS)}")
    module, cls = _READERS[name]
    return getattr(import_module(f"engine.data.formats.{module}"), cls)()


def log_reader(name: str):
    """A fresh reader for log format ``name`` (one of ``LOG_FORMATS``)."""
    if name not in LOG_FORMATS:
        raise DataFormatError(f"unknown log format {name!r}; use one of {', '.join(LOG_FORMATS)}")
    return input_format(name)


def detect_log_format(inputs: str | Path | Sequence[str | Path]) -> str | None:
    """The log format every input is in, or None when none is a log; mixed formats raise."""
    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    found = {}
    for path in paths:
        if not path.exists():
            return None
        names = [n for n in LOG_FORMATS if log_reader(n).detect(path)]
        if len(names) > 1:  # one folder holding two formats: reading one would drop the other
            raise DataFormatError(f"{path} holds logs of several formats ({', '.join(names)}); "
                                  f"ingest one format at a time: pass each format's folders "
                                  f"(or --format NAME)")
        found[path] = names[0] if names else None
    names = set(found.values())
    if names <= {None}:
        return None
    if len(names) > 1:
        listed = ", ".join(f"{p} ({n or 'a table'})" for p, n in found.items())
        raise DataFormatError(f"inputs mix formats: {listed}; ingest one format at a time")
    return names.pop()


def detect_format(inputs: str | Path | Sequence[str | Path]) -> str:
    """The format of ``inputs``: a log format when they are logs, else the table format of
    every file (files of folders included); raises on an unknown file or mixed formats."""
    from engine.data.formats.validate import expand_inputs

    log = detect_log_format(inputs)
    if log is not None:
        return log
    readers = [input_format(name) for name in _TABLE_ORDER]
    found = {}
    for path in expand_inputs(inputs):
        name = next((r.name for r in readers if r.detect(path)), None)
        if name is None:
            raise DataFormatError(f"{path}: unknown input format (expected .csv, .tsv, "
                                  f".parquet or .jsonl); rename it or pass fmt=/--format")
        found.setdefault(name, path)
    if len(found) > 1:
        listed = ", ".join(f"{p} ({n})" for n, p in found.items())
        raise DataFormatError(f"inputs mix formats {sorted(found)} ({listed}); ingest one "
                              f"format at a time")
    return found.popitem()[0]


def ingest_logs(inputs, out, *, fmt: str, **options):
    """``logs.ingest_logs`` with the reader of format ``fmt``."""
    from engine.data.formats.logs import ingest_logs as _ingest_logs

    return _ingest_logs(log_reader(fmt), [inputs] if isinstance(inputs, (str, Path)) else inputs,
                        out, **options)


def q_matrix_from(store, column: str):
    """A confirmatory Q-matrix (items x groups, 0/1) and the group names (first-appearance
    order) from a store's item ``column`` (``"group"``: each item's evaluation or task)."""
    import numpy as np

    from engine.errors import SettingsError

    if column not in ITEM_COLUMNS:
        raise SettingsError(f"--q-matrix-from {column!r}: the store's item columns are "
                            f"{', '.join(ITEM_COLUMNS)}")
    groups = store.meta.get("item_groups")
    if groups is None:
        raise SettingsError(f"{store.path}: the store has no item groups (they come from "
                            f"evaluation logs: ingest them again with this version); or give "
                            f"a --q-matrix CSV")
    names = list(dict.fromkeys(groups))
    code = {g: k for k, g in enumerate(names)}
    q = np.zeros((len(groups), len(names)), np.float32)
    q[np.arange(len(groups)), [code[g] for g in groups]] = 1
    return q, names
