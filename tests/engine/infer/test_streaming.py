"""Streaming and sparse sources give the in-memory estimates; prefetching is real."""

import threading
import time

import numpy as np
import pytest

from engine.api import fit, make_source
from engine.data.blocks import InMemorySource, aligned_tile
from engine.data.sparse import SparseSource
from engine.data.store import write_store
from engine.data.streaming import StreamingSource, prefetch
from engine.infer.fit import fit_source
from engine.infer.settings import FitSettings
from engine.models import get_model


def _simulate(num_subjects, num_items, *, seed, missing=0.1):
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=num_subjects), rng.normal(size=num_items)
    a = np.exp(0.3 * rng.normal(size=num_items))
    p = 1 / (1 + np.exp(-a * (theta[:, None] - b)))
    y = (rng.random(p.shape) < p).astype(np.int8)
    y[rng.random(p.shape) < missing] = -1
    return y, {"ability": theta, "difficulty": b, "discrimination": a}


def _ids(prefix, n):
    return [f"{prefix}{k}" for k in range(n)]


SETTINGS = FitSettings(seed=0, max_passes=10, min_passes=10, max_block_cells=4096,
                       ability_factor="gaussian")  # the path that streams


@pytest.fixture(scope="module")
def dense_case(tmp_path_factory):
    y, truth = _simulate(90, 240, seed=11)
    path = tmp_path_factory.mktemp("stream") / "dense.zarr"
    store = write_store(y, _ids("s", 90), _ids("i", 240), path, chunks=(32, 64))
    return y, truth, store


def _max_gap(a, b):
    return {k: float(np.max(np.abs(a.guide.loc[k] - b.guide.loc[k]))) for k in a.guide.loc}


def _max_gap_in_sds(a, b):
    """Largest location difference in posterior sds (float summation order differs)."""
    sd = a.sds()
    return {k: float(np.max(np.abs(a.guide.loc[k] - b.guide.loc[k]) / sd[k])) for k in a.guide.loc}


def test_streaming_equals_in_memory(dense_case):
    """A tiny memory budget streams tiles from zarr; the estimates match the in-memory fit."""
    y, truth, store = dense_case
    memory = fit(store, "2pl", SETTINGS)
    streamed = fit(store, "2pl", SETTINGS.replace(memory_budget=16 << 10))
    assert memory.extra["source"] == "InMemorySource"
    assert streamed.extra["source"] == "StreamingSource"
    source = make_source(store, SETTINGS.replace(memory_budget=16 << 10))
    assert source.tile == (32, 128) and len(source.keys()) == 3 * 2  # chunk-aligned tiles
    gaps = _max_gap(memory, streamed)
    print("streaming vs in-memory max |loc gap|", gaps)
    assert max(gaps.values()) < 1e-4, gaps
    assert streamed.num_observed == memory.num_observed == int((y >= 0).sum())
    for key in ("subject_n", "item_n", "subject_mean", "item_mean"):
        np.testing.assert_allclose(streamed.extra["stats"][key], memory.extra["stats"][key])
    assert np.corrcoef(streamed.means()["ability"], truth["ability"])[0, 1] > 0.9


def test_stochastic_steps_scale_the_elbo_alike(dense_case):
    """With several steps per pass (partial blocks per step) both sources scale equally."""
    y, _, store = dense_case
    settings = SETTINGS.replace(steps_per_pass=3, max_passes=12, min_passes=12)
    tile = StreamingSource.from_store(store, settings.max_block_cells).tile
    a = fit_source(get_model("2pl"), InMemorySource(y, tile=tile), settings)
    b = fit_source(get_model("2pl"), StreamingSource.from_store(store, settings.max_block_cells),
                   settings)
    gaps = _max_gap(a, b)
    assert max(gaps.values()) < 1e-4, gaps
    assert abs(a.elbo - b.elbo) < 1e-3 * abs(a.elbo)


def test_sparse_equals_dense_on_the_same_observations(tmp_path):
    y, _ = _simulate(80, 200, seed=12, missing=0.93)  # about 7% observed
    y[:, 0] = 1
    y[0, :] = 0
    dense = fit_source(get_model("2pl"), InMemorySource(y, max_block_cells=4096), SETTINGS)
    sparse = fit_source(get_model("2pl"), SparseSource.from_dense(y, batch_size=300), SETTINGS)
    assert sparse.extra["layout"] == "sparse" and sparse.num_observed == dense.num_observed
    # Summation order differs (per tile vs per batch), and with ~6 observations per item
    # rounding grows over passes; in posterior sds the gap stays negligible.
    gaps = _max_gap_in_sds(dense, sparse)
    print("sparse vs dense max |loc gap| / sd", gaps)  # measured 2e-3
    assert max(gaps.values()) < 0.02, gaps
    # through a sparse store, streamed batch by batch (tiny budget) and loaded
    store = write_store(y, _ids("s", 80), _ids("i", 200), tmp_path / "sp.zarr", layout="auto")
    assert store.layout == "sparse" and store.num_observed == int((y >= 0).sum())
    res = fit(store, "2pl", SETTINGS.replace(memory_budget=1 << 10))  # streamed batches
    assert res.extra["layout"] == "sparse" and not make_source(
        store, SETTINGS.replace(memory_budget=1 << 10)).resident
    assert max(_max_gap_in_sds(dense, res).values()) < 0.02
    np.testing.assert_array_equal(res.extra["stats"]["subject_n"], (y >= 0).sum(axis=1))
    assert make_source(store, SETTINGS).resident  # a budget that holds it: loaded


