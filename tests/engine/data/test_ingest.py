"""Tests for engine.data.ingest: every input format round-trips; bad input names file and row."""

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data import ingest, open_store
from engine.errors import DataFormatError, SettingsError, StoreExistsError

DATA = Path("/work/shared/data")
SUBJECTS = ["gpt", "bert", "t5"]
ITEMS = ["q1", "q2", "q3", "q4"]
# -1 = missing; every subject and item has at least one observed response
Y = np.array([[1, 0, -1, 1], [0, -1, 1, 1], [-1, 1, 0, 0]], np.int8)


def _cell(v: int) -> str:
    return "" if v < 0 else str(v)


def _long_rows() -> list[tuple[str, str, int]]:
    return [(s, i, int(Y[a, b])) for a, s in enumerate(SUBJECTS)
            for b, i in enumerate(ITEMS) if Y[a, b] >= 0]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _wide_csv(path: Path) -> Path:
    lines = ["model," + ",".join(ITEMS)]
    lines += [s + "," + ",".join(_cell(v) for v in row) for s, row in zip(SUBJECTS, Y)]
    return _write(path, "\n".join(lines) + "\n")


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def _check(store, fmt: str, sources: list[Path], ordered: bool = True) -> None:
    """Compare with (SUBJECTS, ITEMS, Y); long and jsonl ids are in first-appearance order."""
    if ordered:
        assert list(store.subjects) == SUBJECTS and list(store.items) == ITEMS
    rows = [SUBJECTS.index(s) for s in store.subjects]
    cols = [ITEMS.index(i) for i in store.items]
    assert sorted(rows) == [0, 1, 2] and sorted(cols) == [0, 1, 2, 3]
    np.testing.assert_array_equal(store.load(), Y[np.ix_(rows, cols)])
    assert store.meta["input_format"] == fmt and store.meta["kind"] == "binary"
    assert store.meta["source"] == [str(p) for p in sources]
    assert store.num_observed == int((Y >= 0).sum())


def test_wide_csv(tmp_path):
    src = _wide_csv(tmp_path / "wide.csv")
    _check(ingest(src, tmp_path / "out.zarr"), "wide", [src])
    assert _leftovers(tmp_path) == []


def test_wide_csv_value_spellings_and_row_number_ids(tmp_path):
    src = _write(tmp_path / "w.csv", 'a,b,c\n1.0,True, 0 \n"0",false,NA\n,1,1\n')
    with pytest.raises(DataFormatError, match=r'w\.csv column 1 "a": cannot tell subject ids.*'
                       r"--id-column 'a' if.*--id-column none"):
        ingest(src, tmp_path / "out.zarr")
    store = ingest(src, tmp_path / "out.zarr", id_column="none")
    assert list(store.subjects) == ["0", "1", "2"] and list(store.items) == ["a", "b", "c"]
    np.testing.assert_array_equal(store.load(), [[1, 1, 0], [0, 0, -1], [-1, 1, 1]])


def test_wide_tsv_gz_and_text_first_column(tmp_path):
    src = tmp_path / "w.tsv.gz"
    with gzip.open(src, "wt") as f:
        f.write("who\tq1\tq2\nalice\t1\t0\nbob\t\t1\n")
    store = ingest(src, tmp_path / "out.zarr")
    assert list(store.subjects) == ["alice", "bob"] and list(store.items) == ["q1", "q2"]
    np.testing.assert_array_equal(store.load(), [[1, 0], [-1, 1]])


def test_wide_parquet(tmp_path):
    frame = pd.DataFrame(np.where(Y < 0, np.nan, Y), columns=ITEMS)
    frame.insert(0, "system", SUBJECTS)
    src = tmp_path / "wide.parquet"
    frame.to_parquet(src, index=False)
    _check(ingest(src, tmp_path / "out.zarr"), "wide", [src])


def test_wide_files_are_merged_by_id(tmp_path):
    a = tmp_path / "a.csv"
    b = tmp_path / "b.csv"
    _write(a, "model,q1,q2\ngpt,1,0\nbert,0,\n")
    _write(b, "model,q3,q4,q2\nbert,1,1,\nt5,0,0,1\ngpt,,1,0\n")
    store = ingest([a, b], tmp_path / "out.zarr")
    _check(store, "wide", [a, b])


