"""Every Eval Ever instance-level JSON lines (EvalEval coalition, schema 0.2.x).

One object per line (``every_eval_ever/schemas/instance_level_eval.schema.json`` in the
``every-eval-ever`` package): ``model_id`` is the subject, ``evaluation_name`` + ``/`` +
``sample_id`` the item (its group is the evaluation name), and the response is
``evaluation.score`` (default) or ``evaluation.is_correct`` (``--metric is_correct``: 0/1);
``sample_hash``, ``input`` (hashed) and ``metadata`` go to the store's item side table
(``item_info``).
Input is a file or a folder of them, nested as in the schema's repository
(``<evaluation>/<developer>/<model>/*.jsonl``); the aggregate ``*.json`` records beside
them are skipped. Several evaluations become one matrix; a model missing an evaluation has
missing cells there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from engine.data.arrow import to_numbers
from engine.data.formats.base import (LogFormat, RecordBuffer, Records, first_json, is_jsonl,
                                      json_at_lines, json_lines, pick_metric, plain_lines, text_id,
                                      walk_files)
from engine.data.formats.item_info import describe_sample
from engine.errors import DataFormatError

__all__ = ["EveryEvalEver"]

_KEYS = ("model_id", "evaluation_name", "sample_id")
_METRICS = ("score", "is_correct")


class EveryEvalEver(LogFormat):
    """Reader of Every Eval Ever instance-level ``.jsonl`` files (see the module doc)."""

    name = "every-eval-ever"
    default_metric = ("score",)

    def detect(self, path: Path) -> bool:
        if path.is_file():
            obj = first_json(path) if is_jsonl(path) else None
            return obj is not None and all(k in obj for k in _KEYS) and "evaluation" in obj
        for p in walk_files(path, is_jsonl):
            obj = first_json(p)
            if obj is not None:
                return all(k in obj for k in _KEYS) and "evaluation" in obj
        return False

    def files(self, paths: Sequence[Path]) -> list[Path]:
        found: list[Path] = []
        for root in paths:
            if root.is_file():
                found.append(root)
                continue
            for p in walk_files(root, lambda p: not p.name.lower().endswith(".json")):
                if not is_jsonl(p):
                    raise DataFormatError(f"{p}: not a .jsonl file in the Every Eval Ever folder "
                                          f"{root}; remove it, or pass the .jsonl files")
                found.append(p)
        if not found:
            raise DataFormatError(f"{', '.join(map(str, paths))}: no instance-level .jsonl files "
                                  f"found; pass Every Eval Ever *.jsonl files or their folder")
        return found

    def read(self, path: Path, metric: tuple[str, ...]) -> Iterator[Records]:
        for name in metric:
            if name not in _METRICS:
                raise DataFormatError(f"--metric {name!r}: Every Eval Ever instances carry "
                                      f"evaluation.score and evaluation.is_correct; use "
                                      f"--metric score or --metric is_correct")
        done = 0
        if plain_lines(path):
            done = yield from _read_arrow(path, metric, self.one_metric)
            if done is None:
                return
        yield from _read_lines(path, metric, done, self.one_metric)

    def item_info(self, path: Path, lines) -> dict[int, dict]:
        """``sample_id``, ``sample_hash``, ``input`` and ``metadata`` of the given lines."""
        return {n: describe_sample(sample_id=obj.get("sample_id"),
                                   sample_hash=obj.get("sample_hash"), input=obj.get("input"),
                                   metadata=obj.get("metadata"))
                for n, obj in json_at_lines(path, lines)}


def _read_lines(path: Path, metric: tuple[str, ...], skip: int, one_metric) -> Iterator[Records]:
    """Line by line (the reference; it names the line and field of any problem).
    ``one_metric(evaluation, field, where)``: ``LogFormat.one_metric``."""
    buf = RecordBuffer(path, "evaluation." + metric[0])
    for n, obj in json_lines(path, skip):
        subject = text_id(obj, "model_id", "model", path, n)
        evaluation = text_id(obj, "evaluation_name", "evaluation", path, n)
        sample = text_id(obj, "sample_id", "sample", path, n, numbers=True)
        scores = obj.get("evaluation")
        if not isinstance(scores, dict):
            raise DataFormatError(f'{path} line {n}, field "evaluation": '
                                  f"{'missing' if scores is None else 'not an object'}; "
                                  f'expected {{"score": ..., "is_correct": ...}}')
        present = [k for k in _METRICS if scores.get(k) is not None]
        name, value = pick_metric(scores, metric, path, n, present, "evaluation.")
        one_metric(evaluation, "evaluation." + name, f"{path} line {n}")
        buf.field = "evaluation." + name
        buf.add(subject, f"{evaluation}/{sample}", evaluation, value, n)
        if buf.full():
            yield buf.take()
    last = buf.take()
    if last is not None:
        yield last


_SCHEMA = pa.schema([("model_id", pa.string()), ("evaluation_name", pa.string()),
                     ("sample_id", pa.string()),
                     ("evaluation", pa.struct([("score", pa.float64()),
                                               ("is_correct", pa.bool_())]))])


def _read_arrow(path: Path, metric: tuple[str, ...], one_metric):
    """Arrow's JSON reader on a file without blank lines (row r is line r + 1). Returns None
    when the file is done, else the number of lines read before a line it cannot take as is
    (the line reader goes on from there and names any problem)."""
    done = 0
    try:
        reader = pj.open_json(path, read_options=pj.ReadOptions(block_size=8 << 20),
                              parse_options=pj.ParseOptions(explicit_schema=_SCHEMA,
                                                            unexpected_field_behavior="ignore"))
        for batch in reader:
            records = _arrow_records(path, batch, metric, done, one_metric)
            if records is None:
                return done
            yield records
            done += batch.num_rows
    except pa.ArrowException:
        return done
    return None


def _ids(col: pa.Array) -> tuple[list[str], np.ndarray] | None:
    """``(distinct ids, codes)`` of an id column, or None unless every id is clean text."""
    if col.null_count:
        return None
    coded = pc.dictionary_encode(col)
    ids = coded.dictionary.to_pylist()
    for v in ids:
        if not v or v != v.strip():
            return None
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return ids, to_numbers(coded.indices, np.int64)


def _arrow_records(path: Path, batch: pa.RecordBatch, metric: tuple[str, ...],
                   done: int, one_metric) -> Records | None:
    scores = batch.column("evaluation")
    if scores.null_count:
        return None
    values = pc.struct_field(scores, metric[0])
    if values.null_count:
        return None
    values = to_numbers(pc.cast(values, pa.float64()))
    subject, evaluation, sample = (_ids(batch.column(k)) for k in _KEYS)
    if subject is None or evaluation is None or sample is None:
        return None
    joined = pc.binary_join_element_wise(batch.column("evaluation_name"),
                                         batch.column("sample_id"), "/")
    items = pc.dictionary_encode(joined)
    item = to_numbers(items.indices, np.int64)
    _, first = np.unique(item, return_index=True)
    groups = [evaluation[0][k] for k in evaluation[1][first].tolist()]
    for group, row in zip(groups, first.tolist()):  # every row read metric[0]
        one_metric(group, "evaluation." + metric[0], f"{path} line {done + row + 1}")
    return Records(path, "evaluation." + metric[0], subject[0], subject[1],
                   items.dictionary.to_pylist(), groups, item, values,
                   np.arange(done + 1, done + 1 + batch.num_rows, dtype=np.int64))
