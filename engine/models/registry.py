"""Model names -> builders. A new model is one file plus one line here."""

from __future__ import annotations

from functools import partial
from typing import Callable

from engine.errors import ModelError
from engine.models.logistic import logistic_model
from engine.models.spec import ModelSpec

__all__ = ["MODELS", "get_model"]

MODELS: dict[str, Callable[..., ModelSpec]] = {
    "1pl": partial(logistic_model, "1pl"),
    "2pl": partial(logistic_model, "2pl"),
    "3pl": partial(logistic_model, "3pl"),
    "4pl": partial(logistic_model, "4pl"),
    "feas": partial(logistic_model, "feas"),
}


def get_model(name: str, **options) -> ModelSpec:
    """Build the named model; ``options`` are the builder's keywords (``prior=...``)."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name](**options)
