"""lm-evaluation-harness ``--log_samples`` ingest, and ``--keep`` for runs repeated.

The layout is the one ``lm-eval`` 0.4.13 writes (PyPI wheel): ``lm_eval/loggers/
evaluation_tracker.py`` puts ``results_<date_id>.json`` (``date_id`` = ISO time with ``:``
as ``-``; ``asdict(GeneralConfigTracker)`` adds the top-level ``model_name``) and
``samples_<task>_<date_id>.jsonl`` under ``<output_path>/<model_name_sanitized>/``; each
sample line is built in ``lm_eval/evaluator.py`` (``doc_id``, ``doc``, ``target``,
``arguments``, ``resps``, ``filtered_resps``, ``filter``, ``metrics``, the three hashes, then
one key per metric).
"""

import json

import numpy as np
import pytest

from engine.data import ingest
from engine.errors import DataFormatError, SettingsError

DATE = "2024-05-01T12-30-45.123456"


def sample(doc_id, metrics, filt="none"):
    line = {"doc_id": doc_id, "doc": {"query": f"q{doc_id}", "choices": ["a", "b"], "gold": 0},
            "target": 0, "arguments": {"gen_args_0": {"arg_0": f"q{doc_id}", "arg_1": " a"},
                                       "gen_args_1": {"arg_0": f"q{doc_id}", "arg_1": " b"}},
            "resps": [[["-1.5", "False"]], [["-2.5", "False"]]],
            "filtered_resps": [["-1.5", "False"], ["-2.5", "False"]], "filter": filt,
            "metrics": list(metrics), "doc_hash": "d", "prompt_hash": "p", "target_hash": "t"}
    line.update(metrics)
    return json.dumps(line)


