"""Binary logistic IRT models: 1PL, 2PL, 3PL (guessing), 4PL and DAD's IRT-feas.

All share one logit ``z = a (theta - b)`` and one Bernoulli likelihood with optional
lower (guessing) and upper (feasibility) asymptotes:
``P(y=1) = c * sigmoid(-z) + d * sigmoid(z)`` with ``c = 0``, ``d = 1`` when absent.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from engine.errors import ModelError
from engine.models.priors import (POPULATION_LOCATION, check_family, hyper_params, log_gamma,
                                  logit_beta, logit_uniform, normal, pooled)
from engine.models.spec import Linear, ModelSpec, ParamSpec, Symmetry
from engine.models.special import sigmoid, softplus

__all__ = ["logistic_model", "bernoulli_loglik", "LOGISTIC_MODELS"]

_EPS = 1e-7

# name -> (has discrimination, lower asymptote, upper asymptote, description)
LOGISTIC_MODELS = {
    "1pl": (False, False, False, "Rasch / IRT-base: sigmoid(theta - b)"),
    "2pl": (True, False, False, "IRT-disc: sigmoid(a (theta - b))"),
    "3pl": (True, True, False, "2PL with a guessing lower asymptote c"),
    "4pl": (True, True, True, "2PL with guessing c and feasibility d asymptotes"),
    "feas": (True, False, True, "DAD IRT-feas: d * sigmoid(a (theta - b))"),
}


def bernoulli_loglik(z, y, lower=None, upper=None):
    """Per-cell Bernoulli log-likelihood of ``P = c sigmoid(-z) + d sigmoid(z)``.

    ``lower`` (c) and ``upper`` (d) are probabilities or ``None`` for 0 and 1. With an
    asymptote, ``y`` is a label, 0 or 1 (the logistic models read binary data).

    Each label's probability is ``alpha sigmoid(-z) + beta sigmoid(z)``: a sum of positive
    terms, taken as one log where both coefficients are present (``c`` and ``d`` are kept
    within ``[1e-7, 1 - 1e-7]`` there, so it is at least 1e-7 / 2), and in log space,
    ``log beta - softplus(-z)``, where one is absent, exact however saturated the logit.
    Where both are present, a value near 0 is the float32 log of a number near 1: within
    about 6e-8 absolute, its derivatives accurate. One log and two sigmoids a cell
    differentiate about 2x faster forward over forward than log-sigmoids joined by
    ``logaddexp``.
    """
    if lower is None and upper is None:
        # y log sigmoid(z) + (1 - y) log sigmoid(-z) = y z - softplus(z), written around the
        # nearest label k so that one softplus serves value and derivatives, exact when saturated
        k = jnp.round(y)
        return (y - k) * z - softplus((1.0 - 2.0 * k) * z)
    one = y > 0.5
    if lower is not None and upper is not None:  # both labels' coefficients present
        c, d = jnp.clip(lower, _EPS, 1.0 - _EPS), jnp.clip(upper, _EPS, 1.0 - _EPS)
        return jnp.log(jnp.where(one, c, 1.0 - c) * sigmoid(-z)
                       + jnp.where(one, d, 1.0 - d) * sigmoid(z))
    if upper is None:  # y = 1: c sigmoid(-z) + sigmoid(z); y = 0: (1 - c) sigmoid(-z)
        c = jnp.clip(lower, _EPS, 1.0 - _EPS)
        return jnp.where(one, jnp.log(c * sigmoid(-z) + sigmoid(z)), jnp.log1p(-c) - softplus(z))
    d = jnp.clip(upper, _EPS, 1.0 - _EPS)  # y = 1: d sigmoid(z); y = 0: sigmoid(-z) + (1 - d) sigmoid(z)
    return jnp.where(one, jnp.log(d) - softplus(-z), jnp.log(sigmoid(-z) + (1.0 - d) * sigmoid(z)))


def _linear(*, disc: bool, lower: bool, upper: bool) -> Linear:
    """The logit ``a (theta - b) = a theta - a b`` as a linear predictor; asymptotes as extras."""

    def item(params):
        b = params["difficulty"]
        a = params["discrimination"] if disc else jnp.ones_like(b)
        extras = tuple(params[k] for k, on in (("guessing", lower), ("feasibility", upper)) if on)
        return a[..., None], -a * b, extras

    def cell(eta, extras, y, mask):
        rest = iter(extras)
        return bernoulli_loglik(eta, y, lower=next(rest) if lower else None,
                                upper=next(rest) if upper else None)

    return Linear(subject=lambda params: params["ability"][..., None], item=item, cell=cell)


def _logit_start(y) -> dict:
    """Abilities and difficulties from the logits of subjects' and items' mean responses.

    PROX (Wright and Stone 1979): each side's logits are widened by the other side's spread,
    ``theta = logit(p_s) sqrt(1 + var(b) / 2.89)``, ``b = -logit(p_n) sqrt(1 + var(theta) / 2.89)``,
    centred on the abilities. A start near the answer instead of at zero.
    """
    y = np.asarray(y)
    observed = y >= 0  # False for -1 and NaN
    ones = np.where(observed, y, 0).astype(np.float64)

    def logit(total, count):
        p = np.clip(total / np.maximum(count, 1), 0.02, 0.98)
        return np.log(p / (1.0 - p))

    theta = logit(ones.sum(axis=1), observed.sum(axis=1))
    b = -logit(ones.sum(axis=0), observed.sum(axis=0))
    shift = theta.mean()
    theta, b = theta - shift, b - shift
    theta, b = theta * np.sqrt(1.0 + b.var() / 2.89), b * np.sqrt(1.0 + theta.var() / 2.89)
    return {"ability": theta.astype(np.float32), "difficulty": b.astype(np.float32)}


def _sign_start(y) -> dict:
    """Signed discrimination: start each item's discrimination at +1 or -1 by the sign of its
    covariance with the subjects' mean response on the other items (the rest score).

    The logit ``a (theta - b)`` cannot carry ``a`` across zero without ``b`` passing through
    infinity, so an item started on the wrong side tends to stay there, flat. Subjects with
    fewer than two observed responses have no rest score and are left out. The sums are
    vector-matrix products with per-subject vectors (float32 copies of the matrix only).
    """
    y = np.asarray(y)
    observed = y >= 0  # False for -1 and NaN
    ones = np.where(observed, y, 0).astype(np.float32)
    count = observed.sum(axis=1).astype(np.float64)
    weight = observed & (count >= 2)[:, None]  # a cell whose subject has a rest score
    w = weight.astype(np.float32)
    wy = ones * w
    total = ones.sum(axis=1).astype(np.float64)
    per = np.where(count >= 2, 1.0 / np.maximum(count - 1, 1), 0.0)  # 1 / (n_s - 1)
    # rest_sn = (total_s - y_sn) / (n_s - 1); binary y, so y^2 = y
    a, b = (total * per).astype(np.float32), per.astype(np.float32)
    sum_w = w.sum(axis=0, dtype=np.float64)
    sum_y = wy.sum(axis=0, dtype=np.float64)
    sum_rest = (a @ w).astype(np.float64) - (b @ wy)
    sum_y_rest = (a @ wy).astype(np.float64) - (b @ wy)
    cov = sum_y_rest - sum_y * sum_rest / np.maximum(sum_w, 1)
    return {"discrimination": np.where(cov < 0, -1.0, 1.0).astype(np.float32)}


def _block(name, owner, family, vague_prior, transform="identity", init=0.0, location=None,
           precision=None):
    """A parameter block plus its hyper-parameters under the chosen prior family; under
    ``population`` the pooled location's and precision's priors are ``location`` and
    ``precision`` (POPULATION_LOCATION and Gamma(1, 1) when None), under ``hierarchical``
    seed 003's."""
    if not pooled(family, owner):
        return [ParamSpec(name, owner, vague_prior, transform=transform, init=init)]
    if family == "population":
        mu, u, prior = hyper_params(name, location or POPULATION_LOCATION, precision)
    else:
        mu, u, prior = hyper_params(name)
    return [
        ParamSpec(**mu, init=init),
        ParamSpec(**u),
        ParamSpec(name, owner, prior, transform=transform, init=init),
    ]


