"""Every Eval Ever instance-level JSONL ingest.

Lines follow ``every_eval_ever/schemas/instance_level_eval.schema.json`` (``every-eval-ever``
0.2.3rc1 on PyPI, schema ``instance_level_eval_0.2.2``): the required ``schema_version``,
``evaluation_id``, ``model_id``, ``evaluation_name``, ``sample_id``, ``interaction_type``,
``input`` {raw, reference}, ``answer_attribution`` and ``evaluation`` {score, is_correct};
folders are nested ``<evaluation>/<developer>/<model>/<uuid>_samples.jsonl`` beside the
aggregate ``<uuid>.json``, as the package's converters write them
(``converters/lm_eval/instance_level_adapter.py``).
"""

import json

import numpy as np
import pytest

from engine.cli import main
from engine.data import ingest, open_store
from engine.errors import DataFormatError, SettingsError


def eee_line(model, evaluation, sample, score, correct=None, **extra):
    obj = {"schema_version": "instance_level_eval_0.2.2", "evaluation_id": f"{evaluation}/{model}",
           "model_id": model, "evaluation_name": evaluation, "sample_id": sample,
           "sample_hash": f"h{sample}", "interaction_type": "single_turn",
           "input": {"raw": f"question {sample}", "reference": ["A"], "choices": ["A", "B"]},
           "output": {"raw": ["A"]},
           "answer_attribution": [{"turn_idx": 0, "source": "output.raw", "extracted_value": "A",
                                   "extraction_method": "exact_match", "is_terminal": True}],
           "evaluation": {"score": score,
                          "is_correct": bool(score == 1) if correct is None else correct},
           "metadata": {"subject": "x"}}
    obj.update(extra)
    return json.dumps(obj)


def write_model(root, evaluation, developer, model, scores, *, name="0a1b_samples.jsonl"):
    folder = root / evaluation / developer / model
    folder.mkdir(parents=True, exist_ok=True)
    lines = [eee_line(f"{developer}/{model}", evaluation, str(k), v) for k, v in scores.items()]
    (folder / name).write_text("\n".join(lines) + "\n")
    (folder / name.replace("_samples.jsonl", ".json")).write_text("{}")  # aggregate: skipped
    return folder / name


def dense(store):
    return np.asarray(store.load())


@pytest.fixture
def logs(tmp_path):
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    truth = {}
    for m in ("m1", "m2", "m3"):
        for ev, n in (("mmlu", 6), ("gsm8k", 4)):
            if (m, ev) == ("m3", "gsm8k"):
                continue  # a model missing a whole evaluation: missing cells, not zeros
            scores = {k: float(rng.integers(0, 2)) for k in range(n)}
            write_model(root, ev, "dev", m, scores)
            truth.update({(f"dev/{m}", f"{ev}/{k}"): v for k, v in scores.items()})
    return root, truth


def test_folder_is_one_matrix_with_missing_evaluations(logs, tmp_path):
    root, truth = logs
    store = ingest(root, tmp_path / "s.zarr")
    assert store.meta["input_format"] == "every-eval-ever" and store.kind == "binary"
    subjects, items, y = list(store.subjects), list(store.items), dense(store)
    assert sorted(subjects) == ["dev/m1", "dev/m2", "dev/m3"] and len(items) == 10
    for (s, i), v in truth.items():
        assert y[subjects.index(s), items.index(i)] == v
    m3 = subjects.index("dev/m3")
    assert all(y[m3, items.index(f"gsm8k/{k}")] == -1 for k in range(4))  # missing, not 0
    assert store.num_observed == len(truth)


def test_unit_scores_and_is_correct_metric(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(eee_line("a", "e", "1", 0.25, False) + "\n" + eee_line("a", "e", "2", 1.0)
                    + "\n" + eee_line("b", "e", "1", 0.5, True) + "\n")
    store = ingest(path, tmp_path / "u.zarr")
    assert store.kind == "unit"
    np.testing.assert_array_equal(dense(store), np.array([[0.25, 1.0], [0.5, np.nan]], np.float32))
    store = ingest(path, tmp_path / "b.zarr", metric="is_correct")
    assert store.kind == "binary"
    np.testing.assert_array_equal(dense(store), [[0, 1], [1, -1]])


@pytest.mark.parametrize("bad, message", [
    ("{not json", "line 2: not valid JSON"),
    (eee_line("a", "e", "9", "0.5"), 'line 2, field "evaluation.score": got "0.5"'),
    (eee_line("a", "e", "9", -0.5), 'line 2, field "evaluation.score": got -0.5'),
    (eee_line("", "e", "9", 1.0), 'line 2, field "model_id": empty model id'),
    (json.dumps({"model_id": "a", "evaluation_name": "e", "sample_id": "9"}),
     'line 2, field "evaluation": missing'),
    (eee_line("a", "e", "9", None, None), "line 2: no metric score on this line"),
    (eee_line("a", "e", 9.5, 1.0), 'line 2, field "sample_id": got 9.5'),
    (eee_line("a", "e", "9", float("nan")), 'line 2, field "evaluation.score": got NaN'),
    (eee_line("a", "e", "9", float("inf")), 'line 2, field "evaluation.score": got inf'),
])
def test_malformed_line_names_file_line_and_field(tmp_path, bad, message):
    path = tmp_path / "in.jsonl"
    path.write_text(eee_line("a", "e", "1", 1.0) + "\n" + bad + "\n")
    with pytest.raises(DataFormatError, match=str(path).replace(".", r"\.")) as err:
        ingest(path, tmp_path / "out.zarr", fmt="every-eval-ever")
    assert message in str(err.value)
    assert not (tmp_path / "out.zarr").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]  # no scratch left behind


