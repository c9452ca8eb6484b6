"""HELM run folders.

The layout is the one ``crfm-helm`` 0.5.16 writes (PyPI wheel): ``helm/benchmark/runner.py``
writes ``run_spec.json`` (``asdict_without_nones(RunSpec)``: ``name``, ``scenario_spec``,
``adapter_spec`` with ``model`` and ``model_deployment``, ``metric_specs``, ``groups``) and
``per_instance_stats.json`` (a list of ``PerInstanceStats`` from
``helm/benchmark/metrics/metric.py``: ``instance_id``, ``train_trial_index``, optional
``perturbation``, ``stats`` of ``Stat`` from ``helm/benchmark/metrics/statistic.py`` with
``name`` {name, split}, ``count``, ``sum``, ``sum_squared``, ``min``, ``max``, ``mean``) under
``benchmark_output/runs/<suite>/<run name>/``.
"""

import json

import numpy as np
import pytest

from engine.data import ingest
from engine.errors import DataFormatError


def stat(name, value, split="test"):
    return {"name": {"name": name, "split": split}, "count": 1, "sum": value,
            "sum_squared": value * value, "min": value, "max": value, "mean": value,
            "variance": 0.0, "stddev": 0.0}


def write_run(runs, scenario, model, values, *, extra=None):
    sep = "," if ":" in scenario else ":"  # as helm/benchmark/run_expander.py appends args
    name = f"{scenario}{sep}model={model.replace('/', '_')}"
    folder = runs / name
    folder.mkdir(parents=True)
    spec = {"name": name, "scenario_spec": {"class_name": "helm.benchmark.scenarios.mmlu_"
                                            "scenario.MMLUScenario", "args": {"subject": "anatomy"}},
            "adapter_spec": {"method": "multiple_choice_joint", "model_deployment": model,
                             "model": model, "max_tokens": 1},
            "metric_specs": [{"class_name": "helm.benchmark.metrics.basic_metrics.BasicMetric",
                              "args": {"names": ["exact_match"]}}], "groups": ["mmlu"]}
    (folder / "run_spec.json").write_text(json.dumps(spec, indent=2))
    entries = [{"instance_id": f"id{k}", "train_trial_index": 0,
                "stats": [stat("num_prompt_tokens", 120.0), stat("exact_match", v),
                          stat("quasi_exact_match", v)]} for k, v in enumerate(values)]
    entries += extra or []
    (folder / "per_instance_stats.json").write_text(json.dumps(entries, indent=2))
    for other in ("scenario.json", "scenario_state.json", "stats.json"):
        (folder / other).write_text("{}")
    return folder


def test_runs_become_one_matrix_by_scenario(tmp_path):
    runs = tmp_path / "benchmark_output" / "runs" / "v1"
    rng = np.random.default_rng(2)
    truth = {}
    for model in ("openai/gpt2", "meta/llama-7b"):
        for scenario, n in (("mmlu:subject=anatomy,method=multiple_choice_joint", 4),
                            ("boolq", 3)):
            values = rng.integers(0, 2, n).astype(float).tolist()
            perturbed = {"instance_id": "id0", "train_trial_index": 0,
                         "perturbation": {"name": "typos", "prob": 0.1},
                         "stats": [stat("exact_match", 1 - values[0])]}
            write_run(runs, scenario, model, values, extra=[perturbed])
            truth.update({(model, f"{scenario}/id{k}"): v for k, v in enumerate(values)})
    store = ingest(tmp_path / "benchmark_output", tmp_path / "s.zarr")
    assert store.meta["input_format"] == "helm" and store.kind == "binary"
    y, subjects, items = np.asarray(store.load()), list(store.subjects), list(store.items)
    assert len(items) == 7 and sorted(subjects) == ["meta/llama-7b", "openai/gpt2"]
    for (s, i), v in truth.items():
        assert y[subjects.index(s), items.index(i)] == v  # perturbed entries skipped


def test_missing_stat_lists_those_present_and_trials_need_keep(tmp_path):
    runs = tmp_path / "runs" / "v1"
    folder = write_run(runs, "boolq", "m/a", [1.0, 0.0])
    with pytest.raises(DataFormatError, match=r"per_instance_stats.json entry 1, instance 'id0': "
                                              r"no stat f1_score \(stats present: exact_match, "
                                              r"num_prompt_tokens, quasi_exact_match\)"):
        ingest(runs, tmp_path / "s.zarr", metric="f1_score")
    entries = json.loads((folder / "per_instance_stats.json").read_text())
    entries.append({"instance_id": "id1", "train_trial_index": 1, "stats": [stat("exact_match",
                                                                                  1.0)]})
    (folder / "per_instance_stats.json").write_text(json.dumps(entries))
    with pytest.raises(DataFormatError, match=r"entry 3: model 'm/a' answered item 'boolq/id1' "
                                              r"again \(1 here, 0 at .* entry 2\)"):
        ingest(runs, tmp_path / "s.zarr")
    store = ingest(runs, tmp_path / "s.zarr", keep="mean")
    np.testing.assert_array_equal(np.asarray(store.load()), [[1.0, 0.5]])


def test_unreadable_run_is_named(tmp_path):
    runs = tmp_path / "runs" / "v1"
    write_run(runs, "boolq", "m/a", [1.0])
    bad = write_run(runs, "boolq", "m/b", [1.0]) / "per_instance_stats.json"
    bad.write_text('[{"instance_id": "id0", ')
    with pytest.raises(DataFormatError, match=f"{bad}: not valid JSON"):
        ingest(runs, tmp_path / "s.zarr")
    (bad.parent / "run_spec.json").unlink()
    with pytest.raises(DataFormatError, match=f"{bad}: no run_spec.json beside it"):
        ingest(runs, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()
