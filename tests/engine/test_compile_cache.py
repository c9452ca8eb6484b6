"""Shape buckets and the persistent compilation cache: a new data set of similar shape in a
fresh process loads its programs from the cache, the padding never changes a fit, the cache
can be turned off, and ``leaderboard`` imports no JAX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.infer.fit import bucket_floor, bucket_size

REPO = Path(__file__).resolve().parents[2]
GAUSSIAN = dict(ability_factor="gaussian")  # the variational fit (auto would integrate out)


def _simulate(S: int, N: int, seed: int, missing: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=S), rng.normal(size=N)
    a = np.exp(0.3 * rng.normal(size=N))
    y = (rng.random((S, N)) < 1 / (1 + np.exp(-a * (theta[:, None] - b)))).astype(np.int8)
    y[rng.random((S, N)) < missing] = -1
    return y


def test_bucket_size_pads_by_at_most_an_eighth():
    sizes = np.arange(1, 5000)
    buckets = np.array([bucket_size(int(n)) for n in sizes])
    assert (buckets >= sizes).all() and (buckets >= 8).all()
    big = sizes > 8
    assert (buckets[big] <= np.ceil(sizes[big] * 1.125)).all()
    assert (np.diff(buckets) >= 0).all()  # monotone: similar sizes share a bucket
    assert len(set(buckets[(sizes >= 145) & (sizes <= 160)])) == 1
    assert [bucket_size(n) for n in (5, 161, 1000, 11_873)] == [8, 176, 1024, 12_288]
    coarse = np.array([bucket_size(int(n), 2) for n in sizes])  # the item sampler's grid
    assert (coarse >= buckets).all() and (coarse[big] <= np.ceil(sizes[big] * 1.5)).all()
    assert len(set(coarse[(sizes >= 33) & (sizes <= 48)])) == 1
    assert [bucket_size(n, 2) for n in (32, 40, 49, 65)] == [32, 48, 64, 96]


@pytest.mark.parametrize("per_doubling", [1, 2, 8])
def test_bucket_floor_is_the_largest_bucket_not_over(per_doubling):
    sizes = sorted({bucket_size(n, per_doubling) for n in range(1, 5000)})
    for n in range(1, 4000):
        assert bucket_floor(n, per_doubling) == max([b for b in sizes if b <= n] or [8])


def test_a_capped_grid_has_a_bucketed_size_within_the_cells():
    """A widened ability grid's most points (engine.infer.marginal.cells_cap): the cells
    bound over the cost a point, down to a bucketed size, never below the grid's own."""
    from engine.infer.marginal import cells_cap

    assert cells_cap(88, 88 * 650, 168_000) == 256  # 258 points' worth: 256, a bucket
    assert cells_cap(88, 88 * 650, 10_000) == 88  # over the bound already: no more points
    assert cells_cap(128, 1e6, 5e10) > 320  # far under the bound: no cap that binds
    for points, cells, bound in [(40, 40 * 7, 2000), (100, 100 * 3, 10**6), (24, 24 * 9, 900)]:
        cap = cells_cap(points, cells, bound)
        assert cap == bucket_size(cap, 2) or cap == points
        assert cap * cells // points <= bound or cap == points


