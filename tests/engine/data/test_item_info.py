"""The store's item side table (engine.data.formats.item_info): sample ids, hashes, a hash of
the input, metadata and where each item was first seen, for every log format that has them.

Layouts as in tests/engine/data/test_every_eval_ever.py (Every Eval Ever instance-level
schema 0.2.x), test_lm_eval_logs.py (lm-eval ``--log_samples``: ``doc``, ``doc_hash``,
``prompt_hash``, ``target_hash``, ``target`` per ``lm_eval/evaluator.py``) and
test_helm_logs.py (HELM ``per_instance_stats.json``).
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine.data import ingest, open_store
from engine.data.formats.item_info import METADATA_CHARS, PREVIEW_CHARS, read_item_info
from engine.errors import DataFormatError

from test_helm_logs import write_run


def _sha(value) -> str:  # independent: canonical JSON as the module doc defines it
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _eee_line(model, ev, sample, value, *, text="", meta=None):
    return json.dumps({
        "schema_version": "instance_level_eval_0.2.2", "evaluation_id": f"{ev}/{model}",
        "model_id": model, "evaluation_name": ev, "sample_id": sample,
        "sample_hash": f"hash-{ev}-{sample}", "interaction_type": "single_turn",
        "input": {"raw": text or f"Question {sample}?", "reference": ["B"],
                  "choices": ["A", "B"]},
        "output": {"raw": ["B"]}, "evaluation": {"score": value, "is_correct": bool(value)},
        "metadata": meta if meta is not None else {"subject": f"{ev}_{sample}"}}) + "\n"


def test_every_eval_ever_keeps_hash_input_and_metadata(tmp_path):
    root = tmp_path / "logs"
    long_text = "x" * 50_000  # kept as a hash and a preview, never whole
    big_meta = {"notes": "y" * (METADATA_CHARS + 10)}
    a = root / "mmlu" / "dev" / "a" / "1_samples.jsonl"
    b = root / "mmlu" / "dev" / "b" / "2_samples.jsonl"
    for p in (a, b):
        p.parent.mkdir(parents=True)
    a.write_text(_eee_line("a", "mmlu", "1", 1.0) + _eee_line("a", "mmlu", "2", 0.0))
    # b brings one item a did not have, with a long input and long metadata; its line for
    # item 1 (already seen in a) is not where item 1 is described
    b.write_text(_eee_line("b", "mmlu", "1", 0.0, text="other text", meta={"subject": "z"})
                 + "\n" + _eee_line("b", "mmlu", "3", 1.0, text=long_text, meta=big_meta))
    store = ingest(root, tmp_path / "s.zarr")
    info = read_item_info(store)
    assert sorted(info.index) == sorted(store.items) == ["mmlu/1", "mmlu/2", "mmlu/3"]
    one, three = info.loc["mmlu/1"], info.loc["mmlu/3"]
    assert (one.file, one.line, one.group, one.sample_id) == (str(a), 1, "mmlu", "1")
    assert one.sample_hash == "hash-mmlu-1" and one.input_preview == "Question 1?"
    assert one.input_sha256 == _sha({"raw": "Question 1?", "reference": ["B"],
                                     "choices": ["A", "B"]})
    assert json.loads(one.metadata) == {"subject": "mmlu_1"}
    assert (three.file, three.line) == (str(b), 3)  # line 2 is blank
    assert three.input_sha256 == _sha({"raw": long_text, "reference": ["B"],
                                       "choices": ["A", "B"]})
    assert three.input_preview == long_text[:PREVIEW_CHARS]
    assert three.metadata == "sha256:" + _sha(big_meta)
    assert list(read_item_info(tmp_path / "s.zarr", ["mmlu/2"]).index) == ["mmlu/2"]
    # the side table is in the store directory and nothing is left beside it
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    np.testing.assert_array_equal(open_store(tmp_path / "s.zarr", verify=True).load(),
                                  [[1, 0, -1], [0, -1, 1]])


def test_lm_eval_keeps_doc_hash_and_target(tmp_path):
    run = tmp_path / "out" / "org__model"
    run.mkdir(parents=True)
    date = "2024-05-01T12-00-00.000000"
    (run / f"results_{date}.json").write_text(json.dumps({"model_name": "org/model"}))
    docs = [{"question": "2+2?", "choices": ["3", "4"], "answer": 1},
            {"question": "3+3?", "choices": ["6", "7"], "answer": 0}]
    lines = [{"doc_id": k, "doc": d, "target": str(d["answer"]), "arguments": [],
              "resps": [], "filtered_resps": [], "filter": "none", "metrics": ["acc"],
              "doc_hash": f"dh{k}", "prompt_hash": f"ph{k}", "target_hash": f"th{k}",
              "acc": float(k == 0)} for k, d in enumerate(docs)]
    (run / f"samples_arith_{date}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    info = read_item_info(ingest(tmp_path / "out", tmp_path / "s.zarr"))
    row = info.loc["arith/1"]
    assert (row.sample_id, row.sample_hash, row.line) == ("1", "dh1", 2)
    assert row.input_sha256 == _sha(docs[1])
    assert json.loads(row.metadata) == {"target": "0", "prompt_hash": "ph1", "target_hash": "th1"}


def test_helm_keeps_instance_ids(tmp_path):
    runs = tmp_path / "runs" / "v1"
    write_run(runs, "boolq", "openai/gpt2", [1.0, 0.0])
    write_run(runs, "boolq", "meta/llama", [0.0, 1.0])
    info = read_item_info(ingest(runs, tmp_path / "s.zarr"))
    assert list(info.sample_id) == ["id0", "id1"] and list(info.line) == [1, 2]
    assert info.input_sha256.isna().all()
    assert all(json.loads(m) == {"train_trial_index": 0} for m in info.metadata)


def test_tables_have_no_side_table(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("model,q1\na,1\nb,0\n")
    store = ingest(path, tmp_path / "s.zarr")
    with pytest.raises(DataFormatError, match="no item_info.parquet; item details are kept "
                                              "only for evaluation logs"):
        read_item_info(store)
    assert not (Path(store.path) / "item_info.parquet").exists()