def test_folder_with_one_unreadable_file(logs, tmp_path):
    root, _ = logs
    bad = root / "mmlu" / "dev" / "m2" / "zz_samples.jsonl"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe binary")
    with pytest.raises(DataFormatError, match=f"{bad} line 1: not UTF-8 text"):
        ingest(root, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    stray = root / "notes.txt"
    bad.unlink()
    stray.write_text("hi")
    with pytest.raises(DataFormatError, match=f"{stray}: not a .jsonl file"):
        ingest(root, tmp_path / "out.zarr")


def test_kind_given_is_checked_with_location(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(eee_line("a", "e", "1", 1.0) + "\n\n" + eee_line("a", "e", "2", 0.5) + "\n")
    with pytest.raises(DataFormatError, match=r'line 3, field "evaluation.score": got 0.5; '
                                              r"expected 0 or 1 for kind 'binary'"):
        ingest(path, tmp_path / "out.zarr", kind="binary")


def test_py_irt_jsonl_is_not_taken_for_a_log(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"subject_id": "a", "responses": {"q1": 1, "q2": 0}}\n')
    assert ingest(path, tmp_path / "s.zarr").meta["input_format"] == "jsonl"
    with pytest.raises(SettingsError, match="--metric and --keep apply to evaluation logs"):
        ingest(path, tmp_path / "t.zarr", metric="score")


def test_cli_prints_the_detected_format(logs, tmp_path, capsys):
    root, truth = logs
    assert main(["ingest", str(root), "--out", str(tmp_path / "c.zarr")]) == 0
    out = capsys.readouterr().out
    assert "detected format every-eval-ever" in out and "3 subjects x 10 items" in out
    assert open_store(tmp_path / "c.zarr").num_observed == len(truth)


def test_arrow_and_line_readers_agree(tmp_path):
    """Arrow's reader takes files without blank lines; the line reader (the reference) takes
    the others, and the lines Arrow cannot take as they are (integer sample ids)."""
    from engine.data.formats.base import plain_lines

    rng = np.random.default_rng(3)
    lines = [eee_line(f"m{s}", ev, str(k), float(rng.integers(0, 2)))
             for s in range(4) for ev in ("a", "b") for k in range(7)]
    fast, slow, ints = tmp_path / "fast.jsonl", tmp_path / "slow.jsonl", tmp_path / "ints.jsonl"
    fast.write_text("\n".join(lines) + "\n")
    slow.write_text("\n".join(lines[:5]) + "\n  \n" + "\n".join(lines[5:]) + "\n")
    ints.write_text("\n".join(line.replace('"sample_id": "3"', '"sample_id": 3')
                              for line in lines) + "\n")
    assert plain_lines(fast) and not plain_lines(slow) and plain_lines(ints)
    stores = [ingest(p, tmp_path / f"{p.stem}.zarr") for p in (fast, slow, ints)]
    for store in stores[1:]:
        assert list(store.subjects) == list(stores[0].subjects)
        assert list(store.items) == list(stores[0].items)
        np.testing.assert_array_equal(dense(store), dense(stores[0]))
    assert dense(stores[0]).shape == (4, 14)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:9]) + "\n" + eee_line("m0", "a", " ", 1.0) + "\n")
    with pytest.raises(DataFormatError, match='bad.jsonl line 10, field "sample_id": empty'):
        ingest(bad, tmp_path / "bad.zarr")


def test_gzip_files_and_a_truncated_one(tmp_path):
    import gzip

    text = "\n".join(eee_line(m, "e", str(k), float((k + len(m)) % 2))
                     for m in ("a", "bb") for k in range(3)) + "\n"
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "x.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    store = ingest(folder, tmp_path / "s.zarr")
    np.testing.assert_array_equal(dense(store), [[1, 0, 1], [0, 1, 0]])
    (folder / "y.jsonl.gz").write_bytes(gzip.compress(text.encode())[:-20])
    with pytest.raises(DataFormatError, match=r"y.jsonl.gz: cannot read it"):
        ingest(folder, tmp_path / "t.zarr")
    assert not (tmp_path / "t.zarr").exists()


def test_an_evaluation_reads_one_metric_on_both_readers(tmp_path):
    """--metric score,is_correct takes is_correct where a line's score is null: refused
    naming both lines, whether the first lines went through Arrow's reader or not."""
    root = tmp_path / "data"
    path = write_model(root, "mmlu", "dev", "m1", {k: float(k % 2) for k in range(5)})
    lines = path.read_text().splitlines()
    obj = json.loads(lines[3])
    obj["evaluation"]["score"] = None
    path.write_text("\n".join(lines[:3] + [json.dumps(obj)] + lines[4:]) + "\n")
    with pytest.raises(DataFormatError, match=r"line 4: task 'mmlu' reads metric "
                                              r"'evaluation.is_correct' here, but 'evaluation.score' "
                                              r"at .*line 1"):
        ingest(root, tmp_path / "a.zarr", metric="score,is_correct")
    store = ingest(root, tmp_path / "b.zarr", metric="is_correct")
    assert store.shape == (1, 5)
    assert not (tmp_path / "a.zarr").exists()
