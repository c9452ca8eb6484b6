"""Inspect AI logs (``.eval`` and ``.json``), read through the ``inspect-ai`` log API.

Logs are written with inspect-ai's own ``write_eval_log`` (``inspect_ai/log/_file.py``,
inspect-ai 0.3.285) from ``EvalLog`` / ``EvalSpec`` / ``EvalSample`` / ``Score``
(``inspect_ai/log/_log.py``), so the files are in the layout Inspect writes. Without the
optional extra the reader's error names it; the log tests run only where it is installed.
"""

import importlib.util

import numpy as np
import pytest

from engine.data import ingest
from engine.errors import DataFormatError, SettingsError

HAVE_INSPECT = importlib.util.find_spec("inspect_ai") is not None


@pytest.mark.skipif(HAVE_INSPECT, reason="inspect-ai is installed")
def test_without_the_extra_the_error_names_it(tmp_path):
    log = tmp_path / "logs" / "2026-01-01T00-00-00_toy_abc.eval"
    log.parent.mkdir()
    log.write_bytes(b"PK\x03\x04 not read")
    with pytest.raises(SettingsError, match=r"needs the optional extra: pip install "
                                            r"'irt-engine\[inspect\]'"):
        ingest(log.parent, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def write_log(path, model, task, scores, *, fmt, errors=()):
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalSample, EvalSpec, write_eval_log
    from inspect_ai.scorer import Score

    ids = list(scores)
    spec = EvalSpec(created="2026-01-01T00:00:00+00:00", task=task, model=model,
                    dataset=EvalDataset(name=task, samples=len(ids), sample_ids=ids),
                    config=EvalConfig())
    from inspect_ai._util.error import EvalError

    samples = [EvalSample(id=i, epoch=1, input=f"question {i}", target="A",
                          scores={name: Score(value=v) for name, v in scores[i].items()} or None,
                          error=EvalError(message="model timed out", traceback="",
                                          traceback_ansi="") if i in errors else None)
               for i in ids]
    write_eval_log(EvalLog(eval=spec, status="error" if errors else "success", samples=samples),
                   str(path), format=fmt)


@pytest.mark.skipif(not HAVE_INSPECT, reason="needs the inspect extra (inspect-ai)")
def test_eval_and_json_logs(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.eval", "mockllm/a", "toy", {"s0": {"match": "C"}, "s1": {"match": "I"},
                                                    7: {"match": 0.5}}, fmt="eval")
    write_log(logs / "b.json", "mockllm/b", "toy", {"s0": {"match": "I"}, 7: {"match": True}},
              fmt="json")
    store = ingest(logs, tmp_path / "s.zarr")
    assert store.meta["input_format"] == "inspect" and store.kind == "unit"
    y = np.asarray(store.load())
    assert list(store.subjects) == ["mockllm/a", "mockllm/b"]
    assert list(store.items) == ["toy/s0", "toy/s1", "toy/7"]
    np.testing.assert_array_equal(y, np.array([[1, 0, 0.5], [0, np.nan, 1]], np.float32))


@pytest.mark.skipif(not HAVE_INSPECT, reason="needs the inspect extra (inspect-ai)")
def test_scorers_need_metric_and_list_values_are_errors(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.eval", "m", "t", {"s0": {"match": "C", "f1": 0.3},
                                          "s1": {"match": "I", "f1": [1, 2]}}, fmt="eval")
    with pytest.raises(DataFormatError, match=r"a.eval sample 1 \(id 's0', epoch 1\): scorers match, f1; "
                                              r"pick one with --metric"):
        ingest(logs, tmp_path / "s.zarr")
    with pytest.raises(DataFormatError, match=r'a.eval sample 2 \(id \'s1\', epoch 1\), scorer "f1": a list'):
        ingest(logs, tmp_path / "s.zarr", metric="f1")
    store = ingest(logs, tmp_path / "s.zarr", metric="match")
    np.testing.assert_array_equal(np.asarray(store.load()), [[1, 0]])


@pytest.mark.skipif(not HAVE_INSPECT, reason="needs the inspect extra (inspect-ai)")
@pytest.mark.parametrize("value", ["maybe", "unknown", "", "c", "p", " yes ", "nan", "inf"])
def test_a_score_inspect_would_read_as_zero_is_refused(tmp_path, value):
    """Inspect's value_to_float turns text it does not know (and None) into 0 with a log
    warning; the cell was stored as 0."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.json", "m", "t", {"s0": {"match": "C"}, "s1": {"match": value},
                                          "s2": {"match": "yes"}, "s3": {"match": " 0.25"}},
              fmt="json")
    with pytest.raises(DataFormatError, match=r"a.json sample \d \(id 's1', epoch 1\), scorer "
                                              r"\"match\": got .*Inspect would read it as 0"):
        ingest(logs, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.skipif(not HAVE_INSPECT, reason="needs the inspect extra (inspect-ai)")
def test_known_text_scores_read_as_inspect_reads_them(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.json", "m", "t", {"s0": {"match": "C"}, "s1": {"match": "P"},
                                          "s2": {"match": "Yes"}, "s3": {"match": "0.25"},
                                          "s4": {"match": "N"}}, fmt="json")
    store = ingest(logs, tmp_path / "s.zarr")
    got = dict(zip(store.items, np.asarray(store.load())[0]))
    assert got == {"t/s0": 1.0, "t/s1": 0.5, "t/s2": 1.0, "t/s3": 0.25, "t/s4": 0.0}


@pytest.mark.skipif(not HAVE_INSPECT, reason="needs the inspect extra (inspect-ai)")
def test_a_sample_that_errored_is_named_as_such(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.eval", "m", "t", {"s0": {"match": "C"}, "s1": {}}, fmt="eval",
              errors=("s1",))
    with pytest.raises(DataFormatError, match=r"\(id 's1', epoch 1\): no score: the sample ended "
                                              r"in an error \(model timed out\); rerun it"):
        ingest(logs, tmp_path / "s.zarr")


@pytest.mark.skipif(not HAVE_INSPECT, reason="needs the inspect extra (inspect-ai)")
def test_a_task_reads_one_scorer(tmp_path):
    """--metric f1,match takes match where a sample has no f1: refused naming both samples."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "a.eval", "m", "t", {"s0": {"match": "C", "f1": 0.3}, "s1": {"match": "I"}},
              fmt="eval")
    with pytest.raises(DataFormatError, match=r"\(id 's1', epoch 1\): task 't' reads metric 'match' "
                                              r"here, but 'f1' at .*\(id 's0', epoch 1\)"):
        ingest(logs, tmp_path / "s.zarr", metric="f1,match")