def write_run(root, model, tasks, *, date=DATE, name_key=True):
    folder = root / model.replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    results = {"results": {t: {} for t in tasks}, "config": {"model": "hf",
               "model_args": f"pretrained={model},dtype=float16"},
               "model_name_sanitized": model.replace("/", "__")}
    if name_key:
        results["model_name"] = model
    (folder / f"results_{date}.json").write_text(json.dumps(results, indent=2))
    for task, lines in tasks.items():
        (folder / f"samples_{task}_{date}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "out"
    rng = np.random.default_rng(1)
    truth = {}
    for m, name_key in (("org/model-a", True), ("org/model-b", False)):
        acc = rng.integers(0, 2, 5).astype(float)
        norm = rng.integers(0, 2, 5).astype(float)
        em = rng.integers(0, 2, 3).astype(float)
        write_run(root, m, {
            "hellaswag": [sample(k, {"acc": acc[k], "acc_norm": norm[k]}) for k in range(5)],
            "gsm8k": [sample(k, {"exact_match": em[k]}, "strict-match") for k in range(3)],
        }, name_key=name_key)
        truth[m] = (acc, norm, em)
    return root, truth


def cell(store, subject, item):
    return np.asarray(store.load())[list(store.subjects).index(subject),
                                    list(store.items).index(item)]


def test_metric_picks_the_response(runs, tmp_path):
    root, truth = runs
    store = ingest(root, tmp_path / "a.zarr", metric="acc_norm,exact_match")
    assert store.meta["input_format"] == "lm-eval" and store.kind == "binary"
    assert sorted(store.subjects) == ["org/model-a", "org/model-b"]  # model-b: model_args
    for m, (acc, norm, em) in truth.items():
        for k in range(5):
            assert cell(store, m, f"hellaswag/{k}") == norm[k]
        for k in range(3):
            assert cell(store, m, f"gsm8k/strict-match/{k}") == em[k]


def test_several_metrics_need_metric_and_a_missing_one_lists_those_present(runs, tmp_path):
    root, _ = runs
    with pytest.raises(DataFormatError, match=r"samples_gsm8k_.*line 1: task 'gsm8k'|"
                                              r"samples_hellaswag_.*line 1: task 'hellaswag' "
                                              r"has metrics acc, acc_norm; pick one"):
        ingest(root, tmp_path / "a.zarr")
    with pytest.raises(DataFormatError, match=r"line 1: no metric acc on this line \(metrics "
                                              r"present: exact_match\); pick one with --metric"):
        ingest(root, tmp_path / "a.zarr", metric="acc")
    assert not (tmp_path / "a.zarr").exists()


def test_mixed_kinds_give_unit_and_a_list_metric_is_an_error(tmp_path):
    root = tmp_path / "out"
    write_run(root, "m", {"squad": [sample(0, {"f1": 0.5}), sample(1, {"f1": 1.0})],
                          "boolq": [sample(0, {"f1": True})]})
    store = ingest(root, tmp_path / "u.zarr")
    assert store.kind == "unit"
    assert cell(store, "m", "squad/0") == np.float32(0.5) and cell(store, "m", "boolq/0") == 1
    write_run(root, "m", {"wmt": [sample(0, {"bleu": ["ref", "hyp"]})]})
    with pytest.raises(DataFormatError, match=r'samples_wmt_.*line 1, field "bleu": got '
                                              r'\["ref", "hyp"\]; expected a per-sample number'):
        ingest(root, tmp_path / "b.zarr")


def test_missing_results_file_and_model_name(tmp_path):
    root = tmp_path / "out"
    folder = write_run(root, "m", {"t": [sample(0, {"acc": 1.0})]})
    results = folder / f"results_{DATE}.json"
    results.write_text(json.dumps({"config": {"model": "openai-chat-completions",
                                              "model_args": "model=gpt-4o-mini,max_retries=3"}}))
    assert list(ingest(root, tmp_path / "b.zarr").subjects) == ["gpt-4o-mini"]  # as lm-eval names it
    results.write_text(json.dumps({"config": {"model": "hf", "model_args": "dtype=float16"}}))
    with pytest.raises(DataFormatError, match=f'{results}: no "model_name" and no pretrained='):
        ingest(root, tmp_path / "a.zarr", fmt="lm-eval")
    results.unlink()
    with pytest.raises(DataFormatError, match=f"no results_{DATE}.json beside it"):
        ingest(root, tmp_path / "a.zarr", fmt="lm-eval")


def test_a_model_run_twice_needs_keep(tmp_path):
    root = tmp_path / "out"
    later = "2024-06-02T08-00-00.000001"
    write_run(root, "m", {"t": [sample(0, {"acc": 0.0}), sample(1, {"acc": 1.0})]})
    write_run(root, "m", {"t": [sample(1, {"acc": 1.0}), sample(0, {"acc": 1.0})]}, date=later)
    with pytest.raises(DataFormatError, match=rf"samples_t_{later}.jsonl line 2: model 'm' answered "
                                              rf"item 't/0' again \(1 here, 0 at .*samples_t_{DATE}"
                                              rf".jsonl line 1\).*--keep first\|latest\|mean"):
        ingest(root, tmp_path / "a.zarr")
    assert not (tmp_path / "a.zarr").exists()
    expect = {"first": 0.0, "latest": 1.0, "mean": 0.5}
    for keep, value in expect.items():
        store = ingest(root, tmp_path / f"{keep}.zarr", keep=keep)
        assert cell(store, "m", "t/0") == np.float32(value) and cell(store, "m", "t/1") == 1
        assert store.kind == ("unit" if keep == "mean" else "binary")
    with pytest.raises(DataFormatError, match="averages to 0.5, not binary"):
        ingest(root, tmp_path / "bad.zarr", keep="mean", kind="binary")


def test_a_task_reads_one_metric_and_a_null_is_named(runs, tmp_path):
    """--metric acc_norm,acc takes acc where a line's acc_norm is null: the task's cells would
    mix two metrics. That is an error naming both lines, within a file and across models."""
    root, _ = runs
    path = next((root / "org__model-a").glob("samples_hellaswag_*.jsonl"))
    lines = path.read_text().splitlines()
    obj = json.loads(lines[2])
    obj["acc_norm"] = None
    path.write_text("\n".join(lines[:2] + [json.dumps(obj)] + lines[3:]) + "\n")
    with pytest.raises(DataFormatError, match=rf"{path.name} line 3: task 'hellaswag' reads "
                                              rf"metric 'acc' here, but 'acc_norm' at .*{path.name} "
                                              rf"line 1; .* one metric"):
        ingest(root, tmp_path / "a.zarr", metric="acc_norm,acc,exact_match")
    with pytest.raises(DataFormatError, match=r"line 3: no metric acc_norm or exact_match on this line \(metrics "
                                              r"present: acc, acc_norm \(null\)\)"):
        ingest(root, tmp_path / "a.zarr", metric="acc_norm,exact_match")
    # one metric every line holds: read
    store = ingest(root, tmp_path / "b.zarr", metric="acc,exact_match")
    assert store.shape == (2, 8)
    # across models: model-b's hellaswag has no acc_norm at all
    path.write_text("\n".join(lines) + "\n")
    other = next((root / "org__model-b").glob("samples_hellaswag_*.jsonl"))
    rows = [json.loads(line) for line in other.read_text().splitlines()]
    for r in rows:
        del r["acc_norm"]
        r["metrics"] = ["acc"]
    other.write_text("\n".join(map(json.dumps, rows)) + "\n")
    with pytest.raises(DataFormatError, match=r"task 'hellaswag' reads metric 'acc' here, but "
                                              r"'acc_norm' at "):
        ingest(root, tmp_path / "c.zarr", metric="acc_norm,acc,exact_match")
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "c.zarr").exists()


