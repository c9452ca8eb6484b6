"""Mean-field Gaussian guide on unconstrained parameters, and the fit state pytree."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engine.exported import register_structures
from engine.models.spec import ModelSpec

__all__ = ["GuideState", "FitState", "StepInfo", "init_guide", "reparameterise", "sample",
           "constrained_means"]


class GuideState(NamedTuple):
    """``q(x) = N(loc, exp(log_scale)^2)`` per unconstrained entry; dicts keyed by name."""

    loc: dict
    log_scale: dict


class FitState(NamedTuple):
    """Everything a fit carries between steps; checkpoints as arrays."""

    guide: GuideState
    opt_state: tuple | dict  # Adam's moments, or Newton's running cross curvatures
    step: jax.Array
    rng_key: jax.Array


class StepInfo(NamedTuple):
    """Per-step diagnostics, logged by the fit loop (never inside the step)."""

    elbo: jax.Array  # reparameterised single-sample Monte Carlo estimate
    elbo_smooth: jax.Array  # same sample, Taylor control variate removed
    max_step: jax.Array  # largest |change of loc| / posterior sd
    finite: jax.Array  # all terms finite


register_structures(GuideState, FitState, StepInfo)  # exported programs take and return them

def init_guide(spec: ModelSpec, num_subjects: int, num_items: int, init_scale: float = 0.1) -> GuideState:
    """Locations at each block's ``init``, scales at ``init_scale`` (host float32 arrays)."""
    loc, log_scale = {}, {}
    for p in spec.params:
        shape = p.full_shape(num_subjects, num_items)
        loc[p.name] = np.full(shape, np.asarray(p.init, np.float32), np.float32)  # init may be per-component
        log_scale[p.name] = np.full(shape, np.log(init_scale), np.float32)
    return GuideState(loc, log_scale)


def reparameterise(guide: GuideState, eps: dict) -> dict:
    """``z = loc + scale * eps`` for standard-normal ``eps`` keyed like the guide."""
    return {n: guide.loc[n] + jnp.exp(guide.log_scale[n]) * eps[n] for n in guide.loc}


def sample(guide: GuideState, *, rng_key: jax.Array) -> tuple[dict, dict]:
    """One reparameterised draw ``z = loc + scale * eps``; returns ``(z, eps)``.

    One normal vector covers every block (in name order), cut into the blocks' shapes: a
    single random-number kernel, which compiles several times faster than one per block.
    """
    names = sorted(guide.loc)
    sizes = [guide.loc[n].size for n in names]
    flat = jax.random.normal(rng_key, (sum(sizes),), jnp.float32)
    cuts = np.cumsum(sizes)[:-1]
    eps = {n: part.reshape(guide.loc[n].shape) for n, part in zip(names, jnp.split(flat, cuts))}
    return reparameterise(guide, eps), eps


def constrained_means(spec: ModelSpec, guide: GuideState) -> dict:
    """Point estimates: the constrained value at the posterior location (seed 003 4.2-4.4)."""
    return {p.name: p.constrain(guide.loc[p.name]) for p in spec.params}
