"""Damaged stores are clear errors naming the damaged file, never different numbers; a store
changed under a streaming fit is detected."""

import json
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main
from engine.data import ingest, open_store, write_store
from engine.data.sparse import SparseSource
from engine.data.streaming import StreamingSource
from engine.errors import DataFormatError


def _matrix(num_subjects=40, num_items=70, seed=0, kind="binary"):
    rng = np.random.default_rng(seed)
    if kind == "binary":
        y = (rng.random((num_subjects, num_items)) < 0.6).astype(np.int8)
        y[rng.random(y.shape) < 0.2] = -1
        y[:, 0], y[0, :] = 1, 0  # every subject and item observed
    else:
        y = rng.random((num_subjects, num_items)).astype(np.float32)
        y[rng.random(y.shape) < 0.2] = np.nan
        y[:, 0], y[0, :] = 0.5, 0.25
    return y


def _store(path: Path, layout="dense", kind="binary", seed=0):
    y = _matrix(seed=seed, kind=kind)
    subjects = [f"s{k}" for k in range(y.shape[0])]
    items = [f"i{k}" for k in range(y.shape[1])]
    return y, write_store(y, subjects, items, path, kind=kind, chunks=(16, 8), layout=layout)


def _edit_attrs(store_path: Path, **changes):
    meta_file = store_path / "zarr.json"
    meta = json.loads(meta_file.read_text())
    for key, value in changes.items():
        if value is None:
            meta["attributes"]["irt_engine"].pop(key, None)
        else:
            meta["attributes"]["irt_engine"][key] = value
    meta_file.write_text(json.dumps(meta))


def _flip(path: Path, offset: int, bit: int = 1) -> bytes:
    data = bytearray(path.read_bytes())
    original = bytes(data)
    data[offset] ^= bit
    path.write_bytes(bytes(data))
    return original


def test_every_chunk_file_is_written_and_names_follow_the_grid(tmp_path):
    y, store = _store(tmp_path / "s.zarr")
    shards = sorted(p.relative_to(store.path).as_posix()
                    for p in (store.path / "responses" / "c").rglob("*") if p.is_file())
    # 40 x 70 in (16, 8) chunks, shards of (16, 64): 3 x 2 shard files, all present
    assert shards == [f"responses/c/{r}/{c}" for r in range(3) for c in range(2)]
    assert store.meta["integrity"] == "crc32c-chunks"
    np.testing.assert_array_equal(store.load(), y)


@pytest.mark.parametrize("name", ["responses/c/1/1", "subjects/c/0", "items/c/0",
                                  "responses/zarr.json", "items/zarr.json"])
def test_deleted_file_is_named(tmp_path, name):
    _, store = _store(tmp_path / "s.zarr")
    (store.path / name).unlink()
    with pytest.raises(DataFormatError, match=rf"s\.zarr/{name}: .*missing.*re-run `irt-engine ingest`"):
        open_store(store.path)


@pytest.mark.parametrize("name", ["subject_idx/c/0", "response/c/0", "response/zarr.json"])
def test_deleted_file_in_sparse_store_is_named(tmp_path, name):
    _, store = _store(tmp_path / "s.zarr", layout="sparse")
    (store.path / name).unlink()
    with pytest.raises(DataFormatError, match=rf"s\.zarr/{name}: .*missing"):
        open_store(store.path)


@pytest.mark.parametrize("kind", ["binary", "unit"])
def test_every_single_byte_flip_in_a_chunk_is_caught(tmp_path, kind):
    """Flip one bit in bytes of a shard file in turn (60 spread over it and the last 20, the
    shard index): each read either fails naming the file or gives the original values, never
    other numbers. benchmarks/bench_store_integrity.py flips every byte."""
    y, store = _store(tmp_path / "s.zarr", kind=kind)
    chunk = store.path / "responses" / "c" / "1" / "0"
    caught = same = 0
    size = len(chunk.read_bytes())
    offsets = sorted(set(np.linspace(0, size - 1, 60).astype(int)) | set(range(size - 20, size)))
    for offset in offsets:
        original = _flip(chunk, offset, bit=1 << (offset % 8))
        try:
            got = open_store(store.path).load()
        except DataFormatError as err:
            assert "s.zarr/responses/c/1/0: cannot decode it" in str(err) and "\n" not in str(err)
            caught += 1
        else:
            np.testing.assert_array_equal(got, y)
            same += 1
        chunk.write_bytes(original)
    print(f"{kind}: {caught} flips caught, {same} read back the same values")
    assert caught > 0.9 * (caught + same)


def test_flip_names_the_file_through_dask_too(tmp_path):
    _, store = _store(tmp_path / "s.zarr")
    _flip(store.path / "responses" / "c" / "2" / "1", 5)
    reopened = open_store(store.path)
    with pytest.raises(DataFormatError, match=r"s\.zarr/responses/c/2/1: cannot decode"):
        reopened.responses.compute()
    source = StreamingSource.from_store(reopened, max_block_cells=16 * 8)
    with pytest.raises(DataFormatError, match=r"responses/c/2/1: cannot decode"):
        [source.block(key) for key in source.keys()]


def test_edited_metadata_shape_is_named(tmp_path):
    _, store = _store(tmp_path / "s.zarr")
    meta_file = store.path / "responses" / "zarr.json"
    meta = json.loads(meta_file.read_text())
    meta["shape"] = [40_000, 40_000]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=r"responses/zarr\.json: shape \[40000, 40000\], "
                                              r"but the store's attributes .* say \[40, 70\]"):
        open_store(store.path)


