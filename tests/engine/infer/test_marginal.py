"""The marginal (quadrature) fit against direct numerical integration with scipy."""

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from engine.api import fit
from engine.errors import SettingsError
from engine.infer.marginal import (MarginalSettings, _Quadrature, choose_ability_factor,
                                   distinct_rows, fit_marginal, pool_identical_rows,
                                   proposal_spread)
from engine.infer.settings import FitSettings
from engine.models import get_model
from engine.readout.posterior import within_owner_scales
from engine.run import save_run

from _skewed import skewed_case


def _simulate(S, N, seed, log_a_sd=0.3):
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=S), rng.normal(size=N)
    a = np.exp(log_a_sd * rng.normal(size=N))
    p = 1 / (1 + np.exp(-a * (theta[:, None] - b)))
    return (rng.random((S, N)) < p).astype(np.int8), theta, b, a


def _row_loglik(theta, row, b, a):
    """log p(row | theta) for a 2PL, cell by cell with scipy.stats.bernoulli."""
    p = 1 / (1 + np.exp(-a * (theta - b)))
    seen = row >= 0
    return stats.bernoulli.logpmf(row[seen], p[seen]).sum()


def _scipy_posterior(row, b, a, moments=True):
    """(log marginal likelihood, posterior mean, sd) of one row by adaptive scipy quadrature."""
    grid = np.linspace(-8, 8, 801)
    seen = row >= 0
    p = 1 / (1 + np.exp(-a[seen] * (grid[:, None] - b[seen])))
    lp = stats.bernoulli.logpmf(row[seen], p).sum(1) + stats.norm.logpdf(grid)
    peak, mode = lp.max(), grid[np.argmax(lp)]
    f = lambda t, k: t ** k * np.exp(_row_loglik(t, row, b, a) + stats.norm.logpdf(t) - peak)
    pts = [mode - 0.5, mode, mode + 0.5]
    z = integrate.quad(f, -10, 10, args=(0,), points=pts, limit=200, epsabs=0)[0]
    if not moments:
        return peak + np.log(z), None, None
    m = integrate.quad(f, -10, 10, args=(1,), points=pts, limit=200, epsabs=0)[0] / z
    m2 = integrate.quad(f, -10, 10, args=(2,), points=pts, limit=200, epsabs=0)[0] / z
    return peak + np.log(z), m, np.sqrt(m2 - m * m)


def _scipy_case(num_subjects, num_items, seed):
    """A simulated 2PL with three missing cells in its first row: its items ``x``, ``b``,
    ``a``, distinct patterns with counts, and their float32 responses and mask."""
    y, _, b, a = _simulate(num_subjects, num_items, seed=seed)
    y[0, :3] = -1  # missing cells are left out
    patterns, _, counts = distinct_rows(y)
    mask, yy = (patterns >= 0).astype(np.float32), np.maximum(patterns, 0).astype(np.float32)
    return np.stack([b, np.log(a)], -1), b, a, patterns, counts, yy, mask


def _adapted(spec, x, yy, mask, num_patterns, rounds=4):
    """21 adaptive nodes a pattern, recentred ``rounds`` times at items ``x``."""
    quad = _Quadrature(21, num_patterns)
    for _ in range(rounds):
        theta, w, _ = quad.posterior(spec, x, yy, mask)
        quad.adapt(theta, w)
    return quad


@pytest.mark.parametrize("num_items", [6, 400])
def test_adaptive_quadrature_matches_scipy(num_items):
    """Log marginal likelihood, mean and sd of each pattern's ability posterior, with a few
    items (broad) and with hundreds (sd ~0.1), against scipy.integrate.quad."""
    spec = get_model("2pl")
    x, b, a, patterns, _, yy, mask = _scipy_case(5, num_items, num_items)
    quad = _adapted(spec, x, yy, mask, len(patterns))
    theta, w, log_marg = quad.posterior(spec, x, yy, mask)
    mean = (w * theta).sum(1)
    sd = np.sqrt((w * (theta - mean[:, None]) ** 2).sum(1))
    for u, row in enumerate(patterns):
        ref_z, ref_m, ref_sd = _scipy_posterior(row, b, a)
        assert log_marg[u] == pytest.approx(ref_z, abs=2e-3 + 1e-5 * abs(ref_z))
        assert mean[u] == pytest.approx(ref_m, abs=2e-3 * ref_sd + 1e-5)
        assert sd[u] == pytest.approx(ref_sd, rel=3e-3)


def _scipy_log_post(vec, patterns, counts):
    """The 2PL's marginal log posterior (vague priors) by scipy integration, per pattern."""
    b, log_a = vec[0::2], vec[1::2]
    lp = sum(c * _scipy_posterior(row, b, np.exp(log_a), False)[0] for row, c in zip(patterns, counts))
    return lp + stats.norm.logpdf(b, 0, np.sqrt(1e3)).sum() + stats.norm.logpdf(log_a).sum()


def test_marginal_mode_and_covariance_match_scipy():
    """At the fitted items the scipy-integrated marginal log posterior is flat, and its
    finite-difference curvature inverts to the fit's item covariance (Louis)."""
    spec = get_model("2pl", prior="vague")
    y, _, _, _ = _simulate(300, 3, seed=3, log_a_sd=0.2)
    laplace = MarginalSettings(importance_max_params=0, sampler_chains=0)  # the mode
    guide, cross, info = fit_marginal(spec, y, laplace)
    assert info["converged"] and info["joint_item_covariance"]
    assert info["item_moments"]["method"] == "laplace"
    patterns, _, counts = distinct_rows(y)
    x0 = np.stack([guide.loc["difficulty"], guide.loc["discrimination"]], -1).reshape(-1)
    x0 = x0.astype(np.float64)
    h, P = 1e-3, x0.size
    f = lambda v: _scipy_log_post(v, patterns, counts)
    grad = np.array([(f(x0 + h * e) - f(x0 - h * e)) / (2 * h) for e in np.eye(P)])
    assert np.abs(grad).max() < 0.05  # vs ~10-100 per unit a step of 0.1 away
    hess = np.empty((P, P))
    for i, ei in enumerate(np.eye(P)):
        for j, ej in enumerate(np.eye(P)[:i + 1]):
            hess[i, j] = hess[j, i] = (f(x0 + h * ei + h * ej) - f(x0 + h * ei - h * ej)
                          - f(x0 - h * ei + h * ej) + f(x0 - h * ei - h * ej)) / (4 * h * h)
    cov = np.linalg.inv(-hess)
    for n in range(3):
        np.testing.assert_allclose(info["item_covariance"][n], cov[2 * n:2 * n + 2, 2 * n:2 * n + 2],
                                   rtol=0.03, atol=1e-4)
    # the read-outs' within-item marginal sds are this covariance's diagonal
    sds = within_owner_scales(spec, guide, "item", cross)
    np.testing.assert_allclose(sds["difficulty"], np.sqrt(np.diag(cov)[0::2]), rtol=0.03)
    np.testing.assert_allclose(sds["discrimination"], np.sqrt(np.diag(cov)[1::2]), rtol=0.03)


@pytest.mark.parametrize("rounds", [1, 3])
def test_item_posterior_means_match_scipy_on_a_skewed_posterior(rounds):
    """30 subjects, an easy item: its marginal posterior is skewed, so its mode sits a quarter
    of an sd from its mean. The fit reports the posterior mean and sd (importance sampling
    from the Laplace approximation; with ``rounds=3`` two more rounds from the previous
    round's weighted moments, forced here by a refit threshold every sd passes), checked against a
    2-D grid of scipy-integrated marginal posteriors of the two 1PL difficulties."""
    y, mean, sd, ends = skewed_case()
    settings = MarginalSettings(importance_refit_sd=1.0 if rounds == 3 else 1.15)
    guide, _, info = fit_marginal(get_model("1pl", prior="vague"), y, settings)
    assert info["item_moments"]["method"] == "importance"
    assert [r["kept"] for r in info["item_moments"]["rounds"]] == [True] * rounds
    assert info["item_moments"]["rounds"][-1]["effective_draws"] > 1000
    mode = info["item_mode"][:, 0]
    assert abs(mode[0] - mean[0]) > 0.15 * sd[0]  # the mode is off the mean here
    np.testing.assert_array_less(np.abs(guide.loc["difficulty"] - mean), 0.08 * sd)
    np.testing.assert_allclose(np.exp(guide.log_scale["difficulty"]), sd, rtol=0.06)
    # the 90% interval: the weighted draws' quantiles, skewed as scipy's are, within Monte
    # Carlo error (a 5% quantile's is about 2.1 / sqrt(ESS) sd, more in a weighted tail);
    # the Gaussian's ends sit 0.14-0.18 sd from scipy's on the easy item, and further in all
    assert info["item_moments"]["intervals"] == "weighted draws' quantiles"
    got = info["item_quantiles"][:, :, 0]
    np.testing.assert_array_less(np.abs(got - ends), np.broadcast_to(0.15 * sd, ends.shape))
    gaussian = mean + np.array([[-1.6449], [1.6449]]) * sd
    assert np.abs(gaussian - ends)[:, 0].max() > 0.12 * sd[0]
    assert (np.abs(got - ends) / sd).sum() < (np.abs(gaussian - ends) / sd).sum()


def test_importance_intervals_reach_items_parquet(tmp_path):
    """A fit whose items are importance sampled reports the weighted draws' 5% and 95%
    quantiles as the items' 90% intervals, in items.parquet (mapped through each block's
    transform) and says so in fit.json."""
    y, *_ = _simulate(300, 6, seed=21)
    res = fit(y, model="2pl", settings=FitSettings(seed=0, ability_factor="auto"))
    moments = res.extra["quadrature"]["item_moments"]
    assert moments["method"] == "importance"
    assert moments["intervals"] == "weighted draws' quantiles"
    run = save_run(res, tmp_path / "run", num_draws=200)
    info = json.loads((run.path / "fit.json").read_text())
    assert info["readout"]["item_intervals"].endswith("the weighted draws' 5% and 95% quantiles")
    items = run.items
    np.testing.assert_allclose(items["difficulty_q05"], res.intervals["difficulty"][0], rtol=1e-5)
    np.testing.assert_allclose(items["difficulty_q95"], res.intervals["difficulty"][1], rtol=1e-5)
    np.testing.assert_allclose(items["discrimination_q05"],
                               np.exp(res.intervals["discrimination"][0]), rtol=1e-5)
    gaussian = items["difficulty_mean"] - 1.6449 * items["difficulty_sd"]
    assert np.abs(items["difficulty_q05"] - gaussian).max() > 1e-3  # not the Gaussian's ends
    assert (items["difficulty_q05"] < items["difficulty_mean"]).all()
    assert (items["difficulty_mean"] < items["difficulty_q95"]).all()
    for end, sign in (("q05", -1), ("q95", 1)):  # each item's own ends (skewed by up to a
        near = items["difficulty_mean"] + sign * 1.6449 * items["difficulty_sd"]  # third of
        assert (np.abs(items[f"difficulty_{end}"] - near) < 0.5 * items["difficulty_sd"]).all()


