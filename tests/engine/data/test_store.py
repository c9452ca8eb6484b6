"""Tests for engine.data.store: write/open round trip, checksum, atomic overwrite, errors."""

import json

import numpy as np
import pytest
import zarr

from engine.data import Store, open_store, store_checksum, write_store
from engine.data import store as store_module
from engine.errors import DataFormatError, IRTError, StoreExistsError, StoreNotFoundError


def _matrix(seed: int = 0, shape=(7, 11)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=shape).astype(np.int8)
    y[rng.random(shape) < 0.2] = -1
    y[:, 0] = 1  # no empty rows
    return y


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{k}" for k in range(n)]


def _leftovers(parent) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_round_trip(tmp_path):
    y = _matrix()
    store = write_store(y, _ids("s", 7), _ids("i", 11), tmp_path / "x.zarr",
                        source=["a.csv"], input_format="wide", chunks=(4, 3))
    assert isinstance(store, Store) and store.kind == "binary"
    assert store.shape == (7, 11) and store.num_subjects == 7 and store.num_items == 11
    assert list(store.subjects) == _ids("s", 7) and list(store.items) == _ids("i", 11)
    np.testing.assert_array_equal(store.load(), y)
    assert store.load().dtype == np.int8
    dask_y = store.responses
    assert dask_y.dtype == np.int8 and dask_y.shape == (7, 11)
    np.testing.assert_array_equal(dask_y.compute(), y)
    assert store.num_observed == int((y >= 0).sum())
    assert store.density == pytest.approx((y >= 0).mean())
    meta = store.meta
    assert meta["format_version"] == 1 and meta["missing"] == -1 and meta["dtype"] == "int8"
    assert meta["source"] == ["a.csv"] and meta["input_format"] == "wide"
    assert meta["checksum"] == store_checksum(y, _ids("s", 7), _ids("i", 11))
    assert "T" in meta["created"]
    array = zarr.open_array(tmp_path / "x.zarr" / "responses", mode="r")
    assert array.chunks == (4, 3) and array.shards == (4, 12)
    assert array.metadata.zarr_format == 3
    assert _leftovers(tmp_path) == []
    # reopening gives the same thing; metadata is plain JSON on disk
    assert open_store(tmp_path / "x.zarr").meta == meta
    on_disk = json.loads((tmp_path / "x.zarr" / "zarr.json").read_text())
    assert on_disk["attributes"]["irt_engine"]["num_items"] == 11


def test_chunks_are_clipped_to_shape(tmp_path):
    store = write_store(_matrix(), _ids("s", 7), _ids("i", 11), tmp_path / "x.zarr")
    array = zarr.open_array(store.path / "responses", mode="r")
    assert array.chunks == (7, 11) and array.shards == (7, 11)


def test_checksum_is_deterministic_and_sensitive(tmp_path):
    y, subjects, items = _matrix(), _ids("s", 7), _ids("i", 11)
    a = write_store(y, subjects, items, tmp_path / "a.zarr", chunks=(2, 2))
    b = write_store(y, subjects, items, tmp_path / "b.zarr", source=["other"], chunks=(5, 8))
    assert a.meta["checksum"] == b.meta["checksum"]
    assert store_checksum(y, subjects, items, rows_per_block=3) == a.meta["checksum"]
    flipped = y.copy()
    flipped[3, 4] = 1 - max(flipped[3, 4], 0)
    assert store_checksum(flipped, subjects, items) != a.meta["checksum"]
    assert store_checksum(y, subjects, _ids("j", 11)) != a.meta["checksum"]
    assert store_checksum(y, ["s0s1", ""] + subjects[2:], items) != store_checksum(
        y, ["s0", "s1"] + subjects[2:], items)


def test_verify_detects_corruption(tmp_path):
    store = write_store(_matrix(), _ids("s", 7), _ids("i", 11), tmp_path / "x.zarr")
    assert open_store(store.path, verify=True).meta["checksum"] == store.meta["checksum"]
    array = zarr.open_array(store.path / "responses", mode="r+")
    array[0, 0] = 0
    with pytest.raises(DataFormatError, match="checksum mismatch"):
        open_store(store.path, verify=True)


def test_many_items(tmp_path):
    num_items = 150_000
    y = np.zeros((2, num_items), np.int8)
    store = write_store(y, ["a", "b"], _ids("item-", num_items), tmp_path / "x.zarr")
    again = open_store(store.path)
    assert again.items[-1] == f"item-{num_items - 1}" and again.num_items == num_items


