import warnings

import jax
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import expit
from scipy.stats import lognorm, norm

from engine.infer.guide import GuideState
from engine.models import get_model
from engine.readout.posterior import Z90, draw_posterior, summarize


@pytest.fixture
def guide():
    rng = np.random.default_rng(1)
    loc = {"ability": rng.normal(size=5).astype(np.float32),
           "difficulty": rng.normal(size=4).astype(np.float32),
           "discrimination": rng.normal(0, 0.3, size=4).astype(np.float32)}
    log_scale = {k: np.log(rng.uniform(0.1, 0.5, size=v.shape)).astype(np.float32)
                 for k, v in loc.items()}
    return GuideState(loc, log_scale)


def test_summaries_match_scipy_quantiles(guide):
    spec = get_model("2pl", prior="vague")
    items = summarize(spec, guide, "item")
    sd = np.exp(guide.log_scale["discrimination"])
    loc = guide.loc["discrimination"]
    np.testing.assert_allclose(items["discrimination_q95"], lognorm.ppf(0.95, sd, scale=np.exp(loc)),
                               rtol=1e-4)
    # the posterior mean and sd of the log-normal value, not exp(loc) and the delta method's
    np.testing.assert_allclose(items["discrimination_mean"], lognorm.mean(sd, scale=np.exp(loc)),
                               rtol=1e-6)
    np.testing.assert_allclose(items["discrimination_sd"], lognorm.std(sd, scale=np.exp(loc)),
                               rtol=1e-5)
    np.testing.assert_array_equal(items["difficulty_mean"], guide.loc["difficulty"])
    np.testing.assert_allclose(items["difficulty_sd"], np.exp(guide.log_scale["difficulty"]),
                               rtol=1e-7)
    subjects = summarize(spec, guide, "subject")
    np.testing.assert_allclose(subjects["ability_q05"],
                               norm.ppf(0.05, guide.loc["ability"], np.exp(guide.log_scale["ability"])),
                               rtol=1e-4, atol=1e-5)
    assert Z90 == pytest.approx(norm.ppf(0.95))


@pytest.mark.parametrize("loc, scale, rtol", [(-1.5, 0.6, 1e-4), (-3.0, 0.02, 1e-4),
                                              (0.5, 2.0, 1e-4), (2.0, 5.0, 1e-3)])
def test_logistic_normal_moments_match_scipy_integration(loc, scale, rtol):
    """A guessing's reported mean and sd are E[c] and sd(c) for logit c ~ N(loc, scale^2),
    as scipy integrates them; the interval maps the logit's quantiles. (A logit sd of 5 is
    beyond any fitted asymptote; the rule's error grows there.)"""
    spec = get_model("3pl", prior="vague")
    g = GuideState({"difficulty": np.zeros(1, np.float32), "discrimination": np.zeros(1, np.float32),
                    "guessing": np.full(1, loc, np.float32)},
                   {"difficulty": np.zeros(1, np.float32), "discrimination": np.zeros(1, np.float32),
                    "guessing": np.full(1, np.log(scale), np.float32)})
    items = summarize(spec, g, "item")
    moment = lambda k: quad(lambda z: expit(z) ** k * norm.pdf(z, loc, scale),
                            loc - 12 * scale, loc + 12 * scale, epsabs=1e-12, limit=200)[0]
    mean = moment(1)
    np.testing.assert_allclose(items["guessing_mean"], mean, rtol=rtol / 5)
    np.testing.assert_allclose(items["guessing_sd"], np.sqrt(moment(2) - mean ** 2), rtol=rtol)
    np.testing.assert_allclose(items["guessing_q05"], expit(norm.ppf(0.05, loc, scale)), rtol=1e-5)
    assert items["guessing_q05"][0] < items["guessing_mean"][0] < items["guessing_q95"][0]


def test_a_mean_past_float32s_range_is_inf_not_nan():
    """A log discrimination with a huge sd (a fit whose covariance broke down): E[a]
    overflows; mean and sd are reported inf, without a warning, and the interval stays
    finite."""
    spec = get_model("2pl", prior="vague")
    g = GuideState({"difficulty": np.zeros(2, np.float32), "discrimination": np.zeros(2, np.float32)},
                   {"difficulty": np.zeros(2, np.float32),
                    "discrimination": np.log(np.array([0.5, 30.0], np.float32))})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        items = summarize(spec, g, "item")
    assert np.isfinite(items["discrimination_mean"][0]) and np.isfinite(items["discrimination_sd"][0])
    assert items["discrimination_mean"][1] == np.inf and items["discrimination_sd"][1] == np.inf
    assert np.isfinite(items["discrimination_q95"]).all()


def test_draws_follow_the_guide(guide):
    spec = get_model("2pl", prior="vague")
    d = draw_posterior(spec, guide, 20000, rng_key=jax.random.PRNGKey(0))
    assert d["ability"].shape == (20000, 5)
    np.testing.assert_allclose(d["ability"].mean(0), guide.loc["ability"], atol=0.02)
    np.testing.assert_allclose(np.log(d["discrimination"]).std(0),
                               np.exp(guide.log_scale["discrimination"]), rtol=0.05)


