"""Streaming long-format ingest: folders of files, sparse layout, bounded peak memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data import ingest, open_store
from engine.data.long import ingest_long
from engine.errors import DataFormatError, SettingsError

ROOT = Path(__file__).resolve().parents[3]
DATA = Path("/work/shared/data")
INSTEVAL = DATA / "psych_human_r" / "insteval_long.parquet"


def _frame(num_subjects, num_items, seed, missing=0.0):
    rng = np.random.default_rng(seed)
    s, i = np.meshgrid(np.arange(num_subjects), np.arange(num_items), indexing="ij")
    frame = pd.DataFrame({"subject": [f"s{k}" for k in s.ravel()],
                          "item": [f"q{k}" for k in i.ravel()],
                          "response": rng.integers(0, 2, s.size).astype(float)})
    frame.loc[rng.random(len(frame)) < missing, "response"] = np.nan
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def _split(frame, parts):
    cuts = np.linspace(0, len(frame), parts + 1).astype(int)
    return [frame.iloc[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _dense(frame, store):
    """The expected matrix, in the store's id order."""
    y = np.full(store.shape, -1, np.int8)
    s_at = {s: k for k, s in enumerate(store.subjects)}
    i_at = {i: k for k, i in enumerate(store.items)}
    seen = frame.response.notna()
    y[frame.subject[seen].map(s_at), frame.item[seen].map(i_at)] = frame.response[seen]
    return y


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_folder_of_parquet_files_in_small_batches(tmp_path, layout):
    """Many batches and bands (tiny budget) give the same store as the whole table."""
    frame = _frame(37, 23, seed=1, missing=0.3)
    folder = tmp_path / "parts"
    folder.mkdir()
    for k, part in enumerate(_split(frame, 4)):
        part.to_parquet(folder / f"part-{k}.parquet", index=False, row_group_size=50)
    store = ingest_long(sorted(folder.glob("*.parquet")), tmp_path / "out.zarr", layout=layout,
                        chunks=(4, 8), memory_budget=2000, batch_rows=64)
    assert store.layout == layout and store.meta["input_format"] == "long"
    first = list(dict.fromkeys(frame.subject))  # ids in first-appearance order
    assert list(store.subjects) == first and list(store.items) == list(dict.fromkeys(frame.item))
    np.testing.assert_array_equal(store.load(), _dense(frame, store))
    assert store.num_observed == int(frame.response.notna().sum())
    assert open_store(store.path, verify=True).meta["checksum"] == store.meta["checksum"]
    whole = ingest(folder, tmp_path / "whole.zarr", layout=layout)
    assert whole.meta["checksum"] == store.meta["checksum"]


def test_sparse_conflicts_and_duplicates(tmp_path):
    src = tmp_path / "l.csv"
    src.write_text("subject,item,response\na,q1,1\nb,q2,0\na,q1,1\nb,q1,1\n")
    store = ingest(src, tmp_path / "ok.zarr", layout="sparse")
    assert store.num_observed == 3  # the exact duplicate counts once
    s, i, v = (np.asarray(a) for a in store.observations())
    assert s.tolist() == [0, 1, 1] and i.tolist() == [0, 0, 1] and v.tolist() == [1, 1, 0]
    src.write_text("subject,item,response\na,q1,1\nb,q2,0\na,q1,0\nb,q1,1\n")
    with pytest.raises(DataFormatError, match=r"l\.csv line 2: conflicting duplicate for subject "
                                              r"'a', item 'q1': 1 here but 0 at .*l\.csv line 4"):
        ingest(src, tmp_path / "bad.zarr", layout="sparse")
    with pytest.raises(SettingsError, match="layout='coo'"):
        ingest(src, tmp_path / "bad.zarr", layout="coo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.csv", "ok.zarr"]


@pytest.mark.skipif(not INSTEVAL.exists(), reason="shared InstEval data not available")
def test_insteval_is_stored_sparse(tmp_path):
    """InstEval (2.2% observed) ingests as observations; same content as a dense store."""
    table = pd.read_parquet(INSTEVAL, columns=["s", "d", "y"])
    frame = pd.DataFrame({"subject": table.s, "item": table.d,
                          "response": (table.y >= 4).astype(np.int8)})  # 4-5 of 5: positive
    folder = tmp_path / "insteval"
    folder.mkdir()
    for k, part in enumerate(_split(frame, 3)):
        part.to_parquet(folder / f"part-{k}.parquet", index=False)
    sparse = ingest(folder, tmp_path / "sparse.zarr")
    assert sparse.layout == "sparse" and sparse.shape == (2972, 1128)
    assert sparse.num_observed == len(frame) == 73421
    assert not (sparse.path / "responses").exists()
    dense = ingest(folder, tmp_path / "dense.zarr", layout="dense")
    np.testing.assert_array_equal(sparse.load(), dense.load())
    assert list(sparse.subjects) == list(dense.subjects)


