"""Model declarations (ModelSpec) and their registry."""

from engine.models.logistic import bernoulli_loglik, logistic_model
from engine.models.priors import Prior, log_gamma, logit_beta, logit_uniform, normal
from engine.models.registry import MODELS, default_prior, get_model
from engine.models.special import digamma, lbeta, lgamma, tetragamma, trigamma
from engine.models.spec import Linear, ModelSpec, ParamSpec, Symmetry

__all__ = [
    "ModelSpec", "ParamSpec", "Symmetry", "Linear", "lgamma", "digamma", "trigamma", "tetragamma",
    "lbeta", "Prior", "normal", "log_gamma", "logit_uniform", "logit_beta",
    "MODELS", "get_model", "default_prior", "logistic_model", "bernoulli_loglik",
]