def test_weighted_quantiles_are_the_repeated_draws_quantiles():
    """Integer weights are repeated draws: the weighted quantiles equal NumPy's inverted-CDF
    quantiles of the draws repeated that many times, column by column."""
    from engine.infer.marginal import _weighted_quantiles

    rng = np.random.default_rng(4)
    xs = rng.standard_gamma(2.0, size=(301, 3))
    times = rng.integers(0, 5, size=301)
    times[0] = 1
    got = _weighted_quantiles(times / times.sum(), xs, (0.05, 0.5, 0.95))
    want = np.quantile(np.repeat(xs, times, axis=0), [0.05, 0.5, 0.95], axis=0,
                       method="inverted_cdf")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("d", [10, 32, 150])
def test_proposal_spread_keeps_a_quarter_of_the_draws_on_a_gaussian_target(d):
    """The spread rule against a Monte Carlo effective sample size: target N(0, I_d),
    proposal N(0, s^2 I_d). At the cap (d = 10) more than a quarter counts; narrowed, a
    quarter."""
    s = proposal_spread(d, 1.3)
    z = np.random.default_rng(d).standard_normal((400_000, d)) * s
    logw = stats.norm.logpdf(z).sum(1) - stats.norm.logpdf(z, scale=s).sum(1)
    w = np.exp(logw - logw.max())
    ess = w.sum() ** 2 / (w ** 2).sum() / len(w)
    if s == 1.3:
        assert d == 10 and ess > 0.3
    else:
        assert 1.0 < s < 1.3 and ess == pytest.approx(0.25, rel=0.1)


@pytest.mark.parametrize("at_the_bounds", [False, True])
def test_padded_patterns_change_nothing(at_the_bounds):
    """Patterns padded to a bucketed count (unanswered, counted zero times) give the same
    fit as the distinct patterns alone, also where the data's patterns sit exactly at the
    joint covariance's and the importance draws' cell bounds (the bounds count the data's
    patterns, not the padding)."""
    y = _simulate(300, 9, 5)[0]
    U = distinct_rows(y)[0].shape[0]
    bounds = dict(score_cells_max=U * 21 * 9 * 2, importance_cells_max=U * 11 * 9 * 1000) \
        if at_the_bounds else {}
    runs = [fit_marginal(get_model("2pl"), y, MarginalSettings(bucket_patterns=b, **bounds))
            for b in (True, False)]
    (padded, _, info), (plain, _, plain_info) = runs
    assert info["patterns_padded_to"] > info["num_patterns"] == plain_info["patterns_padded_to"]
    assert info["joint_item_covariance"] and plain_info["joint_item_covariance"]
    assert info["item_moments"]["method"] == plain_info["item_moments"]["method"] == "importance"
    assert info["item_moments"]["draws"] == plain_info["item_moments"]["draws"]
    for name in padded.loc:
        np.testing.assert_allclose(padded.loc[name], plain.loc[name], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(padded.log_scale[name], plain.log_scale[name], atol=1e-4)


def test_memory_budget_sets_chunks_not_results():
    """A small ``memory_budget`` splits the scores and log-likelihoods into small chunks
    (recorded in fit.json's quadrature record) and changes no value; one too small for the
    items' joint covariance turns it off, and the record says so."""
    y = _simulate(400, 8, 3)[0]
    free = fit(y, model="2pl", settings=FitSettings(ability_factor="quadrature"))
    tight = fit(y, model="2pl", settings=FitSettings(ability_factor="quadrature",
                                                     memory_budget=500_000))
    memory = tight.extra["quadrature"]["memory"]
    assert memory["score_chunk"] == memory["cell_chunk"] == 500_000 // 48 < free.extra["quadrature"]["memory"]["score_chunk"]
    assert tight.extra["quadrature"]["joint_item_covariance"]  # 16 values: 8 KB of covariance
    for name in free.guide.loc:
        np.testing.assert_allclose(tight.guide.loc[name], free.guide.loc[name], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(tight.guide.log_scale[name], free.guide.log_scale[name], atol=1e-4)
    tiny = fit(y, model="2pl", settings=FitSettings(ability_factor="quadrature", memory_budget=4000))
    assert tiny.extra["quadrature"]["memory"]["full_cov_max"] == 11 < 16
    assert not tiny.extra["quadrature"]["joint_item_covariance"]


def test_symmetric_pseudo_inverse_is_numpys():
    """The eigendecomposition's pseudo-inverse (the joint information's where it is not
    positive definite) is ``np.linalg.pinv``'s on symmetric matrices that are singular and
    indefinite, one and batched."""
    from engine.infer.marginal import _symmetric_pinv

    rng = np.random.default_rng(3)
    b = rng.standard_normal((4, 30, 30))
    w, v = np.linalg.eigh(b + np.swapaxes(b, 1, 2))
    w[:, :3] = 0.0  # singular
    a = (v * w[:, None, :]) @ np.swapaxes(v, 1, 2)
    assert (np.linalg.eigvalsh(a).min(axis=1) < -1e-3).all()  # indefinite
    np.testing.assert_allclose(_symmetric_pinv(a), np.linalg.pinv(a), atol=1e-10)
    np.testing.assert_allclose(_symmetric_pinv(a[0]), np.linalg.pinv(a[0]), atol=1e-10)
    # the cutoff drops the zero eigenvalues: rank 27, and a A+ A = A
    assert np.linalg.matrix_rank(_symmetric_pinv(a[1])) == 27
    np.testing.assert_allclose(a[1] @ _symmetric_pinv(a[1]) @ a[1], a[1], atol=1e-10)


def test_marginal_recovers_simulated_2pl():
    """Seeded recovery at a short-test shape: estimates near the truth, intervals that cover."""
    y, theta, b, a = _simulate(1500, 10, seed=7)
    spec = get_model("2pl")
    guide, cross, info = fit_marginal(spec, y)
    sds = within_owner_scales(spec, guide, "item", cross)
    assert np.abs(guide.loc["difficulty"] - b).max() < 4 * sds["difficulty"].max()
    z_b = (guide.loc["difficulty"] - b) / sds["difficulty"]
    z_a = (guide.loc["discrimination"] - np.log(a)) / sds["discrimination"]
    assert np.mean(np.abs(np.concatenate([z_b, z_a])) < 1.645) >= 0.7
    z_t = (guide.loc["ability"] - theta) / np.exp(guide.log_scale["ability"])
    assert 0.86 <= np.mean(np.abs(z_t) < 1.645) <= 0.94
    assert np.corrcoef(guide.loc["ability"], theta)[0, 1] > 0.7  # ten items: reliability ~0.6


@pytest.mark.parametrize("model,prior", [("1pl", "vague"), ("2pl", "vague"), ("3pl", "vague"),
                                         ("2pl", "population"), ("4pl", "population"),
                                         ("feas", "population")])
def test_identical_patterns_identical_readouts(tmp_path, model, prior):
    """Subjects with the same answer sheet get the same ability, interval, rank statistics
    and tie group, to the bit; the 4PL under its default priors through the item sampler."""
    from engine.readout.leaderboard import leaderboard

    y, *_ = _simulate(120, 6, seed=11)
    y[40:60] = y[5]  # twenty-one copies of one sheet
    y[61, 2] = -1
    y[62] = y[61]  # and two with a missing cell
    res = fit(y, model=model, prior=prior, settings=FitSettings(seed=0, ability_factor="auto"))
    assert res.extra["ability_factor"]["method"] == "quadrature"
    if model == "4pl":
        assert res.extra["quadrature"]["item_moments"]["method"] == "sampled"
    run = save_run(res, tmp_path / "run", num_draws=300)
    subjects = run.subjects.drop(columns=["subject"])
    for group in ([5] + list(range(40, 60)), [61, 62]):
        rows = subjects.iloc[group]
        same = rows.nunique(dropna=False)
        assert (same == 1).all(), same[same > 1]
    board = leaderboard(run.subjects, None)
    tie = board.set_index("subject")["tie_group"]
    assert tie.loc[[str(s) for s in [5] + list(range(40, 60))]].nunique() == 1
    # twins are drawn apart and rank among each other: one subject is first in each draw
    assert run.subjects["p_top1"].sum() == pytest.approx(1.0)
    assert run.subjects["p_top3"].sum() == pytest.approx(3.0)
    assert run.subjects["rank_mean"].sum() == pytest.approx(120 * 121 / 2)
    p = run.pairwise()
    assert p[5, 40] == p[40, 5] == 0.5 and p[61, 62] == 0.5 and p[5, 5] == 0
    np.testing.assert_array_equal(p[5, :5], p[41, :5])  # twins: the same row elsewhere


def test_mean_field_fits_pool_identical_patterns(tmp_path):
    """The gaussian (mean-field) fit shares the factor of identical sheets too."""
    y, *_ = _simulate(40, 8, seed=12)
    y[10:15] = y[3]
    res = fit(y, model="2pl", settings=FitSettings(seed=0, ability_factor="gaussian"))
    assert res.extra["ability_factor"]["method"] == "gaussian"
    run = save_run(res, tmp_path / "run", num_draws=200)
    rows = run.subjects.drop(columns=["subject"]).iloc[[3, 10, 11, 12, 13, 14]]
    assert (rows.nunique() == 1).all()
    assert run.subjects["p_top1"].sum() == pytest.approx(1.0)
    alone = pool_identical_rows(res.spec, res.guide, np.arange(40 * 8).reshape(40, 8))
    assert alone is res.guide  # nothing shared: the factors are kept


def test_switch_reads_items_per_subject(tmp_path):
    """auto: quadrature up to the bound on responses per subject, mean-field above it; the
    choice and the count it was read from are in fit.json."""
    y, *_ = _simulate(30, 12, seed=13)
    below = fit(y, model="1pl", settings=FitSettings(seed=0, ability_factor="auto",
                                                         quadrature_max_items=12))
    above = fit(y, model="1pl", settings=FitSettings(seed=0, ability_factor="auto",
                                                         quadrature_max_items=11))
    assert below.extra["ability_factor"]["method"] == "quadrature"
    assert above.extra["ability_factor"]["method"] == "gaussian"
    info = json.loads((save_run(below, tmp_path / "q").path / "fit.json").read_text())
    assert info["ability_factor"] == {"requested": "auto", "max_items_per_subject": 12,
                                      "items_per_subject": 12.0, "method": "quadrature",
                                      "max_observed_cells": 500_000, "observed_cells": 360}
    assert info["quadrature"]["num_patterns"] == len(distinct_rows(y)[0])
    assert info["quadrature"]["item_moments"]["method"] == "importance"
    assert info["readout"]["item_intervals"].startswith("marginal posterior (importance")
    info = json.loads((save_run(above, tmp_path / "g").path / "fit.json").read_text())
    assert info["ability_factor"]["method"] == "gaussian"


def test_quadrature_refused_where_it_does_not_apply():
    spec = get_model("2pl", prior="hierarchical")
    with pytest.raises(SettingsError, match="hierarchical|vague priors"):
        choose_ability_factor(spec, np.zeros((3, 2), np.int8), "quadrature", 1000)
    with pytest.raises(SettingsError, match="ability_factor"):
        FitSettings(ability_factor="grid")
    # auto falls back to the mean-field fit, and says so
    assert choose_ability_factor(spec, np.zeros((3, 2), np.int8), "auto", 1000)["method"] == \
        "gaussian"


def test_hyper_parameter_step_matches_scipy():
    """The EM step on a pooled block's N(mu, 1/u) (mu ~ N(0, 3^2), u ~ Gamma(1, 1)) reaches
    the maximum of the items' expected log prior plus the hyper-prior, found by scipy."""
    from scipy import optimize

    from engine.infer.marginal import _update_globals

    spec = get_model("1pl", prior="population")
    assert [p.name for p in spec.by_owner("global")] == ["mu_difficulty", "u_difficulty"]
    rng = np.random.default_rng(3)
    x = rng.normal(0.4, 1.3, size=(40, 1))
    v = rng.uniform(0.05, 0.4, size=(40, 1))

    def minus_q(g):  # in (mu, log u): scipy.stats densities, the log u Jacobian added
        mu, u = g[0], np.exp(g[1])
        return -(stats.norm.logpdf(x[:, 0], mu, u ** -0.5).sum() - 0.5 * u * v.sum()
                 + stats.norm.logpdf(mu, 0, 3.0) + stats.gamma.logpdf(u, 1.0) + g[1])

    ref = optimize.minimize(minus_q, np.zeros(2), method="BFGS", options={"gtol": 1e-8}).x
    got = _update_globals(spec, x, v, np.zeros(2), max_step=1.0)
    np.testing.assert_allclose(got, ref, atol=2e-3)
    # the variances enter: without them the precision is larger
    assert _update_globals(spec, x, 0 * v, np.zeros(2), max_step=1.0)[1] > got[1] + 0.05


def _volume_case():
    """A 2PL under pooled priors, 30 x 5 with a missing cell: its distinct patterns with
    counts, mask and responses (float64), items ``x`` and globals ``g``."""
    y, *_ = _simulate(30, 5, seed=21)
    y[0, 1] = -1
    patterns, _, counts = distinct_rows(y)
    mask = (patterns >= 0).astype(np.float64)
    yy = np.where(patterns >= 0, patterns, 0).astype(np.float64)
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=5), 0.3 * rng.normal(size=5)], -1)
    g = np.array([0.1, np.log(0.8), -0.05, np.log(4.0)])  # mu_b, log u_b, mu_a, log u_a
    return patterns, counts.astype(np.float64), mask, yy, x, g