def test_linked_run_folders_are_read_and_a_dangling_link_is_named(runs, tmp_path):
    """A run folder linked into the output folder is a model like any other (it was skipped
    without a word); a samples file linked to nothing is an error naming it."""
    import os

    root, truth = runs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "org__model-b").rename(elsewhere / "org__model-b")
    os.symlink(elsewhere / "org__model-b", root / "org__model-b")
    os.symlink(root, root / "org__model-a" / "loop")  # a link back up the tree: read once
    store = ingest(root, tmp_path / "a.zarr", metric="acc_norm,exact_match")
    assert sorted(store.subjects) == ["org/model-a", "org/model-b"] and store.shape == (2, 8)
    assert cell(store, "org/model-b", "hellaswag/2") == truth["org/model-b"][1][2]
    dangling = root / "org__model-a" / f"samples_arc_{DATE}.jsonl"
    os.symlink(tmp_path / "gone.jsonl", dangling)
    with pytest.raises(DataFormatError, match=rf"{dangling.name}: a link to .*gone\.jsonl, which "
                                              rf"does not exist; restore its target or remove"):
        ingest(root, tmp_path / "b.zarr", metric="acc_norm,exact_match")
    assert not (tmp_path / "b.zarr").exists()


def test_one_folder_of_two_log_formats_is_refused(runs, tmp_path):
    """An lm-eval tree and a HELM run in one folder: reading the first format found dropped
    the other's models without a word."""
    root, _ = runs
    helm = root / "helm" / "mmlu:subject=x,model=org_m"
    helm.mkdir(parents=True)
    (helm / "run_spec.json").write_text(json.dumps({"name": "mmlu:subject=x,model=org/m",
                                                    "adapter_spec": {"model": "org/m"}}))
    (helm / "per_instance_stats.json").write_text(json.dumps([
        {"instance_id": "id1", "train_trial_index": 0,
         "stats": [{"name": {"name": "exact_match", "split": "test"}, "count": 1, "sum": 1.0,
                    "mean": 1.0}]}]))
    with pytest.raises(DataFormatError, match=rf"{root} holds logs of several formats \(lm-eval, "
                                              rf"helm\); ingest one format at a time"):
        ingest(root, tmp_path / "a.zarr", metric="acc_norm,exact_match")
    assert not (tmp_path / "a.zarr").exists()


