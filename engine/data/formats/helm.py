"""HELM run folders (``benchmark_output/runs/<suite>/<run>/``).

Layout (``helm/benchmark/runner.py`` in ``crfm-helm`` 0.5.x): each run folder holds
``run_spec.json`` (``name`` such as ``mmlu:subject=anatomy,method=multiple_choice_joint,
model=openai_gpt2``; ``adapter_spec.model`` names the model) and ``per_instance_stats.json``,
a JSON array of ``PerInstanceStats`` (``helm/benchmark/metrics/metric.py``): ``instance_id``,
``train_trial_index``, optional ``perturbation`` and ``stats``, each a ``Stat``
(``helm/benchmark/metrics/statistic.py``) with ``name`` {``name``, ``split``, ...},
``count``, ``sum`` and ``mean``. The subject is the model, the item ``<scenario>/<instance_id>``
where the scenario is the run name without its ``model=`` / ``model_deployment=`` arguments
(also the item's group), the response the stat named by ``--metric`` (default
``exact_match``): its ``mean`` (else ``sum / count``). Perturbed instances (robustness
runs) are skipped; several trials of an instance are duplicates (``--keep``). Errors name
the file and the entry (1-based) of the array.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.data.formats.base import (LogFormat, RecordBuffer, Records, cannot_read,
                                      choose_named, text_id, walk_files)
from engine.data.formats.item_info import describe_sample
from engine.data.formats.validate import check_id_text
from engine.errors import DataFormatError

__all__ = ["HelmRuns"]

_STATS = "per_instance_stats.json"


def _is_stats(path: Path) -> bool:
    return path.name == _STATS


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise cannot_read(path, err) from None
    except ValueError as err:
        raise DataFormatError(f"{path}: not valid JSON ({err}); restore the file from the "
                              f"run, or remove the run folder") from None


class HelmRuns(LogFormat):
    """Reader of HELM ``per_instance_stats.json`` run folders (see the module doc)."""

    name = "helm"
    unit = "entry"
    default_metric = ("exact_match",)

    def detect(self, path: Path) -> bool:
        if path.is_file():
            return _is_stats(path)
        return bool(walk_files(path, _is_stats))

    def files(self, paths: Sequence[Path]) -> list[Path]:
        found = [p for root in paths for p in walk_files(root, _is_stats)]
        if not found:
            raise DataFormatError(f"{', '.join(map(str, paths))}: no {_STATS} found; pass HELM's "
                                  f"benchmark_output/runs/<suite> folder or run folders")
        for p in found:
            self._run(p)  # every run names its model before anything is read
        return found

    def _run(self, stats: Path) -> tuple[str, str]:
        spec_path = stats.with_name("run_spec.json")
        if not spec_path.is_file():
            raise DataFormatError(f"{stats}: no run_spec.json beside it; HELM writes the model and "
                                  f"scenario there: keep the run folder whole")
        spec = _load(spec_path)
        adapter = spec.get("adapter_spec") if isinstance(spec, dict) else None
        model = adapter.get("model") or adapter.get("model_deployment") if isinstance(
            adapter, dict) else None
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(model, str) or not model.strip() or not isinstance(name, str):
            raise DataFormatError(f'{spec_path}: expected "name" and "adapter_spec": {{"model": '
                                  f'...}} as HELM writes them; restore the file')
        head, _, args = name.partition(":")
        kept = [a for a in args.split(",") if a and not a.startswith(("model=",
                                                                      "model_deployment="))]
        model = check_id_text(model, "model", f'{spec_path}, field "adapter_spec.model"')
        return model, head + (":" + ",".join(kept) if kept else "")

    def read(self, path: Path, metric: tuple[str, ...]) -> Iterator[Records]:
        model, scenario = self._run(path)
        entries = _load(path)
        if not isinstance(entries, list):
            raise DataFormatError(f"{path}: expected a JSON array of per-instance stats, got "
                                  f"{type(entries).__name__}")
        buf = RecordBuffer(path, metric[0], unit=self.unit)
        for n, entry in enumerate(entries, 1):
            where = f"{path} entry {n}"
            if not isinstance(entry, dict):
                raise DataFormatError(f"{where}: expected an object with instance_id and stats")
            if entry.get("perturbation"):
                continue
            instance = text_id(entry, "instance_id", "instance", path, n, unit=self.unit)
            stats = entry.get("stats")
            if not isinstance(stats, list):
                raise DataFormatError(f'{where}, field "stats": expected a list of stats')
            by_name = {}
            for stat in stats:
                name = stat.get("name") if isinstance(stat, dict) else None
                if isinstance(name, dict) and isinstance(name.get("name"), str) \
                        and not name.get("perturbation"):
                    by_name.setdefault(name["name"], stat)
            pick = choose_named(list(by_name), metric, f"{where}, instance {instance!r}", "stat")
            self.one_metric(scenario, pick, f"{where}, instance {instance!r}")
            buf.field = pick
            buf.add(model, f"{scenario}/{instance}", scenario, _value(by_name[pick], where, pick), n)
            if buf.full():
                yield buf.take()
        last = buf.take()
        if last is not None:
            yield last


    def item_info(self, path: Path, lines) -> dict[int, dict]:
        """The instance id (and train trial) of the given entries; HELM keeps the instance's
        text in the run's ``instances.json``, not in these stats."""
        entries, wanted = _load(path), set(int(n) for n in lines)
        return {n: describe_sample(sample_id=e.get("instance_id"),
                                   metadata={"train_trial_index": e.get("train_trial_index")})
                for n, e in enumerate(entries, 1) if n in wanted and isinstance(e, dict)}


def _value(stat: dict, where: str, name: str) -> float:
    mean, total, count = stat.get("mean"), stat.get("sum"), stat.get("count")
    try:
        for value in (mean,):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        if (isinstance(total, (int, float)) and not isinstance(total, bool)
                and isinstance(count, int) and not isinstance(count, bool) and count > 0):
            return float(total) / count
    except (OverflowError, ZeroDivisionError):  # an integer past float64's range
        raise DataFormatError(f'{where}, stat "{name}": "mean" or "sum" is an integer too large '
                              f"for a float; expected a finite score (fix the value)") from None
    raise DataFormatError(f'{where}, stat "{name}": no numeric "mean" nor "sum" and "count"; '
                          f"expected a HELM Stat")
