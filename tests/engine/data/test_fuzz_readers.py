"""Property tests for every reader: each generated input gives a clean one-line error with
nothing written, or a store equal to a strict reference parser's result.

The reference parsers below are written from the rules in ``engine.data.ingest``'s module
doc with the standard library only (``csv``, ``json`` with an ``object_pairs_hook`` that
rejects duplicate keys, float64 arithmetic), and they also decide *whether* an input is
valid: the reader must reject exactly what the reference rejects. ``FUZZ_EXAMPLES`` sets
the number of examples per reader (a fixed seed in CI; the benchmark run uses more).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.data import ingest
from engine.errors import IRTError

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUZZ = settings(derandomize=True, max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
REJECT = "reject"
ID_NAMES = {"subject", "subject_id", "system", "model", "id", "name"}
NULLS = {"", "na", "n/a", "nan", "null", "none"}
F32_MAX = float(np.finfo(np.float32).max)
OUTCOMES: dict[str, dict[str, int]] = {}  # reader -> outcome counts (printed with -s)

# cells and ids: ordinary ones (drawn 7 times in 8) and the edge cases the issue lists
PLAIN_CELLS = ["0", "1", "", "0.5", "1.0", " 1 ", "true", "NA", "nan", "null", "0.25", "3.5"]
EDGE_CELLS = ["1.00000001", "0.99999999", "-1e-50", "1e-50", "2", "-0", "x", "inf", "1e39",
              '"1"', "1_0", "False", "-1"]
PLAIN_IDS = ["a", "b", "c", "NA", "null", "nan", "é", "a b", "None", "d", "e"]
EDGE_IDS = ["101", "7", " a", "", " ", "a"]
PLAIN_ITEMS = ["q1", "q2", "q3", "NA", "é", "nan"]
EDGE_ITEMS = [" q1", "", "q1"]
CELLS = PLAIN_CELLS + EDGE_CELLS


def mostly(plain: list, edge: list):
    """A strategy for one value: plain 7 times in 8, else an edge case."""
    return st.integers(0, 7).flatmap(
        lambda k: st.sampled_from(edge if k == 0 else plain))


def distinct(draw, plain: list, edge: list, n: int) -> list:
    """``n`` values, distinct plain ones, each replaced by an edge case 1 time in 8."""
    values = draw(st.permutations(plain))[:n]
    return [v if draw(st.integers(0, 7)) else draw(st.sampled_from(edge)) for v in values]


# ----------------------------------------------------------------------------- reference

def ref_value(cell) -> float:
    """float64 value of one cell (NaN missing); raises ValueError on a non-number."""
    if cell is None:
        return math.nan
    if isinstance(cell, bool):
        return float(cell)
    if isinstance(cell, (int, float)):
        return float(cell)  # a huge int raises OverflowError (a rejection)
    if not isinstance(cell, str):
        raise ValueError(cell)
    text = cell.strip().lower()
    if text in NULLS:
        return math.nan
    if text in ("true", "false"):
        return float(text == "true")
    return float(text)


def ref_id(value) -> str:
    """A stripped, non-empty, encodable id; raises ValueError."""
    if not isinstance(value, str):
        raise ValueError(value)
    text = value.strip()
    if not text:
        raise ValueError("empty id")
    text.encode("utf-8")  # UnicodeEncodeError is a ValueError
    return text


def ref_finish(subjects: list[str], items: list[str], y: np.ndarray):
    """Checks shared by all formats; the expected ``(subjects, items, stored, kind)``."""
    if len(set(subjects)) != len(subjects) or len(set(items)) != len(items):
        raise ValueError("duplicate id")
    seen = ~np.isnan(y)
    values = y[seen]
    if not np.isfinite(values).all() or (np.abs(values) > F32_MAX).any() or (values < 0).any():
        raise ValueError("value no kind holds")
    if not seen.any(axis=1).all() or not seen.any(axis=0).all():
        raise ValueError("a subject or item without responses")
    if np.isin(values, (0.0, 1.0)).all():
        return subjects, items, np.where(seen, y, -1).astype(np.int8), "binary"
    kind = "unit" if (values <= 1).all() else "nonnegative"
    return subjects, items, y.astype(np.float32), kind


def ref_wide(header: list, rows: list[list], id_column=None):
    """Wide table: header names and rows of raw cells."""
    names = [str(h).strip() for h in header]
    if not rows:
        raise ValueError("no rows")
    first = [r[0] for r in rows]
    text = [c for c in first if c is not None and str(c).strip()]
    if id_column == "none":
        has_ids = False
    else:
        all_text = bool(text) and all(isinstance(c, str) and _not_number(c) for c in text)
        has_ids = names[0].lower() in ID_NAMES | {""} or all_text
        if not has_ids:
            raise ValueError("ambiguous first column: --id-column needed")
    if has_ids:
        subjects = [ref_id(c if isinstance(c, str) or c is None else str(c)) for c in first]
        items, cells = names[1:], [r[1:] for r in rows]
    else:
        subjects = [str(k) for k in range(len(rows))]
        items, cells = names, rows
    if not items or any(not ref_id(i) for i in items):
        raise ValueError("no items")
    y = np.array([[ref_value(c) for c in row] for row in cells], np.float64).reshape(
        len(rows), len(items))
    return ref_finish(subjects, items, y)


def _not_number(cell: str) -> bool:
    try:
        return math.isnan(ref_value(cell))
    except ValueError:
        return True


def ref_wide_csv(text: str):
    records = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    if not records:
        raise ValueError("empty")
    header, rows = records[0], records[1:]
    if any(len(r) != len(header) for r in rows):
        raise ValueError("ragged")
    return ref_wide(header, rows)


def ref_long(rows: list[tuple]):
    """Long rows ``(subject, item, raw response)``; first-appearance id order."""
    if not rows:
        raise ValueError("no rows")
    subjects: dict[str, int] = {}
    items: dict[str, int] = {}
    cells: dict[tuple[int, int], float] = {}
    for s, i, v in rows:
        s = subjects.setdefault(ref_id(s), len(subjects))
        i = items.setdefault(ref_id(i), len(items))
        value = ref_value(v)
        if math.isnan(value):
            continue
        if (s, i) in cells and cells[(s, i)] != value:
            raise ValueError("conflicting duplicate")
        cells[(s, i)] = value
    y = np.full((len(subjects), len(items)), np.nan)
    for (s, i), value in cells.items():
        y[s, i] = value
    return ref_finish(list(subjects), list(items), y)


def ref_long_csv(text: str):
    records = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    header, rows = records[0], records[1:]
    if any(len(r) != len(header) for r in rows):
        raise ValueError("ragged")
    lower = [h.strip().lower() for h in header]
    col = [next(k for k, h in enumerate(lower) if h in names)
           for names in (("subject", "subject_id"), ("item", "item_id"), ("response",))]
    return ref_long([tuple(r[c] if r[c] != "" or c == col[2] else None for c in col)
                     for r in rows])


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def ref_jsonl(text: str):
    subjects, rows, items = [], [], {}
    for line in text.split("\n"):
        if not line.strip():
            continue
        record = json.loads(line, object_pairs_hook=_no_duplicates)
        if not (isinstance(record, dict) and "subject_id" in record
                and isinstance(record.get("responses"), dict)):
            raise ValueError("not a record")
        subjects.append(ref_id(record["subject_id"]))
        keys = [ref_id(k) for k in record["responses"]]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate item after trimming")
        values = []
        for v in record["responses"].values():
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10 ** 300:
                v = math.inf
            values.append(ref_value(v))
        rows.append(([items.setdefault(k, len(items)) for k in keys], values))
    if not subjects:
        raise ValueError("no records")
    y = np.full((len(subjects), len(items)), np.nan)
    for r, (cols, values) in enumerate(rows):
        y[r, cols] = values
    return ref_finish(subjects, list(items), y)


def reference(fn, *args):
    try:
        return fn(*args)
    except (ValueError, OverflowError, RecursionError):
        return REJECT


# ----------------------------------------------------------------------------- the check

def check(reader: str, src: Path, expected, **kw) -> None:
    out = src.parent / "out.zarr"
    try:
        store = ingest(src, out, **kw)
    except IRTError as err:
        message = str(err)
        assert "\n" not in message and message, message
        assert not out.exists(), "a failed ingest left its output"
        assert [p.name for p in src.parent.iterdir() if p.name.startswith(".")] == []
        assert expected == REJECT, f"reader rejected a valid input: {message}"
        _count(reader, "error")
        return
    assert expected != REJECT, f"reader accepted an input the reference rejects: {src.read_bytes()!r}"
    subjects, items, stored, kind = expected
    assert list(store.subjects) == subjects and list(store.items) == items
    assert store.kind == kind
    got = store.load()
    assert got.dtype == stored.dtype
    np.testing.assert_array_equal(got, stored)
    _count(reader, "store")


def _count(reader: str, outcome: str) -> None:
    counts = OUTCOMES.setdefault(reader, {})
    counts[outcome] = counts.get(outcome, 0) + 1


@st.composite
def wide_tables(draw):
    num_items = draw(st.integers(1, 3))
    first = draw(st.sampled_from(["model", "subject", "", "model", "student", "q0"]))
    header = [first] + distinct(draw, PLAIN_ITEMS, EDGE_ITEMS, num_items)
    num_rows = draw(st.integers(0, 4))
    first_cells = (distinct(draw, PLAIN_IDS, EDGE_IDS, num_rows) if first != "q0"
                   else [draw(mostly(PLAIN_CELLS, EDGE_CELLS)) for _ in range(num_rows)])
    rows = [[first_cells[r]] + [draw(mostly(PLAIN_CELLS, EDGE_CELLS)) for _ in range(num_items)]
            for r in range(num_rows)]
    if rows and draw(st.integers(0, 9)) == 0:
        rows[-1] = rows[-1][:-1]  # a ragged row
    return header, rows


@given(wide_tables())
@FUZZ
def test_wide_csv_reader(table):
    header, rows = table
    text = "\n".join(",".join(r) for r in [header, *rows]) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "w.csv"
        src.write_text(text, encoding="utf-8")
        check("wide csv", src, reference(ref_wide_csv, text))


PARQUET_IDS = {"string": pa.string(), "int": pa.int64(), "float": pa.float64(),
               "binary": pa.binary(), "list": pa.list_(pa.string())}


@st.composite
def wide_parquet_tables(draw):
    num_rows, num_items = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    id_type = draw(st.sampled_from(["string", "string", "string", "int", "float", "binary",
                                    "list"]))
    if id_type == "string":
        id_values = distinct(draw, PLAIN_IDS, EDGE_IDS + [None], num_rows)
    else:
        ids = {"int": st.integers(-3, 3), "float": st.sampled_from([1.0, 2.5]),
               "binary": st.sampled_from([b"a", b"\xff"]), "list": st.just(["a"])}[id_type]
        id_values = [draw(ids) for _ in range(num_rows)]
    value_type = draw(st.sampled_from(["float", "int", "bool", "string"]))
    values = {"float": mostly([0.0, 1.0, 0.5, math.nan, None, 0.25, -0.0],
                              [-1e-50, 1.00000001, math.inf, 1e39, -1.0]),
              "int": mostly([0, 1, 2, None], [-1, 2 ** 60]),
              "bool": st.sampled_from([True, False, None]),
              "string": mostly(PLAIN_CELLS + [None], EDGE_CELLS)}[value_type]
    columns = [[draw(values) for _ in range(num_rows)] for _ in range(num_items)]
    names = [draw(st.sampled_from(["model", "id", "model", "student", ""]))]
    names += [f"q{k}" for k in range(num_items)]
    return names, id_type, id_values, value_type, columns


@given(wide_parquet_tables())
@FUZZ
def test_wide_parquet_reader(table):
    names, id_type, id_values, value_type, columns = table
    arrow = {"float": pa.float64(), "int": pa.int64(), "bool": pa.bool_(), "string": pa.string()}
    arrays = [pa.array(id_values, PARQUET_IDS[id_type])]
    arrays += [pa.array(col, arrow[value_type]) for col in columns]
    rows = [[id_values[r]] + [col[r] for col in columns] for r in range(len(id_values))]
    if id_type in ("float", "binary", "list") and (names[0].lower() in ID_NAMES | {""}):
        expected = REJECT  # ids must be text or integers
    elif id_type == "list":
        expected = REJECT
    else:
        expected = reference(ref_wide, names, rows)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "w.parquet"
        pq.write_table(pa.table(arrays, names=names), src)
        check("wide parquet", src, expected)


@st.composite
def long_rows(draw):
    num = draw(st.integers(0, 8))
    subjects = distinct(draw, PLAIN_IDS, EDGE_IDS, 3)
    items = distinct(draw, PLAIN_ITEMS, EDGE_ITEMS, 3)
    return [(draw(st.sampled_from(subjects)), draw(st.sampled_from(items)),
             draw(mostly(PLAIN_CELLS, EDGE_CELLS))) for _ in range(num)]


@given(long_rows(), st.sampled_from(["subject,item,response", "Subject_ID,item_id,Response"]))
@FUZZ
def test_long_csv_reader(rows, header):
    text = "\n".join([header] + [",".join(r) for r in rows]) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "l.csv"
        src.write_text(text, encoding="utf-8")
        check("long csv", src, reference(ref_long_csv, text) if rows else REJECT)


@given(long_rows(), st.sampled_from(["float", "string"]))
@FUZZ
def test_long_parquet_reader(rows, value_type):
    subjects = [None if s == "" else s for s, _, _ in rows]
    items = [None if i == "" else i for _, i, _ in rows]
    if value_type == "float":
        values = [None if math.isnan(_safe(v)) else _safe(v) for _, _, v in rows]
    else:
        values = [None if v == "" else v for _, _, v in rows]
    table = pa.table([pa.array(subjects, pa.string()), pa.array(items, pa.string()),
                      pa.array(values, pa.float64() if value_type == "float" else pa.string())],
                     names=["subject", "item", "response"])
    expected = reference(ref_long, list(zip(subjects, items, values))) if rows else REJECT
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "l.parquet"
        pq.write_table(table, src)
        check("long parquet", src, expected)


def _safe(cell: str) -> float:
    try:
        return ref_value(cell)
    except ValueError:
        return 0.5


JSON_VALUES = ["0", "1", "0.5", "null", "true", "\"1\"", "\"NA\"", "0.25", "NaN"]
JSON_EDGE_VALUES = ["2", "-1e-50", "1.00000001", "Infinity", "1" + "0" * 400, "9" * 5000,
                    "[1]", "{}", "\"x\"", "1e400", "-1"]
JSON_IDS = ["\"a\"", "\"b\"", "\"NA\"", "\"null\"", "\"é\"", "\"c\"", "\"nan\""]
JSON_EDGE_IDS = ["\"\"", "\" \"", "101", "null", "NaN", "[\"a\"]", "{}", "\"\\ud800\"",
                 "\"a\""]
JSON_KEYS = ["\"q1\"", "\"q2\"", "\"NA\"", "\"é\""]
JSON_EDGE_KEYS = ["\"\"", "\" q1\"", "\"\\udfff\"", "\"q1\""]


@st.composite
def jsonl_lines(draw):
    lines = []
    num = draw(st.integers(0, 4))
    for subject in distinct(draw, JSON_IDS, JSON_EDGE_IDS, num):
        keys = distinct(draw, JSON_KEYS, JSON_EDGE_KEYS, draw(st.integers(1, 3)))
        pairs = [f"{key}: {draw(mostly(JSON_VALUES, JSON_EDGE_VALUES))}" for key in keys]
        head = f'"subject_id": {subject}'
        if draw(st.integers(0, 14)) == 0:
            head += ', "subject_id": "z"'  # a duplicated key
        lines.append("{" + head + ', "responses": {' + ", ".join(pairs) + "}}")
    if lines and draw(st.integers(0, 14)) == 0:
        lines[-1] = lines[-1][:-3]  # truncated JSON
    return lines


@given(jsonl_lines())
@FUZZ
def test_jsonl_reader(lines):
    text = "\n".join(lines) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "p.jsonl"
        src.write_text(text, encoding="utf-8")
        check("jsonl", src, reference(ref_jsonl, text))


def test_outcome_counts_cover_both_branches():
    """Run after the readers (file order): each reader produced both stores and errors, so
    the generators reach valid inputs as well as invalid ones."""
    print("fuzz outcomes", OUTCOMES)
    assert len(OUTCOMES) == 5
    for reader, counts in OUTCOMES.items():
        assert counts.get("store", 0) > 0 and counts.get("error", 0) > 0, (reader, counts)
