"""Tests for engine.models.continuous: log-likelihoods against scipy.stats, inflation,
symmetries, data adaptation and seeded recovery through ``engine.api.fit``."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import expit

from engine.api import fit
from engine.errors import DataFormatError, IRTError, ModelError
from engine.infer.settings import FitSettings
from engine.models import get_model
from engine.models.spec import TRANSFORMS
from engine.run import load_run, save_run

ABILITY = np.array([-4.0, -1.0, 0.0, 0.7, 3.0], np.float32)
DIFFICULTY = np.array([-3.0, -0.5, 0.0, 1.2, 3.5], np.float32)
DISCRIMINATION = np.array([0.2, 1.0, 2.5], np.float32)
LOG_PRECISION = np.array([-2.0, 0.0, 1.5, 4.0], np.float32)
Y_INSIDE = np.array([1e-4, 0.03, 0.3, 0.5, 0.81, 0.999], np.float32)
UNIT_THETA = np.array([0.02, 0.3, 0.5, 0.77, 0.97], np.float32)
UNIT_DELTA = np.array([0.05, 0.4, 0.6, 0.9], np.float32)
SIGNED_A = np.array([-1.0, 0.3, 1.0, 2.2], np.float32)
SCALE = np.array([0.01, 0.7, 3.0], np.float32)
ERRORS = np.array([1e-5, 0.02, 0.4, 1.0, 3.3, 25.0], np.float32)


def _grid(*axes):
    mesh = np.meshgrid(*axes, indexing="ij")
    return [m.ravel() for m in mesh]


def _call(spec, values, y, mask=None):
    params = {p.name: jnp.asarray(values[p.name], jnp.float32) for p in spec.likelihood_params}
    y = jnp.asarray(y, jnp.float32)
    mask = jnp.ones_like(y) if mask is None else jnp.asarray(mask, jnp.float32)
    return np.asarray(spec.loglik(params, y, mask), np.float64)


# ---- likelihoods against scipy.stats ---------------------------------------------------

@pytest.mark.parametrize("discrimination", [True, False])
def test_beta_loglik_matches_scipy(discrimination):
    spec = get_model("beta", inflation="none", discrimination=discrimination)
    t, b, a, o, y = _grid(ABILITY, DIFFICULTY, DISCRIMINATION, LOG_PRECISION, Y_INSIDE)
    got = _call(spec, dict(ability=t, difficulty=b, discrimination=a, log_precision=o), y)
    eta = (a if discrimination else 1.0) * t.astype(np.float64) - b
    want = stats.beta.logpdf(y.astype(np.float64), np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)


def _inflated_reference(y, zero, one, density):
    """Direct mixture: P(0) = zero, P(1) = (1 - zero) one, density scaled by the rest."""
    out = np.where(y == 0, stats.bernoulli.logpmf(1, zero), stats.bernoulli.logpmf(0, zero))
    out = out + np.where(y == 0, 0.0, np.where(y == 1, stats.bernoulli.logpmf(1, one),
                                                  stats.bernoulli.logpmf(0, one)))
    return out + np.where((y > 0) & (y < 1), density, 0.0)


def test_zero_one_inflated_beta_matches_direct_mixture():
    spec = get_model("beta", inflation="zero-one")
    assert {"zero", "one"} <= set(spec.names)
    ys = np.concatenate([[0.0, 1.0], Y_INSIDE]).astype(np.float32)
    t, b, a, o, zero, one, y = _grid(ABILITY[::2], DIFFICULTY[::2], DISCRIMINATION, LOG_PRECISION[:3],
                                     np.array([0.01, 0.3], np.float32), np.array([0.05, 0.6], np.float32), ys)
    got = _call(spec, dict(ability=t, difficulty=b, discrimination=a, log_precision=o, zero=zero, one=one), y)
    eta = a.astype(np.float64) * t - b
    inside = np.clip(y.astype(np.float64), 1e-9, 1 - 1e-9)
    density = stats.beta.logpdf(inside, np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    want = _inflated_reference(y, zero.astype(np.float64), one.astype(np.float64), density)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)
    # the mixture is a proper distribution: mass at 0 and 1 plus the density's share is 1
    assert np.allclose(zero + (1 - zero) * one + (1 - zero) * (1 - one), 1.0)


def test_gamma_loglik_matches_scipy_and_hurdle():
    spec = get_model("gamma", inflation="zero")
    t, d, a, c, e, zero = _grid(UNIT_THETA, UNIT_DELTA, SIGNED_A, SCALE,
                                np.concatenate([[0.0], ERRORS]).astype(np.float32),
                                np.array([0.02, 0.4], np.float32))
    got = _call(spec, dict(ability=t, difficulty=d, discrimination=a, scale=c, zero=zero), e)
    t64, d64, a64 = (v.astype(np.float64) for v in (t, d, a))
    shape = c * (d64 / t64) ** a64
    rate = ((1 - d64) / (1 - t64)) ** a64
    density = stats.gamma.logpdf(np.where(e > 0, e, 1.0), shape, scale=1.0 / rate)
    want = np.where(e == 0, stats.bernoulli.logpmf(1, zero), stats.bernoulli.logpmf(0, zero) + density)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=5e-4, atol=5e-3)


def test_beta3_loglik_matches_scipy():
    spec = get_model("beta3", inflation="none")
    t, d, a, y = _grid(UNIT_THETA, UNIT_DELTA, SIGNED_A, Y_INSIDE)
    got = _call(spec, dict(ability=t, difficulty=d, discrimination=a), y)
    t64, d64, a64 = (v.astype(np.float64) for v in (t, d, a))
    want = stats.beta.logpdf(y.astype(np.float64), (t64 / d64) ** a64, ((1 - t64) / (1 - d64)) ** a64)
    np.testing.assert_allclose(got, want, rtol=5e-4, atol=5e-3)


# ---- expected responses (item characteristic curves) -----------------------------------

def test_expected_responses_match_scipy_means():
    t, b, a, o = _grid(ABILITY, DIFFICULTY, DISCRIMINATION, LOG_PRECISION)
    beta = get_model("beta", inflation="zero-one")
    vals = dict(ability=t, difficulty=b, discrimination=a, log_precision=o,
                zero=np.full_like(t, 0.1), one=np.full_like(t, 0.2))
    got = np.asarray(beta.expected({k: jnp.asarray(v) for k, v in vals.items()}))
    eta = a.astype(np.float64) * t - b
    mean = stats.beta.mean(np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    np.testing.assert_allclose(got, 0.9 * (0.2 + 0.8 * mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean, expit(eta), rtol=1e-9)  # E[y] = sigmoid(eta), seed 003

    t, d, a, c = _grid(UNIT_THETA, UNIT_DELTA, SIGNED_A, SCALE)
    gamma = get_model("gamma", inflation="none")
    got = np.asarray(gamma.expected(dict(ability=t, difficulty=d, discrimination=a, scale=c)))
    t64, d64, a64 = (v.astype(np.float64) for v in (t, d, a))
    want = stats.gamma.mean(c * (d64 / t64) ** a64, scale=((1 - t64) / (1 - d64)) ** a64)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    at_difficulty = np.asarray(gamma.expected(dict(ability=d, difficulty=d, discrimination=a, scale=c)))
    np.testing.assert_allclose(at_difficulty, c, rtol=1e-5)  # theta = delta: E[e] = c (seed 001)

    beta3 = get_model("beta3", inflation="none")
    got = np.asarray(beta3.expected(dict(ability=t, difficulty=d, discrimination=a)))
    want = stats.beta.mean((t64 / d64) ** a64, ((1 - t64) / (1 - d64)) ** a64)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # seed 001 eq. 10: the Beta^3 curve is 1 / (1 + the normalised expected error)
    e_bar = (d64 / (1 - d64)) ** a64 * (t64 / (1 - t64)) ** (-a64)
    np.testing.assert_allclose(got, 1 / (1 + e_bar), rtol=1e-4)


# ---- engine contract: per-cell scalars, missing cells, symmetries ----------------------

CONTINUOUS = [("beta", {"inflation": "zero-one"}), ("beta", {"inflation": "none"}),
              ("beta", {"prior": "hierarchical", "inflation": "none"}),
              ("beta", {"signed_discrimination": True, "inflation": "none"}),
              ("beta-1pl", {"inflation": "none"}), ("gamma", {"inflation": "zero"}),
              ("beta3", {"inflation": "zero-one"}),
              ("beta", {"inflation": "zero-one", "inflation_owner": "subject"}),
              ("beta", {"inflation": "zero-one", "inflation_owner": "both"}),
              ("gamma", {"inflation": "zero", "inflation_owner": "both"})]


def _random_unconstrained(spec, rng, s=5, n=7):
    return {p.name: rng.normal(p.init, 0.7, size=(s, 1) if p.owner == "subject" else (1, n)).astype(np.float32)
            for p in spec.likelihood_params}


def _data_for(spec, rng, s=5, n=7):
    if spec.kind == "unit":
        y = rng.uniform(0.01, 0.99, size=(s, n))
        y[0, 0], y[1, 1] = 0.0, 1.0
    else:
        y = rng.gamma(1.0, 1.0, size=(s, n))
        y[0, 0] = 0.0
    return jnp.asarray(y, jnp.float32)


def _total(spec, x, y, mask=None):
    params = {p.name: TRANSFORMS[p.transform](jnp.asarray(x[p.name])) for p in spec.likelihood_params}
    mask = jnp.ones_like(y) if mask is None else mask
    return jnp.sum(mask * spec.loglik(params, y, mask))


@pytest.mark.parametrize("name,options", CONTINUOUS)
def test_symmetries_and_masked_cells(name, options):
    spec = get_model(name, **options)
    rng = np.random.default_rng(3)
    x, y = _random_unconstrained(spec, rng), _data_for(spec, rng)
    has_zero, has_one = "zero" in spec.names, "one" in spec.names
    if not has_zero or (spec.kind == "unit" and not has_one):
        y = jnp.clip(y, 0.001, 0.999) if spec.kind == "unit" else y + 0.01  # test data only
    base = float(_total(spec, x, y))
    assert np.isfinite(base)
    for sym in spec.symmetries:
        for t in (-0.6, 0.4):
            moved = dict(x)
            for block, m, v in sym.moves:
                moved[block] = x[block] * np.exp(t * np.asarray(m)) + t * np.asarray(v)
            np.testing.assert_allclose(float(_total(spec, moved, y)), base, rtol=2e-5)
    assert abs(float(_total(spec, dict(x, ability=x["ability"] + 0.5), y)) - base) > 1e-3
    # A missing cell reaches loglik as 0 with mask 0 (the engine's fill): no NaN, no gradient.
    mask = jnp.ones_like(y).at[2, 3].set(0.0)
    filled = y.at[2, 3].set(0.0)
    grads = jax.grad(lambda xx: _total(spec, xx, filled, mask))(x)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.values())
    assert np.isfinite(float(_total(spec, x, filled, mask)))


@pytest.mark.parametrize("name,options", CONTINUOUS[:1] + CONTINUOUS[-2:])
def test_loglik_per_cell_scalars(name, options):
    spec = get_model(name, **options)
    rng = np.random.default_rng(4)
    x, y = _random_unconstrained(spec, rng), _data_for(spec, rng)
    params = {p.name: TRANSFORMS[p.transform](jnp.asarray(x[p.name])) for p in spec.likelihood_params}
    full = np.asarray(spec.loglik(params, y, jnp.ones_like(y)))
    for i, j in [(0, 0), (1, 1), (3, 4)]:
        cell = {k: v[i if v.shape[0] > 1 else 0, j if v.shape[1] > 1 else 0] for k, v in params.items()}
        got = float(spec.loglik(cell, y[i, j], jnp.float32(1.0)))
        np.testing.assert_allclose(got, full[i, j], rtol=1e-5)


def test_model_declarations():
    beta = get_model("beta", inflation="none")
    assert beta.kind == "unit" and beta.param("discrimination").transform == "exp"
    assert [s.name for s in beta.symmetries] == ["scale"]
    assert [s.name for s in get_model("beta-1pl").symmetries] == ["shift"]
    assert "discrimination" not in get_model("beta-1pl").names
    gamma = get_model("gamma")
    assert gamma.kind == "nonnegative" and gamma.symmetries == ()
    assert gamma.param("ability").transform == "sigmoid" and gamma.param("scale").transform == "exp"
    assert get_model("beta3").param("discrimination").prior.to_dict() == {"family": "normal", "loc": 1.0,
                                                                          "variance": 1.0}
    with pytest.raises(ModelError, match="unknown inflation 'both'"):
        get_model("beta", inflation="both")
    with pytest.raises(ModelError, match="Beta\\(1, 1\\) priors"):
        get_model("gamma", prior="hierarchical")
    with pytest.raises(ModelError, match="'beta'.*unexpected keyword.*dims"):
        get_model("beta", dims=2)


# ---- data boundary: kinds, inflation chosen from the data, never clipped ---------------

def _simulate_beta(s, n, *, seed, zero=0.0, one=0.0, missing=0.0):
    rng = np.random.default_rng(seed)
    truth = {"ability": rng.normal(size=s), "difficulty": rng.normal(size=n),
             "discrimination": np.exp(0.3 * rng.normal(size=n)), "log_precision": rng.normal(1.5, 0.5, n)}
    eta = truth["discrimination"] * truth["ability"][:, None] - truth["difficulty"]
    o = truth["log_precision"]
    y = rng.beta(np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    y = np.clip(y, 1e-4, 1 - 1e-4)  # the simulated density part stays strictly inside (0, 1)
    u = rng.random(y.shape)
    y[u < zero] = 0.0
    y[(u >= zero) & (u < zero + one)] = 1.0
    y[rng.random(y.shape) < missing] = np.nan
    return y.astype(np.float32), truth


def _r(a, b):
    return float(np.corrcoef(a, b)[0, 1])


def test_beta_recovery_end_to_end_with_missing():
    y, truth = _simulate_beta(120, 200, seed=0, missing=0.1)
    res = fit(y, model="beta", settings=FitSettings(seed=0))
    m = res.means()
    r = {k: _r(m[k], truth[k]) for k in truth}
    print("beta recovery", res.num_passes, res.converged, r)  # measured .993 .982 .853 .705
    assert res.extra["model_options"]["inflation"] == "none"
    assert res.extra["data"]["kind"] == "unit" and res.extra["data"]["boundary"] == {"zeros": 0, "ones": 0}
    assert res.num_observed == int((~np.isnan(y)).sum())
    assert r["ability"] > 0.97 and r["difficulty"] > 0.95
    assert r["discrimination"] > 0.6 and r["log_precision"] > 0.5


def test_inflation_is_automatic_recorded_and_recovers_boundary_shares(tmp_path):
    y, truth = _simulate_beta(120, 100, seed=1, zero=0.15, one=0.05)
    assert (y == 0).any() and (y == 1).any()
    with pytest.raises(DataFormatError, match=r"equal 0 exactly \(first at row \d+, column \d+\).*never clipped"):
        fit(y, model="beta", model_options={"inflation": "none"})
    res = fit(y, model="beta", settings=FitSettings(seed=0))
    assert res.extra["model_options"]["inflation"] == "zero-one"
    assert res.extra["data"]["boundary"] == {"zeros": int((y == 0).sum()), "ones": int((y == 1).sum())}
    m = res.means()
    print("inflated beta", res.num_passes, m["zero"].mean(), m["one"].mean(), _r(m["ability"], truth["ability"]))
    assert abs(m["zero"].mean() - 0.15) < 0.02
    assert abs(m["one"].mean() - 0.05 / 0.85) < 0.02  # one = P(y = 1 | y > 0)
    assert _r(m["ability"], truth["ability"]) > 0.95
    run = save_run(res, tmp_path / "run", num_draws=200)
    info = json.loads((tmp_path / "run" / "fit.json").read_text())
    assert info["model_options"]["inflation"] == "zero-one"
    assert info["model_options"]["inflation_owner"] == "both"  # the default, on record
    assert info["data"]["boundary"]["zeros"] == int((y == 0).sum())
    assert "inflation zero-one per subject with item offsets" in info["spec"]["description"]
    assert info["readout"]["rank_by"] == "expected score"
    again = load_run(run.path)
    assert {"zero", "one"} <= set(again.spec.names)
    assert {"zero_mean", "one_q95", "score_mean", "score_q05"} <= set(again.subjects.columns)
    assert "zero_mean" not in again.items.columns and "zero_item_mean" in again.items.columns


def _simulate_errors(s, n, *, seed):
    rng = np.random.default_rng(seed)
    truth = {"ability": expit(rng.normal(size=s)), "difficulty": expit(rng.normal(size=n)),
             "discrimination": rng.normal(1.5, 0.3, n), "scale": np.exp(rng.normal(0, 0.5, n))}
    t, d, a, c = truth["ability"][:, None], truth["difficulty"], truth["discrimination"], truth["scale"]
    e = rng.gamma(c * (d / t) ** a, ((1 - t) / (1 - d)) ** a)
    return e, truth


def test_gamma_recovery_on_errors():
    e, truth = _simulate_errors(100, 150, seed=1)
    e = e.astype(np.float32)
    # The Gamma shape c (delta/theta)^a makes the likelihood non-concave along a theta-delta
    # ridge where the diagonal Newton step stalls; Adam's gradient steps follow it.
    res = fit(e, model="gamma", settings=FitSettings(seed=0, optimizer="adam", max_passes=400))
    m = res.means()
    r = {k: _r(m[k], truth[k]) for k in truth}
    print("gamma recovery", res.num_passes, res.extra["model_options"], r)  # .995 .89 .84 .50
    assert res.extra["data"]["kind"] == "nonnegative"
    assert r["ability"] > 0.97 and r["difficulty"] > 0.8 and r["discrimination"] > 0.6
    assert np.abs(m["ability"] - truth["ability"]).mean() < 0.1


def test_beta3_recovery_on_transformed_errors():
    e, truth = _simulate_errors(100, 150, seed=2)
    p = (1.0 / (1.0 + e / truth["scale"])).astype(np.float32)  # seed 001 eq. 10
    res = fit(p, model="beta3", settings=FitSettings(seed=0))
    m = res.means()
    r = {k: _r(m[k], truth[k]) for k in ("ability", "difficulty", "discrimination")}
    print("beta3 recovery", res.num_passes, res.extra["model_options"], r)  # .99 .97 .75
    assert r["ability"] > 0.97 and r["difficulty"] > 0.93 and r["discrimination"] > 0.5


def test_data_kind_errors_name_the_cell():
    y = np.full((3, 4), 0.5, np.float32)
    y[2, 1] = 1.7
    with pytest.raises(ModelError, match=r"reads unit responses but the data is nonnegative; "
                                          r"choose a model for nonnegative responses \(gamma: each response "
                                          r"an error >= 0, lower is better\)$"):
        fit(y, model="beta")
    y[2, 1] = -0.2
    with pytest.raises(DataFormatError, match=r"row 2, column 1: got .*-0.2.*non-negative"):
        fit(y, model="gamma")
    y[2, 1] = np.inf
    with pytest.raises(DataFormatError, match=r"row 2, column 1: .*finite number or NaN"):
        fit(y, model="beta")
    with pytest.raises(ModelError, match=r"'2pl' reads binary responses but the data is unit; "
                       r"choose a model for unit responses \(beta, beta-1pl, beta3: each response a "
                       r"score in \[0, 1\], higher is better; gamma: each response an error >= 0, "
                       r"lower is better\); if the data "
                       r"should be 0/1, `irt-engine ingest --kind binary` names the first cell"):
        fit(np.full((3, 4), 0.25, np.float32), model="2pl")
    with pytest.raises(IRTError, match="row 0, column 0: got -3"):
        fit(np.full((2, 2), -3, np.int8), model="2pl")
    binary = np.array([[0, 1, -1], [1, 1, 0]], np.int8)
    for model in ("beta", "beta3"):
        with pytest.raises(DataFormatError, match="all 5 observed responses are exactly 0 or 1.*2pl"):
            fit(binary, model=model)
    with pytest.raises(DataFormatError, match="all 2 observed responses are exactly 0,"):
        fit(np.array([[0.0, np.nan], [np.nan, 0.0]], np.float32), model="gamma")


def test_unused_density_cells_keep_finite_derivatives_at_extreme_draws():
    """A cell on a point mass (or missing) does not use the density; a draw far out in a
    factor that no data pins (its item's every response on a point mass) must not make its
    derivatives NaN (0 * inf): every Beta-IRT fit of the MQM scores with 16 draws per step
    went non-finite at pass 2 before."""
    spec = get_model("beta", inflation="zero-one")
    cell = lambda eta, y, m: spec.linear.cell(eta, (2.0, 0.1, 0.2), y, m)
    for y, m in ((1.0, 1.0), (0.0, 1.0), (0.5, 0.0)):  # on the one mass, the zero mass, missing
        for eta in (-400.0, 0.0, 400.0):
            g = jax.grad(cell)(eta, y, m)
            h = jax.jacfwd(jax.grad(cell))(eta, y, m)
            assert np.isfinite(g) and np.isfinite(h) and g == 0.0 and h == 0.0
    # an observed interior cell still has its density's derivatives
    assert jax.grad(cell)(0.3, 0.7, 1.0) != 0.0


# ---- per-subject boundary probabilities (issue 17) --------------------------------------

def test_subject_inflated_beta_matches_scipy_mixture():
    """Each subject its own P(y = 0) and P(y = 1 | y > 0): a 3 x 4 block of cells against
    scipy's beta density and Bernoulli masses, the subject's probabilities on every item."""
    spec = get_model("beta", inflation="zero-one", inflation_owner="subject")
    assert spec.param("zero").owner == spec.param("one").owner == "subject"
    assert spec.linear is None and spec.score is not None  # the generic per-cell path
    t = np.array([-1.0, 0.2, 2.0])[:, None]
    zero, one = np.array([0.02, 0.2, 0.5])[:, None], np.array([0.7, 0.1, 0.3])[:, None]
    b, a, o = np.array([[-0.5, 0.0, 0.3, 1.5]]), np.array([[0.5, 1.0, 1.0, 2.0]]), np.array([[0.0, 1.0, 2.0, 3.0]])
    y = np.array([[0.0, 0.4, 1.0, 0.93], [1.0, 0.0, 0.02, 0.5], [0.61, 1.0, 0.0, 1e-3]])
    values = dict(ability=t, difficulty=b, discrimination=a, log_precision=o, zero=zero, one=one)
    got = _call(spec, {k: v.astype(np.float32) for k, v in values.items()}, y)
    eta = a * t - b
    density = stats.beta.logpdf(np.clip(y, 1e-9, 1 - 1e-9), np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    want = _inflated_reference(y, zero, one, density)  # (3, 1) masses broadcast over items
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)
    # the score is the expected response: scipy's beta mean under the two masses
    vals = {k: jnp.asarray(v, jnp.float32) for k, v in values.items()}
    mean = stats.beta.mean(np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    np.testing.assert_allclose(np.asarray(spec.score(vals)), (1 - zero) * (one + (1 - one) * mean),
                               rtol=1e-4)
    item = get_model("beta", inflation="zero-one", inflation_owner="item")
    assert item.param("zero").owner == "item" and item.linear is not None and item.score is None


def test_subject_hurdle_gamma_matches_scipy():
    spec = get_model("gamma", inflation="zero", inflation_owner="subject")
    assert spec.param("zero").owner == "subject" and spec.score is not None
    t, zero = np.array([0.2, 0.5, 0.9])[:, None], np.array([0.05, 0.3, 0.6])[:, None]
    d, a, c = np.array([[0.1, 0.4, 0.6, 0.8]]), np.array([[-0.5, 0.8, 1.0, 2.0]]), np.array([[0.5, 1.0, 2.0, 4.0]])
    e = np.array([[0.0, 0.3, 2.5, 10.0], [1.2, 0.0, 0.0, 0.05], [4.0, 0.01, 0.7, 0.0]])
    vals = {k: v.astype(np.float32) for k, v in
            dict(ability=t, difficulty=d, discrimination=a, scale=c, zero=zero).items()}
    got = _call(spec, vals, e)
    shape, rate = c * (d / t) ** a, ((1 - d) / (1 - t)) ** a
    density = stats.gamma.logpdf(np.where(e > 0, e, 1.0), shape, scale=1.0 / rate)
    want = np.where(e == 0, stats.bernoulli.logpmf(1, zero), stats.bernoulli.logpmf(0, zero) + density)
    np.testing.assert_allclose(got, want, rtol=5e-4, atol=5e-3)
    # the score is minus the expected error: the hurdle's mass times scipy's gamma mean
    score = np.asarray(spec.score({k: jnp.asarray(v) for k, v in vals.items()}))
    np.testing.assert_allclose(score, -(1 - zero) * stats.gamma.mean(shape, scale=1.0 / rate), rtol=1e-4)


def test_subject_masses_with_item_offsets_match_scipy():
    """``both``: P(y = 0) = sigmoid(logit zero_s + zero_item_n), the same for ``one``."""
    from scipy.special import logit

    spec = get_model("beta", inflation="zero-one", inflation_owner="both")
    assert {s.name for s in spec.symmetries} == {"scale", "zero-offset", "one-offset"}
    assert spec.param("zero_item").owner == "item" and spec.param("u_zero_item").owner == "global"
    t, zero, one = (np.array(v)[:, None] for v in ([-1.0, 0.5, 1.5], [0.05, 0.2, 0.4], [0.3, 0.1, 0.6]))
    b, a, o = np.array([[-0.5, 0.0, 0.3, 1.5]]), np.array([[0.5, 1.0, 1.0, 2.0]]), np.array([[0.0, 1.0, 2.0, 3.0]])
    zi, oi = np.array([[-2.0, 0.0, 0.5, 3.0]]), np.array([[1.0, -1.0, 0.0, 2.5]])
    y = np.array([[0.0, 0.4, 1.0, 0.93], [1.0, 0.0, 0.02, 0.5], [0.61, 1.0, 0.0, 1e-3]])
    values = dict(ability=t, difficulty=b, discrimination=a, log_precision=o, zero=zero, one=one,
                  zero_item=zi, one_item=oi)
    got = _call(spec, {k: v.astype(np.float32) for k, v in values.items()}, y)
    eta = a * t - b
    density = stats.beta.logpdf(np.clip(y, 1e-9, 1 - 1e-9), np.exp((eta + o) / 2), np.exp((o - eta) / 2))
    want = _inflated_reference(y, expit(logit(zero) + zi), expit(logit(one) + oi), density)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)


def test_inflation_owner_options_and_defaults():
    # built without data (or rebuilt from a run written before the option): per item
    assert get_model("beta", inflation="zero-one").param("one").owner == "item"
    # the data resolves "auto" to per subject and records it; an explicit owner is kept
    spec = get_model("beta")
    y = np.array([[0.0, 0.3, 1.0], [0.5, 1.0, 0.2]], np.float32)
    assert spec.adapt(y) == {"inflation_owner": "both", "inflation": "zero-one"}
    assert get_model("beta", inflation_owner="item").adapt(y) == {"inflation": "zero-one"}
    assert get_model("gamma", inflation_owner="subject", inflation="none").score is None
    assert get_model("beta3", inflation="one", inflation_owner="subject").score is not None
    for name in ("beta", "gamma", "beta3"):
        with pytest.raises(ModelError, match=f"model '{name}': unknown inflation_owner 'row'.*subject, item, both"):
            get_model(name, inflation_owner="row")


def _simulate_boundary_shares(one_share, n, *, seed):
    """Subjects alike in the density (one ability) and unlike only in P(y = 1)."""
    rng = np.random.default_rng(seed)
    s = len(one_share)
    eta = np.zeros((s, 1)) - rng.normal(0.0, 1.0, n)  # same ability, item difficulties vary
    y = rng.beta(np.exp((eta + 2.0) / 2), np.exp((2.0 - eta) / 2))
    y = np.clip(y, 1e-4, 1 - 1e-4)
    y[rng.random((s, n)) < np.asarray(one_share)[:, None]] = 1.0
    return y.astype(np.float32)


def test_subject_boundary_shares_recovered_and_ranked(tmp_path):
    """Seeded recovery: the per-subject P(y = 1) is recovered, and the leaderboard (expected
    score) follows it, where today's per-item masses cannot see it in the ranking."""
    from scipy.stats import kendalltau

    from engine.readout.leaderboard import format_leaderboard, leaderboard

    share = np.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6])
    y = _simulate_boundary_shares(share, 250, seed=7)
    res = fit(y, model="beta", settings=FitSettings(seed=0))
    assert res.extra["model_options"] == {"prior": "vague", "signed_discrimination": False,
                                          "inflation_owner": "both", "inflation": "one"}
    m = res.means()
    print("one by subject", np.round(m["one"], 3), "truth", share)
    np.testing.assert_allclose(m["one"], share, atol=0.07)
    assert kendalltau(m["one"], share)[0] > 0.85
    run = save_run(res, tmp_path / "run", num_draws=300)
    sub = run.subjects
    assert (sub.score_q05 < sub.score_mean).all() and (sub.score_mean < sub.score_q95).all()
    # the expected score from the posterior matches each subject's observed mean response
    np.testing.assert_allclose(sub.score_mean, y.mean(axis=1), atol=0.03)
    board = leaderboard(sub)
    order = [int(s) for s in board["subject"]]
    assert kendalltau(np.arange(len(order)), share[order])[0] < -0.85  # rank 1 = largest share
    text = format_leaderboard(board)
    assert "score" in text.splitlines()[0] and "expected score averaged over the items" in text
    # the mean response is named for the kind: a mean error is no accuracy
    assert "accuracy" in text.splitlines()[0]  # kind unknown: as before
    head = format_leaderboard(board, "nonnegative").splitlines()[0]
    assert "mean err" in head and "accuracy" not in head
    assert "accuracy" not in format_leaderboard(board, "unit").splitlines()[0]