def test_open_missing_store(tmp_path):
    with pytest.raises(StoreNotFoundError, match=r"nope\.zarr.*irt-engine ingest"):
        open_store(tmp_path / "nope.zarr")
    with pytest.raises(FileNotFoundError):
        open_store(tmp_path / "nope.zarr")


def test_open_not_a_store(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreNotFoundError, match="plain: a folder without zarr.json, not an "
                                                 "irt-engine response store"):
        open_store(tmp_path / "plain")
    zarr.open_group(tmp_path / "group.zarr", mode="w", zarr_format=3)
    with pytest.raises(StoreNotFoundError, match="group.zarr: a zarr group, not an irt-engine"):
        open_store(tmp_path / "group.zarr")
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(StoreNotFoundError, match=r"file\.txt: a file, not an irt-engine response "
                                                 r"store .*irt-engine ingest") as err:
        open_store(tmp_path / "file.txt")
    assert "PosixPath" not in str(err.value)
    # a store whose zarr.json is damaged is refused as damaged, not sent to ingest
    store = write_store(_matrix(), _ids("s", 7), _ids("i", 11), tmp_path / "x.zarr")
    (store.path / "zarr.json").write_text("")
    with pytest.raises(StoreNotFoundError, match=r"responses: a zarr array, not an irt-engine "
                                                 r"response store; pass the store's own folder"):
        open_store(store.path / "responses")  # one of the store's arrays, not the store
    (store.path / "zarr.json").write_text("")
    with pytest.raises(DataFormatError, match=r"x\.zarr/zarr\.json: damaged, not readable zarr "
                                              r"metadata .*restore the store from a copy"):
        open_store(store.path)
    (store.path / "zarr.json").write_text("{}")  # parses, but is no zarr metadata
    with pytest.raises(DataFormatError, match=r"zarr\.json: damaged"):
        open_store(store.path)


def test_open_newer_format(tmp_path):
    store = write_store(_matrix(), _ids("s", 7), _ids("i", 11), tmp_path / "x.zarr")
    group = zarr.open_group(store.path, mode="r+")
    group.attrs["irt_engine"] = {**store.meta, "format_version": 99}
    with pytest.raises(DataFormatError, match="newer"):
        open_store(store.path)


