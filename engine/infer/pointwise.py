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


_PROGRAMS: dict[int, tuple[ModelSpec, frozenset, object]] = {}  # id(spec) -> its program


def _cell_fn(spec: ModelSpec, globals_: frozenset):
    """``f(draws, consts, y) -> (K, b)``: the per-cell log-likelihood at every draw; one
    jitted function per spec (kept for the last few), so that repeated calls (a sampler's
    chains, the compare command's models) trace it once per shape."""
    hit = _PROGRAMS.get(id(spec))
    if hit is not None and hit[0] is spec and hit[1] == globals_:
        return hit[2]
    lik = spec.likelihood_params

    def cell(params, consts, y):
        return spec.loglik({**params, **consts}, y, jnp.ones_like(y))

    over_cells = jax.vmap(cell, in_axes=({p.name: (None if p.name in globals_ else 0) for p in lik},
                                         0, 0))
    fn = jax.jit(jax.vmap(over_cells, in_axes=({p.name: 0 for p in lik}, None, None)))
    if len(_PROGRAMS) >= 8:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[id(spec)] = (spec, globals_, fn)
    return fn


def cell_loglik_draws(spec: ModelSpec, draws: dict[str, np.ndarray], subject_idx: np.ndarray,
                      item_idx: np.ndarray, y: np.ndarray, *, num_subjects: int,
                      num_items: int, out: np.ndarray | None = None,
                      chunk_values: int | None = None) -> np.ndarray:
    """``log p(y_c | params_k)`` for each draw ``k`` and cell ``c``, ``(K, b)``.

    ``draws`` holds constrained joint draws ``(K, *full_shape)`` of every likelihood block
    (:func:`engine.readout.posterior.draw_posterior`); each cell gets its subject's and
    item's values and the model's constants, and ``spec.loglik`` is evaluated per cell.

    ``out``: a ``(K, b)`` array to fill (float64 by default, made here); ``chunk_values``:
    about how many draw-cell values are evaluated together (by default every draw's for
    16,384 cells), so that what is held at once does not grow with ``K``.
    """
    lik = spec.likelihood_params
    owner = {p.name: p.owner for p in lik}
    consts = spec.constant_values(num_subjects, num_items)
    const_owner = {c.name: c.owner for c in spec.constants}
    fn = _cell_fn(spec, frozenset(n for n, o in owner.items() if o == "global"))
    num_draws = next(iter(draws.values())).shape[0]
    b = len(y)
    out = np.empty((num_draws, b), np.float64) if out is None else out
    step = num_draws if chunk_values is None else \
        max(1, min(num_draws, chunk_values // max(1, min(b, _CHUNK))))
    for d0 in range(0, num_draws, step):
        d1 = min(d0 + step, num_draws)
        fill = step - (d1 - d0)  # fixed shapes: one compile
        chunk = {n: np.asarray(draws[n][d0:d1]) for n in owner}
        if fill:
            chunk = {n: np.pad(v, [(0, fill)] + [(0, 0)] * (v.ndim - 1), mode="edge")
                     for n, v in chunk.items()}
        for start in range(0, b, _CHUNK):
            stop = min(start + _CHUNK, b)
            pad = _CHUNK - (stop - start) if b > _CHUNK else 0
            s = np.pad(subject_idx[start:stop], (0, pad))
            i = np.pad(item_idx[start:stop], (0, pad))
            yy = np.pad(np.asarray(y[start:stop], np.float32), (0, pad))
            params = {n: (chunk[n] if o == "global" else chunk[n][:, s if o == "subject" else i])
                      for n, o in owner.items()}
            c = {k: v[s if const_owner[k] == "subject" else i] for k, v in consts.items()}
            ll = np.asarray(fn(params, c, yy))
            out[d0:d1, start:stop] = ll[: d1 - d0, : stop - start]
    return out