_RSS_SCRIPT = """
import json, resource, sys
from engine.data import ingest
store = ingest(sys.argv[1], sys.argv[2], memory_budget=32 << 20)
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "cells": store.num_observed}))
"""


def _peak_rss(folder: Path, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(folder), str(out)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _write_long(folder: Path, num_subjects: int, num_items: int, files: int = 4) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    per = num_subjects // files
    items = pa.array([f"item-{k:06d}" for k in range(num_items)])
    for f in range(files):
        subjects = pa.array([f"subject-{k:06d}" for k in range(f * per, (f + 1) * per)])
        table = pa.table({
            "subject": pa.DictionaryArray.from_arrays(np.repeat(np.arange(per, dtype=np.int32),
                                                                num_items), subjects),
            "item": pa.DictionaryArray.from_arrays(np.tile(np.arange(num_items, dtype=np.int32),
                                                           per), items),
            "response": rng.integers(0, 2, per * num_items).astype(np.int8)})
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=1 << 18)


def test_peak_memory_does_not_grow_with_cells(tmp_path):
    """Four times the cells (1M -> 4M rows of long Parquet): peak RSS about the same."""
    _write_long(tmp_path / "small", 1000, 1000)
    _write_long(tmp_path / "large", 4000, 1000)
    small = _peak_rss(tmp_path / "small", tmp_path / "small.zarr")
    large = _peak_rss(tmp_path / "large", tmp_path / "large.zarr")
    print("ingest peak RSS", small, large)
    assert small["cells"] == 1_000_000 and large["cells"] == 4_000_000
    # Holding the input, as a non-streaming reader does, adds ~325 MB for the extra 3M rows.
    assert large["rss_mb"] - small["rss_mb"] < 64, (small, large)  # measured +5 MB


def test_parquet_row_groups_read_one_by_one_keep_row_numbers(tmp_path):
    """Batches do not cross row groups (each is read by its own reader); ids keep their
    first-appearance order and errors name the row index in the file, past several groups."""
    frame = _frame(7, 5, seed=3)
    src = tmp_path / "l.parquet"
    frame.to_parquet(src, index=False, row_group_size=4)  # 9 groups, the last one short
    store = ingest_long([src], tmp_path / "ok.zarr", batch_rows=3)
    assert list(store.subjects) == list(dict.fromkeys(frame.subject))
    np.testing.assert_array_equal(store.load(), _dense(frame, store))
    frame.loc[30, "response"] = 2.5
    frame.to_parquet(src, index=False, row_group_size=4)
    with pytest.raises(DataFormatError, match=r"l\.parquet row index 30\b"):
        ingest_long([src], tmp_path / "bad.zarr", batch_rows=3, kind="binary")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.parquet", "ok.zarr"]


def test_cli_ingest_layout_and_budget(tmp_path, capsys):
    from engine.cli import main

    src = tmp_path / "l.csv"
    src.write_text("subject,item,response\na,q1,1\nb,q2,0\na,q2,1\n")
    assert main(["ingest", str(src), "--out", str(tmp_path / "s.zarr"), "--layout", "sparse",
                 "--memory-budget", "64M"]) == 0
    assert "layout sparse" in capsys.readouterr().out
    assert open_store(tmp_path / "s.zarr").layout == "sparse"
    assert main(["ingest", str(src), "--out", str(tmp_path / "t.zarr"),
                 "--memory-budget", "12Q"]) == 2
    assert "memory budget '12Q' is not a size" in capsys.readouterr().err
    assert not (tmp_path / "t.zarr").exists()


def test_categorical_response_columns_read_their_values(tmp_path):
    """A pandas categorical (Parquet dictionary) column: numbers as text read as numbers; a
    label is named as the file holds it (the error had read "<column of type dictionary<...>>")."""
    import pandas as pd

    from engine.data import ingest
    from engine.errors import DataFormatError

    df = pd.DataFrame({"subject": ["a", "a", "b", "b"], "item": ["q1", "q2", "q1", "q2"],
                       "response": pd.Categorical(["1", "0", "0", "1"])})
    df.to_parquet(tmp_path / "cat.parquet", index=False)
    store = ingest(tmp_path / "cat.parquet", tmp_path / "cat.zarr", fmt="long")
    assert store.load().tolist() == [[1, 0], [0, 1]]
    df["response"] = pd.Categorical(["1", "0", "M", "1"])
    df.to_parquet(tmp_path / "label.parquet", index=False)
    with pytest.raises(DataFormatError, match=r"label\.parquet row index 2, column \"response\": "
                                              r"got 'M'; expected a number"):
        ingest(tmp_path / "label.parquet", tmp_path / "label.zarr", fmt="long")


