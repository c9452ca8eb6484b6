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


def write_log(path, model, task, scores, *, fmt):
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalSample, EvalSpec, write_eval_log
    from inspect_ai.scorer import Score

    ids = list(scores)
    spec = EvalSpec(created="2026-01-01T00:00:00+00:00", task=task, model=model,
                    dataset=EvalDataset(name=task, samples=len(ids), sample_ids=ids),
                    config=EvalConfig())
    samples = [EvalSample(id=i, epoch=1, input=f"question {i}", target="A",
                          scores={name: Score(value=v) for name, v in scores[i].items()})
               for i in ids]
    write_eval_log(EvalLog(eval=spec, status="success", samples=samples), str(path), format=fmt)


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
    with pytest.raises(DataFormatError, match=r"a.eval sample 1 \(id 's0'\): scorers match, f1; "
                                              r"pick one with --metric"):
        ingest(logs, tmp_path / "s.zarr")
    with pytest.raises(DataFormatError, match=r'a.eval sample 2 \(id \'s1\'\), scorer "f1": a list'):
        ingest(logs, tmp_path / "s.zarr", metric="f1")
    store = ingest(logs, tmp_path / "s.zarr", metric="match")
    np.testing.assert_array_equal(np.asarray(store.load()), [[1, 0]])