def _numeric_gradient(volume, x, eps=1e-5):
    """Central differences of ``volume(x, False)[0].sum()``."""
    numeric = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        numeric[idx] = (volume(x + d, False)[0].sum() - volume(x - d, False)[0].sum()) / (2 * eps)
    return numeric


def _numpy_volumes(x, g, theta, base, yy, mask, counts):
    """Each 2PL item's -1/2 log det of its expected information (weights on the nodes
    ``theta`` ``(U, Q)``, log prior + rule weight ``base``) plus its pooled normal priors'
    precisions, the Hessian written out cell by cell, floored as ``_log_volume`` floors it."""
    from engine.infer.marginal import _VOLUME_FLOOR

    a, b = np.exp(x[:, 1]), x[:, 0]
    p = 1 / (1 + np.exp(-a[None, None] * (theta[:, :, None] - b[None, None])))
    ll = (stats.bernoulli.logpmf(yy[:, None, :], p) * mask[:, None, :]).sum(-1) + base
    w = np.exp(ll - ll.max(1, keepdims=True))
    w = w / w.sum(1, keepdims=True) * counts[:, None]
    out = []
    for i in range(x.shape[0]):
        d_b, d_la = -a[i], a[i] * (theta - b[i])  # d eta / d b, d eta / d log a
        seen = mask[:, i:i + 1]
        r, q = (yy[:, i:i + 1] - p[:, :, i]) * seen, p[:, :, i] * (1 - p[:, :, i]) * seen
        h = np.array([[np.sum(w * -q * d_b * d_b), np.sum(w * (-q * d_b * d_la + r * -a[i]))],
                      [0.0, np.sum(w * (-q * d_la * d_la + r * d_la))]])
        h[1, 0] = h[0, 1]
        h -= np.diag([np.exp(g[1]), np.exp(g[3])])  # the pooled normal priors' precisions
        c = _VOLUME_FLOOR ** 2  # -1/2 log |det|, smoothly floored (two of the five indefinite)
        out.append(-0.5 * np.log(np.sqrt(np.linalg.det(-h) ** 2 + c ** 2)))
    return np.array(out)


@pytest.mark.parametrize("limit", [10_000_000, 40])
def test_item_volume_matches_numpy_and_its_gradient(limit):
    """Each item's -1/2 log det of its expected information plus prior precision against a
    direct numpy computation of the 2PL's Hessian, and the gradient of their sum (which
    follows the abilities' posterior weights) against central differences, in float64, in
    one chunk of items and in chunks of one or two items."""
    import jax

    from engine.infer.marginal import _volume

    spec = get_model("2pl", prior="population")
    patterns, counts, mask, yy, x, g = _volume_case()
    theta = np.linspace(-3, 3, 13)[None, :].repeat(len(patterns), 0)
    base = stats.norm.logpdf(theta)
    with jax.enable_x64(True):
        def volume(xx, with_grad=True):
            return _volume(spec, xx, theta, base, yy, mask, counts, g, limit, with_grad,
                           dtype=np.float64)

        vol, grad = volume(x)
        numeric = _numeric_gradient(volume, x)
        # a compile-bound fit's one program: the volumes alone from the gradients' program
        one = _volume(spec, x, theta, base, yy, mask, counts, g, limit, False, np.float64,
                      one_program=True)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(vol, _numpy_volumes(x, g, theta, base, yy, mask, counts),
                               rtol=1e-9)
    assert one[1] is None
    np.testing.assert_allclose(one[0], vol, rtol=1e-12)


def test_item_volume_is_floored_smoothly_where_the_information_is_near_singular():
    """A pooled block's volume is ``-1/2 log |det|`` of its information within
    ``c^2 / det^2`` where the determinant is far from ``c = _VOLUME_FLOOR ** p`` on either
    side, and at most ``-1/2 log c`` everywhere, smooth (unfloored it grew without bound at
    a singular information, and a 4PL's items ran there; a hard floor left a cusp they sat
    on; a floor that capped every indefinite information trapped a 2PL's items far from the
    mode, where their informations are indefinite). The globals' EM objective
    sees the same: ``_volume_variances`` is the volume's derivative in the blocks' prior
    precisions (``d vol / d u_j``, ``A = D + diag(u)``), times -2."""
    import jax
    import jax.numpy as jnp

    from engine.infer.marginal import _VOLUME_FLOOR, _log_volume, _volume_variances

    spec = get_model("2pl", prior="population")  # both item blocks pooled
    c = _VOLUME_FLOOR ** 2
    infos = np.array([[[4.0, 1.0], [1.0, 3.0]],  # positive definite, det 11
                      [[30.0, 2.0], [2.0, 12.0]],  # det 356
                      [[2.0, 3.0], [3.0, 1.0]],  # indefinite (det -7)
                      [[0.05, 0.0], [0.0, 0.1]],  # det 0.005, below c
                      [[1.0, 0.0], [0.0, 0.0]]])  # singular
    rng = np.random.default_rng(3)
    random = rng.normal(size=(200, 2, 2)) * rng.uniform(0.01, 3, size=(200, 1, 1))
    random = random + np.swapaxes(random, 1, 2)
    with jax.enable_x64(True):
        vol = np.array([float(_log_volume(jnp.asarray(a))) for a in infos])
        vol_random = np.array([float(_log_volume(jnp.asarray(a))) for a in random])

        def volume_in_u(u, d):  # the volume of A = D + diag(u)
            return _log_volume(jnp.asarray(d) + jnp.diag(u))

        grads = np.array([np.asarray(jax.grad(volume_in_u)(jnp.zeros(2), a)) for a in infos])
    det = np.linalg.det(infos)
    far = np.abs(det) > 1.0  # positive definite and indefinite alike: -1/2 log |det|
    np.testing.assert_allclose(vol[far], -0.5 * np.log(np.abs(det[far])), atol=0, rtol=0.01)
    assert np.all(np.abs(vol[far] + 0.5 * np.log(np.abs(det[far]))) < c ** 2 / det[far] ** 2)
    assert far[:3].all() and vol[2] == pytest.approx(-0.5 * np.log(7.0), rel=1e-6)
    top = -0.5 * np.log(c)
    assert np.all(np.isfinite(vol)) and np.all(vol <= top + 1e-12)
    assert np.all(np.isfinite(vol_random)) and np.all(vol_random <= top + 1e-12)
    assert vol[3] < vol[4] == pytest.approx(top)  # the volume rises smoothly to the floor
    assert vol[3] == pytest.approx(-0.5 * np.log(np.hypot(0.005, c)), rel=1e-9)
    np.testing.assert_allclose(_volume_variances(spec, infos), -2.0 * grads, rtol=1e-9,
                               atol=1e-12)


def test_pooled_prior_keeps_the_scale_where_items_outnumber_subjects():
    """The population prior's hyper-parameters are fitted with the items integrated out: at
    60 x 150 (simulated theta, b ~ N(0, 1), log a ~ N(0, 0.3^2)) the scale stays the
    population's. At the items' mode alone the difficulties shrink towards their mean,
    round after round (200 x 400: sd 0.2 after 30 iterations)."""
    y, theta, b, a = _simulate(60, 150, seed=1)
    res = fit(y, model="2pl", prior="population",
              settings=FitSettings(ability_factor="quadrature"))
    assert res.converged and res.extra["ability_factor"]["method"] == "quadrature"
    loc = res.guide.loc
    assert 0.85 < np.std(loc["ability"]) < 1.2
    assert 0.85 < np.std(loc["difficulty"]) / np.std(b) < 1.2
    assert abs(np.mean(loc["discrimination"]) - np.mean(np.log(a))) < 0.3
    assert abs(float(loc["mu_discrimination"]) - np.mean(loc["discrimination"])) < 0.05
    sd_b = np.exp(-0.5 * float(loc["u_difficulty"]))  # the pooled block's sd, fitted
    assert 0.8 < sd_b / np.std(b) < 1.25
    sds = res.sds()
    z = np.concatenate([(loc["difficulty"] - b) / sds["difficulty"],
                        (loc["ability"] - theta) / sds["ability"]])
    assert 0.8 <= np.mean(np.abs(z) < 1.645) <= 0.97