@pytest.mark.parametrize("bad, match", [
    (lambda y, s, i: (y[:, :5], s, i), "shape"),
    (lambda y, s, i: (y.astype(np.int16), s, i), "dtype int16"),
    (lambda y, s, i: (np.where(y == 1, 2, y).astype(np.int8), s, i), "0, 1 or -1"),
    (lambda y, s, i: (y, ["s0"] * 7, i), "duplicate subject id 's0'"),
    (lambda y, s, i: (y, s, i[:10] + ["i1"]), "duplicate item id 'i1'"),
])
def test_write_store_rejects_bad_input(tmp_path, bad, match):
    args = bad(_matrix(), _ids("s", 7), _ids("i", 11))
    with pytest.raises(DataFormatError, match=match):
        write_store(*args, tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists() and _leftovers(tmp_path) == []


def test_write_store_unknown_kind(tmp_path):
    with pytest.raises(DataFormatError, match="kind 'ordinal' is not supported"):
        write_store(_matrix(), _ids("s", 7), _ids("i", 11), tmp_path / "x.zarr", kind="ordinal")


def test_overwrite(tmp_path):
    out = tmp_path / "x.zarr"
    first = write_store(_matrix(0), _ids("s", 7), _ids("i", 11), out)
    with pytest.raises(StoreExistsError, match=r"x\.zarr: already exists.*overwrite"):
        write_store(_matrix(1), _ids("s", 7), _ids("i", 11), out)
    with pytest.raises(FileExistsError):
        write_store(_matrix(1), _ids("s", 7), _ids("i", 11), out)
    assert open_store(out).meta["checksum"] == first.meta["checksum"]
    second = write_store(_matrix(1), _ids("s", 7), _ids("i", 11), out, overwrite=True)
    np.testing.assert_array_equal(open_store(out).load(), _matrix(1))
    assert second.meta["checksum"] != first.meta["checksum"]
    assert _leftovers(tmp_path) == []


def test_overwrite_refuses_foreign_directory(tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(StoreExistsError, match="not an irt-engine store; refusing"):
        write_store(_matrix(), _ids("s", 7), _ids("i", 11), out, overwrite=True)
    assert (out / "notes.txt").read_text() == "keep me"


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "x.zarr"
    old = write_store(_matrix(0), _ids("s", 7), _ids("i", 11), out)

    def broken(tmp, *args, **kwargs):
        tmp.mkdir()
        (tmp / "partial").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(store_module, "_write_group", broken)
    with pytest.raises(OSError, match="disk full"):
        write_store(_matrix(1), _ids("s", 7), _ids("i", 11), out, overwrite=True)
    with pytest.raises(OSError, match="disk full"):
        write_store(_matrix(1), _ids("s", 7), _ids("i", 11), tmp_path / "new.zarr")
    assert open_store(out).meta["checksum"] == old.meta["checksum"]
    assert not (tmp_path / "new.zarr").exists() and _leftovers(tmp_path) == []


def test_errors_are_irt_errors():
    assert issubclass(StoreExistsError, IRTError) and issubclass(StoreExistsError, FileExistsError)


def test_sparse_layout_round_trip(tmp_path):
    y = _matrix(3, shape=(40, 60))
    y[np.random.default_rng(4).random(y.shape) < 0.97] = -1  # ~7% observed
    y[:, 0], y[0, :] = 1, 0
    dense = write_store(y, _ids("s", 40), _ids("i", 60), tmp_path / "d.zarr")
    sparse = write_store(y, _ids("s", 40), _ids("i", 60), tmp_path / "s.zarr", layout="auto")
    assert dense.layout == "dense" and sparse.layout == "sparse"
    assert sparse.num_observed == dense.num_observed == int((y >= 0).sum())
    assert not (sparse.path / "responses").exists()
    s, i, v = (np.asarray(a) for a in sparse.observations())
    assert s.dtype == np.int32 and i.dtype == np.int32 and v.dtype == np.int8
    np.testing.assert_array_equal(y[s, i], v)
    assert np.all(np.diff(s.astype(np.int64) * 60 + i) > 0)  # sorted by (subject, item)
    np.testing.assert_array_equal(sparse.load(), y)
    np.testing.assert_array_equal(sparse.responses.compute(), y)
    assert open_store(sparse.path, verify=True).meta["checksum"] == sparse.meta["checksum"]
    with pytest.raises(DataFormatError, match="dense store has no observation arrays"):
        dense.observations()
    arr = zarr.open_array(sparse.path / "response", mode="r+", zarr_format=3)
    arr[0] = 1 - arr[0]
    with pytest.raises(DataFormatError, match="checksum mismatch"):
        open_store(sparse.path, verify=True)


def test_dense_writer_in_bands_matches_write_store(tmp_path):
    from engine.data.writer import DenseWriter

    y = _matrix(5, shape=(23, 9))
    whole = write_store(y, _ids("s", 23), _ids("i", 9), tmp_path / "a.zarr", chunks=(4, 3))
    with DenseWriter(tmp_path / "b.zarr", _ids("s", 23), _ids("i", 9), chunks=(4, 3)) as w:
        for start in (0, 3, 10, 11):  # bands that do not line up with chunk rows
            w.write_rows(y[start:{0: 3, 3: 10, 10: 11, 11: 23}[start]])
        banded = w.commit()
    np.testing.assert_array_equal(banded.load(), y)
    assert banded.meta["checksum"] == whole.meta["checksum"]
    assert banded.num_observed == whole.num_observed
    with pytest.raises(DataFormatError, match="rows written; expected 23"):
        with DenseWriter(tmp_path / "c.zarr", _ids("s", 23), _ids("i", 9)) as w:
            w.write_rows(y[:5])
            w.commit()
    assert not (tmp_path / "c.zarr").exists() and _leftovers(tmp_path) == []


def test_sparse_writer_rejects_unsorted_or_bad_observations(tmp_path):
    from engine.data.writer import SparseWriter

    for s, i, v, match in [([1, 0], [0, 0], [1, 1], "sorted by"),
                           ([0, 0], [1, 1], [1, 0], "sorted by"),
                           ([0], [7], [1], "out of range"),
                           ([0], [0], [2], "must be 0 or 1")]:
        with pytest.raises(DataFormatError, match=match):
            with SparseWriter(tmp_path / "x.zarr", _ids("s", 3), _ids("i", 4)) as w:
                w.append(np.array(s), np.array(i), np.array(v, np.int8))
        assert _leftovers(tmp_path) == []
    with SparseWriter(tmp_path / "x.zarr", _ids("s", 3), _ids("i", 4), chunk=2) as w:
        w.append(np.array([0, 0, 1]), np.array([0, 3, 2]), np.array([1, 0, 1], np.int8))
        w.append(np.array([2]), np.array([1]), np.array([0], np.int8))
        store = w.commit()
    assert store.num_observed == 4 and store.load()[0, 3] == 0 and store.load()[2, 1] == 0