def test_within_item_marginal_sds_invert_each_items_precision():
    """Each item's 2 x 2 precision (guide precisions, minus the likelihood's cross
    curvature) inverted directly; an item whose matrix is not positive definite keeps the
    mean-field sds; uncoupled owners and blocks are untouched."""
    from engine.readout.posterior import within_owner_scales

    spec = get_model("2pl", prior="vague")
    rng = np.random.default_rng(0)
    n = 6
    log_scale = {"ability": np.zeros(3, np.float32),
                 "difficulty": rng.normal(-1, 0.3, n).astype(np.float32),
                 "discrimination": rng.normal(-1.5, 0.3, n).astype(np.float32)}
    guide = GuideState({k: np.zeros_like(v) for k, v in log_scale.items()}, log_scale)
    pb, pa = np.exp(-2.0 * log_scale["difficulty"]), np.exp(-2.0 * log_scale["discrimination"])
    h = 0.6 * np.sqrt(pa * pb) * rng.choice([-1.0, 1.0], n)
    h[-1] = 2.0 * np.sqrt(pa[-1] * pb[-1])  # not positive definite
    out = within_owner_scales(spec, guide, "item", {"difficulty|discrimination": h})
    for j in range(n - 1):
        cov = np.linalg.inv(np.array([[pb[j], -h[j]], [-h[j], pa[j]]], np.float64))
        np.testing.assert_allclose(out["difficulty"][j], np.sqrt(cov[0, 0]), rtol=1e-5)
        np.testing.assert_allclose(out["discrimination"][j], np.sqrt(cov[1, 1]), rtol=1e-5)
        assert out["difficulty"][j] > np.exp(log_scale["difficulty"][j])  # 1 / (1 - .36): wider
    np.testing.assert_allclose(out["difficulty"][-1], np.exp(log_scale["difficulty"][-1]), rtol=1e-6)
    assert within_owner_scales(spec, guide, "subject", {"difficulty|discrimination": h}) == {}
    table = summarize(spec, guide, "item", cross={"difficulty|discrimination": h})
    np.testing.assert_allclose(table["difficulty_sd"], out["difficulty"], rtol=1e-5)
    np.testing.assert_allclose(table["difficulty_sd_meanfield"], np.exp(log_scale["difficulty"]),
                               rtol=1e-5)


def test_within_item_intervals_cover_linked_truth_near_nominal():
    """Simulated 2PL, 200 x 400: the items' 90% intervals cover the truth (linked to the
    fit's scale by mean/sigma, as the vague priors set the scale) close to 90% with the
    within-item correction; the mean-field intervals are narrower and cover less."""
    from engine import FitSettings
    from engine.api import fit

    rng = np.random.default_rng(0)
    theta, b, a = rng.normal(size=200), rng.normal(size=400), np.exp(0.3 * rng.normal(size=400))
    y = (rng.random((200, 400)) < 1 / (1 + np.exp(-a * (theta[:, None] - b)))).astype(np.int8)
    res = fit(y, "2pl", settings=FitSettings(seed=0))
    assert set(res.cross) == {"difficulty|discrimination"}
    fitted = np.asarray(res.guide.loc["ability"])
    k = np.std(fitted) / np.std(theta)
    c = np.mean(fitted) - k * np.mean(theta)
    truth = {"difficulty": k * b + c, "discrimination": a / k}
    table = summarize(res.spec, res.guide, "item", cross=res.cross)
    rates = {}
    for block, t in truth.items():
        inside = (table[f"{block}_q05"] <= t) & (t <= table[f"{block}_q95"])
        rates[block] = float(np.mean(inside))
        assert np.all(table[f"{block}_sd"] >= table[f"{block}_sd_meanfield"] * 0.999)
    plain = summarize(res.spec, res.guide, "item")
    before = float(np.mean((plain["difficulty_q05"] <= truth["difficulty"])
                           & (truth["difficulty"] <= plain["difficulty_q95"])))
    print("linked 90% coverage with the correction", rates, "difficulty mean-field", before)
    assert 0.85 <= rates["difficulty"] <= 0.97 and 0.85 <= rates["discrimination"] <= 0.97
    assert before < rates["difficulty"]


def test_within_item_marginal_sds_for_three_coupled_blocks():
    """3PL (difficulty, discrimination, guessing): the signs of the cross terms matter with
    three blocks; the marginal sds equal the diagonal of the inverted 3 x 3 precision."""
    from engine.readout.posterior import within_owner_scales

    spec = get_model("3pl")
    rng = np.random.default_rng(1)
    n = 5
    names = ("difficulty", "discrimination", "guessing")
    log_scale = {"ability": np.zeros(2, np.float32)}
    log_scale |= {k: rng.normal(-1, 0.2, n).astype(np.float32) for k in names}
    guide = GuideState({k: np.zeros_like(v) for k, v in log_scale.items()}, log_scale)
    prec = {k: np.exp(-2.0 * log_scale[k].astype(np.float64)) for k in names}
    cross = {f"{a}|{b}": 0.4 * np.sqrt(prec[a] * prec[b]) * rng.choice([-1.0, 1.0], n)
             for i, a in enumerate(names) for b in names[i + 1:]}
    cross["difficulty|guessing"][0] = np.nan  # a non-finite item keeps the mean-field sds
    out = within_owner_scales(spec, guide, "item", cross)
    for j in range(1, n):
        m = np.diag([prec[k][j] for k in names])
        for key, h in cross.items():
            a, b = (names.index(x) for x in key.split("|"))
            m[a, b] = m[b, a] = -h[j]
        cov = np.linalg.inv(m)
        for i, k in enumerate(names):
            np.testing.assert_allclose(out[k][j], np.sqrt(cov[i, i]), rtol=1e-5)
    for k in names:
        np.testing.assert_allclose(out[k][0], np.exp(log_scale[k][0]), rtol=1e-6)
