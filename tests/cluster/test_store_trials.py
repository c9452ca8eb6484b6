"""Trials over a matrix larger than the memory budget read the items they sample from the store
(a local path or an s3:// URL) instead of receiving the whole matrix."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

import cluster.stability as stability_module
from cluster.bootstrap import run_bootstrap
from cluster.columns import StoreColumns, columns, trial_responses
from cluster.settings import BootstrapSettings, RunnerSettings, StabilitySettings
from cluster.stability import run_stability
from engine.data.store import Store, write_store
from engine.errors import DataFormatError
from engine.infer.settings import FitSettings
from tests.cluster.conftest import simulate_2pl

INPROCESS = RunnerSettings(backend="inprocess", progress=False)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    y = simulate_2pl(16, 40, seed=11)
    y[3, 5] = y[7, 30] = -1  # missing cells travel as -1
    path = tmp_path_factory.mktemp("trials") / "store.zarr"
    write_store(y, [f"s{i}" for i in range(16)], [f"i{j}" for j in range(40)], path, chunks=(4, 8))
    return y, path


def test_columns_read_from_the_store_equal_the_matrix(matrix):
    y, path = matrix
    ref, info = trial_responses(path, memory_budget=64)  # 640 cells x 3 copies > 64 bytes
    assert isinstance(ref, StoreColumns) and ref.shape == y.shape
    assert info["trial_data"] == "read from the store per trial"
    rng = np.random.default_rng(0)
    for cols in (rng.permutation(40)[:9], rng.integers(0, 40, 40), np.array([39, 0, 0, 17])):
        np.testing.assert_array_equal(columns(ref, cols), y[:, cols])
    held, _ = trial_responses(path, memory_budget=1 << 30)
    np.testing.assert_array_equal(held, y)  # under the budget: the matrix itself
    stale = StoreColumns(str(path), y.shape, "0" * 64)
    with pytest.raises(DataFormatError, match="the store changed since the analysis started"):
        stale.columns([1])


def _spy_context(monkeypatch, module):
    seen = {}
    real = module.run_trials

    def spy(fn, context, *args, **kw):
        seen["context"] = context
        return real(fn, context, *args, **kw)

    monkeypatch.setattr(module, "run_trials", spy)
    return seen


def test_stability_over_the_budget_never_loads_the_matrix(matrix, tmp_path, monkeypatch):
    y, path = matrix
    settings = StabilitySettings(sizes=(8,), trials_per_size=3, passes=8, seed=2)
    fit_small = FitSettings(seed=2, memory_budget=64, max_block_cells=320)
    seen = _spy_context(monkeypatch, stability_module)
    with monkeypatch.context() as m:
        m.setattr(Store, "load", lambda self: pytest.fail("the whole matrix was loaded"))
        out = run_stability(path, tmp_path / "small", settings, INPROCESS, fit_small)
    ctx = seen["context"]
    assert isinstance(ctx.fit.y, StoreColumns)
    assert len(pickle.dumps(ctx)) < 8000  # what a Ray task receives: no matrix in it
    # the full-data accuracies came from the store's statistics, not a loaded matrix
    observed = y >= 0
    np.testing.assert_allclose(ctx.full_accuracy,
                               np.where(observed, y, 0).sum(1) / observed.sum(1), rtol=1e-12)
    assert len(out.trials) == 6 and set(out.trials["method"]) == {"irt", "accuracy"}
    # the trials' samples are the in-memory run's: accuracy rankings agree exactly
    full = run_stability(path, tmp_path / "big", settings, INPROCESS,
                         FitSettings(seed=2, memory_budget=1 << 30, max_block_cells=320))
    acc = lambda df: df[df["method"] == "accuracy"].reset_index(drop=True)
    pd.testing.assert_frame_equal(acc(out.trials), acc(full.trials))
    irt = lambda df: df[df["method"] == "irt"]["tau_between"].to_numpy()
    np.testing.assert_allclose(irt(out.trials), irt(full.trials), atol=0.15)


def test_bootstrap_over_the_budget_reads_its_replicates_from_the_store(matrix, tmp_path,
                                                                         monkeypatch):
    import cluster.bootstrap as bootstrap_module

    _, path = matrix
    seen = _spy_context(monkeypatch, bootstrap_module)
    settings = BootstrapSettings(replicates=3, passes=6, seed=1)
    out = run_bootstrap(path, tmp_path / "boot", settings, INPROCESS,
                        FitSettings(seed=1, memory_budget=64, max_block_cells=320))
    assert isinstance(seen["context"].y, StoreColumns)
    assert sorted(out.replicates["replicate"].unique()) == [0, 1, 2]
    assert len(out.replicates) == 3 * 16


def test_dimensions_over_the_budget_refuses_before_reading(matrix, tmp_path, monkeypatch):
    """Parallel analysis cannot stream: over the budget it says so before any response is read."""
    from cluster.dimensions import DIMENSIONS_CELL_BYTES, run_dimensions
    from cluster.settings import DimensionsSettings
    from engine.errors import SettingsError

    y, path = matrix
    monkeypatch.setattr(Store, "load", lambda self: pytest.fail("read the responses"))
    need = y.size * DIMENSIONS_CELL_BYTES
    with pytest.raises(SettingsError, match="raise --memory-budget") as err:
        run_dimensions(path, tmp_path / "d", DimensionsSettings(shuffles=2), INPROCESS,
                       FitSettings(seed=0, memory_budget=need - 1))
    assert str(path) in str(err.value) and "16 x 40" in str(err.value)
    assert not (tmp_path / "d").exists()


def test_dimensions_refuses_a_model_without_p_correct_before_any_work(tmp_path):
    """``dimensions --model gamma`` on error data ran every shuffle and then failed in the
    residual step, leaving shuffles.parquet and trials.json. It is refused first, naming
    the models that work, with nothing written."""
    from cluster.dimensions import run_dimensions
    from cluster.settings import DimensionsSettings
    from engine.errors import ModelError

    rng = np.random.default_rng(0)
    errors = rng.gamma(2.0, 1.0, size=(20, 12)).astype(np.float32)
    with pytest.raises(ModelError, match=r"'gamma' is nonnegative; residual eigenvalues need a "
                                         r"one-skill binary model's P\(correct\) \(--model 1pl"):
        run_dimensions(errors, tmp_path / "g", DimensionsSettings(model="gamma", shuffles=2),
                       INPROCESS, FitSettings(seed=0))
    assert not (tmp_path / "g").exists()