def test_attributes_claiming_a_huge_matrix_fail_at_open(tmp_path):
    """A 40,000 x 40,000 claim is refused at open (the id arrays disagree), before any read."""
    _, store = _store(tmp_path / "s.zarr")
    _edit_attrs(store.path, num_subjects=40_000, num_items=40_000)
    with pytest.raises(DataFormatError, match=r"subjects/zarr\.json: shape \[40\], but .* "
                                              r"say \[40000\]"):
        open_store(store.path)


@pytest.mark.parametrize("key, value, match", [
    ("num_observed", "12", r"attribute 'num_observed' is '12', not a count"),
    ("num_items", None, r"attribute 'num_items' is None, not a count"),
    ("checksum", None, r"attribute 'checksum' is missing"),
    ("layout", "ragged", r"attribute 'layout' is 'ragged'"),
    ("num_observed", 10 ** 6, r"num_observed 1000000 exceeds 40 x 70 cells"),
])
def test_damaged_attribute_is_named(tmp_path, key, value, match):
    _, store = _store(tmp_path / "s.zarr")
    _edit_attrs(store.path, **{key: value})
    with pytest.raises(DataFormatError, match=r"s\.zarr/zarr\.json: " + match):
        open_store(store.path)


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_wrong_observed_count_is_caught_in_memory_and_streaming(tmp_path, layout):
    y, store = _store(tmp_path / "s.zarr", layout=layout)
    true_count = int((y >= 0).sum())
    if layout == "sparse":  # the arrays' length is checked at open; lie in a dense store
        _edit_attrs(store.path, num_observed=true_count - 1)
        with pytest.raises(DataFormatError, match=r"subject_idx/zarr\.json: shape"):
            open_store(store.path)
        return
    _edit_attrs(store.path, num_observed=true_count - 1)
    reopened = open_store(store.path)
    with pytest.raises(DataFormatError, match=rf"holds {true_count} observed responses but the "
                                              rf"store's attributes .* say {true_count - 1}"):
        reopened.load()
    source = StreamingSource.from_store(reopened, max_block_cells=16 * 8)
    with pytest.raises(DataFormatError, match=rf"holds {true_count} observed"):
        for key in source.keys():
            source.block(key)


def test_store_replaced_under_a_streaming_read(tmp_path):
    path = tmp_path / "s.zarr"
    y, store = _store(path)
    source = StreamingSource.from_store(store, max_block_cells=16 * 8)
    first = [source.block(key).y.copy() for key in source.keys()]
    assert sum(int((b >= 0).sum()) for b in first) == int((y >= 0).sum())
    # another store of the same shape, written over it
    write_store(_matrix(seed=1), list(store.subjects), list(store.items), path, chunks=(16, 8),
                overwrite=True)
    with pytest.raises(DataFormatError, match=r"the store changed while it was being read"):
        source.block(source.keys()[0])


def test_chunk_rewritten_in_place_under_a_streaming_read(tmp_path):
    """A chunk file replaced by another valid one (its own CRC matches) is still caught: the
    block differs from its first read."""
    y, store = _store(tmp_path / "a.zarr")
    _, other = _store(tmp_path / "b.zarr", seed=1)
    source = StreamingSource.from_store(store, max_block_cells=16 * 8)
    for key in source.keys():
        source.block(key)
    name = Path("responses/c/0/0")
    (store.path / name).write_bytes((other.path / name).read_bytes())
    with pytest.raises(DataFormatError, match=r"changed while the fit was reading it \(block"):
        for key in source.keys():
            source.block(key)


def test_sparse_streaming_source_checks_reads(tmp_path):
    y, store = _store(tmp_path / "s.zarr", layout="sparse")
    source = SparseSource.from_store(store, batch_size=64, in_memory=False)
    blocks = [source.block(key) for key in source.keys()]
    assert sum(int((b.y >= 0).sum()) for b in blocks) == int((y >= 0).sum())
    _flip(store.path / "response" / "c" / "0", 3)
    with pytest.raises(DataFormatError, match=r"response/c/0: cannot decode"):
        SparseSource.from_store(open_store(store.path), batch_size=64, in_memory=False).block(0)


def test_store_without_chunk_crcs_is_verified_whole(tmp_path):
    """A store from before per-chunk CRCs has its whole checksum recomputed on open."""
    _, store = _store(tmp_path / "s.zarr")
    _edit_attrs(store.path, integrity=None)
    assert open_store(store.path).meta.get("integrity") is None  # intact: opens
    _edit_attrs(store.path, checksum="0" * 64)
    with pytest.raises(DataFormatError, match=r"checksum mismatch"):
        open_store(store.path)


def test_fit_cli_on_a_store_missing_a_chunk(tmp_path, capsys):
    _, store = _store(tmp_path / "s.zarr")
    (store.path / "responses" / "c" / "0" / "1").unlink()
    code = main(["fit", str(store.path), "--out", str(tmp_path / "run"), "--model", "1pl"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "responses/c/0/1: chunk file missing" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "run" / "fit.json").exists()


def test_ingest_cli_id_column(tmp_path, capsys):
    src = tmp_path / "w.csv"
    src.write_text("student,q1,q2\n101,1,0\n102,0,1\n")
    assert main(["ingest", str(src), "--out", str(tmp_path / "a.zarr")]) != 0
    err = capsys.readouterr().err
    assert "--id-column 'student'" in err and not (tmp_path / "a.zarr").exists()
    assert main(["ingest", str(src), "--out", str(tmp_path / "a.zarr"),
                 "--id-column", "student"]) == 0
    store = open_store(tmp_path / "a.zarr")
    assert list(store.subjects) == ["101", "102"] and list(store.items) == ["q1", "q2"]
    src.write_text("student,q1,q2\n101,1,0\n101,0,1\n")  # the duplicate, now seen
    with pytest.raises(DataFormatError, match=r"w\.csv line 3: duplicate subject '101'"):
        ingest(src, tmp_path / "b.zarr", id_column="student")
