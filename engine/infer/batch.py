"""Many small fits at once: the fit step vectorised with ``jax.vmap`` over a batch of trials.

Resampling trials (ranking stability, bootstrap) refit the same model on many matrices of one
shape. Each trial here runs the very update of ``engine.infer.step`` on its whole matrix as a
single block (one Monte Carlo draw per step unless ``FitSettings.mc_draws`` sets more);
``vmap`` stacks the trials and ``lax.scan`` runs a fixed number of passes, so a batch compiles
once and runs as one program. Trials start from a warm guide (usually the full fit's posterior,
sliced to the trial's items), so few passes suffice; every trial's ELBO trace comes back so the
caller can check convergence with the same rule as ``fit_source``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engine.compile_cache import count_compiles, use_compilation_cache
from engine.infer.elbo import make_block_terms
from engine.infer.fit import converged_at
from engine.infer.guide import FitState, GuideState
from engine.infer.settings import FitSettings
from engine.infer.step import draw_many, init_opt_state, make_update, stack_draws
from engine.infer.terms import terms_shapes
from engine.models.spec import ModelSpec

__all__ = ["BatchResult", "fit_batch", "slice_guide"]


class BatchResult(NamedTuple):
    """Averaged final guides (leading axis: trial) and per-pass ELBO traces."""

    guide: GuideState  # numpy arrays, each with a leading trial axis
    elbo: np.ndarray  # (trials, passes) smoothed ELBO per pass
    converged: np.ndarray  # (trials,) bool, by ``engine.infer.fit.converged_at``


def slice_guide(spec: ModelSpec, guide: GuideState, subjects=None, items=None) -> GuideState:
    """The guide restricted to some subjects and/or items (global blocks kept whole)."""
    pick = {"subject": subjects, "item": items}
    loc, log_scale = {}, {}
    for p in spec.params:
        idx = pick.get(p.owner)
        take = (lambda a: np.asarray(a)) if idx is None else (lambda a: np.asarray(a)[idx])
        loc[p.name], log_scale[p.name] = take(guide.loc[p.name]), take(guide.log_scale[p.name])
    return GuideState(loc, log_scale)


@lru_cache(maxsize=64)
def _batched(spec: ModelSpec, settings: FitSettings, num_subjects: int, num_items: int,
             num_passes: int, window: int, draws: int):
    terms = make_block_terms(spec, num_subjects, num_items, with_hessian=True)
    update = make_update(spec, settings)
    subject_idx = jnp.arange(num_subjects, dtype=jnp.int32)
    item_idx = jnp.arange(num_items, dtype=jnp.int32)

    shapes = terms_shapes(spec, num_subjects, num_items, with_hessian=True)

    def one(guide: GuideState, y, key):
        state = FitState(guide, init_opt_state(settings, guide, shapes), jnp.zeros((), jnp.int32),
                         key)
        zeros = jax.tree.map(jnp.zeros_like, guide)

        def body(carry, i):
            state, acc = carry
            state, zs, epss = draw_many(state, draws)  # as fit_source draws them
            z, eps = stack_draws(*zs), stack_draws(*epss)
            # per draw, as fit_source computes them (a vmap over draws rounds differently)
            lik = stack_draws(*[terms(zk, subject_idx, item_idx, y) for zk in zs])
            state, info = update(state, z, eps, lik, jnp.float32(1.0))
            keep = (i >= num_passes - window).astype(jnp.float32)
            acc = jax.tree.map(lambda a, g: a + keep * g, acc, state.guide)
            return (state, acc), info.elbo_smooth

        (state, acc), trace = jax.lax.scan(body, (state, zeros), jnp.arange(num_passes))
        return jax.tree.map(lambda a: a / window, acc), trace

    return jax.jit(jax.vmap(one))


def fit_batch(spec: ModelSpec, y: np.ndarray, init: GuideState, seeds, num_passes: int = 30,
              settings: FitSettings = FitSettings()) -> BatchResult:
    """Fit ``spec`` to each matrix of ``y`` (trials, subjects, items) for ``num_passes`` passes.

    Parameters
    ----------
    y : int8 ``(T, S, N)`` responses with ``-1`` missing, one matrix per trial.
    init : a guide whose arrays carry a leading trial axis ``T`` (see ``slice_guide``).
    seeds : ``T`` integers; trial ``t`` draws its Monte Carlo samples from ``seeds[t]``.
    num_passes : passes per trial; the last ``settings.patience`` are Polyak-averaged.

    Returns
    -------
    BatchResult; ``converged[t]`` applies the convergence rule of ``fit_source`` to the trace.
    """
    use_compilation_cache()
    settings = settings.for_model(spec)  # the model's own optimizer; naming another is refused
    y = np.asarray(y, np.int8)
    if y.ndim != 3:
        raise ValueError(f"y must be (trials, subjects, items), got shape {y.shape}")
    T, S, N = y.shape
    window = max(1, min(settings.patience, num_passes))
    # One Monte Carlo draw per step unless settings.mc_draws asks for more: the trials' final
    # guides are Polyak averages, and on 161 x 25 trials 16 draws moved the stability taus by
    # 0.003 at 1.4x the cost (BENCHMARKS.md), so the automatic rule of fit_source is not used.
    draws = settings.mc_draws or 1
    run = _batched(spec, settings, S, N, int(num_passes), window, draws)
    # Pad the batch to a power of two by repeating trial 0, so a few programs serve all
    # batch sizes; the padding is dropped below.
    padded = 1 << max(0, (T - 1).bit_length())
    fill = lambda a: np.concatenate([a, np.repeat(a[:1], padded - T, axis=0)]) if padded > T else a
    seeds = fill(np.asarray(seeds, np.uint32).reshape(T))
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
    guide = jax.tree.map(lambda a: jnp.asarray(fill(np.asarray(a, np.float32))), init)
    with count_compiles():  # a batch that compiled a new program prunes the cache to its cap
        out, trace = run(guide, jnp.asarray(fill(y)), keys)
    out = jax.tree.map(lambda a: np.asarray(a)[:T], out)
    trace = np.asarray(trace)[:T]
    converged = np.array([converged_at(list(t), settings.tol, window, min(settings.min_passes, len(t)))
                          for t in trace])
    return BatchResult(out, trace, converged)
