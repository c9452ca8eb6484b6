"""The grid update of new subjects' abilities against a direct numerical integration."""

import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy import stats

from engine.api import fit
from engine.errors import ModelError
from engine.infer.conditional import (GridSettings, conditional_abilities, conditional_applies,
                                      sigma_points)
from engine.infer.settings import FitSettings
from engine.models import get_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "readout"))
from _item_runs import simulate_2pl  # noqa: E402


def _reference(guide, y_row, grid=np.linspace(-7, 7, 1401), nodes=12):
    """q*(theta) on a fine grid: each item's expectation by a 12 x 12 Gauss-Hermite rule over
    its factor (difficulty, log-discrimination), the 2PL cell likelihood from
    scipy.stats.bernoulli, the N(0, 1) prior from scipy.stats.norm."""
    x, w = hermegauss(nodes)
    w = w / w.sum()
    u_b, u_a = (a.ravel() for a in np.meshgrid(x, x))
    weight = np.outer(w, w).ravel()
    logpost = stats.norm.logpdf(grid)
    for j in np.flatnonzero(y_row >= 0):
        b = guide.loc["difficulty"][j] + np.exp(guide.log_scale["difficulty"][j]) * u_b
        a = np.exp(guide.loc["discrimination"][j] + np.exp(guide.log_scale["discrimination"][j]) * u_a)
        p = 1 / (1 + np.exp(-a[:, None] * (grid[None, :] - b[:, None])))
        logpost += weight @ stats.bernoulli.logpmf(y_row[j], np.clip(p, 1e-15, 1 - 1e-15))
    dens = np.exp(logpost - logpost.max())
    mean = (dens * grid).sum() / dens.sum()
    return mean, np.sqrt((dens * (grid - mean) ** 2).sum() / dens.sum())


def test_sigma_points_match_normal_moments():
    for d in (1, 2, 3, 5):
        u, w = sigma_points(d)
        assert w.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(w @ u, 0.0, atol=1e-12)
        np.testing.assert_allclose((u * w[:, None]).T @ u, np.eye(d), atol=1e-12)


def test_grid_update_matches_direct_integration():
    y, _, _ = simulate_2pl(80, 40, seed=3)
    res = fit(y[:70], "2pl", settings=FitSettings(seed=0))
    guide = res.guide
    assert guide.loc["discrimination"].std() > 0
    new = y[70:74].copy()
    new[0, 5:] = -1  # five responses only: a broad, skewed posterior
    new[1, :] = 1  # all correct: the grid must widen past the fitted abilities
    out, info = conditional_abilities(res.spec, guide, new)
    for s in range(new.shape[0]):
        mean, sd = _reference(guide, new[s])
        got_mean, got_sd = out.loc["ability"][s], np.exp(out.log_scale["ability"][s])
        # sigma points vs Gauss-Hermite expectations: agreement to a few percent of the sd
        print(s, "mean gap", (got_mean - mean) / sd, "sd ratio", got_sd / sd)
        assert abs(got_mean - mean) < 0.03 * sd, (s, got_mean, mean, sd)
        assert got_sd == pytest.approx(sd, rel=0.03), (s, got_sd, sd)
    assert np.isfinite(info["log_normalizer"]).all()


def test_a_narrow_posterior_is_resolved_between_grid_points():
    """Thousands of responses: the posterior sd is far below the grid spacing."""
    y, truth, _ = simulate_2pl(60, 3000, seed=5)
    res = fit(y[:50], "2pl", settings=FitSettings(seed=0))
    coarse, _ = conditional_abilities(res.spec, res.guide, y[50:], settings=GridSettings(grid_size=32))
    fine, info = conditional_abilities(res.spec, res.guide, y[50:], settings=GridSettings(grid_size=400))
    spacing = (info["grid"][1] - info["grid"][0]) / 31
    sd = np.exp(fine.log_scale["ability"])
    assert sd.max() < spacing / 3
    np.testing.assert_allclose(coarse.loc["ability"], fine.loc["ability"], atol=0.05 * sd.min())
    np.testing.assert_allclose(np.exp(coarse.log_scale["ability"]), sd, rtol=0.02)


def test_only_scalar_binary_abilities_use_the_grid():
    assert conditional_applies(get_model("2pl")) and conditional_applies(get_model("3pl"))
    assert not conditional_applies(get_model("mirt-comp", dims=2))
    assert not conditional_applies(get_model("beta"))
    with pytest.raises(ModelError, match="frozen fit"):
        conditional_abilities(get_model("beta"), None, np.zeros((1, 2), np.int8))