def test_long_csv(tmp_path):
    rows = _long_rows()
    text = "subject_id,item_id,response\n" + "".join(f"{s},{i},{v}\n" for s, i, v in rows)
    src = _write(tmp_path / "long.csv", text + "gpt,q3,\n")  # an empty response = missing
    store = ingest(src, tmp_path / "out.zarr")
    _check(store, "long", [src], ordered=False)
    assert list(store.items) == ["q1", "q2", "q4", "q3"]  # first appearance


def test_long_parquet(tmp_path):
    frame = pd.DataFrame(_long_rows(), columns=["Subject", "Item", "Response"])
    src = tmp_path / "long.parquet"
    frame.to_parquet(src, index=False)
    store = ingest(src, tmp_path / "out.zarr")
    _check(store, "long", [src], ordered=False)
    text = "subject,item,response\n" + "".join(f"{s},{i},{v}\n" for s, i, v in _long_rows())
    same = ingest(_write(tmp_path / "l.csv", text), tmp_path / "l.zarr")
    assert store.meta["checksum"] == same.meta["checksum"]  # same data, same checksum


def test_long_parquet_folder(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    rows = _long_rows()
    for k, part in enumerate([rows[:3], rows[3:6], rows[6:] + rows[:2]]):  # identical dups
        table = pa.table({"subject": [r[0] for r in part], "item": [r[1] for r in part],
                          "response": pa.array([r[2] for r in part], pa.uint8())})
        pq.write_table(table, folder / f"part-{k}.parquet")
    (folder / "_SUCCESS").write_text("")
    store = ingest(folder, tmp_path / "out.zarr", fmt="long")
    _check(store, "long", sorted(folder.glob("*.parquet")), ordered=False)


def test_jsonl(tmp_path):
    lines = [json.dumps({"subject_id": s, "responses": {i: int(v) for i, v in zip(ITEMS, row)
                                                        if v >= 0}})
             for s, row in zip(SUBJECTS, Y)]
    lines[0] = lines[0].replace('"q4": 1', '"q4": true')
    src = _write(tmp_path / "irt.jsonl", "\n".join(lines) + "\n\n")
    _check(ingest(src, tmp_path / "out.zarr"), "jsonl", [src], ordered=False)


def test_overwrite(tmp_path):
    src, out = _wide_csv(tmp_path / "w.csv"), tmp_path / "out.zarr"
    ingest(src, out)
    with pytest.raises(StoreExistsError, match="out.zarr: already exists"):
        ingest(src, out)
    other = _write(tmp_path / "o.csv", "model,z1\nm,1\n")
    assert ingest(other, out, overwrite=True).shape == (1, 1)
    assert open_store(out).items[0] == "z1" and _leftovers(tmp_path) == []


def test_chunks_argument(tmp_path):
    store = ingest(_wide_csv(tmp_path / "w.csv"), tmp_path / "out.zarr", chunks=(2, 2))
    assert store.responses.chunks == ((2, 1), (2, 2))
    with pytest.raises(SettingsError, match="chunks must be two positive integers"):
        ingest(_wide_csv(tmp_path / "w.csv"), tmp_path / "bad.zarr", chunks=(0, 2))


BAD_INPUTS = [
    ("v.csv", "model,q1,q2\na,1,0\nb,0.7x,1\n", r"v\.csv line 3, column \"q1\": got '0\.7x'"),
    ("v.csv", "model,q1,q2\na,1,0\nb,1,-2\n",
     r"v\.csv line 3, column \"q2\": got -2; expected a response >= 0.*errors = -score"),
    ("v.csv", "model,q1,q2\na,1,0\nb,-0.5,1\n", r"v\.csv line 3, column \"q1\": got -0\.5; expected a"),
    ("v.csv", "student,q1\n101,1\n101,0\n", r'v\.csv column 1 "student": cannot tell.*--id-column'),
    ("v.csv", "model,q1,q2\na,1,0\nb,inf,1\n", r"v\.csv line 3, column \"q1\": got inf; expected a finite"),
    ("v.csv", "model,q1,q2\na,1,0\nb,1\n", r"v\.csv line 3: 2 fields, but the header has 3"),
    ("v.csv", "model,q1,q2\na,1,0\nb,1,1\na,0,0\n",
     r"v\.csv line 4: duplicate subject 'a' \(first at .*v\.csv line 2\); ids must be unique, "
     r"merge or rename them \(a table of one row per response is long format: pass --format "
     r"long, and --columns subject=NAME,item=NAME,response=NAME where its columns have other "
     r"names\)"),
    ("v.csv", "model,q1,q2\na,1,0\nb,,\n", r"v\.csv line 3: subject 'b' has no observed.*drop"),
    ("v.csv", "model,q1,q2\na,1,\nb,0,\n", r"v\.csv column \"q2\": item 'q2' has no observed"),
    ("v.csv", "model,q1,q1\na,1,0\n", r"v\.csv column 3: duplicate item column 'q1'"),
    ("v.csv", "model,q1\n", r"v\.csv: no rows"),
    ("v.csv", "", r"v\.csv: file is empty"),
    ("v.csv", "model\na\n", r"v\.csv: no item columns"),
    ("l.csv", "subject,item,response\na,q1,1\na,q2,0\na,q1,0\n",
     r"l\.csv line 2: conflicting duplicate for subject 'a', item 'q1'.*l\.csv line 4"),
    ("l.csv", "subject,item,response\na,q1,1\n,q2,0\n", r"l\.csv line 3: empty subject id"),
    ("l.csv", "subject,item,response\na,q1,1\nb, ,0\n", r"l\.csv line 3: empty item id"),
    ("l.csv", "subject,item,response\na,q1,1\nb,q1,yes\n", r"l\.csv line 3, column \"response\""),
    ("l.csv", "subject,item,response\na,q1,1\nb,q1,1,1\n", r"l\.csv line 3: 4 fields"),
    ("l.csv", "subject,item,score\na,q1,1\n", r"l\.csv: no response column.*name the ones that "
     r"hold them with --columns subject=NAME,item=NAME,response=NAME"),
    ("l.csv", "subject,item,response\n", r"l\.csv: no rows"),
    ("l.csv", "subject,item,response\na,q1,1\nb,q1,\n", r"l\.csv line 3: subject 'b' has no"),
    ("l.csv", "subject,item,response\na,q1,1\na,q2,NA\n", r"l\.csv line 3: item 'q2' has no"),
    ("bad.parquet", "not parquet", r"bad\.parquet: cannot read"),
    ("j.jsonl", '{"subject_id": "a", "responses": {"q1": 1}}\n{"subject_id": "b", "resp\n',
     r"j\.jsonl line 2: invalid JSON"),
    ("j.jsonl", '{"subject_id": "a", "responses": {"q1": 1}}\n{"responses": {"q1": 0}}\n',
     r"j\.jsonl line 2: missing key \"subject_id\""),
    ("j.jsonl", '{"subject_id": "a", "responses": {"q1": 1}}\n{"subject_id": "b", '
     '"responses": {"q1": "x"}}\n', r"j\.jsonl line 2, item \"q1\": got 'x'"),
    ("j.jsonl", '{"subject_id": "a", "responses": {"q1": -3}}\n', r"j\.jsonl line 1, item \"q1\""),
    ("j.jsonl", "\n", r"j\.jsonl: no records"),
    ("data.xlsx", "whatever", r"data\.xlsx: unknown input format"),
]


@pytest.mark.parametrize("name, text, match", BAD_INPUTS)
def test_bad_input(tmp_path, name, text, match):
    src = _write(tmp_path / name, text)
    with pytest.raises(DataFormatError, match=match):
        ingest(src, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists() and _leftovers(tmp_path) == []


def test_csv_written_with_the_pandas_index_beside_an_id_column(tmp_path):
    """``DataFrame.to_csv`` keeps the index as an unnamed first column. Beside an id column
    (a filtered frame of ``subject_id`` and items), the id column holds the ids, with
    ``--id-column`` or found by its name, and the index is no item."""
    frame = pd.DataFrame({"subject_id": [7, 8, 9, 10], "q1": [1, 0, 1, 1], "q2": [0, 1, 1, 0]})
    kept = frame[frame["subject_id"] != 8]  # index 0, 2, 3: a filtered frame
    kept.to_csv(tmp_path / "f.csv")
    for k, option in enumerate([{}, {"id_column": "subject_id"}]):
        store = ingest(tmp_path / "f.csv", tmp_path / f"f{k}.zarr", **option)
        assert list(store.subjects) == ["7", "9", "10"] and list(store.items) == ["q1", "q2"]
        np.testing.assert_array_equal(store.load(), kept[["q1", "q2"]].to_numpy())
    # an unnamed first column before items only: still the ids (the index), as before
    frame[["q1", "q2"]].set_axis(["a", "b", "c", "d"]).to_csv(tmp_path / "ids.csv")
    assert list(ingest(tmp_path / "ids.csv", tmp_path / "ids.zarr").subjects) == ["a", "b", "c", "d"]
    # an unnamed first column of text holds the ids, whatever the next column is named
    for k, text in enumerate([",model,q1\nalice,1,0\nbob,0,1\n", ",id,q1\nm1,1,0\nm2,0,1\n",
                              ",id\nm1,1\nm2,0\n"]):
        (tmp_path / f"t{k}.csv").write_text(text)
        store = ingest(tmp_path / f"t{k}.csv", tmp_path / f"t{k}.zarr")
        assert list(store.subjects) == text.split("\n")[1].split(",")[:1] + \
            text.split("\n")[2].split(",")[:1], k
        assert list(store.items) == text.split("\n")[0].split(",")[1:], k
    # a skipped index column still counts in the column numbers errors give
    (tmp_path / "gap.csv").write_text(",subject_id,q1,\n0,a,1,\n1,b,0,\n")
    with pytest.raises(DataFormatError, match=r"gap\.csv column 4: empty column name"):
        ingest(tmp_path / "gap.csv", tmp_path / "gap.zarr")


def test_unnamed_index_column_and_bad_encoding(tmp_path):
    src = tmp_path / "w.csv"
    pd.DataFrame({"q1": [1, 0], "q2": [0, 1]}, index=["m1", "m2"]).to_csv(src)
    assert list(ingest(src, tmp_path / "out.zarr").subjects) == ["m1", "m2"]
    bad = tmp_path / "latin.csv"
    bad.write_bytes("model,q1\nna\xefve,1\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin\.csv: cannot read"):
        ingest(bad, tmp_path / "bad.zarr")


def test_parquet_with_its_pandas_index_reads_the_index_as_subject_ids(tmp_path):
    """``DataFrame.to_parquet`` keeps the index: as a last column (named, or
    ``__index_level_0__``), or only in the file's metadata (a named range of integers).
    It holds the subject ids, as the first column of a CSV written with its index does."""
    frame = pd.DataFrame({"q1": [1, 0, 1], "q2": [0, 1, 1]}, index=["m1", "m2", "m3"])
    for k, name in enumerate(["model", None]):
        frame.rename_axis(name).to_parquet(tmp_path / f"w{k}.parquet")
        store = ingest(tmp_path / f"w{k}.parquet", tmp_path / f"w{k}.zarr")
        assert list(store.subjects) == ["m1", "m2", "m3"] and list(store.items) == ["q1", "q2"]
        np.testing.assert_array_equal(store.load(), frame.to_numpy())
    numbered = frame.set_axis(pd.RangeIndex(5, 8, name="subject_id"))
    numbered.to_parquet(tmp_path / "r.parquet")
    assert pq.read_schema(tmp_path / "r.parquet").names == ["q1", "q2"]  # ids in metadata only
    assert list(ingest(tmp_path / "r.parquet", tmp_path / "r.zarr").subjects) == ["5", "6", "7"]
    frame.reset_index(drop=True).to_parquet(tmp_path / "plain.parquet")  # no ids: as before
    with pytest.raises(DataFormatError, match=r'column 1 "q1": cannot tell subject ids'):
        ingest(tmp_path / "plain.parquet", tmp_path / "plain.zarr")
    frame.set_index([frame.index, pd.Index([1, 2, 3], name="run")]).to_parquet(
        tmp_path / "multi.parquet")
    with pytest.raises(DataFormatError, match=r"multi\.parquet: its pandas index has 2 levels"):
        ingest(tmp_path / "multi.parquet", tmp_path / "multi.zarr")
    assert not (tmp_path / "plain.zarr").exists() and not (tmp_path / "multi.zarr").exists()
    # a range index over columns whose names need checking: every column stays an item
    frame.set_axis(pd.RangeIndex(0, 3, name="id")).rename(columns={"q2": "größe"}).to_parquet(
        tmp_path / "named.parquet")
    store = ingest(tmp_path / "named.parquet", tmp_path / "named.zarr")
    assert list(store.subjects) == ["0", "1", "2"] and list(store.items) == ["q1", "größe"]


@pytest.mark.parametrize("ids", [["a", "b", "c", "d"], ["101", "102", "103", "104"]])
def test_parquet_id_column_beside_a_pandas_index_keeps_its_ids(tmp_path, ids):
    """A frame with its own id column whose index pandas also stored (a filtered frame's
    ``__index_level_0__``, or a named index): the id column holds the ids, as it would
    without the index, and the index is no item."""
    frame = pd.DataFrame({"subject": ids, "q1": [1, 0, 1, 1], "q2": [0, 1, 1, 0]})
    for k, kept in enumerate([frame[frame["q1"] >= 0].iloc[[0, 2, 1, 3]],
                              frame.rename_axis("row"), frame.set_axis(
                                  pd.RangeIndex(10, 14, name="row"))]):
        kept.to_parquet(tmp_path / f"f{k}.parquet")
        store = ingest(tmp_path / f"f{k}.parquet", tmp_path / f"f{k}.zarr")
        assert list(store.subjects) == kept["subject"].tolist(), k
        assert list(store.items) == ["q1", "q2"], k
        np.testing.assert_array_equal(store.load(), kept[["q1", "q2"]].to_numpy())
        # the same with the id column named (--id-column): the stored index is still no item
        named = ingest(tmp_path / f"f{k}.parquet", tmp_path / f"n{k}.zarr", id_column="subject")
        assert list(named.subjects) == kept["subject"].tolist(), k
        assert list(named.items) == ["q1", "q2"], k
    # --id-column none: every column an item, the stored index no item (rows numbered)
    frame[frame["q1"] >= 0].iloc[[0, 2, 1, 3]][["q1", "q2"]].to_parquet(tmp_path / "none.parquet")
    rows = ingest(tmp_path / "none.parquet", tmp_path / "none.zarr", id_column="none")
    assert list(rows.items) == ["q1", "q2"] and rows.kind == "binary"
    # --id-column naming the stored index itself: the index holds the ids, the rest are items
    frame[["q1", "q2"]].set_axis(pd.Index(["r1", "r2", "r3", "r4"], name="row")).to_parquet(
        tmp_path / "by_row.parquet")
    by_row = ingest(tmp_path / "by_row.parquet", tmp_path / "by_row.zarr", id_column="row")
    assert list(by_row.subjects) == ["r1", "r2", "r3", "r4"]
    assert list(by_row.items) == ["q1", "q2"]


def test_wide_conflict_across_files(tmp_path):
    a = _write(tmp_path / "a.csv", "model,q1\ngpt,1\n")
    b = _write(tmp_path / "b.csv", "model,q1\ngpt,0\n")
    with pytest.raises(DataFormatError, match=r"b\.csv line 2, column \"q1\": got 0 .*earlier "
                       r"input file has 1 \(.*a\.csv line 2\)"):
        ingest([a, b], tmp_path / "out.zarr")


def test_bad_parquet_names_row_index(tmp_path):
    src = tmp_path / "w.parquet"
    pd.DataFrame({"id": ["a", "b", "c"], "q1": [1, 0, 1], "q2": ["1", "0", "?"]}).to_parquet(src)
    with pytest.raises(DataFormatError, match=r"w\.parquet row index 2, column \"q2\": got '\?'"):
        ingest(src, tmp_path / "out.zarr")
    assert _leftovers(tmp_path) == []


def test_conflict_across_folder_files(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    _write(folder / "a.csv", "subject,item,response\ns,q1,1\ns,q2,0\n")
    _write(folder / "b.csv", "subject,item,response\nt,q1,1\ns,q2,1\n")
    with pytest.raises(DataFormatError, match=r"a\.csv line 3: conflicting.*b\.csv line 3"):
        ingest(folder, tmp_path / "out.zarr")


def test_bad_arguments_and_paths(tmp_path):
    src = _wide_csv(tmp_path / "w.csv")
    with pytest.raises(DataFormatError, match="no such input file"):
        ingest(tmp_path / "missing.csv", tmp_path / "out.zarr")
    with pytest.raises(DataFormatError, match="no input files"):
        ingest([], tmp_path / "out.zarr")
    with pytest.raises(DataFormatError, match="unknown input format 'xml'"):
        ingest(src, tmp_path / "out.zarr", fmt="xml")
    with pytest.raises(DataFormatError, match="kind 'ordinal' is not supported"):
        ingest(src, tmp_path / "out.zarr", kind="ordinal")
    with pytest.raises(DataFormatError, match="mix formats"):
        ingest([src, _write(tmp_path / "j.jsonl", "{}\n")], tmp_path / "out.zarr")
    bad = _write(tmp_path / "w.csv", "model,q1\na,5\n")
    with pytest.raises(DataFormatError, match=r"w\.csv line 2, column \"q1\": got 5; expected 0"):
        ingest(bad, tmp_path / "out.zarr", kind="binary")
    assert not (tmp_path / "out.zarr").exists() and _leftovers(tmp_path) == []


def test_lsat7(tmp_path):
    src = DATA / "demo" / "lsat7.csv"
    if not src.exists():
        pytest.skip("shared demo data not available")
    store = ingest(src, tmp_path / "lsat7.zarr")
    assert store.shape == (1000, 5) and list(store.items) == [f"item{k}" for k in range(1, 6)]
    np.testing.assert_allclose(store.load().mean(axis=0), [0.828, 0.658, 0.772, 0.606, 0.843],
                               atol=5e-4)


def test_nlu_wide_csv(tmp_path):
    src = DATA / "nlu" / "responses_items_x_subjects.parquet"
    if not src.exists():
        pytest.skip("shared NLU data not available")
    table = pq.read_table(src)  # one row per item: transpose into one row per subject
    subjects = table.column_names[3:]
    y = np.stack([table.column(s).to_numpy() for s in subjects]).astype(np.uint8)
    items = [str(i) for i in table.column("item_id").to_pylist()]
    body = np.full((y.shape[0], 2 * y.shape[1]), ord(","), np.uint8)
    body[:, 1::2] = y + ord("0")
    wide = tmp_path / "nlu.csv"
    with open(wide, "wb") as f:
        f.write(("model," + ",".join(items) + "\n").encode())
        for name, row in zip(subjects, body):
            f.write(name.encode() + row.tobytes() + b"\n")
    store = ingest(wide, tmp_path / "nlu.zarr")
    assert store.shape == (90, 82_756) and list(store.subjects) == subjects
    assert round(float(store.load().mean()), 4) == 0.4872
    assert re.fullmatch(r"[0-9a-f]{64}", store.meta["checksum"])


@pytest.mark.parametrize("name, line", [("w.csv.gz", "m{k},1,0\n"), ("l.csv.gz", "m{k},q1,1\n"),
                                        ("p.jsonl.gz", '{{"subject_id": "m{k}", "responses": {{"q1": 1}}}}\n')])
def test_truncated_gzip_is_a_clean_error(tmp_path, name, line):
    header = {"w": "model,q1,q2\n", "l": "subject,item,response\n", "p": ""}[name[0]]
    data = gzip.compress((header + "".join(line.format(k=k) for k in range(3000))).encode())
    src = tmp_path / name
    src.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match=re.escape(name) + r": cannot read it \(Compressed "
                                                                r"file ended"):
        ingest(src, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_id_column_anywhere(tmp_path, suffix):
    frame = pd.DataFrame({"q1": [1, 0, 1], "student": [101, 102, 103], "q2": [0, 1, None]})
    src = tmp_path / f"w{suffix}"
    frame.to_csv(src, index=False) if suffix == ".csv" else frame.to_parquet(src, index=False)
    store = ingest(src, tmp_path / "out.zarr", id_column="student")
    assert list(store.subjects) == ["101", "102", "103"] and list(store.items) == ["q1", "q2"]
    np.testing.assert_array_equal(store.load(), [[1, 0], [0, 1], [1, -1]])
    with pytest.raises(SettingsError, match=r"no column 'pupil' \(--id-column\); the header has "
                                            r"\['q1', 'student', 'q2'\]"):
        ingest(src, tmp_path / "other.zarr", id_column="pupil")
    with pytest.raises(DataFormatError, match=r'column 1 "q1": cannot tell subject ids'):
        ingest(src, tmp_path / "other.zarr")
