"""The ELBO a fit reports is the ELBO of the posterior it returns, for both optimisers:
checked against an independent scipy Monte Carlo estimate of the 2PL's ELBO, under the
vague and the population priors."""

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit

from engine.api import fit
from engine.infer.settings import FitSettings


# population's hyper-priors per block: mu's sd, u's Gamma shape and rate
HYPER = {"difficulty": (3.0, 1.0, 1.0), "discrimination": (1.0, 2.0, 0.5)}


def _item_prior(z, block, vague_sd, population):
    """log p of an item block and, under population, of its hyper-parameters: the block
    ~ N(mu, 1/u), mu ~ N(0, s^2), u ~ Gamma(shape, rate) fitted as log u (Jacobian
    included), with (s, shape, rate) from HYPER."""
    if not population:
        return stats.norm.logpdf(z[block], 0, vague_sd).sum()
    mu, log_u = z[f"mu_{block}"], z[f"u_{block}"]
    sd, shape, rate = HYPER[block]
    return (stats.norm.logpdf(z[block], mu, 1 / np.sqrt(np.exp(log_u))).sum()
            + stats.norm.logpdf(mu, 0, sd) + stats.gamma.logpdf(np.exp(log_u), shape, scale=1 / rate)
            + log_u)


def _scipy_elbo(res, y, population, num_draws=300, seed=1):
    """E_q[log p(y, z)] + H[q] for the 2PL (theta ~ N(0, 1); vague: b ~ N(0, 1000),
    log a ~ N(0, 1); population: both pooled) at the returned mean-field guide, by Monte
    Carlo with scipy densities."""
    rng = np.random.default_rng(seed)
    loc, ls = res.guide.loc, res.guide.log_scale
    seen = y >= 0
    total = []
    for _ in range(num_draws):
        z = {k: loc[k] + np.exp(ls[k]) * rng.standard_normal(loc[k].shape) for k in loc}
        theta, b, a = z["ability"], z["difficulty"], np.exp(z["discrimination"])
        p = expit(a[None, :] * (theta[:, None] - b[None, :]))
        lik = stats.bernoulli.logpmf(np.where(seen, y, 0), p)[seen].sum()
        prior = (stats.norm.logpdf(theta, 0, 1).sum()
                 + _item_prior(z, "difficulty", np.sqrt(1e3), population)
                 + _item_prior(z, "discrimination", 1.0, population))
        total.append(lik + prior)
    entropy = sum(float(np.sum(ls[k])) + ls[k].size * 0.5 * (1 + np.log(2 * np.pi)) for k in ls)
    return float(np.mean(total)) + entropy, float(np.std(total) / np.sqrt(num_draws))


@pytest.mark.parametrize("prior", ["vague", "population"])
@pytest.mark.parametrize("optimizer", ["newton"])  # Adam is refused for the 2PL
def test_reported_elbo_matches_an_independent_estimate(optimizer, prior):
    rng = np.random.default_rng(0)
    theta, b, a = rng.normal(size=300), rng.normal(size=8), np.exp(rng.normal(0, 0.3, 8))
    y = (rng.random((300, 8)) < expit(a * (theta[:, None] - b))).astype(np.int8)
    res = fit(y, model="2pl", prior=prior,
              settings=FitSettings(seed=0, optimizer=optimizer, progress=False))
    hypers = {"mu_difficulty", "u_difficulty", "mu_discrimination", "u_discrimination"}
    assert {p.name for p in res.spec.params} == (
        {"ability", "difficulty", "discrimination"} | (hypers if prior == "population" else set()))
    reference, se = _scipy_elbo(res, y, prior == "population")
    # the reported value averages the last passes' estimates; allow their noise and 4 SE
    assert abs(res.elbo - reference) < 4 * se + 0.01 * abs(reference), (res.elbo, reference, se)
