"""Evaluation-log readers: one module per format behind ``base.LogReader``.

``LOG_FORMATS`` names them (``ingest --format NAME``); ``detect_log_format`` picks one for
inputs that are logs (``None`` for tables: wide, long, py-irt jsonl); ``ingest_logs`` writes
a store from them through the long-format path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.errors import DataFormatError

__all__ = ["KEEP", "LOG_FORMATS", "detect_log_format", "ingest_logs", "log_reader"]

LOG_FORMATS = ("every-eval-ever", "lm-eval", "helm", "inspect")
KEEP = ("first", "latest", "mean")


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