@pytest.mark.parametrize("model", ["3pl", "feas"])
def test_asymptotes_stay_at_their_mode_under_pooled_priors(model, monkeypatch):
    """The volume integrates out only the pooled blocks. An asymptote's logit-uniform prior
    has no information left at the boundary, so its -1/2 log det grew without bound there:
    a 3PL at 300 x 40 ran 500 iterations, its objective swinging by 40 and the guessing
    of 0.3% of items running to 0, and never converged. Its volume is the pooled blocks'.
    At 100 x 20 the whole-item volume loses ground too (3PL from pass 26, IRT-feas from
    pass 37; ``auto`` fell back to the mean-field fit) where the pooled volume converges in
    13 passes. The items' posterior moments after convergence (importance sampling, Laplace
    draws) change neither, and are left out here."""
    from dataclasses import replace

    import engine.api
    from engine.infer.marginal import _item_volume, fit_marginal_result

    def mode_only(spec, y, fit_settings, settings=MarginalSettings(), aside=None, **kw):
        settings = replace(settings, importance_max_params=0, laplace_draws=0)
        return fit_marginal_result(spec, y, fit_settings, settings, aside)

    monkeypatch.setattr(engine.api, "fit_marginal_result", mode_only)
    y, *_ = _simulate(100, 20, seed=1)
    res = fit(y, model=model, prior="population", settings=FitSettings(seed=0))
    assert res.extra["ability_factor"]["method"] == "quadrature"
    assert res.converged and res.num_passes < 60
    spec = get_model(model, prior="population")
    # as the asymptote runs to its bound the model tends to the 2PL, and so does the
    # volume (the whole item's information had -1/2 log det grow by 7.5 from here to there)
    x = np.zeros((4, 3), np.float32)
    theta = np.linspace(-2, 2, 5, dtype=np.float32)[None].repeat(6, 0)
    yy = np.tile(np.array([1, 0, 1, 1], np.int8), (6, 1))
    mask = np.ones((6, 4), np.float32)
    w = np.full((6, 5), 0.2, np.float32)
    g = np.zeros(4, np.float32)
    vols = []
    for bound in (-15.0, -30.0):  # logit of the guessing (3PL) or of 1 - feasibility
        x[:, 2] = bound if model == "3pl" else -bound
        vols.append(np.asarray(_item_volume(spec, x, theta, yy, mask, w, g, False)[0]))
    assert np.all(np.isfinite(vols))
    np.testing.assert_allclose(vols[0], vols[1], atol=1e-3)


def test_a_barely_identified_pooled_fit_converges_at_its_objectives_top():
    """A 2PL drawn from its population priors with every discrimination near 0.2 (100 x 8):
    Newton and EM steps settled into a cycle of 0.01-sized moves with the objective flat to
    1e-5 and ran to the iteration limit (500 passes). Moves measured in posterior sds (0.03)
    now end it; the objective it stops at is the highest it reached."""
    from scipy.special import expit

    rng = np.random.default_rng(10_000)
    t = get_model("2pl", prior="population").draw_prior(100, 8, rng)
    assert np.exp(t["discrimination"]).max() < 0.35  # the regime: no item is informative
    p = expit(np.exp(t["discrimination"]) * (t["ability"][:, None] - t["difficulty"]))
    y = (rng.random((100, 8)) < p).astype(np.int8)
    res = fit(y, model="2pl", settings=FitSettings(seed=0, progress=False))
    assert res.extra["ability_factor"]["method"] == "quadrature"
    assert res.converged and res.num_passes < 100
    objective = [row["elbo"] for row in res.trace]
    assert objective[-1] >= max(objective) - 1e-3


def test_abilities_over_the_items_laplace_draws_match_importance_sampling():
    """Where the items' posterior is too long for importance sampling, the abilities are
    averaged over item draws from its Laplace approximation. On a 1PL of 30 x 150 both
    routes apply: the averaged abilities match importance sampling's (the items' exact
    posterior, up to Monte Carlo error) within 0.03 of their sd, where the abilities at the
    items' mode miss by 0.14 (their scale 2% narrow)."""
    from engine.infer.marginal import fit_marginal

    y = _simulate(30, 150, seed=1, log_a_sd=0.0)[0]
    spec = get_model("1pl")
    runs = {}
    for name, st in (("importance", MarginalSettings()),
                     ("laplace", MarginalSettings(importance_max_params=0, sampler_chains=0)),
                     ("mode", MarginalSettings(importance_max_params=0, laplace_draws=0,
                                               sampler_chains=0))):
        guide, _, info = fit_marginal(spec, y, st)
        runs[name] = (np.asarray(guide.loc["ability"]), np.exp(np.asarray(guide.log_scale["ability"])), info)
    ref, ref_sd, info = runs["importance"]
    assert info["item_moments"]["method"] == "importance"
    assert runs["laplace"][2]["item_moments"]["abilities"]["method"] == "laplace draws"
    assert runs["mode"][2]["item_moments"]["abilities"]["method"] == "mode"
    z = lambda name: np.abs(runs[name][0] - ref) / ref_sd
    assert z("laplace").max() < 0.03
    assert z("mode").max() > 0.08  # the regime: the mode's abilities are measurably off
    np.testing.assert_allclose(runs["laplace"][1], ref_sd, rtol=0.05)


def test_set_aside_items_report_their_posterior_against_the_fitted_abilities():
    """Under pooled priors a constant item stays out of the mode search, and importance
    sampling integrates it out of every draw of the items and globals against that draw's
    ability posteriors, so the pool widens as the exact posterior's does and every value
    agrees with NUTS's (every item with its data): on a 1PL of 150 x 12 with one item all
    answered right and one all wrong, within 0.25 NUTS sd and sd ratio 0.8-1.25 (measured
    0.10 and 0.95-1.06). A fit without those items (the answered items as they were read
    before) puts one item 0.49 NUTS sd off."""
    from engine.api import fit_nuts
    from engine.infer.nuts import NutsSettings

    y = _simulate(150, 12, seed=7, log_a_sd=0.0)[0]
    y[:, 0], y[:, 1] = 1, 0
    res = fit(y, "1pl", settings=FitSettings(seed=0, progress=False))
    assert res.extra["ability_factor"]["method"] == "quadrature"
    assert res.extra["data"]["constant_items"] == 2
    aside = res.extra["quadrature"]["set_aside"]
    assert aside["items"] == 2 and aside["method"] == "integrated out of every importance draw"
    assert aside["pool_shift_sds"] > 1  # the pool these items move (in the fit's sds)
    assert res.extra["quadrature"]["item_moments"]["set_aside"] == "integrated out of each draw"
    exact = fit_nuts(y, "1pl", NutsSettings(seed=0))
    assert exact.converged and "constant_items" not in exact.extra["data"]
    for block in ("ability", "difficulty"):
        got, got_sd = res.means()[block], res.sds()[block]
        want, sd = exact.means()[block], exact.sds()[block]
        assert (np.abs(got - want) < 0.25 * sd).all(), block
        assert (np.abs(got_sd / sd - 1) < 0.25).all(), block
    got_b, b, sd = res.means()["difficulty"], exact.means()["difficulty"], exact.sds()["difficulty"]
    informative = got_b[2:]
    assert got_b[0] < informative.min() and got_b[1] > informative.max()
    without = fit(y[:, 2:], "1pl", settings=FitSettings(seed=0, progress=False))
    assert (np.abs(without.means()["difficulty"] - b[2:]) / sd[2:]).max() > 0.35


def test_set_aside_items_are_integrated_out_where_the_shared_grid_draws_allow():
    """Whether importance sampling integrates the set-aside items out of its draws is judged
    in the shared grid's cells, the units its draws are counted in: a 1PL of 100 x 50 with
    8 constant items costs about 12,000 cells a draw on the grid and 50,260 for those
    items, so 4,000 draws fit the 4e8-cell bound. Counted against the adaptive nodes'
    55,000 cells a draw (100 patterns x 11 nodes x 50 items) they did not, and the fit ran the item sampler instead (6.8 s
    against 2.7 s; both within 0.1 NUTS sd there, `bench_marginal.py --data 100x50c8
    --model 1pl`)."""
    y = _simulate(100, 50, seed=0, log_a_sd=0.0)[0]
    y[:, -8:] = np.arange(8) % 2 == 0
    res = fit(y, "1pl", settings=FitSettings(seed=0, progress=False))
    q = res.extra["quadrature"]
    assert q["item_moments"]["nodes"]["nodes"] == "shared grid"
    assert q["item_moments"]["set_aside"] == "integrated out of each draw"
    assert q["item_moments"]["method"] == "importance"
    assert q["set_aside"]["method"] == "integrated out of every importance draw"
    b = res.means()["difficulty"]
    assert (b[-8::2] < b[:-8].min()).all() and (b[-7::2] > b[:-8].max()).all()


_B = np.linspace(-20, 20, 3001)  # the difficulty's grid in the scipy reference


