"""lm-evaluation-harness ``--log_samples`` output.

Layout (``lm_eval/loggers/evaluation_tracker.py`` in the ``lm-eval`` package, 0.4.x): one
folder per model under the output path, holding ``results_<date>.json`` (the aggregate; its
top-level ``model_name``, else ``config.model_args`` as lm-eval reads it, names the model) and
one ``samples_<task>_<date>.jsonl`` per task with the same ``<date>``. Each sample line
(``lm_eval/evaluator.py``) carries ``doc_id``, ``filter``, ``metrics`` (the names) and one key
per metric (``acc``, ``acc_norm``, ``exact_match``, ...). The item is ``<task>/<doc_id>`` (with
``/<filter>`` before the doc id when the filter is not ``none``), its group the task; the
item side table (``item_info``) keeps ``doc_hash``, a hash of ``doc`` and the target.
``--metric`` picks the metric (a comma list is tried in order); without it a task's single
metric is used and several are an error listing them. Runs are ordered by ``<date>``
(``--keep latest`` / ``first``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.data.formats.base import (LogFormat, RecordBuffer, Records, cannot_read, first_json,
                                      json_at_lines, json_lines, pick_metric, text_id, walk_files)
from engine.data.formats.item_info import describe_sample
from engine.data.formats.validate import check_id_text
from engine.errors import DataFormatError, SettingsError

__all__ = ["LMEvalHarness"]

_SAMPLES = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.jsonl$")


def _is_samples(path: Path) -> bool:
    return _SAMPLES.match(path.name) is not None


class LMEvalHarness(LogFormat):
    """Reader of lm-evaluation-harness per-sample logs (see the module doc)."""

    name = "lm-eval"
    default_metric: tuple[str, ...] = ()
    options = LogFormat.options | {"filters"}

    def __init__(self):
        self._models: dict[Path, str] = {}
        self._filters: frozenset[str] | None = None  # None: every filter, each its own items
        self._seen: set[str] = set()  # the filters the files carry (read where --filter is given)

    def ingest(self, inputs: Sequence[Path], out: Path, *, filters=None, **options):
        """``filters``: the lm-eval filters to keep (``--filter strict-match``) in a task
        scored under several (gsm8k's strict-match and flexible-extract), which otherwise
        gives one item per filter and document, counting each document once per filter. A
        task under one filter (or none) is read whole; a task under several none of which
        is named is an error listing its filters, and so is a name no task carries (a
        misspelt filter), once every file has been read and before the store is written."""
        self._seen = set()
        if filters is not None:
            names = filters.split(",") if isinstance(filters, str) else list(filters)
            self._filters = frozenset(n.strip() for n in names if n.strip())
            if not self._filters:
                raise SettingsError(f"--filter {filters!r}: name one or more lm-eval filters")
        return super().ingest(inputs, out, **options)

    def detect(self, path: Path) -> bool:
        if path.is_file():
            return _is_samples(path) and "doc_id" in (first_json(path) or {})
        return bool(walk_files(path, _is_samples)) and bool(
            walk_files(path, lambda p: p.name.startswith("results_") and p.suffix == ".json"))

    def files(self, paths: Sequence[Path]) -> list[Path]:
        found = []
        for root in paths:
            for p in walk_files(root, _is_samples):
                found.append((_SAMPLES.match(p.name)["date"], str(p), p))
        if not found:
            raise DataFormatError(f"{', '.join(map(str, paths))}: no samples_<task>_<date>.jsonl "
                                  f"files found; run lm_eval with --log_samples --output_path "
                                  f"DIR and pass DIR")
        for _, _, p in found:
            self._model(p)  # every run names its model before anything is read
        return [p for _, _, p in sorted(found)]

    def _model(self, samples: Path) -> str:
        results = samples.with_name(f"results_{_SAMPLES.match(samples.name)['date']}.json")
        if results in self._models:
            return self._models[results]
        if not results.is_file():
            raise DataFormatError(f"{samples}: no {results.name} beside it; lm-eval writes the "
                                  f"model name there: keep the run folder whole")
        try:
            data = json.loads(results.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as err:
            raise cannot_read(results, err) from None
        except ValueError as err:
            raise DataFormatError(f"{results}: not valid JSON ({err}); restore the file") from None
        name = data.get("model_name") if isinstance(data, dict) else None
        if not isinstance(name, str) or not name.strip():
            args = (data.get("config") or {}).get("model_args") if isinstance(data, dict) else None
            name = _name_from_args(args)
            if name is None:
                raise DataFormatError(f'{results}: no "model_name" and no pretrained= (or peft=, '
                                      f'model=, path=, ...) in "config.model_args"; add '
                                      f'"model_name": "<model>" to it')
        self._models[results] = check_id_text(name, "model", f"{results}, model name")
        return self._models[results]

    def read(self, path: Path, metric: tuple[str, ...]) -> Iterator[Records]:
        model, task = self._model(path), _SAMPLES.match(path.name)["task"]
        buf = RecordBuffer(path, metric[0] if metric else "metric")
        keep = self._kept_filters(path, task)  # None: every line
        for n, obj in json_lines(path):
            filt = obj.get("filter", "none")
            if not isinstance(filt, str):
                raise DataFormatError(f'{path} line {n}, field "filter": expected text, got '
                                      f"{filt!r}")
            if keep is not None and filt not in keep:
                continue  # --filter: another filter's scoring of the document
            doc = text_id(obj, "doc_id", "document", path, n, numbers=True)
            names = obj.get("metrics")
            if not isinstance(names, list) or not all(isinstance(m, str) for m in names):
                raise DataFormatError(f'{path} line {n}, field "metrics": expected the list of '
                                      f"metric names lm-eval writes; is this a --log_samples file?")
            want = metric
            if not want:
                if len(names) != 1:
                    raise DataFormatError(f"{path} line {n}: task {task!r} has metrics "
                                          f"{', '.join(names) or 'none'}; pick one with --metric "
                                          f"NAME")
                want = tuple(names)
            name, value = pick_metric(obj, want, path, n, names)
            self.one_metric(task, name, f"{path} line {n}")
            buf.field = name
            item = f"{task}/{doc}" if filt == "none" else f"{task}/{filt}/{doc}"
            buf.add(model, item, task, value, n)
            if buf.full():
                yield buf.take()
        last = buf.take()
        if last is not None:
            yield last


    def _kept_filters(self, path: Path, task: str) -> frozenset[str] | None:
        """The filters whose lines ``--filter`` keeps in this task's file (None: all). Only a
        task scored under several filters is filtered; it must carry a named one."""
        if self._filters is None:
            return None
        present = {obj.get("filter", "none") for _, obj in json_lines(path)}
        named = {f for f in present if isinstance(f, str) and f != "none"}
        self._seen |= named
        if len(named) <= 1:  # one scoring a document: nothing counted twice
            return None
        keep = named & self._filters
        if not keep:
            raise DataFormatError(f"{path}: task {task!r} is scored under filters "
                                  f"{', '.join(sorted(named))}, none of --filter "
                                  f"{','.join(sorted(self._filters))}; name one of them")
        return frozenset(keep | {"none"})

    def finish(self, files: Sequence[Path]) -> None:
        """After every file is read: a ``--filter`` name that no task carries is an error."""
        unknown = sorted((self._filters or frozenset()) - self._seen - {"none"})  # none: kept
        if unknown:
            where = files[0].parent if len(files) == 1 else f"the {len(files)} samples files"
            raise SettingsError(
                f"--filter {','.join(unknown)}: no task in {where} is scored under "
                f"{'it' if len(unknown) == 1 else 'them'}; the filters present are "
                f"{', '.join(sorted(self._seen)) or 'none (each task under one scoring)'}")

    def item_info(self, path: Path, lines) -> dict[int, dict]:
        """``doc_id``, ``doc_hash``, ``doc`` (the input) and the target and prompt/target
        hashes (metadata) of the given lines."""
        keys = ("target", "prompt_hash", "target_hash")
        return {n: describe_sample(sample_id=obj.get("doc_id"), sample_hash=obj.get("doc_hash"),
                                   input=obj.get("doc"),
                                   metadata={k: obj[k] for k in keys if k in obj} or None)
                for n, obj in json_at_lines(path, lines)}


_PREFIXES = ("peft", "delta", "pretrained", "model", "path", "engine")  # lm-eval's own order


def _name_from_args(args) -> str | None:
    """The model name lm-eval derives from ``model_args`` (``GeneralConfigTracker
    ._get_model_name`` in ``lm_eval/loggers/evaluation_tracker.py``)."""
    if isinstance(args, dict):
        return next((str(args[k]) for k in _PREFIXES if args.get(k)), None)
    if isinstance(args, str):
        for key in _PREFIXES:
            match = re.search(rf"(?:^|,)\s*{key}=([^,]+)", args)
            if match:
                return match.group(1)
    return None
