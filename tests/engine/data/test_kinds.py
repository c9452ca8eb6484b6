"""Continuous response kinds in ingest and stores: unit scores and non-negative errors.

Every input format and layout round-trips float32 values with NaN missing; the kind is
detected (smallest holding every value) or given; out-of-kind values name file, row and
column and leave nothing behind; float stores fit alike streamed, in memory and sparse.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.api import fit, make_source
from engine.cli import main
from engine.data import ingest, open_store, write_store
from engine.data.sparse import SparseSource
from engine.data.store import sparse_checksum, store_checksum
from engine.data.streaming import StreamingSource
from engine.errors import DataFormatError
from engine.infer.settings import FitSettings

SUBJECTS = ["gpt", "bert", "t5", "llama"]
ITEMS = ["q1", "q2", "q3", "q4", "q5"]
NAN = np.nan
# exactly representable values, so text formats round-trip bit for bit; NaN = missing
UNIT = np.array([[0.25, 1.0, NAN, 0.0, 0.5],
                 [0.125, NAN, 0.75, 0.375, 1.0],
                 [NAN, 0.625, 0.0, 0.875, 0.25],
                 [1.0, 0.5, 0.5, NAN, 0.0]], np.float32)
ERRORS = np.where(np.isnan(UNIT), NAN, UNIT * 8 - np.floor(UNIT * 4)).astype(np.float32)
FORMATS = ["wide.csv", "wide.parquet", "long.csv", "long.parquet", "py.jsonl"]


def _write(y: np.ndarray, path: Path) -> Path:
    """Write ``y`` (NaN missing) in the format named by ``path`` (see ``FORMATS``)."""
    if path.name.startswith("wide"):
        frame = pd.DataFrame(y, columns=ITEMS)
        frame.insert(0, "model", SUBJECTS)
        frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path)
    elif path.name.startswith("long"):
        rows = [(s, i, float(y[a, b])) for a, s in enumerate(SUBJECTS)
                for b, i in enumerate(ITEMS) if not np.isnan(y[a, b])]
        frame = pd.DataFrame(rows, columns=["subject", "item", "response"])
        frame.to_csv(path, index=False) if path.suffix == ".csv" else frame.to_parquet(path)
    else:
        path.write_text("".join(json.dumps({"subject_id": s, "responses": {
            i: float(y[a, b]) for b, i in enumerate(ITEMS) if not np.isnan(y[a, b])}}) + "\n"
            for a, s in enumerate(SUBJECTS)))
    return path


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def _aligned(store) -> np.ndarray:
    """The store's matrix in (SUBJECTS, ITEMS) order (long ids come in appearance order)."""
    rows = [list(store.subjects).index(s) for s in SUBJECTS]
    cols = [list(store.items).index(i) for i in ITEMS]
    return store.load()[np.ix_(rows, cols)]


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("kind, y", [("unit", UNIT), ("nonnegative", ERRORS)])
def test_round_trip(tmp_path, name, layout, kind, y):
    src = _write(y, tmp_path / name)
    store = ingest(src, tmp_path / "out.zarr", layout=layout)
    assert store.kind == kind and store.layout == layout  # detected
    assert store.meta["dtype"] == "float32" and store.meta["missing"] == "nan"
    assert store.meta["format_version"] == 2
    got = _aligned(store)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, y)  # NaN positions and values, bit for bit
    assert store.num_observed == int((~np.isnan(y)).sum())
    zeros, ones = int((y == 0).sum()), int((y == 1).sum())
    assert store.boundary["zeros"] == zeros and store.boundary["ones"] == ones
    first = np.argwhere(store.load() == 0)[0].tolist()
    assert store.boundary["first_zero"] == first
    open_store(store.path, verify=True)  # the checksum covers the float values and kind
    if layout == "dense":
        assert store.responses.dtype == np.float32
    else:
        s, i, v = (np.asarray(a) for a in store.observations())
        assert v.dtype == np.float32 and not np.isnan(v).any()
        np.testing.assert_array_equal(v, store.load()[s, i])


def test_detect_smallest_kind(tmp_path):
    binary = np.where(np.isnan(UNIT), NAN, UNIT >= 0.5).astype(np.float32)
    for y, kind, dtype in ((binary, "binary", np.int8), (UNIT, "unit", np.float32),
                           (ERRORS, "nonnegative", np.float32)):
        (tmp_path / kind).mkdir()
        store = ingest(_write(y, tmp_path / kind / "long.csv"), tmp_path / f"{kind}.zarr")
        assert store.kind == kind and store.load().dtype == dtype
    assert store.meta["format_version"] == 2
    assert open_store(tmp_path / "binary.zarr").meta["format_version"] == 1  # unchanged