def test_a_link_to_nothing_is_named_whatever_the_format_looks_for(tmp_path):
    """A dangling ``.json`` link: Inspect's detector opens .json files to read them, and a
    link it could not open was skipped without a word."""
    import os

    logs = tmp_path / "logs"
    logs.mkdir()
    os.symlink(tmp_path / "gone.json", logs / "2026-01-01_toy.json")
    with pytest.raises(DataFormatError, match=r"2026-01-01_toy\.json: a link to .*gone\.json, which "
                                              r"does not exist"):
        ingest(logs, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def test_filter_keeps_one_scoring_of_each_document(tmp_path, capsys):
    """gsm8k scored under strict-match and flexible-extract gives two items per document,
    counting it twice; --filter keeps one. Tasks without a filter are kept; a filter no line
    of a task carries is an error listing the task's."""
    from engine.cli import main

    root = tmp_path / "out"
    em = {"strict-match": [1.0, 0.0, 1.0], "flexible-extract": [1.0, 1.0, 1.0]}
    write_run(root, "org/m", {
        "gsm8k": [sample(k, {"exact_match": em[f][k]}, f) for f in em for k in range(3)],
        "hellaswag": [sample(k, {"acc": 1.0}) for k in range(2)],
        "triviaqa": [sample(k, {"exact_match": 1.0}, "remove_whitespace") for k in range(2)]})
    both = ingest(root, tmp_path / "both.zarr", metric="exact_match,acc")
    assert both.shape == (1, 10)
    # a task under one filter (triviaqa) or none (hellaswag) is read whole
    one = ingest(root, tmp_path / "one.zarr", metric="exact_match,acc", filters="strict-match")
    assert sorted(one.items) == ["gsm8k/strict-match/0", "gsm8k/strict-match/1",
                                 "gsm8k/strict-match/2", "hellaswag/0", "hellaswag/1",
                                 "triviaqa/remove_whitespace/0", "triviaqa/remove_whitespace/1"]
    assert cell(one, "org/m", "gsm8k/strict-match/1") == 0.0
    with pytest.raises(DataFormatError, match=r"samples_gsm8k_.*task 'gsm8k' is scored under "
                                              r"filters flexible-extract, strict-match, none of "
                                              r"--filter strict_match; name one of them"):
        ingest(root, tmp_path / "typo.zarr", metric="exact_match,acc", filters="strict_match")
    assert not (tmp_path / "typo.zarr").exists()
    # a name no task carries, beside one that a task does (a misspelt second filter): named,
    # with the filters present, once every file is read, and no store written
    with pytest.raises(SettingsError, match=r"--filter flexible_extract: no task in .* is scored "
                                            r"under it; the filters present are flexible-extract, "
                                            r"remove_whitespace, strict-match"):
        ingest(root, tmp_path / "typo2.zarr", metric="exact_match,acc",
               filters="strict-match,flexible_extract")
    assert not (tmp_path / "typo2.zarr").exists()
    assert not list(tmp_path.glob(".typo2*"))  # nor the reading's scratch
    # "none" names lm-eval's unfiltered lines, always kept: never unknown
    kept = ingest(root, tmp_path / "none.zarr", metric="exact_match,acc",
                  filters="strict-match,none")
    assert sorted(kept.items) == sorted(one.items)
    wide = tmp_path / "wide.csv"
    wide.write_text("subject,q1\na,1\nb,0\n")
    capsys.readouterr()
    assert main(["ingest", str(wide), "--out", str(tmp_path / "w.zarr"), "--filter", "x"]) == 2
    assert "--filter applies to lm-eval logs only; this input is wide" in capsys.readouterr().err
