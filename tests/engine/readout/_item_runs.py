"""Simulated runs shared by the item read-out tests (small matrices)."""

from pathlib import Path

import numpy as np
import pytest

from engine.api import fit
from engine.data import write_store
from engine.infer.settings import FitSettings
from engine.run import save_run

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[3].parent / "shared" / "data"


def simulate_2pl(num_subjects, num_items, *, seed, log_a_sd=0.3, b_sd=1.0):
    """Responses from theta ~ N(0, 1), b ~ N(0, b_sd^2), log a ~ N(0, log_a_sd^2)."""
    rng = np.random.default_rng(seed)
    truth = {"ability": rng.normal(size=num_subjects), "difficulty": rng.normal(0, b_sd, num_items),
             "discrimination": np.exp(log_a_sd * rng.normal(size=num_items))}
    p = 1 / (1 + np.exp(-truth["discrimination"] * (truth["ability"][:, None] - truth["difficulty"])))
    y = (rng.random(p.shape) < p).astype(np.int8)
    return y, truth, p


def fit_run(tmp_path, y, model="2pl", name="run", settings=FitSettings(seed=0), **options):
    """Write ``y`` to a store, fit, save a run directory; returns the Run."""
    store = write_store(y, [f"s{i}" for i in range(y.shape[0])], [f"i{j}" for j in range(y.shape[1])],
                        tmp_path / f"{name}.zarr")
    res = fit(store.path, model=model, settings=settings, **options)
    return save_run(res, tmp_path / name, num_draws=400)


# the mean-field fit, for tests of read-outs that take any run: on 60 x 400 it takes 2.3 s
# where the default fit (quadrature, its items sampled) takes 24 s, and in the suite beside
# another worker 60 s
MEAN_FIELD = FitSettings(seed=0, ability_factor="gaussian")