@pytest.mark.parametrize("name", FORMATS)
def test_kind_override(tmp_path, name):
    binary = np.where(np.isnan(UNIT), NAN, UNIT >= 0.5).astype(np.float32)
    src = _write(binary, tmp_path / name)
    store = ingest(src, tmp_path / "u.zarr", kind="unit")  # 0/1 scores held as unit scores
    assert store.kind == "unit" and store.load().dtype == np.float32
    np.testing.assert_array_equal(_aligned(store), binary)
    (tmp_path / "b").mkdir()
    store = ingest(_write(UNIT, tmp_path / "b" / name), tmp_path / "n.zarr", kind="nonnegative")
    assert store.kind == "nonnegative"
    np.testing.assert_array_equal(_aligned(store), UNIT)


def _with(y: np.ndarray, value: float) -> np.ndarray:
    y = y.copy()
    y[2, 3] = value  # subject t5, item q4
    return y


# (matrix, kind, pattern after the location): each a value no kind / the given kind holds
BAD = [
    (_with(UNIT, -0.25), None, r"got -0\.25; expected a response >= 0.*errors = -score"),
    (_with(UNIT, -0.25), "unit", r"got -0\.25; expected a score in \[0, 1\] for kind 'unit'"),
    (_with(UNIT, 1.5), "unit", r"got 1\.5; expected a score in \[0, 1\] for kind 'unit'.*--kind"),
    (_with(np.where(np.isnan(UNIT), NAN, UNIT > 0.5).astype(np.float32), 0.5), "binary",
     r"got 0\.5; expected 0 or 1 for kind 'binary'"),
    (_with(ERRORS, -2.0), "nonnegative", r"got -2; expected an error >= 0"),
    (_with(UNIT, np.inf), None, r"got inf; expected a finite number"),
    (_with(ERRORS, -np.inf), "nonnegative", r"got -inf; expected a finite number"),
]
WHERE = {"wide.csv": r'wide\.csv line 4, column "q4"',
         "wide.parquet": r'wide\.parquet row index 2, column "q4"',
         "long.csv": r'long\.csv line \d+, column "response"',
         "long.parquet": r'long\.parquet row index \d+, column "response"',
         "py.jsonl": r'py\.jsonl line 3, item "q4"'}


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("y, kind, match", BAD)
def test_out_of_kind_values(tmp_path, name, y, kind, match):
    src = _write(y, tmp_path / name)
    with pytest.raises(DataFormatError, match=WHERE[name] + ": " + match):
        ingest(src, tmp_path / "out.zarr", kind=kind, layout="dense")
    assert not (tmp_path / "out.zarr").exists() and _leftovers(tmp_path) == []


def test_long_error_names_the_exact_row(tmp_path):
    src = _write(_with(UNIT, 1.5), tmp_path / "long.csv")
    row = 2 + pd.read_csv(src).index[pd.read_csv(src)["response"] == 1.5][0]
    with pytest.raises(DataFormatError, match=rf"long\.csv line {row}, column \"response\""):
        ingest(src, tmp_path / "out.zarr", kind="unit")


def test_cli_kind(tmp_path, capsys):
    src = _write(UNIT, tmp_path / "long.parquet")
    assert main(["ingest", str(src), "--out", str(tmp_path / "a.zarr"), "--kind",
                 "nonnegative"]) == 0
    assert "kind nonnegative" in capsys.readouterr().out
    assert main(["ingest", str(src), "--out", str(tmp_path / "b.zarr"), "--kind", "binary"]) == 2
    assert "expected 0 or 1 for kind 'binary'" in capsys.readouterr().err
    assert not (tmp_path / "b.zarr").exists() and _leftovers(tmp_path) == []