@pytest.mark.parametrize("model,settings", [
    ("2pl", {}),
    ("gamma", {"max_passes": 60, "min_passes": 60}),  # Adam, the model's own optimizer
    ("3pl", {"max_passes": 40}),
])
def test_padding_does_not_change_the_fit(model, settings):
    y = _simulate(150, 37, seed=3, missing=0.1)  # pads to 160 x 40
    if model == "gamma":  # positive scores where the binary matrix has a response
        scores = np.random.default_rng(3).gamma(2.0, 0.5, y.shape).astype(np.float32)
        y = np.where(y >= 0, scores, np.nan).astype(np.float32)
    fits = [engine.fit(y, model=model, settings=engine.FitSettings(
        seed=0, bucket_shapes=b, **GAUSSIAN, **settings)) for b in (True, False)]
    padded, plain = fits
    assert padded.extra["bucket"] == [160, 40] and "bucket" not in plain.extra
    assert padded.num_passes == plain.num_passes
    assert padded.elbo == pytest.approx(plain.elbo, rel=1e-5)
    for name, value in plain.means().items():
        assert padded.means()[name].shape == value.shape
        np.testing.assert_allclose(padded.means()[name], value, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(padded.sds()[name], plain.sds()[name], rtol=1e-4, atol=1e-4)


def test_padding_keeps_a_frozen_refit():
    y = _simulate(150, 37, seed=5)  # pads to 160 x 40, the shapes of the 2PL fits above
    first = engine.fit(y, settings=engine.FitSettings(seed=0, **GAUSSIAN))
    frozen = frozenset({"difficulty", "discrimination"})
    refits = [engine.fit(y, init=first.guide, frozen=frozen, settings=engine.FitSettings(
        seed=1, bucket_shapes=b, min_passes=5, **GAUSSIAN)) for b in (True, False)]
    for name in ("ability", "difficulty"):
        np.testing.assert_allclose(refits[0].means()[name], refits[1].means()[name], atol=1e-4)
    np.testing.assert_array_equal(refits[0].means()["difficulty"], first.means()["difficulty"])


_CHILD = """
import json, sys
import numpy as np
import engine
y = np.load(sys.argv[1])
res = engine.fit(y, settings=engine.FitSettings(seed=0, ability_factor="gaussian"))
print(json.dumps({"compile": res.extra["compile"], "bucket": res.extra.get("bucket")}))
"""


def _fit_in_fresh_process(y: np.ndarray, tmp_path: Path, env: dict) -> dict:
    data = tmp_path / f"y{len(list(tmp_path.glob('y*.npy')))}.npy"
    np.save(data, y)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(data)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_similar_data_set_hits_the_cache_in_a_fresh_process(tmp_path):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_", "IRT_ENGINE_COMPILATION"))}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    first = _fit_in_fresh_process(_simulate(150, 37, seed=1), tmp_path, env)
    entries = sorted(p.name for p in cache.iterdir())
    # a different matrix of another (similar) shape: the same bucket, so the same programs
    second = _fit_in_fresh_process(_simulate(146, 39, seed=2, missing=0.05), tmp_path, env)
    assert first["bucket"] == second["bucket"] == [160, 40]
    assert first["compile"]["cache_misses"] > 0 and len(entries) > 0
    assert second["compile"]["cache_misses"] == 0
    assert second["compile"]["cache_hits"] > 0
    assert sorted(p.name for p in cache.iterdir()) == entries  # nothing new compiled
    # IRT_ENGINE_COMPILATION_CACHE=0: JAX is given no cache, so it neither reads nor writes one
    off = _fit_in_fresh_process(_simulate(150, 37, seed=3), tmp_path,
                                {**{k: v for k, v in env.items() if k != "JAX_COMPILATION_CACHE_DIR"},
                                 "IRT_ENGINE_COMPILATION_CACHE": "0",
                                 "HOME": str(tmp_path / "home")})
    assert off["compile"]["cache_hits"] == 0 and off["compile"]["cache"] is None
    assert not (tmp_path / "home").exists()


def test_leaderboard_imports_no_jax(tmp_path):
    from engine.run import save_run

    y = _simulate(40, 12, seed=4)
    run = save_run(engine.fit(y, settings=engine.FitSettings(seed=0, max_passes=20)),
                   tmp_path / "run")
    code = ("import sys; from engine.cli import main; rc = main(['leaderboard', sys.argv[1], '--top-k', '5']); "
            "bad = sorted(m for m in ('jax', 'jaxlib', 'scipy.stats', 'zarr', 'dask') "
            "if m in sys.modules); print('LOADED', bad); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(run.path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LOADED []" in out.stdout
    # the board is the one load_run's tables give (the path that imports the model)
    from engine.readout.leaderboard import format_leaderboard, leaderboard

    board = format_leaderboard(leaderboard(run.subjects, 5))
    assert out.stdout.replace("LOADED []", "").strip() == board.strip()


_QUADRATURE_CHILD = """
import json, sys
import numpy as np
import engine
y = np.load(sys.argv[1])
res = engine.fit(y, settings=engine.FitSettings(seed=0, ability_factor="quadrature"))
print(json.dumps({"compile": res.extra["compile"], "quadrature": res.extra["quadrature"]}))
"""


def test_a_similar_short_test_hits_the_cache_in_a_fresh_process(tmp_path):
    """The quadrature fit pads the distinct answer patterns to a bucketed count: another
    short test with as many items and a similar number of patterns compiles nothing."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_", "IRT_ENGINE_COMPILATION"))}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    runs = []
    for k, (S, seed) in enumerate([(390, 4), (410, 5)]):  # 152 and 149 patterns: 160
        np.save(tmp_path / f"q{k}.npy", _simulate(S, 8, seed=seed))
        out = subprocess.run([sys.executable, "-c", _QUADRATURE_CHILD, str(tmp_path / f"q{k}.npy")],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        if k == 0:
            entries = sorted(p.name for p in cache.iterdir())
    first, second = (r["quadrature"] for r in runs)
    assert first["num_patterns"] != second["num_patterns"]
    assert first["patterns_padded_to"] == second["patterns_padded_to"]
    assert runs[0]["compile"]["cache_misses"] > 0
    assert runs[1]["compile"]["cache_misses"] == 0 and runs[1]["compile"]["cache_hits"] > 0
    assert sorted(p.name for p in cache.iterdir()) == entries  # nothing new compiled


def test_second_fit_in_a_process_traces_nothing_and_gives_the_same_numbers():
    """A script's or notebook's next fit of the same shape and settings reuses the jitted
    block terms and update (no program traced or loaded), with the numbers a fit built
    afresh gives, to the bit."""
    from engine.infer.fit import _programs

    settings = engine.FitSettings(seed=0, ability_factor="gaussian", max_passes=30)
    # 150 x 37 (padded to 160 x 40): the shape of the 2PL fits above
    engine.fit(_simulate(150, 37, seed=5), model="2pl", settings=settings)
    y = _simulate(150, 37, seed=6)
    again = engine.fit(y, model="2pl", settings=settings)
    assert again.extra["compile"]["programs"] == 0 and again.extra["compile"]["trace_s"] == 0
    _programs.cache_clear()
    fresh = engine.fit(y, model="2pl", settings=settings)
    assert fresh.extra["compile"]["trace_s"] > 0
    for name in fresh.guide.loc:
        np.testing.assert_array_equal(again.guide.loc[name], fresh.guide.loc[name])
        np.testing.assert_array_equal(again.guide.log_scale[name], fresh.guide.log_scale[name])
    other = engine.fit(y, model="1pl", settings=settings)  # another model: its own programs
    assert other.extra["compile"]["trace_s"] > 0 and "discrimination" not in other.guide.loc


def _entry(folder: Path, name: str, size: int, used_s: float, stamp_s: float | None = None) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (used_s, used_s))
    if stamp_s is not None:
        path.with_name(name.removesuffix("-cache") + "-atime").write_bytes(
            int(stamp_s * 1e9).to_bytes(8, "little"))
    return path


def test_the_cache_folder_is_pruned_to_its_cap_least_recently_used_first(tmp_path, monkeypatch):
    from engine.compile_cache import prune_compilation_cache

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("IRT_ENGINE_COMPILATION_CACHE", raising=False)
    old = _entry(tmp_path, "jit_a-1-cache", 400, 1000.0)
    stamped = _entry(tmp_path, "jit_b-2-cache", 400, 1000.0, stamp_s=5000.0)  # used late (JAX's stamp)
    trace_old = _entry(tmp_path, "traces/fit-3.exported", 300, 2000.0)
    recent = _entry(tmp_path, "jit_c-4-cache", 400, 4000.0)
    other = _entry(tmp_path, "notes.txt", 10_000, 0.0)  # not an entry: never removed
    assert prune_compilation_cache(10_000) == 0 and old.exists()  # under the cap: nothing
    removed = prune_compilation_cache(1200)  # 1,516 bytes of entries, kept under 960
    assert not old.exists() and not trace_old.exists() and removed == 700
    assert stamped.exists() and stamped.with_name("jit_b-2-atime").exists() and recent.exists()
    assert other.exists()
    removed = prune_compilation_cache(500)
    assert not recent.exists() and not stamped.exists()
    assert not stamped.with_name("jit_b-2-atime").exists() and other.exists()
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "0")  # the cache off: never touched
    keep = _entry(tmp_path, "jit_d-5-cache", 400, 1.0)
    assert prune_compilation_cache(0) == 0 and keep.exists()


@pytest.mark.parametrize("text, expected", [("1G", 2 ** 30), ("512M", 512 * 2 ** 20), ("2gib", 2 ** 31),
                                            ("1000000", 10 ** 6), ("-1", None), ("0", 0)])
def test_the_cap_reads_sizes(monkeypatch, text, expected):
    from engine.compile_cache import compilation_cache_max_bytes

    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE", text)
    assert compilation_cache_max_bytes() == expected


@pytest.mark.parametrize("text", ["lots", "-5G", "1Q", "nan", "inf", ""])
def test_a_bad_cap_is_a_settings_error_naming_it(monkeypatch, text):
    from engine.compile_cache import compilation_cache_max_bytes, use_compilation_cache
    from engine.errors import SettingsError

    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE", text)
    with pytest.raises(SettingsError, match="IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE.*512M or 2G"):
        compilation_cache_max_bytes()
    monkeypatch.delenv("IRT_ENGINE_COMPILATION_CACHE", raising=False)
    with pytest.raises(SettingsError, match="IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE"):
        use_compilation_cache()


def test_a_fit_that_added_entries_prunes_the_folder(tmp_path, monkeypatch):
    """count_compiles prunes after the outermost block saw a cache miss, and only then."""
    import engine.compile_cache as cc

    calls = []
    monkeypatch.setattr(cc, "prune_compilation_cache", lambda: calls.append(1) or 0)
    with cc.count_compiles():
        with cc.count_compiles():
            cc._on_event("/jax/compilation_cache/cache_misses")
        assert calls == []  # the inner block ends inside the outer one
    assert calls == [1]
    with cc.count_compiles():
        cc._on_event("/jax/compilation_cache/cache_hits")
    assert calls == [1]


def test_a_bad_cap_is_one_line_from_any_command(tmp_path, monkeypatch, capsys):
    """The cap is read as every command starts: a bad value is the command's error (exit 2),
    not a traceback."""
    from engine.cli import main

    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE", "1.5X")
    monkeypatch.delenv("IRT_ENGINE_COMPILATION_CACHE", raising=False)
    assert main(["leaderboard", str(tmp_path / "no-run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irt-engine leaderboard: error: IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE='1.5X'")
