"""Model names -> builders. A new model is one file plus one line here."""

from __future__ import annotations

import inspect
from functools import partial
from typing import Callable

from engine.errors import ModelError
from engine.models.continuous import beta3_model, beta_model, gamma_model
from engine.models.logistic import logistic_model
from engine.models.multidim import mirt_model
from engine.models.spec import ModelSpec

__all__ = ["MODELS", "get_model", "default_prior", "resolve_prior", "models_by_default"]

# A builder's ``prior`` default is the model's (``default_prior``): population for the
# binary logistic models. Under it the asymptote models' guessing and feasibility take Beta
# priors (``logistic_model``); with U[0, 1] asymptotes their pooled difficulties shrank and
# the asymptotes took over (mean-field 4PL at 300 x 800: difficulty sd 0.17, r 0.49 against
# 0.61 vague), and seed 003's vague priors left guessing/difficulty ridges that the exact
# posterior follows (3PL 200 x 400: guessing 90% coverage 0.55). Vague stays available by name.
MODELS: dict[str, Callable[..., ModelSpec]] = {
    "1pl": partial(logistic_model, "1pl"),
    "2pl": partial(logistic_model, "2pl"),
    "3pl": partial(logistic_model, "3pl"),
    "4pl": partial(logistic_model, "4pl"),
    "feas": partial(logistic_model, "feas"),
    "beta": beta_model,
    "beta-1pl": partial(beta_model, discrimination=False),
    "gamma": gamma_model,
    "beta3": beta3_model,
    "mirt-comp": partial(mirt_model, "comp"),
    "mirt-noncomp": partial(mirt_model, "noncomp"),
    "irt-vec": partial(mirt_model, "vec"),
}


def default_prior(name: str) -> str:
    """The prior family the named model takes when none is named (its builder's default):
    ``population`` for the binary logistic models (1PL-4PL, feas), whose scale it keeps to
    the ability population's; ``vague`` for the others."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return inspect.signature(MODELS[name]).parameters["prior"].default


def resolve_prior(name: str, prior: str | None) -> str:
    """``prior``, or the model's default when it is None (what fit.json then records)."""
    return default_prior(name) if prior is None else prior


def get_model(name: str, **options) -> ModelSpec:
    """Build the named model; ``options`` are the builder's keywords (``prior=...``)."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    try:
        inspect.signature(MODELS[name]).bind(**options)
    except TypeError as err:  # an option the builder does not take
        taken = [p for p in inspect.signature(MODELS[name]).parameters
                 if p not in ("self", "args", "kwargs")]
        raise ModelError(f"model {name!r}: {err}; its options are {', '.join(taken) or 'none'}") \
            from None
    return MODELS[name](**options)


def models_by_default() -> dict[str, ModelSpec]:
    """Each registered model that builds without options, built (the multi-skill models need
    their skills and are left out): what error messages list as the models to choose."""
    out = {}
    for name in MODELS:
        try:
            out[name] = get_model(name)
        except ModelError:
            continue
    return out