@pytest.mark.parametrize("fmt", ["long", "wide"])
def test_decimal_cells_and_string_view_ids_are_read(tmp_path, fmt):
    """Parquet DECIMAL responses are numbers (read as their nearest float, as text is) and
    Arrow ``string_view`` columns are text, ids and cells alike; both had been refused. A
    Decimal outside the kind is refused as any number is, naming its row and column."""
    from decimal import Decimal

    D = lambda *v: pa.array([None if x is None else Decimal(x) for x in v], pa.decimal128(4, 2))
    sv = lambda *v: pa.array(list(v), pa.string_view())
    if fmt == "long":
        table = pa.table({"subject": sv("a", "a", "b", "b"), "item": sv("q1", "q2", "q1", "q2"),
                          "response": D("0.50", "1.00", "0.25", None)})
        bad = table.set_column(2, "response", D("0.50", "1.00", "1.25", None))
    else:
        table = pa.table({"subject": sv("a", "b"), "q1": D("0.50", "0.25"), "q2": sv("1", "")})
        bad = table.set_column(1, "q1", D("0.50", "1.25"))
    pq.write_table(table, tmp_path / "d.parquet")
    store = ingest(tmp_path / "d.parquet", tmp_path / "d.zarr", fmt=fmt, kind="unit")
    assert store.subjects.tolist() == ["a", "b"] and store.items.tolist() == ["q1", "q2"]
    np.testing.assert_array_equal(store.load(), np.array([[0.5, 1.0], [0.25, np.nan]], np.float32))
    pq.write_table(bad, tmp_path / "bad.parquet")
    where = r"row index 2, column \"response\"" if fmt == "long" else r"row index 1, column \"q1\""
    with pytest.raises(DataFormatError, match=rf"bad\.parquet {where}: got 1\.25; expected a "
                                              rf"score in \[0, 1\]"):
        ingest(tmp_path / "bad.parquet", tmp_path / "bad.zarr", fmt=fmt, kind="unit")
    assert not (tmp_path / "bad.zarr").exists()


def test_columns_name_a_long_tables_roles(tmp_path, capsys):
    """A long table whose columns are not named subject / item / response (a leaderboard's
    ``system``, ``seg_id``, ``score``) is read with ``columns`` (``--columns``), as the same
    table under the known names; a name not in the header, an unknown role, a column named
    twice and wide input are refused, naming the option."""
    from engine.cli import main

    frame = _frame(6, 5, seed=3)
    frame.to_parquet(tmp_path / "known.parquet", index=False)
    renamed = frame.rename(columns={"subject": "system", "item": "seg_id", "response": "score"})
    renamed.insert(0, "test_set", "t1")  # a column no role reads
    renamed.to_csv(tmp_path / "board.csv", index=False)
    want = ingest(tmp_path / "known.parquet", tmp_path / "known.zarr")
    got = ingest(tmp_path / "board.csv", tmp_path / "board.zarr",
                 columns={"subject": "system", "item": "seg_id", "response": "score"})
    assert list(got.subjects) == list(want.subjects) and list(got.items) == list(want.items)
    np.testing.assert_array_equal(got.load(), want.load())
    assert main(["ingest", str(tmp_path / "board.csv"), "--out", str(tmp_path / "cli.zarr"),
                 "--columns", "subject=system,item=seg_id,response=score"]) == 0
    np.testing.assert_array_equal(open_store(tmp_path / "cli.zarr").load(), want.load())
    assert "detected format" not in capsys.readouterr().out
    # one role named, the others found by their known names
    frame.rename(columns={"subject": "system"}).to_csv(tmp_path / "one.csv", index=False)
    one = ingest(tmp_path / "one.csv", tmp_path / "one.zarr", columns={"subject": "system"})
    np.testing.assert_array_equal(one.load(), want.load())
    with pytest.raises(DataFormatError, match=r"board\.csv: no column 'model' \(--columns "
                                              r"subject=model\); its header has \['test_set'"):
        ingest(tmp_path / "board.csv", tmp_path / "x.zarr", columns={"subject": "model"})
    with pytest.raises(SettingsError, match=r"unknown role\(s\) \['system'\]"):
        ingest(tmp_path / "board.csv", tmp_path / "x.zarr", columns={"system": "system"})
    with pytest.raises(SettingsError, match="column 'score' is named for two roles"):
        ingest(tmp_path / "board.csv", tmp_path / "x.zarr",
               columns={"item": "score", "response": "score"})
    with pytest.raises(SettingsError, match=r"applies to long input only; this input is wide"):
        ingest(tmp_path / "board.csv", tmp_path / "x.zarr", fmt="wide",
               columns={"subject": "system"})
    assert main(["ingest", str(tmp_path / "board.csv"), "--out", str(tmp_path / "x.zarr"),
                 "--columns", "system"]) == 2
    assert "'system' is not ROLE=NAME" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()
    # without the option, the error says how to name them
    with pytest.raises(DataFormatError, match=r"no subject column.*--columns subject=NAME"):
        ingest(tmp_path / "board.csv", tmp_path / "x.zarr", fmt="long")
