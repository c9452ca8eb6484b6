"""Prior densities on unconstrained parameter values, vague and hierarchical families.

Notation follows the seeds: ``N(m, v)`` has variance ``v``; ``N(mu, 1/u)`` has
precision ``u``; ``Gamma(a, b)`` has shape ``a`` and rate ``b``. A prior argument is
either a number or the name of a global parameter (its constrained value is used),
which is how hierarchical priors pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

__all__ = ["Prior", "normal", "log_gamma", "logit_uniform", "logit_beta", "hyper_params",
           "PRIOR_FAMILIES", "check_family", "pooled", "POPULATION_LOCATION"]

Arg = Union[float, str]
_LOG_2PI = 1.8378770664093453


@dataclass(frozen=True)
class Prior:
    """A density on the unconstrained value ``x``.

    family ``normal``: args (loc, variance) or (loc, None) with ``precision`` set.
    family ``log_gamma``: ``x = log u`` with ``u ~ Gamma(shape, rate)`` (Jacobian included).
    family ``logit_uniform``: ``x = logit(c)`` with ``c ~ U[0, 1]`` (Jacobian included).
    family ``logit_beta``: ``x = logit(c)`` with ``c ~ Beta(shape, rate)``: ``shape`` and
    ``rate`` hold the Beta's two shapes (Jacobian included; Beta(1, 1) is logit_uniform).
    """

    family: str
    loc: Arg = 0.0
    variance: Arg | None = 1.0
    precision: Arg | None = None
    shape_: float = 1.0
    rate: float = 1.0

    def normal_params(self, env: Mapping[str, jax.Array]):
        """``(loc, precision)`` of a ``normal`` prior, names looked up in ``env``."""
        get = lambda a: env[a] if isinstance(a, str) else a
        prec = get(self.precision) if self.precision is not None else 1.0 / get(self.variance)
        return get(self.loc), prec

    def log_prob(self, x, env: Mapping[str, jax.Array]):
        """Elementwise log density of unconstrained ``x``; ``env`` maps global names to values."""
        if self.family == "normal":
            loc, prec = self.normal_params(env)
            return 0.5 * (jnp.log(prec) - _LOG_2PI) - 0.5 * prec * (x - loc) ** 2
        if self.family == "log_gamma":
            a, b = self.shape_, self.rate
            return a * jnp.log(b) - gammaln(a) + a * x - b * jnp.exp(x)
        if self.family == "logit_uniform":
            return jax.nn.log_sigmoid(x) + jax.nn.log_sigmoid(-x)
        if self.family == "logit_beta":
            a, b = self.shape_, self.rate
            log_norm = gammaln(a + b) - gammaln(a) - gammaln(b)
            return log_norm + a * jax.nn.log_sigmoid(x) + b * jax.nn.log_sigmoid(-x)
        raise ValueError(f"unknown prior family {self.family!r}")

    def sample(self, rng, shape, env: Mapping[str, float]):
        """Draws of the unconstrained value (numpy), ``env`` as in :meth:`log_prob`."""
        if self.family == "normal":
            loc, prec = (float(v) for v in self.normal_params(env))
            return rng.normal(loc, 1.0 / np.sqrt(prec), shape)
        if self.family == "log_gamma":
            return np.log(rng.gamma(self.shape_, 1.0 / self.rate, shape))
        if self.family == "logit_uniform":
            c = rng.random(shape)
            return np.log(c) - np.log1p(-c)
        if self.family == "logit_beta":
            # logit of a Beta(a, b) draw as log G_a - log G_b (G ~ Gamma): no rounding to 0 or 1
            return (np.log(rng.gamma(self.shape_, 1.0, shape))
                    - np.log(rng.gamma(self.rate, 1.0, shape)))
        raise ValueError(f"unknown prior family {self.family!r}")

    def references(self) -> tuple[str, ...]:
        return tuple(a for a in (self.loc, self.variance, self.precision) if isinstance(a, str))

    def to_dict(self) -> dict:
        if self.family == "normal":
            d = {"family": "normal", "loc": self.loc}
            if self.precision is not None:
                d["precision"] = self.precision
            else:
                d["variance"] = self.variance
            return d
        if self.family == "log_gamma":
            return {"family": "log_gamma", "shape": self.shape_, "rate": self.rate}
        if self.family == "logit_beta":
            return {"family": "logit_beta", "a": self.shape_, "b": self.rate}
        return {"family": self.family}


# vague and hierarchical are seed 003's (sections 4.2-4.3). population keeps the subjects'
# vague N(0, 1) (the ability population that fixes the scale, as in marginal maximum
# likelihood) and pools each item block through N(mu, 1/u): a learned location and scale,
# so no flat prior's volume pulls the scale where items outnumber subjects. Its locations
# have proper, weakly informative priors (POPULATION_LOCATION, or the block's own): with
# few items seed 003's N(0, 10^6) leaves a funnel (a -> 0, b -> -inf) open to the exact
# posterior, and a prior that can be drawn from is what simulation-based calibration needs.
PRIOR_FAMILIES = ("vague", "hierarchical", "population")


def check_family(prior: str) -> str:
    """``prior`` when it names a prior family; ModelError naming the choices otherwise."""
    if prior not in PRIOR_FAMILIES:
        from engine.errors import ModelError

        raise ModelError(f"unknown prior family {prior!r}; use one of {', '.join(PRIOR_FAMILIES)}")
    return prior


def pooled(family: str, owner: str) -> bool:
    """Whether a block of ``owner`` pools through hyper-parameters under ``family``."""
    return family == "hierarchical" or (family == "population" and owner == "item")


def normal(loc: Arg = 0.0, variance: Arg | None = 1.0, *, precision: Arg | None = None) -> Prior:
    """``N(loc, variance)``, or ``N(loc, 1/precision)`` when ``precision`` is given."""
    return Prior("normal", loc=loc, variance=None if precision is not None else variance,
                 precision=precision)


# The population family's default location prior of a pooled block: sd 3 on the logit
# scale, so a block's mean difficulty may sit anywhere a benchmark's mean accuracy does
# (0.3%-99.7% for an average subject at two sd). Blocks on a log scale name their own.
POPULATION_LOCATION = normal(0.0, 9.0)


def log_gamma(shape: float = 1.0, rate: float = 1.0) -> Prior:
    """Density of ``log u`` for ``u ~ Gamma(shape, rate)``."""
    return Prior("log_gamma", shape_=shape, rate=rate, variance=None)


def logit_uniform() -> Prior:
    """Density of ``logit c`` for ``c ~ U[0, 1]``."""
    return Prior("logit_uniform", variance=None)


def logit_beta(a: float, b: float) -> Prior:
    """Density of ``logit c`` for ``c ~ Beta(a, b)``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"logit_beta needs positive shapes, got a={a}, b={b}")
    return Prior("logit_beta", shape_=float(a), rate=float(b), variance=None)


def hyper_params(block: str, location: Prior | None = None, precision: Prior | None = None):
    """The two global hyper-parameters of a pooled block.

    ``mu_<block> ~ location`` and ``u_<block> ~ precision``, the latter fitted as ``log u``;
    seed 003's ``N(0, 10^6)`` and ``Gamma(1, 1)`` (sections 4.2-4.3) where None. Returns
    ``(mu_spec_kwargs, u_spec_kwargs, prior_for_block)``.
    """
    mu, u = f"mu_{block}", f"u_{block}"
    return (
        dict(name=mu, owner="global", prior=location or normal(0.0, 1e6), in_likelihood=False),
        dict(name=u, owner="global", prior=precision or log_gamma(1.0, 1.0), transform="exp",
             in_likelihood=False),
        normal(mu, precision=u),
    )
