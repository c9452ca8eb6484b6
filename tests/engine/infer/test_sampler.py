"""The items' marginal posterior sampled (engine.infer.sampler) against independent references:
ArviZ's R-hat and effective sample size, a scipy-integrated posterior on a grid, and
importance sampling where that applies."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from engine.infer.marginal import MarginalSettings, fit_marginal
from engine.infer.sampler import effective_draws, split_rhat, tail_effective_draws
from engine.models import get_model
from engine.readout.posterior import summary_columns, within_owner_scales

from _skewed import skewed_case

_SHORT = dict(sampler_warmup=400, sampler_draws=800,  # enough for these small posteriors
              sampler_check_laplace=False)  # sampled, whatever the pilot finds


def _ar1(rng, chains, draws, rho, shift=None):
    """AR(1) chains with unit marginal variance, each optionally moved by ``shift``."""
    z = rng.standard_normal((chains, draws, 3))
    x = np.empty_like(z)
    x[:, 0] = z[:, 0]
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho ** 2) * z[:, t]
    return x + (0.0 if shift is None else shift[:, None, None])


def test_rhat_and_effective_draws_match_arviz():
    """Split R-hat against ``arviz.rhat(method="split")``; effective draws against
    ``arviz.ess(method="mean")`` and the AR(1) chain's own ``N (1 - rho) / (1 + rho)``; a
    chain set apart from the others raises R-hat."""
    az = pytest.importorskip("arviz")
    rng = np.random.default_rng(0)
    for rho in (0.0, 0.6, 0.9):
        x = _ar1(rng, 4, 2000, rho)
        ours_r, ours_e = split_rhat(x), effective_draws(x)
        ours_t = tail_effective_draws(x)
        for v in range(3):
            assert ours_r[v] == pytest.approx(float(az.rhat(x[:, :, v], method="split")), abs=1e-6)
            assert ours_e[v] == pytest.approx(float(az.ess(x[:, :, v], method="mean")), rel=1e-6)
            assert ours_t[v] == pytest.approx(float(az.ess(x[:, :, v], method="tail")), rel=1e-6)
        assert np.median(ours_e) == pytest.approx(8000 * (1 - rho) / (1 + rho), rel=0.2)
    # many values: taken in chunks, the same numbers
    from engine.infer.sampler import _effective_draws
    many = _ar1(rng, 4, 1000, 0.6).repeat(200, axis=2)[..., :590] + rng.normal(size=590) * 1e-3
    np.testing.assert_array_equal(effective_draws(many.reshape(4, 1000, 59, 10)),
                                  _effective_draws(many).reshape(59, 10))
    # the tails in chunks as well, each value's quantiles its own; a value held still
    # (an item nobody answered) counts every draw, as ArviZ does
    many[:, :, 7] = 0.5
    tails = tail_effective_draws(many)
    np.testing.assert_array_equal(tails[:8], tail_effective_draws(many[:, :, :8]))
    assert tails[7] == 4000 and tails[3] == pytest.approx(
        float(az.ess(many[:, :, 3], method="tail")), rel=1e-6)
    # an odd number of draws: each chain split as ArviZ splits it (the middle draw left out)
    odd = _ar1(rng, 4, 1999, 0.6)
    assert effective_draws(odd)[0] == pytest.approx(float(az.ess(odd[:, :, 0], method="mean")),
                                                    rel=1e-9)
    assert split_rhat(odd)[0] == pytest.approx(float(az.rhat(odd[:, :, 0], method="split")),
                                               abs=1e-9)
    apart = _ar1(rng, 4, 1000, 0.5, shift=np.array([0.0, 0.0, 0.0, 1.0]))
    assert split_rhat(apart).min() > 1.05 > split_rhat(_ar1(rng, 4, 1000, 0.5)).max()


def test_sd_standard_error_matches_arviz_and_normal_theory():
    """The sd's Monte Carlo error against ArviZ's definition (``mcse(method="sd")``: ArviZ's
    own where it runs, else the definition written out over ``az.ess``) and, for independent
    normal draws, against ``sd / sqrt(2 N)``; a long tail (one chain's far excursion) shows
    in it."""
    az = pytest.importorskip("arviz")
    import xarray as xr

    from engine.infer.sampler import sd_standard_error
    from tests.engine.infer._arviz_reference import mcse_sd

    rng = np.random.default_rng(3)
    x = _ar1(rng, 4, 2000, 0.6)
    x[..., 2] = np.exp(x[..., 2])  # a skewed value
    ours = sd_standard_error(x)
    data = xr.Dataset({"v": (("chain", "draw", "value"), x), "s": (("chain", "draw"), x[..., 0] * 2)})
    ref = mcse_sd(az, data)
    np.testing.assert_allclose(ours, ref["v"].values, rtol=1e-6)
    assert sd_standard_error(x[..., 0] * 2).shape == () and float(
        sd_standard_error(x[..., 0] * 2)) == pytest.approx(float(ref["s"]), rel=1e-6)
    try:
        own = az.mcse(data, method="sd")
    except TypeError:  # numpy >= 2.5: ArviZ's per-entry loop fails; the written-out one stands
        own = None
    if own is not None:
        np.testing.assert_allclose(ref["v"].values, own["v"].values, rtol=1e-12)
    iid = rng.normal(size=(4, 5000, 200)) * 2.0
    assert np.median(sd_standard_error(iid)) == pytest.approx(2.0 / np.sqrt(2 * 20000), rel=0.05)
    tail = rng.normal(size=(4, 2000, 1))
    tail[0, 1000:1050] += 25.0  # fifty far draws in one chain
    assert sd_standard_error(tail)[0] > 10 * sd_standard_error(rng.normal(size=(4, 2000, 1)))[0]
    assert sd_standard_error(np.ones((2, 100, 3))).tolist() == [0.0, 0.0, 0.0]
    x[0, 3, 1] = np.nan  # a NaN draw: no error, as in ArviZ
    got = sd_standard_error(x)
    assert np.isnan(got[1]) and got[0] == ours[0]
    # many values, taken in chunks: each value's error as on its own
    many = _ar1(rng, 4, 1000, 0.6).repeat(400, axis=2)[..., :1100] + rng.normal(size=1100) * 1e-3
    chunked = sd_standard_error(many.reshape(4, 1000, 110, 10)).reshape(-1)  # 1,048 a chunk
    np.testing.assert_allclose(chunked[[0, 300, 1099]], [sd_standard_error(many[:, :, [v]])[0]
                                                          for v in (0, 300, 1099)], rtol=1e-9)


def test_sampled_items_match_a_scipy_integrated_posterior():
    """Where importance sampling is off, the sampler's item means and sds match the scipy
    grid's within Monte Carlo error, where the mode and its curvature do not."""
    y, mean, sd, ends = skewed_case()
    spec = get_model("1pl", prior="vague")
    guide, cross, info = fit_marginal(spec, y, MarginalSettings(importance_max_params=0, **_SHORT))
    record = info["item_moments"]
    assert record["method"] == "sampled" and record["sampler"]["rhat_max"] < 1.05
    assert record["sampler"]["ess_min"] > 300
    mc = 3.5 * sd / np.sqrt(record["sampler"]["ess_min"])  # 3.5 Monte Carlo sds of a mean
    np.testing.assert_array_less(np.abs(guide.loc["difficulty"] - mean), mc)
    np.testing.assert_allclose(np.exp(guide.log_scale["difficulty"]), sd, rtol=0.1)
    mode = info["item_mode"][:, 0]
    assert abs(mode[0] - mean[0]) > 0.15 * sd[0] > mc[0]  # the regime: the mode is off
    # the 90% interval: the draws' quantiles, asymmetric about the mean as the grid's are,
    # and the item table's where the fit sampled
    sampled = info["item_quantiles"][:, :, 0]
    assert (np.abs(sampled - ends) < 0.15 * sd).all()
    assert (ends[1] - mean) / (mean - ends[0]) == pytest.approx(
        (sampled[1] - guide.loc["difficulty"]) / (guide.loc["difficulty"] - sampled[0]), abs=0.15)
    table = summary_columns(spec, guide, "item", cross, {"difficulty": sampled})
    np.testing.assert_allclose(table["difficulty_q05"], sampled[0], rtol=1e-6)
    np.testing.assert_allclose(table["difficulty_q95"], sampled[1], rtol=1e-6)
    gaussian = summary_columns(spec, guide, "item", cross)
    assert np.abs(gaussian["difficulty_q05"] - sampled[0]).max() > 0.1 * sd.max()


def _middling_2pl(num_subjects: int = 600) -> np.ndarray:
    rng = np.random.default_rng(4)
    theta, b, a = (rng.normal(size=num_subjects), np.linspace(-1, 1, 5),
                   np.exp(0.2 * rng.normal(size=5)))
    p = 1 / (1 + np.exp(-a * (theta[:, None] - b)))
    return (rng.random((num_subjects, 5)) < p).astype(np.int8)


def test_sampled_items_and_abilities_agree_with_importance_sampling():
    """A 2PL of 600 x 5 (ten item values, both symmetries moving), items of middling
    difficulty: importance sampling keeps thousands of effective draws there, so both are
    the same posterior; the sampler's item means and sds and the abilities' means and sds
    agree with it within Monte Carlo error. (A hard item of low discrimination has a long
    tail that importance sampling from the Laplace approximation under-reaches: with
    ``b ~ N(0, 1)`` at seed 4 its difficulty came out 3.04, sd 0.98, where the sampler and
    NUTS on the same marginal posterior (``benchmarks/nuts_marginal.py``) give 3.28 and 1.5.)"""
    y = _middling_2pl()
    spec = get_model("2pl", prior="vague")
    ref, ref_cross, ref_info = fit_marginal(spec, y, MarginalSettings())
    assert ref_info["item_moments"]["method"] == "importance"
    got, cross, info = fit_marginal(spec, y, MarginalSettings(importance_max_params=0, **_SHORT))
    sampler = info["item_moments"]["sampler"]
    assert info["item_moments"]["method"] == "sampled" and sampler["rhat_max"] < 1.05
    assert set(sampler["acceptance"]) >= {"shift", "scale"}
    ref_sds, sds = (within_owner_scales(spec, g, "item", c) | {
        "ability": np.exp(np.asarray(g.log_scale["ability"], np.float64))}
        for g, c in ((ref, ref_cross), (got, cross)))
    mc = 3.5 / np.sqrt(sampler["ess_min"])  # Monte Carlo sds of a mean, in posterior sds
    for block in ("difficulty", "discrimination", "ability"):
        z = np.abs(np.asarray(got.loc[block]) - np.asarray(ref.loc[block])) / ref_sds[block]
        assert z.max() < mc + 0.02, block
        np.testing.assert_allclose(sds[block], ref_sds[block], rtol=0.1, err_msg=block)
    # the reported discrimination: the draws' mean and sd of exp(log a), against the
    # log-normal moments of importance sampling's Gaussian; the difficulty's is its mean
    drawn = info["item_constrained"]
    np.testing.assert_allclose(drawn[0, :, 0], got.loc["difficulty"], atol=1e-5)
    ref_table = summary_columns(spec, ref, "item", ref_cross)
    table = summary_columns(spec, got, "item", cross, moments={"discrimination": drawn[:, :, 1]})
    np.testing.assert_array_equal(table["discrimination_rhat"], drawn[2, :, 1].astype(np.float32))
    np.testing.assert_array_equal(table["discrimination_mcse_sd"], drawn[4, :, 1].astype(np.float32))
    assert (table["discrimination_mcse_sd"] > 0).all() and (
        table["discrimination_mcse_sd"] < 0.2 * table["discrimination_sd"]).all()
    assert table["discrimination_rhat"].max() <= sampler["rhat_max"] + 1e-4
    assert table["discrimination_ess"].min() >= sampler["ess_min"] - 0.1
    np.testing.assert_array_equal(table["discrimination_mean"], drawn[0, :, 1].astype(np.float32))
    np.testing.assert_array_equal(table["discrimination_sd"], drawn[1, :, 1].astype(np.float32))
    z = np.abs(table["discrimination_mean"] - ref_table["discrimination_mean"]) / ref_table[
        "discrimination_sd"]
    assert z.max() < mc + 0.02
    np.testing.assert_allclose(table["discrimination_sd"], ref_table["discrimination_sd"], rtol=0.1)
    assert (table["discrimination_mean"] > np.exp(got.loc["discrimination"])).all()  # Jensen


def test_the_pilot_keeps_the_laplace_approximation_where_the_draws_agree_with_it():
    """Both sides of the switch. With 3,000 subjects the middling 2PL's pilot draws sit on
    its Laplace approximation, so the fit reports that (and says why); with 600 the
    discriminations' means sit a median 0.3 sd below the mode (the pull of the prior's
    volume, which importance sampling corrects there), and a short 3PL test's are far off
    it (guessing and difficulty bend round each other)."""
    spec = get_model("2pl", prior="vague")
    _, _, info = fit_marginal(spec, _middling_2pl(3000), MarginalSettings(importance_max_params=0))
    record = info["item_moments"]
    assert record["method"] == "laplace" and record["abilities"]["method"] == "laplace draws"
    pilot = record["sampler"]["pilot"]
    assert pilot["agrees"] and "agree with the Laplace" in record["sampler"]["because"]
    assert max(pilot["shift_median"].values()) < 0.25
    # the pilot is the warm-up's; only its kept draws are cut short here
    _, _, info = fit_marginal(spec, _middling_2pl(), MarginalSettings(importance_max_params=0,
                                                                      sampler_draws=200))
    assert info["item_moments"]["method"] == "sampled"
    assert info["item_moments"]["sampler"]["pilot"]["shift_median"]["discrimination"] > 0.25
    rng = np.random.default_rng(0)
    theta, b, a = rng.normal(size=500), rng.normal(size=8), np.exp(0.3 * rng.normal(size=8))
    c = rng.beta(2, 8, 8)
    p = c + (1 - c) / (1 + np.exp(-a * (theta[:, None] - b)))
    y = (rng.random(p.shape) < p).astype(np.int8)
    _, _, info = fit_marginal(get_model("3pl"), y, MarginalSettings(sampler_warmup=200,
                                                                    sampler_draws=200))
    pilot = info["item_moments"]["sampler"]["pilot"]
    assert not pilot["agrees"] and max(pilot["shift_median"].values()) > 0.3


def test_an_item_nobody_answered_stays_put_and_a_broken_covariance_is_mended():
    """An item set aside (every response missing, as the fit does for constant items) is
    held at its value while the others are sampled; covariance blocks that are not positive
    definite or not finite still give a factor (the clean CI run that found this crashed in
    ``np.linalg.cholesky``)."""
    from engine.infer.sampler import _factor

    y = np.concatenate([_middling_2pl(), np.full((600, 1), -1, np.int8)], axis=1)
    guide, _, info = fit_marginal(get_model("2pl", prior="vague"), y,
                                  MarginalSettings(importance_max_params=0, **_SHORT))
    assert info["item_moments"]["method"] == "sampled"
    np.testing.assert_array_equal(info["item_quantiles"][0, 5], info["item_quantiles"][1, 5])
    assert guide.loc["difficulty"][5] == pytest.approx(info["item_mode"][5, 0], abs=1e-6)
    blocks = np.array([[[1.0, 2.0], [2.0, 1.0]], [[np.nan, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]])
    factor = _factor(blocks)
    assert np.isfinite(factor).all()
    np.testing.assert_allclose(factor[0] @ factor[0].T, [[1.5, 1.5], [1.5, 1.5]], atol=1e-6)


def test_a_stalled_mode_search_is_sampled_from_its_best_pass():
    """A mode search that stops for want of progress (here forced: every pass must gain all
    of the objective, so it stops after two) reports no Laplace approximation at a point
    that is not the mode: the posterior is sampled from its best pass whatever the pilot
    finds, the fit counts as converged where the chains mix (``mode_converged`` false), and
    its means and sds are those sampled from the converged mode, within Monte Carlo error."""
    y = _middling_2pl()
    spec = get_model("2pl", prior="population")
    ref, _, ref_info = fit_marginal(spec, y, MarginalSettings(importance_max_params=0, **_SHORT))
    assert ref_info["mode_converged"] and ref_info["item_moments"]["method"] == "sampled"
    short = {k: v for k, v in _SHORT.items() if k != "sampler_check_laplace"}
    got, _, info = fit_marginal(spec, y, MarginalSettings(
        importance_max_params=0, tol=1.0, divergence_patience=2, **short))
    assert info["diverged"]["at_pass"] == 3 and not info["mode_converged"]
    record = info["item_moments"]
    assert record["method"] == "sampled" and info["converged"]
    assert "best pass" in record["sampler"]["started_at"] and "pilot" in record["sampler"]
    sampler = record["sampler"]
    assert sampler["rhat_max"] < 1.1  # 1.02-1.07 between runs (XLA's rounding); the means'
    # check below scales with the chains' effective draws
    ref_mode, mode = ref_info["item_mode"], info["item_mode"]
    ref_sd = np.sqrt(np.diagonal(ref_info["item_covariance"], axis1=1, axis2=2))
    assert (np.abs(mode - ref_mode) / ref_sd).max() > 0.1  # started away from the mode
    mc = 3.5 / np.sqrt(min(sampler["ess_min"], ref_info["item_moments"]["sampler"]["ess_min"]))
    for j, block in enumerate(("difficulty", "discrimination")):
        z = np.abs(np.asarray(got.loc[block]) - np.asarray(ref.loc[block])) / ref_sd[:, j]
        assert z.max() < np.sqrt(2) * mc + 0.02, block
        np.testing.assert_allclose(np.exp(got.log_scale[block]), np.exp(ref.log_scale[block]),
                                   rtol=0.15, err_msg=block)


def test_items_nobody_answered_leave_a_pooled_prior_as_if_they_were_not_there():
    """Under pooled priors an item nobody answered has only its prior, so it integrates out:
    the other items' and the pool's posterior are those of the data without it. Held still
    at one value with its prior terms counted, six such items pinned the pool's precision
    to them and halved the answered items' sds (the 2PL's SBC at 30 x 20, where a quarter of
    the items are set aside as constant, failed on it). The sampler's means and sds with
    six unanswered columns added match its own without them, within Monte Carlo error,
    the pool's hyper-parameters too."""
    y = _middling_2pl(300)
    spec = get_model("2pl", prior="population")
    settings = MarginalSettings(importance_max_params=0, **_SHORT)
    ref, _, ref_info = fit_marginal(spec, y, settings)
    padded = np.concatenate([y, np.full((len(y), 6), -1, np.int8)], axis=1)
    got, _, info = fit_marginal(spec, padded, settings)
    for i in (ref_info, info):
        assert i["item_moments"]["method"] == "sampled"
    ess = min(ref_info["item_moments"]["sampler"]["ess_min"],
              info["item_moments"]["sampler"]["ess_min"])
    mc = np.sqrt(2) * 3.5 / np.sqrt(ess)  # two runs' Monte Carlo error, in posterior sds
    for block in ("difficulty", "discrimination"):
        ref_sd = np.exp(np.asarray(ref.log_scale[block], np.float64))
        sd = np.exp(np.asarray(got.log_scale[block], np.float64))[:5]
        z = np.abs(np.asarray(got.loc[block])[:5] - np.asarray(ref.loc[block])) / ref_sd
        assert z.max() < mc + 0.05, block
        np.testing.assert_allclose(sd, ref_sd, rtol=0.2, err_msg=block)
    # the pools' locations and log precisions (held items: the locations' sds 0.41 and 0.46
    # of these, the log precisions 1.3 and 1.3 sds off)
    for name in ("mu_difficulty", "u_difficulty", "mu_discrimination", "u_discrimination"):
        ref_sd, sd = (float(np.exp(g.log_scale[name])) for g in (ref, got))
        assert abs(float(got.loc[name]) - float(ref.loc[name])) < (mc + 0.05) * ref_sd, name
        assert 0.75 < sd / ref_sd < 1.33, name


def test_the_kept_draws_are_extended_while_some_value_keeps_too_few_effective_draws():
    """Under ``sampler_ess_min`` effective draws (here a floor no chain reaches), the kept
    draws are extended by as many again, ``sampler_extend_max`` times, each extension
    recorded with its reason, and the worst value's effective draws grow with them; with
    the floor met (0) or no extensions allowed, the chains stop at ``sampler_draws``, and
    where another extension would take the sampler over ``sampler_cells_max`` cells (the
    cost bound that decides whether a fit is sampled at all) it stops and says so."""
    from dataclasses import replace

    from engine.infer.sampler import sample_items

    spec = get_model("1pl", prior="vague")
    patterns = ((np.arange(32)[:, None] >> np.arange(5)) & 1).astype(np.float64)
    counts = np.bincount(np.random.default_rng(3).integers(0, 32, 400), minlength=32) * 1.0
    grid = np.linspace(-4.0, 4.0, 40)
    log_base = -0.5 * grid ** 2 - 0.5 * np.log(2 * np.pi) + np.log(grid[1] - grid[0])
    base = MarginalSettings(sampler_warmup=100, sampler_draws=100, sampler_check_laplace=False)
    records = {}
    for name, floor, most, sweep in (("met", 0.0, 2, None), ("short", 1e9, 2, None),
                                     ("none allowed", 1e9, 0, None), ("dear", 1e9, 2, 1e8)):
        _, records[name] = sample_items(
            spec, np.zeros((5, 1)), np.zeros(0), np.full((5, 1, 1), 0.01), np.zeros((0, 0)),
            grid, log_base, patterns, 1 - patterns, counts,
            replace(base, sampler_ess_min=floor, sampler_extend_max=most), seed=2,
            sweep_cells=sweep)
    met, short, none, dear = (records[k] for k in ("met", "short", "none allowed", "dear"))
    assert (met["draws"], met["extended"], none["draws"], none["extended"]) == (100, [], 100, [])
    # 4 chains x (100 warm-up + 200 kept sweeps) x 1e8 cells at least (more on a widened
    # grid: a sweep's cost grows with its points): over the bound's 5e10
    assert (dear["draws"], dear["extended"]) == (100, []) and dear["ess_min"] == met["ess_min"]
    head, cells, tail = dear["not_extended"].partition(" draws would take the sampler to ")
    bulk, tail_ess = re.fullmatch(r"(\d+) effective draws under 1e\+09; (\d+) tail effective "
                                  r"draws under 1e\+09: another 100", head).groups()
    assert abs(int(bulk) - dear["ess_min"]) <= 1 and abs(int(tail_ess) - dear["ess_tail_min"]) <= 1
    assert float(tail.split(" cells,")[0]) >= 1.2e11
    assert tail.endswith(" cells, over sampler_cells_max") and cells
    assert short["draws"] == 300 and [e["at_draws"] for e in short["extended"]] == [100, 200]
    assert all("effective draws under 1e+09" in e["because"] for e in short["extended"])
    assert all("tail effective draws under 1e+09" in e["because"] for e in short["extended"])
    assert short["ess_min"] > 2 * met["ess_min"]  # three times the draws: ~3x the ESS


def test_another_data_set_of_the_same_sizes_runs_the_same_chains():
    """The chains' program takes the data (grid, patterns, counts, each subject's pattern) as
    arguments, not as constants, and pads the subjects to a bucketed count: a second data
    set with other answers, another grid and 10 fewer subjects compiles nothing (before, a
    new program each time: 3 s of a 300 x 150 fit's 10). Its draws are its own: the
    abilities' moments and the items' means follow its counts."""
    from engine.compile_cache import count_compiles
    from engine.infer.sampler import sample_items

    spec = get_model("1pl", prior="vague")
    patterns = ((np.arange(32)[:, None] >> np.arange(5)) & 1).astype(np.float64)  # all of 2^5
    settings = MarginalSettings(sampler_warmup=100, sampler_draws=100, sampler_check_laplace=False)
    out = []
    for seed, (lo, subjects) in enumerate([(-4.0, 600), (-3.5, 590)]):
        rng = np.random.default_rng(seed)
        counts = np.bincount(rng.integers(0, 32, subjects), minlength=32).astype(np.float64)
        grid = np.linspace(lo, -lo, 40)
        log_base = -0.5 * grid ** 2 - 0.5 * np.log(2 * np.pi) + np.log(grid[1] - grid[0])
        x = rng.normal(0, 0.3, size=(5, 1))
        with count_compiles() as compiles:
            moments, record = sample_items(spec, x, np.zeros(0), np.full((5, 1, 1), 0.01),
                                           np.zeros((0, 0)), grid, log_base, patterns,
                                           1 - patterns, counts, settings, seed=seed)
        assert record["method"] == "sampled"
        out.append((moments, compiles.programs))
    assert out[0][1] > 0 and out[1][1] == 0  # the second one compiled nothing
    (first, _), (second, _) = out
    assert not np.allclose(first[0], second[0])  # the items' means: each its own data
    assert not np.allclose(first[4], second[4])  # the patterns' ability means
    assert np.isfinite(second[4]).all() and (second[5] > 0).all()


def test_the_items_are_padded_to_a_bucketed_number_and_the_padding_is_inert():
    """The chains' program pads the items with items nobody answers (held still, their
    prior terms and their zeros left out) to a bucketed number: boards of 6 and 7 items
    run one program, and the draws are those of the unpadded program (JAX's partitionable
    random bits give the answered items the same numbers), here to the bit."""
    from dataclasses import replace

    from engine.compile_cache import count_compiles
    from engine.infer.sampler import sample_items

    spec = get_model("1pl", prior="vague")
    settings = MarginalSettings(sampler_warmup=200, sampler_draws=400, sampler_check_laplace=False)
    grid = np.linspace(-4.0, 4.0, 40)
    log_base = -0.5 * grid ** 2 - 0.5 * np.log(2 * np.pi) + np.log(grid[1] - grid[0])

    def run(n, bucket, seed=1):
        rng = np.random.default_rng(n)
        patterns = ((np.arange(64)[:, None] >> np.arange(n)) & 1).astype(np.float64)
        counts = np.bincount(rng.integers(0, 64, 500), minlength=64).astype(np.float64)
        with count_compiles() as compiles:
            moments, record = sample_items(
                spec, rng.normal(0, 0.3, (n, 1)), np.zeros(0), np.full((n, 1, 1), 0.01),
                np.zeros((0, 0)), grid, log_base, patterns, 1 - patterns, counts,
                replace(settings, bucket_patterns=bucket), seed=seed)
        assert record["method"] == "sampled", record
        return moments, compiles.programs

    padded, _ = run(6, True)
    plain, _ = run(6, False)
    assert padded[0].shape == (6, 1) and padded[2].shape == (6, 1, 1)
    for a, b in zip(padded[:8], plain[:8]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    for field in ("xs", "w", "grid", "y1", "y0"):  # the kept draws, for the ability intervals
        np.testing.assert_allclose(getattr(padded[8], field), getattr(plain[8], field),
                                   rtol=1e-6, atol=1e-9)
    seven, programs = run(7, True)
    assert programs == 0 and seven[0].shape == (7, 1)  # 6 and 7 items: one program of 8
    assert run(7, False)[1] > 0  # unpadded, 7 items are another program


def test_the_pilot_is_read_over_the_items_someone_answered():
    """Items nobody answered stay put in the chains (sd 0). Counted in the pilot's medians
    they made them 0 wherever most items were set aside, and such a pilot never agreed:
    a 10 x 550 1PL with 400 constant items was sampled in full (17 s) where its 150
    answered items' draws sat on the Laplace approximation (5 s now)."""
    from engine.infer.sampler import _against_laplace

    rng = np.random.default_rng(0)
    n, k, answered = 10, 2, np.arange(10) < 4  # six of ten items set aside
    mode, sd = rng.normal(size=(n, k)), np.full((n, k), 0.5)
    dx = np.broadcast_to(mode, (2, 500, n, k)).copy()
    dx[:, :, answered] += sd[answered] * rng.standard_normal((2, 500, 4, k))
    pilot = _against_laplace(dx, mode, sd, ["difficulty", "discrimination"], answered)
    assert pilot["agrees"], pilot
    assert all(0.9 < r < 1.1 for r in pilot["sd_ratio_median"].values())
    everything = _against_laplace(dx, mode, sd, ["difficulty", "discrimination"],
                                  np.ones(n, bool))  # as before: the set-aside items counted
    assert not everything["agrees"] and everything["sd_ratio_median"]["difficulty"] == 0.0
    dx[:, :, answered] += 0.5 * sd[answered]  # draws half a Laplace sd off: they disagree
    assert not _against_laplace(dx, mode, sd, ["difficulty", "discrimination"],
                                answered)["agrees"]
    # no fitted item to judge (every answered one set aside): no agreement, and a record
    # without the NaNs a median of nothing gave (fit.json is strict JSON)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        none = _against_laplace(dx, mode, sd, ["difficulty", "discrimination"], np.zeros(n, bool))
    assert not none["agrees"] and none["shift_median"] == {}
    json.dumps(none, allow_nan=False)


@pytest.mark.parametrize("model", ["2pl", "3pl"])
def test_set_aside_items_are_sampled_with_their_answers(model):
    """Where the items' posterior is sampled, items every subject answered alike are sampled
    with their answers (the 2PL's started from their grid read-out; the 3PL's, which has no
    grid read-out, from the pool's prior), so the pool, the other items and the abilities
    see them, and every value agrees with NUTS's (every item with its data): 60 x 10 with
    one item all right and one all wrong, within 0.25 NUTS sd and sd ratio 0.75-1.25 (2PL
    measured 0.09 and 0.94-1.11). With them set aside from the sampler (the pool fitted
    without them) the 2PL's answered difficulties were up to 0.32 NUTS sd off and 0.75 as
    wide; the 3PL held them at one value (sd 0, the same difficulty for both)."""
    from engine.api import constant_columns, fit_nuts, set_aside_constant
    from engine.infer.marginal import fit_marginal_result
    from engine.infer.nuts import NutsSettings
    from engine.infer.settings import FitSettings

    rng = np.random.default_rng(3)
    theta, b, a = rng.normal(size=60), rng.normal(size=10), np.exp(0.3 * rng.normal(size=10))
    y = (rng.random((60, 10)) < 1 / (1 + np.exp(-a * (theta[:, None] - b)))).astype(np.int8)
    y[:, 0], y[:, 1] = 1, 0
    const = constant_columns(y)
    spec = get_model(model, prior="population")
    res = fit_marginal_result(spec, set_aside_constant(y), FitSettings(seed=0, progress=False),
                              MarginalSettings(importance_max_params=0, sampler_check_laplace=False),
                              aside=(np.flatnonzero(const), y[:, const]))
    q = res.extra["quadrature"]
    assert q["set_aside"]["items"] == 2
    assert q["set_aside"]["method"] == "sampled with their answers"
    assert q["item_moments"]["sampler"]["set_aside"] == "sampled with their answers"
    exact = fit_nuts(y, model, NutsSettings(seed=0))
    assert exact.converged
    def scales(r):  # unconstrained sds; the items' within-item marginal ones
        out = {k: np.exp(np.asarray(v, np.float64)) for k, v in r.guide.log_scale.items()}
        return out | within_owner_scales(r.spec, r.guide, "item", r.cross)

    sds = scales(res), scales(exact)
    for block in ["ability"] + [p.name for p in spec.by_owner("item")]:
        got, want = (np.asarray(r.guide.loc[block], np.float64) for r in (res, exact))
        got_sd, sd = (np.asarray(s[block], np.float64) for s in sds)
        assert (np.abs(got - want) < 0.25 * sd).all(), (block, np.abs(got - want) / sd)
        assert (np.abs(got_sd / sd - 1) < 0.25).all(), (block, got_sd / sd)


def test_set_aside_items_keep_the_chains_running_and_the_pilot_judges_the_fitted_ones():
    """Where the fit set items aside, its Laplace approximation is the pool's without them,
    so the chains run on whatever the pilot finds, and the pilot's record compares the
    items the fit fitted. On a 1PL leaderboard of 10 x 550 with 400 items every subject got
    wrong, those 400, counted, agreed with their read-out and outvoted the 150 answered
    items, so the fit kept the Laplace approximation: answered items' sds 0.77 of NUTS's,
    abilities up to 0.60 NUTS sd off. Now the abilities agree with NUTS (4 x 1,000 draws,
    R-hat 1.017) within 0.25 sd (measured 0.08), the items' sds within 0.8-1.25 (measured
    0.93-1.06)."""
    from engine.api import fit, fit_nuts
    from engine.infer.nuts import NutsSettings
    from engine.infer.settings import FitSettings

    from tests.cluster.conftest import simulate_2pl

    # the bootstrap test's leaderboard (tests/cluster/test_bootstrap.py)
    y = np.concatenate([simulate_2pl(10, 150, seed=4), np.zeros((10, 400), np.int8)], axis=1)
    y[0, -1] = -1
    res = fit(y, "1pl", FitSettings(seed=0, nuts_first_subjects=0))  # the quadrature fit
    sampler = res.extra["quadrature"]["item_moments"]["sampler"]
    assert sampler["method"] == "sampled" and sampler["set_aside"] == "sampled with their answers"
    assert sampler["pilot"]["agrees"] is False
    exact = fit_nuts(y, "1pl", NutsSettings(seed=0))
    sd = np.exp(np.asarray(exact.guide.log_scale["ability"], np.float64))
    z = np.abs(res.means()["ability"] - exact.means()["ability"]) / sd
    assert z.max() < 0.25
    ratio = res.sds()["difficulty"] / exact.sds()["difficulty"]
    assert ((ratio > 0.8) & (ratio < 1.25)).all()


def test_a_grid_that_cuts_the_posterior_off_is_widened(monkeypatch):
    """The sampler's ability grid comes from the patterns' posteriors at the items' mode;
    where the sampled items put some pattern's posterior against the grid's end (more than
    ``EDGE_MASS`` on its end points), the grid is widened and the draws are those of a grid
    that was wide from the start, within Monte Carlo error. Held to the narrow grid, the
    extreme patterns' abilities are pulled in by a third or more of their sd: the case
    this guards."""
    from engine.infer import sampler
    from engine.infer.sampler import sample_items

    spec = get_model("1pl", prior="vague")
    settings = MarginalSettings(**_SHORT)
    rng = np.random.default_rng(3)
    n = 6
    patterns = ((np.arange(64)[:, None] >> np.arange(n)) & 1).astype(np.float64)
    counts = np.bincount(rng.integers(0, 64, 400), minlength=64).astype(np.float64)
    x0 = np.linspace(-1.0, 1.0, n)[:, None]

    def run(lo, hi, grid_max=None):
        grid = np.arange(lo, hi + 1e-9, 0.1)
        log_base = -0.5 * grid ** 2 - 0.5 * np.log(2 * np.pi) + np.log(0.1)
        moments, record = sample_items(spec, x0, np.zeros(0), np.full((n, 1, 1), 0.05),
                                       np.zeros((0, 0)), grid, log_base, patterns,
                                       1 - patterns, counts, settings, seed=2,
                                       grid_max=grid_max)
        assert record["method"] == "sampled", record
        sd = np.sqrt(moments[5])
        return moments[4], sd, record

    wide_mean, wide_sd, wide = run(-6.0, 6.0)
    assert "grid_widened" not in wide and wide["grid_edge_mass"] < sampler.EDGE_MASS
    mean, sd, narrow = run(-1.5, 1.5)
    (first, *_) = narrow["grid_widened"]
    assert first["at"].startswith("warm-up call") and first["edge_mass"] > sampler.EDGE_MASS
    assert first["span"][0] < -3.0 and first["span"][1] > 3.0
    assert narrow["grid_edge_mass"] < sampler.EDGE_MASS
    np.testing.assert_allclose(mean, wide_mean, atol=0.02)  # measured 0.0003
    np.testing.assert_allclose(sd, wide_sd, rtol=0.02)
    # within the caller's grid_max (its cells bound) the widened grid is coarser
    mean, sd, capped = run(-1.5, 1.5, grid_max=48)
    assert max(w["points"] for w in narrow["grid_widened"]) > 48
    assert all(w["points"] <= 48 for w in capped["grid_widened"])
    assert capped["grid_widened"][-1]["spacing"] > 0.1
    np.testing.assert_allclose(mean, wide_mean, atol=0.05)
    monkeypatch.setattr(sampler, "MAX_WIDEN", 0)  # the grid as given
    cut_mean, cut_sd, cut = run(-1.5, 1.5)
    assert "grid_widened" not in cut and cut["grid_edge_mass"] > 0.01
    off = np.abs(cut_mean - wide_mean) / wide_sd
    assert off.max() > 0.3  # the all-right and all-wrong answer sheets (measured 0.63)


def test_padding_patterns_do_not_widen_the_grid():
    """Patterns counted zero times (the padding to a bucketed number answers nothing, so its
    posterior is the prior's) are not read for the grid's ends: on [-4, 4] the prior has
    2.7e-5 of its mass on the end points, over ``EDGE_MASS``, while the answered 30-item
    sheets stay far inside."""
    from engine.infer import sampler
    from engine.infer.sampler import sample_items

    spec = get_model("1pl", prior="vague")
    rng = np.random.default_rng(5)
    n = 30
    answered = (rng.random((20, n)) < 0.5).astype(np.float64)
    y1 = np.concatenate([answered, np.zeros((1, n))])
    y0 = np.concatenate([1 - answered, np.zeros((1, n))])  # the padding: nothing answered
    counts = np.concatenate([np.ones(20), [0.0]])
    grid = np.arange(-4.0, 4.0 + 1e-9, 0.1)
    log_base = -0.5 * grid ** 2 - 0.5 * np.log(2 * np.pi) + np.log(0.1)
    prior_edge = 2 * np.exp(log_base[0])
    assert prior_edge > sampler.EDGE_MASS
    _, record = sample_items(spec, np.linspace(-1.0, 1.0, n)[:, None], np.zeros(0),
                             np.full((n, 1, 1), 0.05), np.zeros((0, 0)), grid, log_base, y1, y0,
                             counts, MarginalSettings(**_SHORT), seed=0)
    assert record["method"] == "sampled", record
    assert "grid_widened" not in record and record["grid_points"] == grid.size
    assert 0.0 < record["grid_edge_mass"] < sampler.EDGE_MASS


def test_the_sampler_is_given_the_points_its_cells_bound_allows(monkeypatch):
    """``_sampled`` hands ``sample_items`` the most points a widened grid may have: the
    grid's own where the chains already cost nearly ``sampler_cells_max``, a bucketed size
    within the bound where there is room, ``sampler_grid_max`` where the bound is far off."""
    from engine.infer import sampler
    from engine.infer.fit import bucket_floor
    from engine.infer.marginal import _Quadrature, _sampled

    spec = get_model("1pl", prior="vague")
    n = 6
    patterns = ((np.arange(64)[:, None] >> np.arange(n)) & 1).astype(np.float64)
    counts = np.bincount(np.random.default_rng(3).integers(0, 64, 400),
                         minlength=64).astype(np.float64)
    quad = _Quadrature(21, 64)
    quad.mean, quad.sd = np.linspace(-2, 2, 64), np.full(64, 0.5)
    given = []

    def spy(spec, x, g, cov, g_cov, grid, *args, grid_max=None, **kw):
        given.append((grid.size, grid_max))
        return None, {"method": "not sampled"}

    monkeypatch.setattr(sampler, "sample_items", spy)

    def call(bound):
        return _sampled(spec, np.linspace(-1.0, 1.0, n)[:, None], np.zeros(0),
                        np.full((n, 1, 1), 0.05), np.zeros((0, 0)), quad, patterns,
                        np.ones_like(patterns), counts, MarginalSettings(sampler_cells_max=bound))

    _, record = call(1)  # over any bound: the cells the chains cost, in the reason
    cells = float(record["because"].split()[0])
    call(10 ** 15)
    points, cap = given[-1]
    assert cap == MarginalSettings().sampler_grid_max
    call(int(cells * 1.01))
    assert given[-1] == (points, points)  # no room: the grid's own size (coarser if widened)
    call(int(cells * 2.7))
    assert given[-1][1] == bucket_floor(int(points * 2.7), 2) > points