def test_set_aside_items_move_the_pool_they_are_read_under():
    """Items every subject answered alike are read under the globals' posterior with them
    in it: ``p(g) prod_i ∫ N(x; mu, 1/u) e^{l_i(x)} dx prod_j L_j(g)``, the fitted items'
    likelihoods ``l_i`` quadratic, the set-aside items' ``L_j`` against the abilities.
    Against scipy on dense grids (the pool's location and log precision 81 x 81 over 6
    sds, each item's difficulty 3,001 points, the hyper-priors from scipy.stats), for
    three constant items of a 1PL (all right, all wrong, all right with half unanswered)
    against 20 ability patterns, ten fitted items. Held at the fitted pool (the read-out
    before), the same items are read over a posterior sd nearer its centre and half as
    wide."""
    from engine.infer.marginal import _set_aside_posteriors

    spec = get_model("1pl", prior="population")
    assert [(p.name, p.prior.family) for p in spec.by_owner("global")] == [
        ("mu_difficulty", "normal"), ("u_difficulty", "log_gamma")]
    mu_prior, u_prior = (p.prior for p in spec.by_owner("global"))
    rng = np.random.default_rng(3)
    x_fit = rng.normal(0.0, 1.0, 10)  # ten fitted items, each likelihood N(x_i, 0.2^2)
    lam = np.full((10, 1, 1), 25.0)
    h = 25.0 * x_fit[:, None]
    g, g_cov = np.array([0.1, 0.0]), np.array([[0.1, 0.0], [0.0, 0.2]])  # a proposal only
    nodes, weights = np.polynomial.hermite_e.hermegauss(15)
    theta = np.linspace(-2, 2, 20)[:, None] + 0.5 * nodes  # (U, Q) pattern posteriors
    w = np.tile(weights / weights.sum(), (20, 1))
    inverse = np.repeat(np.arange(20), 2)  # 40 subjects
    responses = np.ones((40, 3), np.int8)
    responses[:, 1] = 0
    responses[::2, 2] = -1
    means, covs, ok, record, _ = _set_aside_posteriors(spec, np.zeros((3, 1)), g, theta, w,
                                                    inverse, responses, 8_000_000,
                                                    (g_cov, h, lam))
    assert ok.all() and record["pool_draws"] == 1024 and record["effective_draws"] > 256
    held = _set_aside_posteriors(spec, np.zeros((3, 1)), g, theta, w, inverse, responses,
                                 8_000_000)

    p_right = np.einsum("uq,uqb->ub", w, 1 / (1 + np.exp(-(theta[:, :, None] - _B))))[inverse]
    right, wrong = np.log(p_right), np.log1p(-p_right)
    lik = np.array([np.where(col[:, None] == 1, right, np.where(col[:, None] == 0, wrong, 0.0)
                             ).sum(0) for col in responses.T])  # (3, B)
    MU, LU = np.meshgrid(np.linspace(-3, 3, 81), np.linspace(-5, 3, 81), indexing="ij")
    pts = np.stack([MU.ravel(), LU.ravel()], -1)
    log_g = (stats.norm.logpdf(pts[:, 0], mu_prior.loc, np.sqrt(mu_prior.variance))
             + stats.gamma.logpdf(np.exp(pts[:, 1]), u_prior.shape_, scale=1 / u_prior.rate)
             + pts[:, 1])  # the log precision's density
    prior = stats.norm.logpdf(_B[None, :], pts[:, :1], np.exp(-0.5 * pts[:, 1:]))  # (P, B)
    log_fitted = 0.0
    for lam_i, h_i in zip(lam[:, 0, 0], h[:, 0]):  # one item at a time: (P, B) each
        fitted = prior + (-0.5 * lam_i * _B ** 2 + h_i * _B)[None]
        top = fitted.max(axis=1, keepdims=True)
        log_fitted = log_fitted + np.log(integrate.trapezoid(np.exp(fitted - top), _B, axis=1)) \
            + top[:, 0]
    cond = prior[:, None, :] + lik[None, :, :]  # (P, 3, B)
    top = cond.max(axis=2, keepdims=True)
    dens = np.exp(cond - top)
    mass = integrate.trapezoid(dens, _B, axis=2)
    log_w = log_g + log_fitted + (np.log(mass) + top[:, :, 0]).sum(1)
    wt = np.exp(log_w - log_w.max())
    wt /= wt.sum()
    ref_mean = wt @ (integrate.trapezoid(dens * _B, _B, axis=2) / mass)
    ref_sd = np.sqrt(wt @ (integrate.trapezoid(dens * _B ** 2, _B, axis=2) / mass) - ref_mean ** 2)
    got_sd = np.sqrt(covs[:, 0, 0])
    np.testing.assert_allclose(means[:, 0], ref_mean, atol=0.02 * ref_sd.min())
    np.testing.assert_allclose(got_sd, ref_sd, rtol=0.02)
    # the regime: the pool held at its fit reads them nearer its centre, and narrower
    assert (np.abs(held[0][:, 0] - ref_mean) > ref_sd).all()
    assert (np.sqrt(held[1][:, 0, 0]) < 0.6 * ref_sd).all()


def test_set_aside_items_integrate_out_of_each_draw_as_scipy_does():
    """A set-aside item integrated out of an importance draw against that draw's ability
    posteriors: ``log L = log ∫ N(v; mu, 1/u) prod_u E_u[P(1 | theta, v)]^n1
    E_u[P(0 | theta, v)]^n0 dv``, with ``E_u`` over pattern ``u``'s ability posterior given
    the draw's items, and the item's posterior mean and variance given the draw, equal scipy's
    adaptive quadrature (abilities on a dense trapezoid, the item's value by ``quad``), for
    two draws of a 1PL's items and pool."""
    import jax.numpy as jnp

    from engine.infer.marginal import _grid_draw_aside, _log_prior, _set_aside_axis

    spec = get_model("1pl", prior="population")
    rng = np.random.default_rng(11)
    n, U = 4, 3
    xs = rng.normal(0.0, 1.0, (2, n, 1))
    gs = np.array([[0.3, -0.5], [-0.2, 0.4]])  # (mu, log u) per draw
    y1 = np.array([[1, 1, 0, 1], [0, 1, 0, 0], [1, 0, 1, 1]], np.float64)
    y0 = 1.0 - y1
    y0[2, 1] = 0.0  # pattern 2 did not answer item 1
    n1, n0 = np.array([[3.0, 0.0, 2.0]]), np.array([[0.0, 1.0, 0.0]])  # one set-aside item
    grid = np.linspace(-9.0, 9.0, 361)
    log_base = stats.norm.logpdf(grid) + np.log(grid[1] - grid[0])
    axis = _set_aside_axis(0.0, 1.5, 121)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    lp, _, _, _, mean, second = (np.asarray(v, np.float64) for v in _grid_draw_aside(
        spec, f32(xs), f32(gs), f32(grid), f32(log_base), f32(y1), f32(y0), f32(axis[:, None]),
        f32(np.log(np.gradient(axis))), f32(n1), f32(n0)))
    th = np.linspace(-12.0, 12.0, 4801)
    for d in range(2):
        p_items = 1 / (1 + np.exp(-(th[:, None] - xs[d, :, 0])))  # (T, n)
        post = np.exp(np.log(p_items) @ y1.T + np.log1p(-p_items) @ y0.T) * stats.norm.pdf(th)[:, None]
        post /= integrate.trapezoid(post, th, axis=0)  # (T, U) each pattern's posterior

        def lik(v):
            e1 = integrate.trapezoid(post / (1 + np.exp(-(th - v)))[:, None], th, axis=0)
            return np.prod(e1 ** n1[0] * (1 - e1) ** n0[0]) * stats.norm.pdf(
                v, gs[d, 0], np.exp(-0.5 * gs[d, 1]))

        kw = dict(points=[gs[d, 0]], limit=200, epsabs=0)
        total = integrate.quad(lik, -40, 40, **kw)[0]
        m = integrate.quad(lambda v: v * lik(v), -40, 40, **kw)[0] / total
        var = integrate.quad(lambda v: (v - m) ** 2 * lik(v), -40, 40, **kw)[0] / total
        prior = float(_log_prior(spec, f32(xs[d]), f32(gs[d])))
        assert lp[d] - prior == pytest.approx(np.log(total), abs=2e-3)
        assert mean[d, 0, 0] == pytest.approx(m, abs=2e-3 * np.sqrt(var))
        assert second[d, 0, 0, 0] - mean[d, 0, 0] ** 2 == pytest.approx(var, rel=2e-3)


@pytest.mark.parametrize("model", ["1pl", "2pl"])
def test_fitted_items_integrate_against_the_pool_as_scipy_does(model):
    """The globals' log posterior from the fitted items' quadratic likelihoods, each
    integrated against the pool in closed form, equals the hyper-priors (scipy.stats) plus
    each item's integral on a dense grid of its values, for a few draws of the globals."""
    from engine.infer.marginal import _fitted_items_given_globals

    spec = get_model(model, prior="population")
    hyper = spec.by_owner("global")
    blocks = [p for p in spec.params if p.owner == "item"]
    k = len(blocks)
    rng = np.random.default_rng(5)
    a = rng.normal(size=(3, k, k))
    lam = np.einsum("nij,nkj->nik", a, a) + 2.0 * np.eye(k)  # three items
    h = rng.normal(size=(3, k))
    draws = rng.normal(0.0, 0.5, (4, len(hyper)))
    env = {p.name: np.exp(draws[:, i]) if p.prior.family == "log_gamma" else draws[:, i]
           for i, p in enumerate(hyper)}
    priors = [(env[p.prior.loc], env[p.prior.precision]) for p in blocks]
    got = _fitted_items_given_globals(spec, draws, priors, h, lam)
    axis = np.linspace(-12, 12, 1201 if k == 1 else 241)
    pts = np.stack([m.ravel() for m in np.meshgrid(*[axis] * k, indexing="ij")], -1)  # (P, k)
    for d in range(len(draws)):
        want = sum(stats.norm.logpdf(draws[d, i], p.prior.loc, np.sqrt(p.prior.variance))
                   if p.prior.family == "normal" else
                   stats.gamma.logpdf(np.exp(draws[d, i]), p.prior.shape_, scale=1 / p.prior.rate)
                   + draws[d, i] for i, p in enumerate(hyper))
        log_pool = sum(stats.norm.logpdf(pts[:, j], priors[j][0][d], priors[j][1][d] ** -0.5)
                       for j in range(k))
        for i in range(3):
            f = np.exp(log_pool - 0.5 * np.einsum("pi,ij,pj->p", pts, lam[i], pts) + pts @ h[i])
            f = f.reshape([len(axis)] * k)
            for _ in range(k):
                f = integrate.trapezoid(f, axis, axis=0)
            want += np.log(f)
        assert got[d] == pytest.approx(want, abs=1e-6)


def test_set_aside_posteriors_stay_finite_where_the_grid_overflows():
    """A pool of log discriminations with a tiny precision spans a grid whose far end
    overflows float32 (a = e^300): those grid points drop out instead of making the item's
    posterior NaN (seen in simulation-based calibration, 2PL 30 x 20)."""
    from engine.infer.marginal import _set_aside_posteriors

    spec = get_model("2pl", prior="population")
    names = [p.name for p in spec.by_owner("global")]
    g = np.array([{"mu_difficulty": 0.0, "u_difficulty": 0.0, "mu_discrimination": 0.0,
                   "u_discrimination": -8.0}[n] for n in names])
    theta = np.tile(np.linspace(-2, 2, 5), (3, 1))
    w = np.full((3, 5), 0.2)
    inverse = np.array([0, 0, 1, 2, 2])
    responses = np.array([[1], [1], [1], [1], [-1]], np.int8)
    means, covs, ok, *_ = _set_aside_posteriors(spec, np.zeros((1, 2)), g, theta, w, inverse,
                                            responses, 8_000_000)
    assert ok.all() and np.isfinite(means).all() and np.isfinite(covs).all()


