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

__all__ = ["MODELS", "get_model"]

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


def get_model(name: str, **options) -> ModelSpec:
    """Build the named model; ``options`` are the builder's keywords (``prior=...``)."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    try:
        inspect.signature(MODELS[name]).bind(**options)
    except TypeError as err:  # an option the builder does not take
        raise ModelError(f"model {name!r}: {err}; see the builder's documented options") from None
    return MODELS[name](**options)