def test_ingest_names_columns_and_codes_that_make_the_data_non_binary(tmp_path, capsys):
    """Where a few columns (a demographic, a count) keep 0/1 items from being binary, or
    every response is a small whole number (ratings, chosen options, 1/2 codes), ingest
    says so with the fix; data whose kind is what it means get no note."""
    from engine.data.kinds import kind_note

    rng = np.random.default_rng(0)
    items = rng.integers(0, 2, (40, 5)).astype(float)
    age = rng.integers(18, 80, (40, 1)).astype(float)
    frame = pd.DataFrame(np.hstack([items, age]), columns=[f"q{k}" for k in range(5)] + ["age"])
    frame.insert(0, "subject", [f"s{k}" for k in range(40)])
    frame.to_csv(tmp_path / "w.csv", index=False)
    assert main(["ingest", str(tmp_path / "w.csv"), "--out", str(tmp_path / "w.zarr")]) == 0
    out = capsys.readouterr().out
    assert "kind nonnegative" in out
    assert "note: kind nonnegative: 5 of 6 item columns hold only 0/1, and age holds other " \
           "values" in out and "drop it and ingest again: the responses are then binary" in out
    likert = rng.integers(1, 7, (40, 8)).astype(float)
    likert[3, 2] = np.nan
    note = kind_note(np.hstack([likert, age]), [f"q{k}" for k in range(8)] + ["age"],
                     "nonnegative")
    assert "8 of 9 item columns hold at most 12 values (from 1 to 6)" in note
    assert "recode them to 0/1" in note and "age holds a wider range" in note
    assert kind_note(items, list("abcde"), "binary") is None
    assert kind_note(items, list("abcde"), "nonnegative") is None  # 0/1 under --kind: no advice
    assert kind_note(np.full((3, 2), np.nan), ["a", "b"], "nonnegative") is None
    errors = rng.gamma(2.0, 1.0, (40, 8))  # real errors: no note
    assert kind_note(errors, list("abcdefgh"), "nonnegative") is None
    scores = rng.uniform(0, 1, (40, 8))
    assert kind_note(scores, list("abcdefgh"), "unit") is None


def test_float_checksums(tmp_path):
    store = write_store(UNIT, SUBJECTS, ITEMS, tmp_path / "d.zarr", kind="unit")
    again = UNIT.copy()
    again[np.isnan(again)] = -np.float32(np.nan)  # another NaN bit pattern: same data
    assert store_checksum(again, SUBJECTS, ITEMS, kind="unit") == store.meta["checksum"]
    assert store_checksum(UNIT, SUBJECTS, ITEMS, kind="nonnegative") != store.meta["checksum"]
    sparse = write_store(UNIT, SUBJECTS, ITEMS, tmp_path / "s.zarr", kind="unit", layout="sparse")
    assert sparse_checksum(*sparse.observations(), SUBJECTS, ITEMS, kind="unit") == \
        sparse.meta["checksum"]
    with pytest.raises(DataFormatError, match=r"unit responses must each be a score in \[0, 1\]"):
        write_store(ERRORS, SUBJECTS, ITEMS, tmp_path / "x.zarr", kind="unit")
    with pytest.raises(DataFormatError, match="dtype float64; expected float32"):
        write_store(UNIT.astype(np.float64), SUBJECTS, ITEMS, tmp_path / "x.zarr", kind="unit")
    assert not (tmp_path / "x.zarr").exists() and _leftovers(tmp_path) == []


# --- fits from float stores -----------------------------------------------------------

SETTINGS = FitSettings(seed=0, max_passes=8, min_passes=8, max_block_cells=2048, progress=False)
EARLY = SETTINGS.replace(max_passes=4, min_passes=4)


def _simulate_scores(num_subjects=48, num_items=96, seed=3):
    """Beta-IRT scores with exact zeros and ones and 10% missing."""
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=num_subjects), rng.normal(size=num_items)
    mu = 1 / (1 + np.exp(-(theta[:, None] - b)))
    y = rng.beta(mu * 8, (1 - mu) * 8).astype(np.float32)
    u = rng.random(y.shape)
    y[u < 0.05], y[(u >= 0.05) & (u < 0.08)] = 0.0, 1.0
    y[rng.random(y.shape) < 0.1] = np.nan
    return y, theta


def _ids(prefix, n):
    return [f"{prefix}{k}" for k in range(n)]


def _max_gap(a, b):
    return {k: float(np.max(np.abs(a.guide.loc[k] - b.guide.loc[k]))) for k in a.guide.loc}