def test_a_short_test_compiles_quickly_and_fits_the_same():
    """A fit whose quadrature grid is small (400 x 5: 32 patterns at most x 21 nodes x 5
    items) compiles its programs at XLA's optimisation level 0, records it, and gives the
    fully optimised programs' answer to float precision; a grid over the bound does not."""
    y = _simulate(400, 5, 4)[0]
    spec = get_model("2pl")
    quick = fit_marginal(spec, y)
    full = fit_marginal(spec, y, MarginalSettings(quick_compile_cells=0))
    assert quick[2]["quick_compile"] is True and full[2]["quick_compile"] is False
    assert fit_marginal(spec, y, MarginalSettings(quick_compile_cells=32 * 21 * 5 - 1)
                        )[2]["quick_compile"] is False
    for name in full[0].loc:
        np.testing.assert_allclose(quick[0].loc[name], full[0].loc[name], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(quick[0].log_scale[name], full[0].log_scale[name], atol=1e-4)
    assert quick[2]["log_marginal_posterior"] == pytest.approx(full[2]["log_marginal_posterior"],
                                                               abs=1e-3)


def test_a_quickly_compiled_fit_that_runs_long_compiles_optimised_from_then_on(monkeypatch):
    """A quickly compiled fit runs its programs at XLA's level 0 for its first
    ``quick_compile_passes`` passes and optimised from there (fit.json's
    ``optimised_from_pass``); the items' volumes come from one program (with the gradients,
    through ``jax.hessian``) for the first ``_ONE_PROGRAM_CALLS`` calls, from the two faster
    ones after. Read from the options and arguments each program is called with."""
    import engine.exported as exported
    import engine.infer.marginal as marginal
    from engine.exported import QUICK_COMPILE

    seen, volumes, real_prior, real_volume = [], [], marginal._item_prior, marginal._volume

    def item_prior(*args):
        seen.append(exported._OPTIONS.get())
        return real_prior(*args)

    def volume(*args, **kwargs):
        volumes.append((args[9], kwargs.get("one_program", args[11] if len(args) > 11 else None)))
        return real_volume(*args, **kwargs)

    monkeypatch.setattr(marginal, "_item_prior", item_prior)
    monkeypatch.setattr(marginal, "_volume", volume)
    monkeypatch.setattr(marginal, "_ONE_PROGRAM_CALLS", 4)
    y = _simulate(200, 6, 3)[0]
    spec = get_model("2pl", prior="population")
    settings = MarginalSettings(quick_compile_passes=2, max_iter=6, sampler_chains=0)
    info = fit_marginal(spec, y, settings)[2]
    assert info["quick_compile"] is True and info["optimised_from_pass"] == 3
    quick = tuple(sorted(QUICK_COMPILE.items()))
    assert seen[0] == quick and seen[-1] is None and set(seen) == {quick, None}
    assert [single for _, single in volumes[:4]] == [True] * 4
    assert len(volumes) > 4 and not any(single for _, single in volumes[4:])
    assert any(not with_grad for with_grad, _ in volumes[4:])
    short = fit_marginal(spec, y, MarginalSettings(quick_compile_passes=500, max_iter=6, sampler_chains=0))[2]
    assert short["optimised_from_pass"] is None
    assert fit_marginal(spec, y, MarginalSettings(quick_compile_cells=0, quick_compile_passes=2,
                                                  max_iter=6, sampler_chains=0))[2]["optimised_from_pass"] is None


def test_volume_route_is_read_from_the_cells_and_both_routes_fit_alike(monkeypatch):
    """Under pooled priors the items' volumes are taken on each pattern's adaptive nodes
    where those hold at most ``_GRID_VOLUME_CELLS`` cells (300 x 8: 256 patterns x 21 nodes x
    8 items), on one shared grid above it; fit.json records which. The two routes give the
    same fit (the grid matches the nodes' volumes to 1e-4 nats)."""
    import engine.infer.marginal as marginal

    y = _simulate(300, 8, 7)[0]
    spec = get_model("2pl", prior="population")
    adaptive = fit_marginal(spec, y)
    assert adaptive[2]["volume_nodes"] == {"nodes": "adaptive", "points": 21}
    monkeypatch.setattr(marginal, "_GRID_VOLUME_CELLS", 0)
    grid = fit_marginal(spec, y)
    assert grid[2]["volume_nodes"]["nodes"] == "shared grid"
    assert grid[2]["quick_compile"] is True
    for name in adaptive[0].loc:
        np.testing.assert_allclose(grid[0].loc[name], adaptive[0].loc[name], atol=1e-4)
    assert grid[2]["log_marginal_posterior"] == pytest.approx(
        adaptive[2]["log_marginal_posterior"], abs=1e-3)
    assert fit_marginal(get_model("2pl", prior="vague"), y)[2]["volume_nodes"] is None


@pytest.mark.parametrize("num_items", [8, 400])
def test_item_draws_weighted_on_a_shared_grid_match_scipy(num_items, monkeypatch):
    """Item draws are weighted with each pattern's log marginal likelihood and ability
    moments. On a short test they are integrated on one evenly spaced grid shared by every
    pattern (a matrix product per draw); on a long test, whose posteriors are narrow, on each
    pattern's adaptive nodes. Either way they match scipy.integrate.quad at each draw, and
    the shared grid matches the adaptive nodes it replaces."""
    from engine.infer.marginal import _DrawNodes

    spec = get_model("2pl", prior="vague")
    x, _, _, patterns, counts, yy, mask = _scipy_case(12, num_items, 3)
    quad = _adapted(spec, x, yy, mask, len(patterns))
    rng = np.random.default_rng(0)
    draws = x.reshape(-1) + 0.05 * rng.standard_normal((3, x.size))  # items near the mode
    nodes = _DrawNodes(spec, quad, counts, 11)
    assert nodes.shared == (num_items == 8)
    _, lm, m1, m2 = nodes.moments(spec, draws, x.shape, yy, mask)
    for d, vec in enumerate(draws):
        for u in (0, 5, 11):
            ref_z, ref_m, ref_sd = _scipy_posterior(patterns[u], vec[0::2], np.exp(vec[1::2]))
            assert lm[d, u] == pytest.approx(ref_z, abs=2e-3 + 1e-5 * abs(ref_z))
            assert m1[d, u] == pytest.approx(ref_m, abs=3e-3 * ref_sd + 1e-5)
            assert np.sqrt(m2[d, u] - m1[d, u] ** 2) == pytest.approx(ref_sd, rel=5e-3)
    if nodes.shared:  # the same moments as the adaptive nodes it replaces
        monkeypatch.setattr(_DrawNodes, "GRID_PER_NODE", 0)
        adaptive = _DrawNodes(spec, quad, counts, 11)
        assert not adaptive.shared
        for got, want in zip(nodes.moments(spec, draws, x.shape, yy, mask),
                             adaptive.moments(spec, draws, x.shape, yy, mask)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_round_short_of_its_target_draws_more_from_the_same_proposal():
    """An importance round whose effective sample falls short of ``importance_target_ess``
    draws more from its proposal, as many as the shared grid's cost allows within the cell
    bound. On a 2PL of 300 x 6 under vague priors (a skewed posterior) the first round's
    618 draws keep 117 effective, too few to keep; extended, the same round keeps 335, and
    its moments agree with a 4,000-draw run within that run's Monte Carlo error."""
    from engine.infer.marginal import fit_marginal

    y = _simulate(300, 6, seed=2)[0]
    spec = get_model("2pl", prior="vague")
    one_round = dict(importance_refit_sd=10.0, importance_refit_shift=10.0)
    runs = {}
    for name, target, cells in (("short", 0.0, 2_000_000), ("extended", 1e9, 2_000_000),
                                ("long", 0.0, 400_000_000)):
        guide, _, info = fit_marginal(spec, y, MarginalSettings(
            importance_target_ess=target, importance_cells_max=cells, **one_round))
        record = info["item_moments"]
        assert record["method"] == "importance" and record["nodes"]["nodes"] == "shared grid"
        runs[name] = (guide, record["rounds"])
    short, extended = runs["short"][1][0], runs["extended"][1][0]
    assert short["draws"] < 700 and not short["kept"]
    assert extended["draws"] > 2 * short["draws"] and extended["kept"]
    assert runs["long"][1][0]["draws"] == 4000
    ref, got = runs["long"][0], runs["extended"][0]
    for block in ("difficulty", "discrimination", "ability"):
        sd = np.exp(np.asarray(ref.log_scale[block]))
        gap = np.abs(np.asarray(got.loc[block]) - np.asarray(ref.loc[block])) / sd
        assert gap.max() < 0.35, block
        np.testing.assert_allclose(np.exp(np.asarray(got.log_scale[block])), sd, rtol=0.15)


def test_item_volume_on_the_shared_grid_matches_numpy_and_its_gradient():
    """The items' volumes with the abilities' weights on one shared grid (the fit's route
    where it does not compile quickly) against the direct numpy computation of the 2PL's
    Hessian on the same grid, the gradient of their sum (through the weights) against
    central differences in float64, and the volumes against the adaptive nodes' in float32."""
    import jax

    from engine.infer.marginal import _DrawNodes, _items_volume, _VolumeRoute

    spec = get_model("2pl", prior="population")
    patterns, counts, mask, yy, x, g = _volume_case()
    quad = _adapted(spec, x, yy.astype(np.float32), mask.astype(np.float32), len(patterns))
    settings = MarginalSettings()
    route = _VolumeRoute(shared=True)
    with jax.enable_x64(True):
        def volume(xx, with_grad=True):
            return _items_volume(spec, xx, quad, yy, mask, counts, g, settings, with_grad,
                                 route, dtype=np.float64)

        vol, grad = volume(x)
        nodes = route.grid
        assert isinstance(nodes, _DrawNodes) and nodes.shared
        numeric = _numeric_gradient(volume, x)
        assert route.grid.theta is nodes.theta  # the same grid throughout
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)
    expected = _numpy_volumes(x, g, nodes.theta[None, :], nodes.log_base, yy, mask, counts)
    np.testing.assert_allclose(vol, expected, rtol=1e-9)
    adaptive = _items_volume(spec, x, quad, yy, mask, counts, g, settings, True, None)
    np.testing.assert_allclose(vol, adaptive[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad, adaptive[1], rtol=1e-3, atol=1e-4)


def test_rounds_pooled_against_the_mixture_of_their_proposals_recover_a_known_posterior():
    """Importance rounds pooled with deterministic-mixture weights: for a normal target and
    three normal proposals (one off centre and narrow, as a first round at the mode with a
    missed tail is), the pooled weights give the target's mean and covariance, with more
    effective draws than any round's own weights keep."""
    from engine.infer.marginal import _pooled_weights, _truncated_weights

    rng = np.random.default_rng(3)
    mu, cov = np.array([0.5, -1.0, 2.0]), np.array([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1],
                                                     [0.0, 0.1, 2.0]])
    target = stats.multivariate_normal(mu, cov)
    pool, own = [], []
    for centre, scale in ((mu + 0.8, 0.7), (mu + 0.2, 1.1), (mu, 1.3)):
        factor = scale * np.linalg.cholesky(cov)
        z = rng.standard_normal((4000, 3))
        xs = centre + z @ factor.T
        logp = target.logpdf(xs) + 7.0  # any constant
        pool.append((xs, logp, np.zeros(4000), np.zeros(4000), centre, factor))
        own.append(_truncated_weights(logp + 0.5 * (z ** 2).sum(axis=1))[1])
    xs, w, ess = _pooled_weights(pool)
    assert xs.shape == (12000, 3) and ess > max(own)
    mean = w @ xs
    centred = xs - mean
    np.testing.assert_allclose(mean, mu, atol=0.05 * np.sqrt(np.diag(cov)).max())
    np.testing.assert_allclose((centred * w[:, None]).T @ centred, cov, atol=0.1)


@pytest.mark.parametrize("model", ["2pl", "feas"])
def test_grid_volume_gradients_match_the_hessians_pullback(model):
    """The shared grid's volumes and their gradients (second derivatives by two forward
    passes, one reverse pass through them; and the compile-bound fit's pullback through
    ``jax.hessian``) against ``jax.vjp`` through the volumes as ``jax.hessian`` gives them,
    written here, in float64, at items, globals and weights away from zero: two models
    (the adaptive nodes' test takes two more), one with every block pooled (2PL), one with
    an asymptote that is not (feas)."""
    import jax
    import jax.numpy as jnp

    from engine.infer.marginal import (_grid_curves, _grid_item_volume, _item_blocks,
                                       _log_volume, _pooled_blocks)

    spec = get_model(model, prior="population")
    rng = np.random.default_rng(7)
    k, h = len(_item_blocks(spec)), len(spec.by_owner("global"))
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=(7, k)) * 0.4)
        g = jnp.asarray(rng.normal(size=h) * 0.2)
        grid = jnp.linspace(-3.0, 3.0, 17)
        a1, a0 = (jnp.asarray(rng.random((17, 7)) * 3) for _ in range(2))
        vol, gx, g1, g0 = _grid_item_volume.fn(spec, x, g, grid, a1, a0, with_grad=True)
        blocks, pooled = _item_blocks(spec), _pooled_blocks(spec)
        env = {p.name: p.constrain(g[i]) for i, p in enumerate(spec.by_owner("global"))}

        def volumes(xx, b1, b0):
            def one(xn, b1n, b0n):
                def log_post(v):
                    c1, c0 = _grid_curves(spec, v[None, :], grid)
                    return b1n @ c1[:, 0] + b0n @ c0[:, 0] + sum(
                        p.prior.log_prob(v[j], env) for j, p in enumerate(blocks))
                return _log_volume(-jax.hessian(log_post)(xn)[np.ix_(pooled, pooled)])
            return jax.vmap(one)(xx, b1.T, b0.T)

        ref, pullback = jax.vjp(volumes, x, a1, a0)  # eager: compiled, the 4PL's took
        want = (ref, *pullback(jnp.ones_like(ref)))  # twice as long
        small = _grid_item_volume.fn(spec, x, g, grid, a1, a0, with_grad=True, small=True)
        alone = _grid_item_volume.fn(spec, x, g, grid, a1, a0, with_grad=False)[0]
        for each in ((vol, gx, g1, g0), small, (alone,)):
            for a, b in zip(each, want):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
        assert np.abs(np.asarray(gx)).max() > 1e-3  # a gradient that is there


