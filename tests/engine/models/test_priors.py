"""Tests for engine.models.priors: each family against scipy.stats, by-name references."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from engine.models import get_model, log_gamma, logit_uniform, normal
from engine.models.priors import Prior, hyper_params

X = np.array([-30.0, -5.0, -1.3, 0.0, 0.4, 2.0, 7.5], np.float32)


def _log_prob(prior, x, env=None):
    return np.asarray(prior.log_prob(jnp.asarray(x), env or {}), np.float64)


@pytest.mark.parametrize("loc,variance", [(0.0, 1.0), (1.0, 1.0), (0.0, 1e3), (-2.5, 0.04),
                                          (0.0, 1e6)])
def test_normal_variance_matches_scipy(loc, variance):
    want = stats.norm.logpdf(X.astype(np.float64), loc, np.sqrt(variance))
    np.testing.assert_allclose(_log_prob(normal(loc, variance), X), want, rtol=1e-5)


@pytest.mark.parametrize("u", [0.01, 1.0, 3.7, 250.0])
def test_normal_precision_by_name_matches_scipy(u):
    prior = normal(0.5, precision="u_x")
    want = stats.norm.logpdf(X.astype(np.float64), 0.5, 1.0 / np.sqrt(u))
    np.testing.assert_allclose(_log_prob(prior, X, {"u_x": jnp.float32(u)}), want, rtol=1e-5)


def test_normal_loc_and_variance_by_name():
    env = {"mu_x": jnp.float32(-1.2), "v_x": jnp.float32(2.5), "u_x": jnp.float32(0.4)}
    want = stats.norm.logpdf(X.astype(np.float64), -1.2, np.sqrt(2.5))
    np.testing.assert_allclose(_log_prob(normal("mu_x", "v_x"), X, env), want, rtol=1e-5)
    np.testing.assert_allclose(_log_prob(normal("mu_x", precision="u_x"), X, env), want, rtol=1e-5)


def test_normal_precision_overrides_variance():
    prior = normal(0.0, 7.0, precision=4.0)
    assert prior.variance is None and prior.precision == 4.0
    np.testing.assert_allclose(_log_prob(prior, X), stats.norm.logpdf(X, 0.0, 0.5), rtol=1e-5)


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (2.0, 0.5), (0.5, 3.0), (10.0, 10.0)])
def test_log_gamma_matches_scipy_with_jacobian(a, b):
    x = np.array([-8.0, -2.0, -0.3, 0.0, 0.7, 2.0, 3.5])
    want = stats.gamma.logpdf(np.exp(x), a, scale=1.0 / b) + x
    np.testing.assert_allclose(_log_prob(log_gamma(a, b), x.astype(np.float32)), want,
                               rtol=1e-5, atol=1e-5)


def test_logit_uniform_matches_scipy_logistic():
    want = stats.logistic.logpdf(X.astype(np.float64))
    np.testing.assert_allclose(_log_prob(logit_uniform(), X), want, rtol=1e-5)
    # and it is the density of logit(c) for c ~ U[0, 1]: d/dx sigmoid(x)
    x = np.linspace(-6, 6, 13)
    np.testing.assert_allclose(np.exp(_log_prob(logit_uniform(), x.astype(np.float32))),
                               stats.logistic.cdf(x) * stats.logistic.sf(x), rtol=1e-5)


@pytest.mark.parametrize("prior", [normal(0.3, 2.0), log_gamma(2.0, 1.5), log_gamma(1.0, 1.0),
                                   logit_uniform()], ids=["normal", "log_gamma", "gamma11", "logit"])
def test_densities_integrate_to_one(prior):
    f = lambda x: float(np.exp(prior.log_prob(jnp.float32(x), {})))
    total, _ = integrate.quad(f, -60, 60, limit=200, points=[-5, 0, 5])
    assert total == pytest.approx(1.0, abs=1e-4)


def test_unknown_family_raises():
    with pytest.raises(ValueError, match="unknown prior family 'cauchy'"):
        Prior("cauchy").log_prob(jnp.zeros(2), {})


def test_to_dict():
    assert normal(0.0, 1e3).to_dict() == {"family": "normal", "loc": 0.0, "variance": 1e3}
    assert normal("mu_b", precision="u_b").to_dict() == {"family": "normal", "loc": "mu_b",
                                                        "precision": "u_b"}
    assert log_gamma(1.0, 2.0).to_dict() == {"family": "log_gamma", "shape": 1.0, "rate": 2.0}
    assert logit_uniform().to_dict() == {"family": "logit_uniform"}


def test_hyper_params_for_a_block():
    mu, u, prior = hyper_params("difficulty")
    assert mu["name"] == "mu_difficulty" and mu["owner"] == "global"
    assert mu["prior"] == normal(0.0, 1e6) and not mu["in_likelihood"]
    assert u["name"] == "u_difficulty" and u["transform"] == "exp"
    assert u["prior"] == log_gamma(1.0, 1.0) and not u["in_likelihood"]
    assert prior.references() == ("mu_difficulty", "u_difficulty")


@pytest.mark.parametrize("name", ["1pl", "2pl", "3pl", "4pl", "feas"])
def test_hierarchical_priors_reference_globals_by_name(name):
    spec = get_model(name, prior="hierarchical")
    glob = {p.name: p for p in spec.by_owner("global")}
    for p in spec.params:
        for ref in p.prior.references():
            assert ref in glob, f"{p.name} references {ref}, not a global of {spec.name}"
    pooled = [p for p in spec.params if p.prior.references()]
    assert {p.name for p in pooled} == {p.name for p in spec.likelihood_params
                                        if p.name in ("ability", "difficulty", "discrimination")}
    # Evaluate ability's prior with env built from the globals' constrained values.
    rng = np.random.default_rng(0)
    z = {n: np.float32(rng.normal()) for n in glob}
    env = {n: glob[n].constrain(jnp.float32(v)) for n, v in z.items()}
    ability = spec.param("ability")
    x = rng.normal(size=20).astype(np.float32)
    want = stats.norm.logpdf(x, float(env["mu_ability"]), 1.0 / np.sqrt(np.exp(z["u_ability"])))
    np.testing.assert_allclose(_log_prob(ability.prior, x, env), want, rtol=1e-5)


@pytest.mark.parametrize("name", ["1pl", "2pl", "3pl", "4pl", "feas"])
def test_vague_priors(name):
    spec = get_model(name, prior="vague")
    assert not spec.by_owner("global")
    assert spec.param("ability").prior == normal(0.0, 1.0)
    assert spec.param("difficulty").prior == normal(0.0, 1e3)
    if name != "1pl":
        assert spec.param("discrimination").prior == normal(0.0, 1.0)  # on log a
        for family in ("vague", "population"):  # population: the signed a is not pooled
            assert get_model(name, prior=family, signed_discrimination=True).param(
                "discrimination").prior == normal(1.0, 1.0)
    for n in ("guessing", "feasibility"):
        if n in spec.names:
            assert spec.param(n).prior == logit_uniform()


def test_each_model_names_its_default_prior():
    """The 1PL and 2PL default to the population priors (their scale is the abilities'
    N(0, 1) whatever the matrix's shape); the others, asymptote models included, to seed
    003's vague ones.
    A model built without a prior is the one built with its default."""
    from engine.errors import ModelError
    from engine.models import MODELS
    from engine.models.registry import default_prior, resolve_prior

    for name in MODELS:
        want = "population" if name in ("1pl", "2pl") else "vague"
        assert default_prior(name) == want
        assert resolve_prior(name, None) == want and resolve_prior(name, "hierarchical") == "hierarchical"
        options = {"dims": 2} if name in ("mirt-comp", "mirt-noncomp", "irt-vec") else {}
        assert get_model(name, **options) == get_model(name, prior=want, **options)
    with pytest.raises(ModelError, match="unknown model 'rasch'"):
        default_prior("rasch")