@pytest.fixture(scope="module")
def float_case(tmp_path_factory):
    """Simulated unit scores, one dense and one sparse store of them, and the in-memory fit."""
    y, theta = _simulate_scores()
    path = tmp_path_factory.mktemp("float")
    dense = write_store(y, _ids("s", 48), _ids("i", 96), path / "d.zarr", kind="unit",
                        chunks=(16, 32))
    sparse = write_store(y, _ids("s", 48), _ids("i", 96), path / "sp.zarr", kind="unit",
                         layout="sparse")
    return y, theta, dense, sparse, fit(dense, "beta", SETTINGS)


def test_streamed_float_store_equals_in_memory(float_case):
    y, theta, store, _, _ = float_case
    # compared after 4 passes: see test_sparse_equals_dense_on_the_same_float_observations
    memory = fit(store, "beta", EARLY)
    streamed = fit(store, "beta", EARLY.replace(memory_budget=8 << 10))
    assert memory.extra["source"] == "FloatInMemorySource"
    assert streamed.extra["source"] == "StreamingSource"
    block = make_source(store, SETTINGS.replace(memory_budget=8 << 10)).block((0, 0))
    assert block.y.dtype == np.float32 and np.isnan(block.y).any()
    # the store's boundary record makes the streamed fit choose the in-memory inflation
    assert memory.extra["model_options"]["inflation"] == "zero-one"
    assert streamed.extra["model_options"]["inflation"] == "zero-one"
    assert streamed.extra["data"]["boundary"] == memory.extra["data"]["boundary"] == {
        "zeros": int((y == 0).sum()), "ones": int((y == 1).sum())}
    gaps = _max_gap(memory, streamed)
    print("streamed vs in-memory max |loc gap|", gaps)
    assert max(gaps.values()) < 1e-4, gaps
    for key in ("subject_n", "item_n", "subject_mean", "item_mean"):
        np.testing.assert_allclose(streamed.extra["stats"][key], memory.extra["stats"][key],
                                   rtol=1e-6)
    ability = streamed.means()["ability"]
    assert np.all(np.isfinite(ability)) and np.corrcoef(ability, theta)[0, 1] > 0.8


def test_sparse_equals_dense_on_the_same_float_observations(float_case):
    y, _, dense_store, store, dense = float_case
    source = make_source(store, SETTINGS.replace(memory_budget=1 << 10))
    assert isinstance(source, SparseSource) and not source.resident
    assert source.empty_block().y.dtype == np.float32
    assert source.block(0).y.dtype == np.float32
    res = fit(store, "beta", SETTINGS.replace(memory_budget=1 << 10))  # streamed batches
    assert res.num_observed == dense.num_observed == int((~np.isnan(y)).sum())
    assert res.extra["model_options"]["inflation"] == "zero-one"  # from the store's record
    # Summation order differs (matrix products per tile, sums per observation batch). This
    # small fit's first passes take steps of up to 1e6 posterior sds, which amplify float
    # rounding about 20x a pass (measured: 3e-7 after 2 passes, 2e-5 after 4, 5e-3 after 8,
    # between two exact implementations of the same terms), so the fits are compared after
    # 4 passes; tests/engine/infer/test_linear.py checks the terms themselves agree.
    dense = fit(dense_store, "beta", EARLY)
    res = fit(store, "beta", EARLY.replace(memory_budget=1 << 10))
    gaps = _max_gap(dense, res)
    print("sparse vs dense max |loc gap|", gaps)
    assert max(gaps.values()) < 1e-3, gaps
    with pytest.raises(DataFormatError, match=r"sp\.zarr: \d+ response\(s\) equal 0 exactly "
                                              r"\(first at row \d+, column \d+\)"):
        fit(store, "beta", SETTINGS.replace(memory_budget=1 << 10),
            model_options={"inflation": "none"})


def test_streaming_source_tiles_keep_float(tmp_path):
    store = write_store(UNIT, SUBJECTS, ITEMS, tmp_path / "d.zarr", kind="unit", chunks=(2, 2))
    source = StreamingSource.from_store(store, max_block_cells=6)
    tiles = {k: source.block(k) for k in source.keys()}
    got = np.full(UNIT.shape, -7.0, np.float32)
    for (r, c), b in tiles.items():
        rows, cols = min(source.tile[0], 4 - r), min(source.tile[1], 5 - c)
        got[r:r + rows, c:c + cols] = b.y[:rows, :cols]
        assert b.y.dtype == np.float32 and np.isnan(b.y[rows:, :]).all()
    np.testing.assert_array_equal(got, UNIT)
    assert np.isnan(source.empty_block().y).all()