@pytest.mark.parametrize("model", ["1pl", "3pl"])
def test_node_volume_gradients_match_the_hessians_pullback(model):
    """The volumes on each pattern's adaptive nodes and their gradients in the items and the
    node weights (forward-mode second derivatives; and the compile-bound fit's pullback
    through ``jax.hessian``) against ``jax.vjp`` through the volumes as ``jax.hessian``
    gives them, written here, in float64, with some cells unanswered. Two models: the
    second derivatives are the shared grid's (:func:`_pooled_volume`), tested there for
    the other three."""
    import jax
    import jax.numpy as jnp

    from engine.infer.marginal import _cell_loglik, _item_blocks, _item_volume, _log_volume, \
        _pooled_blocks

    spec = get_model(model, prior="population")
    rng = np.random.default_rng(8)
    k, h = len(_item_blocks(spec)), len(spec.by_owner("global"))
    U, Q, n = 5, 7, 6
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=(n, k)) * 0.4)
        g = jnp.asarray(rng.normal(size=h) * 0.2)
        theta = jnp.asarray(rng.normal(size=(U, Q)))
        y = jnp.asarray((rng.random((U, n)) < 0.5).astype(np.float64))
        mask = jnp.asarray((rng.random((U, n)) < 0.8).astype(np.float64))
        w = jnp.asarray(rng.random((U, Q)) * 2)
        blocks, pooled = _item_blocks(spec), _pooled_blocks(spec)
        env = {p.name: p.constrain(g[i]) for i, p in enumerate(spec.by_owner("global"))}

        def volumes(xx, ww):
            def one(xn, yn, mn):
                def log_post(v):
                    ll = _cell_loglik(spec, v[None, :], theta, yn[:, None], mn[:, None])[..., 0]
                    return jnp.sum(ww * ll) + sum(p.prior.log_prob(v[j], env)
                                                  for j, p in enumerate(blocks))
                return _log_volume(-jax.hessian(log_post)(xn)[np.ix_(pooled, pooled)])
            return jax.vmap(one, in_axes=(0, 1, 1))(xx, y, mask)

        def reference(xx, ww):
            ref, pullback = jax.vjp(volumes, xx, ww)
            return (ref, *pullback(jnp.ones_like(ref)))

        want = jax.jit(reference)(x, w)  # compiled: eager, the 3PL's test took 1.5x as long
        got = jax.jit(lambda *a, **kw: _item_volume.fn(spec, *a, **kw),
                      static_argnames=("with_grad", "small"))
        forward = got(x, theta, y, mask, w, g, with_grad=True)
        small = got(x, theta, y, mask, w, g, with_grad=True, small=True)
        alone = got(x, theta, y, mask, w, g, with_grad=False)[0]
        for each in (forward, small, (alone,)):
            for a, b in zip(each, want):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
        assert np.abs(np.asarray(forward[1])).max() > 1e-3  # gradients that are there
        assert np.abs(np.asarray(forward[2])).max() > 1e-3


@pytest.mark.parametrize("model", ["3pl", "4pl"])
def test_asymptote_models_item_volume_gradient_on_both_routes(model):
    """The pooled blocks' volume of a 3PL and a 4PL item (asymptotes not pooled, their
    curvature still moving the abilities' weights): the gradient of the volumes' sum against
    central differences in float64, on the shared grid and on the adaptive nodes, and the
    two routes' volumes against each other. At 6 items the posteriors' sd is about 1, so the
    grid is spaced at 1 (24 points); one 4PL item's volume is then 0.024 nats from an
    81-node reference, and 0.0085 on 21 adaptive nodes (the others agree to 1e-4): the two
    routes are compared at 0.03. The grid is taken where there are many more cells, and
    narrower posteriors."""
    import jax

    from engine.infer.marginal import _items_volume, _VolumeRoute

    rng = np.random.default_rng(3)
    y = _simulate(40, 6, seed=5)[0]
    patterns, _, counts = distinct_rows(y)
    mask = (patterns >= 0).astype(np.float64)
    yy = np.where(patterns >= 0, patterns, 0).astype(np.float64)
    spec = get_model(model, prior="population")
    k = len(spec.by_owner("item"))
    x = np.concatenate([rng.normal(size=(6, 1)), 0.3 * rng.normal(size=(6, 1)),
                        -1.5 + 0.3 * rng.normal(size=(6, k - 2))], 1)
    g = np.array([0.1, np.log(0.8), -0.05, np.log(4.0)])
    quad = _adapted(spec, x, yy.astype(np.float32), mask.astype(np.float32), len(patterns))
    vols = {}
    for shared in (True, False):
        route = _VolumeRoute(shared=shared)
        with jax.enable_x64(True):
            def volume(xx, with_grad=True):
                return _items_volume(spec, xx, quad, yy, mask, counts.astype(np.float64), g,
                                     MarginalSettings(), with_grad, route, dtype=np.float64)

            vol, grad = volume(x)
            numeric = _numeric_gradient(volume, x)
        assert route.record(21)["nodes"] == ("shared grid" if shared else "adaptive")
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)
        vols[shared] = vol
    np.testing.assert_allclose(vols[True], vols[False], atol=0.03)
    assert np.median(np.abs(vols[True] - vols[False])) < 1e-4


@pytest.mark.parametrize("model", ["2pl", "3pl"])
def test_globals_gradient_is_the_laplace_objectives(model):
    """The gradient in the globals that the fit's Newton and EM steps take
    (:func:`_hyper_derivatives`) against central differences of what the fit maximises in
    them: the log prior plus the items' volumes. Away from the mode (random items) some items'
    information is not positive definite, and a 3PL's guessing is not pooled: the variances
    must be the pooled blocks' own, signed (before: off by up to 0.7 and 1.5 in ``log u``)."""
    import jax

    from engine.infer.marginal import (_expected_terms, _hyper_derivatives, _item_prior,
                                       _items_volume, _total_prior)

    rng = np.random.default_rng(3)
    y = _simulate(60, 6, seed=5)[0]
    patterns, _, counts = distinct_rows(y)
    counts = counts.astype(np.float64)
    mask = (patterns >= 0).astype(np.float64)
    yy = np.where(patterns >= 0, patterns, 0).astype(np.float64)
    spec = get_model(model, prior="population")
    k = len(spec.by_owner("item"))
    x = np.concatenate([rng.normal(size=(6, 1)), 0.3 * rng.normal(size=(6, 1)),
                        -1.5 + 0.3 * rng.normal(size=(6, 1))], 1)[:, :k]
    g = np.array([0.1, np.log(0.8), -0.05, np.log(4.0)])
    quad = _adapted(spec, x, yy.astype(np.float32), mask.astype(np.float32), len(patterns))
    with jax.enable_x64(True):
        theta, w, _ = quad.posterior(spec, x, yy, mask)
        _, _, hess = _expected_terms(spec, x, theta, yy, mask, w * counts[:, None], 10 ** 7)
        hess = hess + _item_prior(spec, x, g)[2][:, :, None] * np.eye(k)
        assert (np.linalg.eigvalsh(-hess[:, :2, :2]).min(axis=1) < 0).any()  # not all PD
        g_grad = _hyper_derivatives(spec, x, -hess, g)[0]

        def objective(gg):
            return _total_prior(spec, x, gg, _item_prior(spec, x, gg)[0]) + _items_volume(
                spec, x, quad, yy, mask, counts, gg, MarginalSettings(), False, None,
                dtype=np.float64)[0].sum()

        eps = 3e-3  # the priors are float32: small steps are rounding
        numeric = np.array([(objective(g + eps * e) - objective(g - eps * e)) / (2 * eps)
                            for e in np.eye(len(g))])
    np.testing.assert_allclose(g_grad, numeric, atol=2e-3)


