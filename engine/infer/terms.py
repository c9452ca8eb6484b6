"""Likelihood terms of a block: a value with its gradient and Hessian pieces per block.

Both ways of computing them (per cell in :mod:`engine.infer.elbo`, through a linear
predictor in :mod:`engine.infer.linear`) return this one type.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from engine.exported import register_structures
from engine.models.spec import ModelSpec

__all__ = ["Terms", "add_terms", "scale_terms", "cross_pairs", "terms_shapes",
           "value_grad_hessian"]


class Terms(NamedTuple):
    """A scalar value with its gradient and Hessian pieces, dicts keyed by parameter.

    ``hess[name]`` is the diagonal; ``cross["a|b"]`` the mixed second derivative of two
    scalar blocks of the same owner (e.g. one item's difficulty and discrimination).
    """

    value: jax.Array
    grad: dict
    hess: dict
    cross: dict = {}


register_structures(Terms)  # exported programs take and return them


def value_grad_hessian(f, argnum: int = 0):
    """``f``'s value, gradient and Hessian in argument ``argnum`` (traced), from one
    forward-over-reverse pass: the value and gradient ride along as the Hessian's
    auxiliary outputs. Three separate transforms traced ``f`` three times (LSAT7's
    cold fit: exporting the marginal fit's three programs that use this took 0.37 s,
    0.51 s before)."""
    def grad_and_aux(*args):
        value, grad = jax.value_and_grad(f, argnum)(*args)
        return grad, (value, grad)

    def terms(*args):
        hess, (value, grad) = jax.jacfwd(grad_and_aux, argnum, has_aux=True)(*args)
        return value, grad, hess

    return terms


def add_terms(a: Terms, b: Terms) -> Terms:
    return jax.tree.map(jnp.add, a, b)


def scale_terms(t: Terms, factor) -> Terms:
    return jax.tree.map(lambda x: x * factor, t)


def cross_pairs(spec: ModelSpec) -> list[tuple[str, str]]:
    """Pairs of scalar likelihood blocks with the same owner (whose mixed terms we keep)."""
    lik = [p for p in spec.likelihood_params if p.shape == () and p.owner != "global"]
    return [(a.name, b.name) for i, a in enumerate(lik) for b in lik[i + 1:] if a.owner == b.owner]


def terms_shapes(spec: ModelSpec, num_subjects: int, num_items: int, with_hessian: bool = True,
                 frozen: frozenset = frozenset()) -> Terms:
    """The shapes of a block's terms (``jax.ShapeDtypeStruct`` leaves), read from ``spec``
    without tracing it: what both term builders return for these arguments."""
    f32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    free = [p for p in spec.likelihood_params if p.name not in frozen]
    grad = {p.name: f32(p.full_shape(num_subjects, num_items)) for p in free}
    owner = {p.name: p for p in free}
    cross = {f"{a}|{b}": f32(owner[a].full_shape(num_subjects, num_items))
             for a, b in cross_pairs(spec) if with_hessian and a in owner and b in owner}
    return Terms(f32(()), grad, dict(grad), cross)