def test_sparse_source_never_builds_a_dense_matrix(tmp_path):
    """Blocks of a sparse source are observation batches, however large S x N is."""
    rng = np.random.default_rng(0)
    S, N, M = 200_000, 300_000, 5000  # 6e10 cells: a dense matrix could not be allocated
    s, i = rng.integers(0, S, M), rng.integers(0, N, M)
    source = SparseSource(s, i, rng.integers(0, 2, M).astype(np.int8), S, N, batch_size=1024)
    blocks = [source.block(k) for k in source.keys()]
    assert all(b.y.shape == (1024,) and b.subject_idx.shape == (1024,) for b in blocks)
    assert sum(int((b.y >= 0).sum()) for b in blocks) == M == source.num_observed


def test_aligned_tile():
    assert aligned_tile((1000, 10000), (1000, 2048), 1 << 22) == (1000, 4096)
    assert aligned_tile((90, 240), (32, 64), 4096) == (32, 128)
    assert aligned_tile((10, 10), (32, 64), 4096) == (10, 10)
    assert aligned_tile((5000, 5000), (1024, 8192), 1 << 20) == (209, 5000)


def test_prefetch_reads_ahead_and_propagates_errors():
    produced = []

    def slow():
        for k in range(5):
            produced.append(k)
            yield k

    it = prefetch(slow(), depth=2)
    assert next(it) == 0
    time.sleep(0.2)
    assert len(produced) >= 3  # the thread ran ahead while the consumer waited
    assert list(it) == [1, 2, 3, 4]

    def broken():
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(prefetch(broken(), depth=2))
    before = threading.active_count()
    it = prefetch(iter(range(100)), depth=1)
    next(it)
    it.close()  # stops the thread
    assert threading.active_count() <= before


_TWO_DEVICES = """
import json, sys, numpy as np, jax
from engine.api import fit
from engine.data.store import write_store
from engine.infer.settings import FitSettings
rng = np.random.default_rng(5)
S, N = 64, 300
th, b = rng.normal(size=S), rng.normal(size=N)
y = (rng.random((S, N)) < 1 / (1 + np.exp(-(th[:, None] - b)))).astype(np.int8)
y[rng.random((S, N)) < 0.1] = -1
ids = lambda p, n: [f"{p}{k}" for k in range(n)]
dense = write_store(y, ids("s", S), ids("i", N), sys.argv[1] + "/d.zarr", chunks=(32, 50))
sparse = write_store(y, ids("s", S), ids("i", N), sys.argv[1] + "/s.zarr", layout="sparse")
base = FitSettings(seed=0, max_passes=8, min_passes=8, max_block_cells=1024)
out = {}
for name, store, k in (("dense1", dense, 1), ("dense2", dense, 2), ("sparse2", sparse, 2)):
    res = fit(store, "1pl", base.replace(num_devices=k, memory_budget=1024))
    out[name] = [res.extra["source"], res.num_devices,
                 {n: v.tolist() for n, v in res.guide.loc.items()},
                 {n: np.exp(v).tolist() for n, v in res.guide.log_scale.items()}]
print(json.dumps({"devices": jax.local_device_count(), **out}))
"""


def test_two_devices_equal_one_for_streaming_and_sparse(tmp_path):
    """Streamed tiles and sparse batches are dealt over 2 devices by the same pmap path."""
    import json

    from _multidevice import run_with_devices

    proc = run_with_devices(_TWO_DEVICES, 2, scratch=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["devices"] == 2
    assert res["dense1"][:2] == ["StreamingSource", 1] and res["dense2"][:2] == ["StreamingSource", 2]
    assert res["sparse2"][:2] == ["SparseSource", 2]
    for name in ("dense2", "sparse2"):  # the same observations, dense tiles or sparse batches
        for block, loc in res["dense1"][2].items():
            sd = np.asarray(res["dense1"][3][block])
            gap = np.max(np.abs(np.asarray(loc) - np.asarray(res[name][2][block])) / sd)
            assert gap < 0.01, f"{name} {block}: max |1 device - {name}| = {gap} sd"


def test_a_stalled_try_is_run_again_in_a_new_folder(tmp_path):
    """The forced-devices helper reruns only XLA's stalled all-reduce, each try in its own
    empty folder: a store the stalled try wrote does not make the rerun fail."""
    from _multidevice import _XLA_STUCK, run_with_devices

    script = f"""
import pathlib, sys
folder = pathlib.Path(sys.argv[1])
assert not any(folder.iterdir()), "a rerun met an earlier try's files"
(folder / "d.zarr").mkdir()
first = folder.parent / "stalled-once"
if not first.exists():
    first.touch()
    sys.exit("Expected 2 {_XLA_STUCK}, but not all of them arrived on time")
print(folder.name, sys.argv[2])
"""
    proc = run_with_devices(script, 2, "extra", scratch=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["try2", "extra"]
    assert (tmp_path / "try1" / "d.zarr").is_dir()