def logistic_model(name: str, *, prior: str = "population",
                   signed_discrimination: bool = False) -> ModelSpec:
    """Build a binary logistic model under a prior family: ``population`` (the default),
    or seed 003's ``vague`` and ``hierarchical`` (sections 4.2-4.3).

    Population (default): ``theta ~ N(0, 1)``; the item blocks (difficulty, log
    discrimination) pool as in hierarchical, so the scale is the ability population's
    whatever the matrix's shape. (Under vague, the flat difficulty prior's volume stretches
    the scale where items outnumber subjects.)
    Vague: ``theta ~ N(0, 1)``, ``b ~ N(0, 10^3)``, ``log a ~ N(0, 1)``.
    Population's hyper-priors: ``mu_difficulty ~ N(0, 3^2)``, ``u_difficulty ~ Gamma(1, 1)``;
    of log a, ``mu_discrimination ~ N(0, 1)`` and ``u_discrimination ~ Gamma(2, 1/2)``.
    Hierarchical: each block ``~ N(mu, 1/u)`` with ``mu ~ N(0, 10^6)``, ``u ~ Gamma(1, 1)``.
    Asymptotes (guessing, feasibility): ``c ~ Beta(2, 8)`` and ``d ~ 1 - Beta(2, 8)`` under
    population, ``U[0, 1]`` under vague and hierarchical (seed 002 eq. 1, seed 004 A.1).
    With ``signed_discrimination`` the discrimination is fitted on the real line (DAD, seed
    002 footnote 4) with ``a ~ N(1, 1)`` (vague and population), started at 1.
    """
    if name not in LOGISTIC_MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {sorted(LOGISTIC_MODELS)}")
    check_family(prior)
    disc, lower, upper, description = LOGISTIC_MODELS[name]
    if signed_discrimination and not disc:
        raise ModelError(f"--signed-discrimination needs a model with discrimination, not {name!r}")
    params = []
    params += _block("ability", "subject", prior, normal(0.0, 1.0))
    params += _block("difficulty", "item", prior, normal(0.0, 1e3))
    if disc:
        if signed_discrimination:
            # Under population the signed discrimination keeps its N(1, 1): pooled, the
            # negative items it is there to flag would be pulled towards the positive ones.
            family = "vague" if prior == "population" else prior
            params += _block("discrimination", "item", family, normal(1.0, 1.0), init=1.0)
        else:
            # the pooled log discrimination: location N(0, 1) (a typical a in 0.14-7.4) and
            # precision Gamma(2, 1/2): spread sd 0.5 typical, over 1 with prior probability
            # 0.09, over 2 with 0.007 (Gamma(1, 1) put 10% on a spread over 3, a ~ e^+-6)
            params += _block("discrimination", "item", prior, normal(0.0, 1.0), transform="exp",
                             location=normal(0.0, 1.0), precision=log_gamma(2.0, 0.5))
    # the population's asymptote priors (see the docstring), as mirt users set one: mean 0.2
    # (0.8), 90% within 0.04-0.42 (0.58-0.96). Under U[0, 1] with pooled difficulties the
    # asymptotes took the items' spread over, and a guessing that could explain an item's
    # correct answers left its difficulty on a long ridge.
    population = prior == "population"
    if lower:
        params.append(ParamSpec("guessing", "item", logit_beta(2.0, 8.0) if population
                                else logit_uniform(), transform="sigmoid", init=-2.0))
    if upper:
        params.append(ParamSpec("feasibility", "item", logit_beta(8.0, 2.0) if population
                                else logit_uniform(), transform="sigmoid", init=2.0))
    # The logit a (theta - b) is unchanged by a common shift of theta and b, and by
    # scaling theta and b by k while dividing a by k.
    symmetries = [Symmetry("shift", (("ability", 0.0, 1.0), ("difficulty", 0.0, 1.0)))]
    if disc:
        a_move = ("discrimination", -1.0, 0.0) if signed_discrimination else ("discrimination", 0.0, -1.0)
        symmetries.append(Symmetry("scale", (("ability", 1.0, 0.0), ("difficulty", 1.0, 0.0), a_move)))
    label = name + ("-signed" if signed_discrimination else "")
    linear = _linear(disc=disc, lower=lower, upper=upper)
    return ModelSpec(
        name=label,
        kind="binary",
        params=tuple(params),
        linear=linear,
        # 1PL only: with a discrimination the start also sets where the fit lands on the
        # weakly identified scale ridge of the vague prior (seen moving posterior sds ~10%)
        # Signed: the start puts each item on the side of zero its data point to.
        initial=_logit_start if not disc else (_sign_start if signed_discrimination else None),
        description=f"{description}; {prior} priors",
        symmetries=tuple(symmetries),
    )
