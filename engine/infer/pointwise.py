"""The per-cell log-likelihood at posterior draws: ``log p(y_c | params_k)`` for chosen cells.

Held-out scoring (:mod:`engine.readout.compare`) and a sampler's pointwise log-likelihood
(ArviZ's ``log_likelihood`` group, :mod:`engine.infer.nuts`) both read it; it evaluates the
model's own ``spec.loglik`` cell by cell, so no model is defined twice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from engine.models.spec import ModelSpec

__all__ = ["cell_loglik_draws"]

_CHUNK = 1 << 14  # cells evaluated together (times the number of draws)


def _cell_fn(spec: ModelSpec, globals_: frozenset):
    """``f(draws, consts, y) -> (K, b)``: the per-cell log-likelihood at every draw."""
    lik = spec.likelihood_params

    def cell(params, consts, y):
        return spec.loglik({**params, **consts}, y, jnp.ones_like(y))

    over_cells = jax.vmap(cell, in_axes=({p.name: (None if p.name in globals_ else 0) for p in lik},
                                         0, 0))
    return jax.jit(jax.vmap(over_cells, in_axes=({p.name: 0 for p in lik}, None, None)))


def cell_loglik_draws(spec: ModelSpec, draws: dict[str, np.ndarray], subject_idx: np.ndarray,
                      item_idx: np.ndarray, y: np.ndarray, *, num_subjects: int,
                      num_items: int) -> np.ndarray:
    """``log p(y_c | params_k)`` for each draw ``k`` and cell ``c``, ``(K, b)``.

    ``draws`` holds constrained joint draws ``(K, *full_shape)`` of every likelihood block
    (:func:`engine.readout.posterior.draw_posterior`); each cell gets its subject's and
    item's values and the model's constants, and ``spec.loglik`` is evaluated per cell.
    """
    lik = spec.likelihood_params
    owner = {p.name: p.owner for p in lik}
    consts = spec.constant_values(num_subjects, num_items)
    const_owner = {c.name: c.owner for c in spec.constants}
    fn = _cell_fn(spec, frozenset(n for n, o in owner.items() if o == "global"))
    num_draws = next(iter(draws.values())).shape[0]
    b = len(y)
    out = np.empty((num_draws, b), np.float64)
    for start in range(0, b, _CHUNK):
        stop = min(start + _CHUNK, b)
        pad = _CHUNK - (stop - start) if b > _CHUNK else 0  # fixed shapes: one compile
        s = np.pad(subject_idx[start:stop], (0, pad))
        i = np.pad(item_idx[start:stop], (0, pad))
        yy = np.pad(np.asarray(y[start:stop], np.float32), (0, pad))
        params = {n: (draws[n] if o == "global" else draws[n][:, s if o == "subject" else i])
                  for n, o in owner.items()}
        c = {k: v[s if const_owner[k] == "subject" else i] for k, v in consts.items()}
        ll = np.asarray(fn(params, c, yy), np.float64)
        out[:, start:stop] = ll[:, : stop - start]
    return out
