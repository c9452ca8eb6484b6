"""Inspect AI evaluation logs (``.eval`` and ``.json``), through the ``inspect-ai`` log API.

An optional extra (``pip install 'irt-engine[inspect]'``): without it, reading these logs
is a one-line error saying so. The header (``read_eval_log(..., header_only=True)``) names
the model (``eval.model``, the subject) and the task (``eval.task``, the item group); the
samples are streamed one at a time (``read_eval_log_samples``). The item is
``<task>/<sample id>``; the response is the score of the scorer named by ``--metric`` (a
task's only scorer by default; several are an error listing them), converted as Inspect's
own ``value_to_float`` does ("C" 1, "I" 0, "P" 0.5, "N" 0, booleans, numbers, numeric
text); other text, None and list or dict values are an error (Inspect reads them as 0).
Several epochs of a sample are duplicates (``--keep``). Errors name the file and the sample
by id and epoch, with its place (1-based) in the order the log API returns the samples;
a sample that ended in an error is named as such. Every response of a task comes from one
scorer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.data.formats.base import (LogFormat, RecordBuffer, Records, choose_named,
                                      walk_files)
from engine.errors import DataFormatError, SettingsError

__all__ = ["InspectLogs", "EXTRA"]

EXTRA = "pip install 'irt-engine[inspect]' (the inspect-ai package)"


def _is_eval(path: Path) -> bool:
    return path.suffix == ".eval"


def _is_json_log(path: Path) -> bool:
    if path.suffix != ".json":
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:  # a link to nothing is taken, so that the folder walk names it
        return path.is_symlink() and not path.exists()
    text = b"".join(head.split())
    return text.startswith(b'{"version":') and b'"eval":' in text


def _api():
    try:
        from inspect_ai.log import read_eval_log, read_eval_log_samples
        from inspect_ai.scorer import value_to_float
    except ImportError:
        raise SettingsError(f"reading Inspect AI logs needs the optional extra: {EXTRA}") from None
    return read_eval_log, read_eval_log_samples, value_to_float


class InspectLogs(LogFormat):
    """Reader of Inspect AI logs (see the module doc)."""

    name = "inspect"
    unit = "sample"
    default_metric: tuple[str, ...] = ()

    def detect(self, path: Path) -> bool:
        if path.is_file():
            return _is_eval(path) or _is_json_log(path)
        return bool(walk_files(path, _is_eval)) or bool(walk_files(path, _is_json_log))

    def files(self, paths: Sequence[Path]) -> list[Path]:
        found = [p for root in paths for p in walk_files(root, lambda p: _is_eval(p)
                                                          or _is_json_log(p))]
        if not found:
            raise DataFormatError(f"{', '.join(map(str, paths))}: no Inspect AI logs (.eval, or "
                                  f".json written by inspect) found")
        _api()
        return found

    def read(self, path: Path, metric: tuple[str, ...]) -> Iterator[Records]:
        read_eval_log, read_samples, value_to_float = _api()
        try:
            header = read_eval_log(str(path), header_only=True)
        except Exception as err:  # the log API raises many kinds; name the file
            raise DataFormatError(f"{path}: not a readable Inspect AI log ({_short(err)}); "
                                  f"check the file or remove it") from None
        model, task = (header.eval.model or "").strip(), (header.eval.task or "").strip()
        if not model or not task:
            raise DataFormatError(f"{path}: the log names no model or no task (eval.model, "
                                  f"eval.task)")
        to_float = value_to_float()
        buf = RecordBuffer(path, metric[0] if metric else "scores", unit=self.unit)
        n = 0
        try:
            samples = read_samples(str(path), all_samples_required=False)
            for n, sample in enumerate(samples, 1):
                where = f"{path} sample {n} (id {sample.id!r}, epoch {sample.epoch})"
                scores = sample.scores or {}
                if not scores and getattr(sample, "error", None) is not None:
                    raise DataFormatError(f"{where}: no score: the sample ended in an error "
                                          f"({_short(sample.error.message)}); rerun it "
                                          f"(inspect eval-retry), or remove the log")
                want = metric or tuple(scores)
                if not metric and len(scores) != 1:
                    raise DataFormatError(f"{where}: scorers {', '.join(scores) or 'none'}; pick "
                                          f"one with --metric NAME")
                pick = choose_named(list(scores), want, where, "scorer")
                self.one_metric(task, pick, where)
                buf.field = pick
                buf.add(model, f"{task}/{sample.id}", task,
                        _score(scores[pick].value, to_float, f'{where}, scorer "{pick}"'), n)
                if buf.full():
                    yield buf.take()
        except DataFormatError:
            raise
        except Exception as err:
            raise DataFormatError(f"{path} sample {n + 1}: cannot read it ({_short(err)}); check "
                                  f"the log") from None
        last = buf.take()
        if last is not None:
            yield last


def _inspect_reads(text: str) -> bool:
    """Whether Inspect's ``value_to_float`` (inspect-ai 0.3.285, ``scorer/_metric.py``) reads
    ``text`` without falling back to 0: the sentinels "C", "I", "P", "N" exactly; yes, no,
    true, false in any case (not stripped); text ``float`` parses to a finite number."""
    if text in ("C", "I", "P", "N") or text.lower() in ("yes", "true", "no", "false"):
        return True
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _score(value, to_float, where: str) -> float:
    """A score as Inspect's ``value_to_float`` reads it, where it reads it. Inspect turns
    anything else (None, unknown text such as "maybe") into 0 with a warning; here that is
    an error naming the sample, never a 0."""
    if isinstance(value, (list, dict)):
        raise DataFormatError(f"{where}: a {type(value).__name__} value; pick a scorer with one "
                              f"value per sample with --metric")
    if isinstance(value, str) and not _inspect_reads(value):
        raise DataFormatError(f"{where}: got text {value!r}; expected a finite number, true/false, "
                              f"yes/no or C/I/P/N (Inspect would read it as 0): fix the scorer's "
                              f"value, or pick another scorer with --metric")
    elif value is None or not isinstance(value, (str, bool, int, float)):
        raise DataFormatError(f"{where}: got {value!r}; expected a number, true/false, yes/no or "
                              f"C/I/P/N (Inspect would read it as 0): rescore the sample, or pick "
                              f"another scorer with --metric")
    return float(to_float(value))


def _short(err: Exception) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:200]