@pytest.mark.parametrize("model", ["beta", "beta-1pl", "beta3", "gamma"])
def test_identical_rows_get_identical_read_outs(tmp_path, model):
    """Subjects with the same scores in every cell get the same ability, interval, rank
    statistics and tie group in the continuous models too (issue 16, part 4)."""
    from engine.readout.leaderboard import leaderboard

    y = (_simulate_errors(60, 6, seed=1)[0] if model == "gamma"
         else _simulate_beta(60, 6, seed=4)[0]).astype(np.float32)
    same = [5] + list(range(40, 50))
    y[same[1:]] = y[5]
    settings = (FitSettings(seed=0, optimizer="adam", max_passes=400) if model == "gamma"
                else FitSettings(seed=0))
    run = save_run(fit(y, model=model, settings=settings), tmp_path / "run", num_draws=300)
    rows = run.subjects.drop(columns=["subject"]).iloc[same]
    spread = rows.nunique(dropna=False)
    assert (spread == 1).all(), spread[spread > 1]
    assert {"ability_mean", "ability_q05"} <= set(rows.columns)
    tie = leaderboard(run.subjects, None).set_index("subject")["tie_group"]
    assert tie.loc[[str(s) for s in same]].nunique() == 1
    # twins drawn apart: they rank among each other, so the ranks of a draw are 1..S
    assert run.subjects["p_top1"].sum() == pytest.approx(1.0)
    assert run.subjects["rank_mean"].sum() == pytest.approx(60 * 61 / 2)
    others = run.subjects.drop(columns=["subject"]).iloc[[0, 1, 2]]
    assert others["ability_mean"].nunique() == 3  # rows not alike keep their own values
