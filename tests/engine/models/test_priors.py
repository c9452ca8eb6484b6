"""Tests for engine.models.priors: each family against scipy.stats, by-name references."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from engine.models import get_model, log_gamma, logit_beta, logit_uniform, normal
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


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (2.0, 8.0), (8.0, 2.0), (0.5, 0.7), (30.0, 4.0)])
def test_logit_beta_matches_scipy_beta_with_jacobian(a, b):
    """The density of logit(c), c ~ Beta(a, b): Beta's log density at c plus log c(1 - c);
    Beta(1, 1) is logit_uniform."""
    x = np.array([-12.0, -4.0, -1.3, 0.0, 0.4, 2.0, 6.0])
    c = stats.logistic.cdf(x)
    want = stats.beta.logpdf(c, a, b) + np.log(c) + np.log1p(-c)
    np.testing.assert_allclose(_log_prob(logit_beta(a, b), x.astype(np.float32)), want,
                               rtol=1e-5, atol=1e-4)
    if a == b == 1.0:
        np.testing.assert_allclose(_log_prob(logit_beta(a, b), X), _log_prob(logit_uniform(), X),
                                   atol=1e-5)


def test_logit_beta_refuses_shapes_that_are_not_positive():
    for a, b in ((0.0, 1.0), (2.0, -1.0)):
        with pytest.raises(ValueError, match="positive shapes"):
            logit_beta(a, b)


@pytest.mark.parametrize("prior", [normal(0.3, 2.0), log_gamma(2.0, 1.5), log_gamma(1.0, 1.0),
                                   logit_uniform(), logit_beta(2.0, 8.0)],
                         ids=["normal", "log_gamma", "gamma11", "logit", "logit_beta"])
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
    assert logit_beta(2, 8).to_dict() == {"family": "logit_beta", "a": 2.0, "b": 8.0}


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


@pytest.mark.parametrize("name", ["3pl", "4pl", "feas"])
def test_population_asymptotes_take_beta_priors_and_seed_003s_families_keep_uniform(name):
    """Under population a guessing is Beta(2, 8) and a feasibility 1 - Beta(2, 8) (mean 0.2
    below / above the curve); not pooled: no hyper-parameters of their own. Vague and
    hierarchical keep seed 003's U[0, 1]."""
    spec = get_model(name, prior="population")
    want = {"guessing": logit_beta(2.0, 8.0), "feasibility": logit_beta(8.0, 2.0)}
    for block, prior in want.items():
        if block in spec.names:
            assert spec.param(block).prior == prior and not prior.references()
            assert f"mu_{block}" not in spec.names
    for family in ("vague", "hierarchical"):
        other = get_model(name, prior=family)
        for block in want:
            if block in other.names:
                assert other.param(block).prior == logit_uniform()


def test_each_model_names_its_default_prior():
    """The binary logistic models (1PL-4PL, feas) default to the population priors (their
    scale is the abilities' N(0, 1) whatever the matrix's shape); the others to seed 003's
    vague ones.
    A model built without a prior is the one built with its default."""
    from engine.errors import ModelError
    from engine.models import MODELS
    from engine.models.registry import default_prior, resolve_prior

    for name in MODELS:
        want = "population" if name in ("1pl", "2pl", "3pl", "4pl", "feas") else "vague"
        assert default_prior(name) == want
        assert resolve_prior(name, None) == want and resolve_prior(name, "hierarchical") == "hierarchical"
        options = {"dims": 2} if name in ("mirt-comp", "mirt-noncomp", "irt-vec") else {}
        assert get_model(name, **options) == get_model(name, prior=want, **options)
    with pytest.raises(ModelError, match="unknown model 'rasch'"):
        default_prior("rasch")


@pytest.mark.parametrize("prior,env", [(normal(0.3, 2.0), {}), (normal("m", precision="u"), {"m": -1.5, "u": 4.0}),
                                       (log_gamma(2.0, 0.5), {}), (log_gamma(1.0, 1.0), {}),
                                       (logit_uniform(), {}), (logit_beta(2.0, 8.0), {}),
                                       (logit_beta(0.5, 0.7), {})],
                         ids=["normal", "normal-by-name", "log_gamma", "gamma11", "logit",
                              "logit_beta", "logit_beta_u"])
def test_draws_follow_the_density(prior, env):
    """``Prior.sample`` draws from the density ``log_prob`` evaluates: a KS test of 4,000
    draws against the CDF integrated from ``exp(log_prob)`` with scipy."""
    draws = prior.sample(np.random.default_rng(0), (4000,), env)
    assert draws.shape == (4000,) and np.isfinite(draws).all()
    grid = np.linspace(-40, 40, 160_001)
    dens = np.exp(np.asarray(prior.log_prob(jnp.asarray(grid), {k: jnp.float32(v) for k, v in env.items()}),
                             np.float64))
    cdf = integrate.cumulative_trapezoid(dens, grid, initial=0.0)
    assert cdf[-1] == pytest.approx(1.0, abs=1e-4)
    p = stats.kstest(draws, lambda x: np.interp(x, grid, cdf)).pvalue
    assert p > 1e-3


def test_population_hyper_priors_are_proper_and_hierarchical_keeps_seed_003s():
    """Population: mu_difficulty ~ N(0, 3^2), u_difficulty ~ Gamma(1, 1), and for log a
    mu ~ N(0, 1), u ~ Gamma(2, 1/2); hierarchical keeps N(0, 10^6) and Gamma(1, 1)."""
    pop = get_model("2pl", prior="population")
    assert pop.param("mu_difficulty").prior == normal(0.0, 9.0)
    assert pop.param("u_difficulty").prior == log_gamma(1.0, 1.0)
    assert pop.param("mu_discrimination").prior == normal(0.0, 1.0)
    assert pop.param("u_discrimination").prior == log_gamma(2.0, 0.5)
    assert get_model("1pl", prior="population").param("mu_difficulty").prior == normal(0.0, 9.0)
    hier = get_model("2pl", prior="hierarchical")
    for block in ("ability", "difficulty", "discrimination"):
        assert hier.param(f"mu_{block}").prior == normal(0.0, 1e6)
        assert hier.param(f"u_{block}").prior == log_gamma(1.0, 1.0)


def test_draw_prior_draws_pooled_blocks_from_their_drawn_hyper_parameters():
    """``ModelSpec.draw_prior``: the globals first, then each pooled block from N(mu, 1/u)
    at the drawn mu and u (20,000 items: the block's mean and sd match them)."""
    spec = get_model("2pl", prior="population")
    t = spec.draw_prior(7, 20_000, np.random.default_rng(3))
    assert t["ability"].shape == (7,) and t["difficulty"].shape == (20_000,)
    for block in ("difficulty", "discrimination"):
        sd = 1.0 / np.sqrt(np.exp(t[f"u_{block}"]))
        assert np.mean(t[block]) == pytest.approx(t[f"mu_{block}"], abs=5 * sd / np.sqrt(20_000))
        assert np.std(t[block]) == pytest.approx(sd, rel=0.03)
    # the hyper-parameters themselves follow their priors: mu_difficulty's sd is 3
    mus = [spec.draw_prior(1, 1, np.random.default_rng(s))["mu_difficulty"] for s in range(400)]
    assert stats.kstest(mus, stats.norm(0, 3).cdf).pvalue > 1e-3
