"""Evaluation-log readers: one module per format behind ``base.LogReader``.

``LOG_FORMATS`` names them (``ingest --format NAME``); ``detect_log_format`` picks one for
inputs that are logs (``None`` for tables: wide, long, py-irt jsonl); ``ingest_logs`` writes
a store from them through the long-format path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.errors import DataFormatError

__all__ = ["ITEM_COLUMNS", "KEEP", "LOG_FORMATS", "detect_log_format", "ingest_logs", "log_reader",
           "q_matrix_from"]

LOG_FORMATS = ("every-eval-ever", "lm-eval", "helm", "inspect")
KEEP = ("first", "latest", "mean")
ITEM_COLUMNS = ("group",)  # the store's per-item columns from logs (meta "item_groups")


def log_reader(name: str):
    """A fresh reader for format ``name`` (one of ``LOG_FORMATS``)."""
    if name == "every-eval-ever":
        from engine.data.formats.every_eval_ever import EveryEvalEver

        return EveryEvalEver()
    if name == "lm-eval":
        from engine.data.formats.lm_eval import LMEvalHarness

        return LMEvalHarness()
    if name == "helm":
        from engine.data.formats.helm import HelmRuns

        return HelmRuns()
    if name == "inspect":
        from engine.data.formats.inspect_ai import InspectLogs

        return InspectLogs()
    raise DataFormatError(f"unknown log format {name!r}; use one of {', '.join(LOG_FORMATS)}")


def detect_log_format(inputs: str | Path | Sequence[str | Path]) -> str | None:
    """The log format every input is in, or None when none is a log; mixed formats raise."""
    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    found = {}
    for path in paths:
        if not path.exists():
            return None
        name = next((n for n in LOG_FORMATS if log_reader(n).detect(path)), None)
        found[path] = name
    names = set(found.values())
    if names <= {None}:
        return None
    if len(names) > 1:
        listed = ", ".join(f"{p} ({n or 'a table'})" for p, n in found.items())
        raise DataFormatError(f"inputs mix formats: {listed}; ingest one format at a time")
    return names.pop()


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