def test_items_volumes_from_the_fourth_pass_keep_a_small_leaderboard_off_their_peak():
    """A 2PL of 24 subjects x 120 items under the population priors. Fitted with the items'
    volumes from the first pass, items that started where their information is singular
    (their answers follow the abilities: an indefinite information in the log
    discrimination) sat on the volume's peak there, every step off it refused, and the
    search stalled (``divergence_patience``) 95 nats below the mode (seed 0; 3 of 8 seeds
    escaped it). With the volumes from the fourth pass (the default) it converges, higher,
    and the first three passes say they left the volumes out."""
    y = _simulate(24, 120, seed=0)[0]
    spec = get_model("2pl", prior="population")
    off = dict(sampler_chains=0)  # the item moments are not what this compares
    _, _, stuck = fit_marginal(spec, y, MarginalSettings(volume_from_pass=0, **off))
    assert stuck["diverged"] is not None and not stuck["mode_converged"]
    assert all(row["items_volume"] for row in stuck["trace"])
    _, _, info = fit_marginal(spec, y, MarginalSettings(**off))
    assert info["mode_converged"] and info["diverged"] is None
    assert [row["items_volume"] for row in info["trace"][:4]] == [False] * 3 + [True]
    assert info["log_marginal_posterior"] > stuck["log_marginal_posterior"] + 10
    # a fit that settles before the volumes enter does not stop there: the pool has not moved
    _, _, late = fit_marginal(spec, _simulate(300, 5, seed=0)[0],
                              MarginalSettings(volume_from_pass=30, **off))
    assert late["mode_converged"] and len(late["trace"]) > 30
    assert late["trace"][-1]["items_volume"]


def test_the_ability_prior_is_one_program_at_every_shape():
    """The fit asks for the ability prior's log density at its nodes, its importance nodes
    and its shared grid: three shapes, one program (called on fixed-length chunks); the
    values are the standard normal's (the population prior), as scipy gives them."""
    from engine.compile_cache import count_compiles
    from engine.infer.marginal import _ability_prior

    spec = get_model("2pl", prior="population")
    rng = np.random.default_rng(3)
    first = rng.normal(0, 2, (70, 21))
    np.testing.assert_allclose(_ability_prior(spec, first), stats.norm.logpdf(first), rtol=1e-6)
    with count_compiles() as compiles:
        for shape in [(44,), (1280, 11), (5000,)]:
            theta = rng.normal(0, 2, shape)
            got = _ability_prior(spec, theta)
            assert got.shape == shape
            np.testing.assert_allclose(got, stats.norm.logpdf(theta), rtol=1e-6)
    assert compiles.programs == 0


def test_laplace_draws_abilities_on_a_grid_that_spans_them(monkeypatch):
    """The abilities averaged over item draws are integrated on a grid laid out from the
    patterns' posteriors at the items' mode; draws with lower discriminations move and
    widen them past it, and the grid is widened: each pattern's mean and variance then
    match a scipy-free reference, a fine trapezoid over [-10, 10] of every draw's
    posterior. On the mode's grid the all-right and all-wrong sheets were cut off."""
    from engine.infer import marginal
    from engine.infer.marginal import _DrawNodes, _laplace_abilities

    spec = get_model("2pl", prior="vague")
    n = 20
    x = np.stack([np.linspace(-1.0, 1.0, n), np.full(n, np.log(2.0))], axis=1)
    patterns = np.array([np.zeros(n), np.ones(n), (np.arange(n) < 10), (np.arange(n) % 2)],
                        np.float64)
    counts = np.ones(len(patterns))
    quad = _Quadrature(21, len(patterns))
    quad.mean, quad.sd = np.array([-1.6, 1.6, 0.0, 0.0]), np.full(4, 0.05)  # a narrow mode
    proposal = np.tile(np.diag([0.01, 0.25 ** 2]), (n, 1, 1))
    settings = MarginalSettings(laplace_draws=100)
    mask = np.ones_like(patterns)

    # the reference: the same antithetic draws as _laplace_abilities, each pattern's
    # posterior on a fine grid under each draw, averaged by the law of total variance
    rng = np.random.default_rng(1)
    z = rng.standard_normal((50, 2 * n))
    z = np.concatenate([z, -z]).reshape(100, n, 2)
    items = x + np.einsum("nij,dnj->dni", np.linalg.cholesky(proposal), z)
    theta = np.linspace(-10, 10, 20001)
    a, b = np.exp(items[:, :, 1]), items[:, :, 0]
    logit = a[:, None, :] * (theta[None, :, None] - b[:, None, :])  # (D, T, n)
    log_p1, log_p0 = -np.logaddexp(0, -logit), -np.logaddexp(0, logit)
    ll = np.einsum("un,dtn->dut", patterns, log_p1) + np.einsum("un,dtn->dut", 1 - patterns, log_p0)
    lw = ll - 0.5 * theta ** 2
    w = np.exp(lw - lw.max(axis=2, keepdims=True))
    w /= w.sum(axis=2, keepdims=True)
    m1, m2 = w @ theta, w @ theta ** 2
    ref_mean = m1.mean(axis=0)
    ref_var = m2.mean(axis=0) - ref_mean ** 2

    (mean, var, draws), record = _laplace_abilities(spec, x, np.zeros(0), proposal, quad,
                                                    patterns, mask, counts, settings)
    assert record["nodes"]["widened_from"] < record["nodes"]["points"]
    unbounded = record["nodes"]["points"]  # 384
    np.testing.assert_allclose(mean, ref_mean, atol=1e-5)  # measured 3e-8
    np.testing.assert_allclose(var, ref_var, rtol=1e-5)  # measured 7e-7
    # the exact 90% intervals: the same resampled draws' posteriors averaged on the fine grid
    def fine_quantiles(dens):  # each pattern's, and its mean and sd
        cdf = np.cumsum(dens, axis=1) - 0.5 * dens  # the midpoint rule on spacing 0.001
        at = dens @ theta
        return (np.array([[np.interp(q, c, theta) for c in cdf] for q in (0.05, 0.95)]), at,
                np.sqrt(dens @ theta ** 2 - at ** 2))

    # placed at the picked draws' own moments: their mixture's quantiles, exactly (here
    # every draw at its weight: 100 draws of 4 patterns fit MIXTURE_CELLS)
    pick, weight = draws.mixture(seed=5)
    assert np.count_nonzero(weight) == 100
    ref_q, at, spread = fine_quantiles(np.tensordot(weight, w[pick], 1) / weight.sum())
    got = draws.quantiles(spec, at, spread, seed=5)
    np.testing.assert_allclose(got, ref_q, atol=1e-4 * spread.min())  # measured 1e-6
    # placed at all draws' moments, as the fit reports them: all draws' quantiles
    ref_q, _, _ = fine_quantiles(w.mean(axis=0))
    got = draws.quantiles(spec, ref_mean, np.sqrt(ref_var), seed=5)
    np.testing.assert_allclose(got, ref_q, atol=0.01 * np.sqrt(ref_var).min())
    # a widened grid stays within importance_cells_max: fewer points, coarser, still close
    bound = MarginalSettings(laplace_draws=100, importance_cells_max=168_000)
    (mean, var, _), record = _laplace_abilities(spec, x, np.zeros(0), proposal, quad,
                                                patterns, mask, counts, bound)
    wide = record["nodes"]
    assert wide["widened_from"] < wide["points"] < unbounded
    assert record["draws"] * (4 * wide["points"] + 4 * n * wide["points"] // 32) <= 168_000
    np.testing.assert_allclose(mean, ref_mean, atol=1e-4)
    np.testing.assert_allclose(var, ref_var, rtol=1e-4)
    monkeypatch.setattr(_DrawNodes, "cuts", lambda *args: False)  # held to the mode's grid
    (cut_mean, cut_var, _), _ = _laplace_abilities(spec, x, np.zeros(0), proposal, quad,
                                                patterns, mask, counts, settings)
    assert np.abs(cut_mean - ref_mean).max() > 0.1  # measured 0.36


@settings(max_examples=60, deadline=None)
@given(draws=st.integers(1, 700), patterns=st.integers(1, 9), rows=st.integers(1, 300),
       seed=st.integers(0, 2 ** 16), nan=st.booleans(), sds=st.sampled_from([3.0, 8.0]),
       flat=st.booleans())
@example(draws=600, patterns=3, rows=256, seed=1, nan=True, sds=8.0, flat=False)
def test_answered_span_is_the_whole_arrays_extremes(draws, patterns, rows, seed, nan, sds, flat):
    """The grid's reach over the answered patterns' posteriors, taken a block of draws at a
    time from float32 tables, equals the whole tables' extremes in float64 (padding
    patterns and NaNs left out; a NaN beside the extreme does not hide it); one draw's
    ``(U,)`` moments (the item sampler's) as well."""
    from engine.infer.marginal import answered_span

    rng = np.random.default_rng(seed)
    m1 = rng.normal(0.0, 2.0, (draws, patterns)).astype(np.float32)
    m2 = (m1.astype(np.float64) ** 2 + rng.gamma(1.0, 0.3, (draws, patterns))
          * (rng.random((draws, patterns)) < 0.9)).astype(np.float32)
    counts = rng.integers(0, 3, patterns)
    counts[rng.integers(patterns)] = 1  # at least one answered pattern
    if flat:
        m1, m2 = m1[0], m2[0]
    live = counts > 0

    def reach(m1):  # every answered pattern's mean -+ sds sd, in float64
        mean = m1.astype(np.float64)[..., live]
        sd = np.sqrt(np.maximum(m2.astype(np.float64)[..., live] - mean ** 2, 0.0))
        return mean - sds * sd, mean + sds * sd

    low, high = reach(m1)
    if nan:  # a NaN beside the lowest reach: in its draw, another answered pattern (or,
        # with one answered pattern, the next draw), so in the same block of draws
        cols = np.flatnonzero(live)
        low2d = np.atleast_2d(low)
        r, c = np.unravel_index(np.argmin(low2d), low2d.shape)
        spot = ((r, cols[(c + 1) % cols.size]) if cols.size > 1 else
                ((r + 1) % low2d.shape[0], cols[0]))
        if cols.size > 1 or low2d.shape[0] > 1:
            m1 = np.atleast_2d(m1).copy()
            m1[spot] = np.nan
            m1 = m1[0] if flat else m1
            low, high = reach(m1)
    got = answered_span(m1, m2, counts, sds, rows=rows)
    if np.isnan(low).all():  # nothing to reach: the grid stays as it is
        assert got == (np.inf, -np.inf)
    else:
        assert got == (float(np.nanmin(low)), float(np.nanmax(high)))
    assert answered_span(m1, m2, np.zeros(patterns, int), sds) == (np.inf, -np.inf)
