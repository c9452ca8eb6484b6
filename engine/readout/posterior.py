"""Posterior read-outs from the mean-field guide: summaries and joint draws."""

from __future__ import annotations

from functools import lru_cache, partial
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from engine.infer.guide import GuideState
from engine.exported import QUICK_COMPILE
from engine.host import to_device
from engine.models.spec import TRANSFORMS, ModelSpec

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["draw_posterior", "summarize", "summarize_draws", "summary_columns",
           "draw_summary_columns", "result_columns", "within_owner_scales", "interval_90",
           "Z90"]

Z90 = 1.6448536269514722  # standard normal 95th percentile: a central 90% interval


def draw_posterior(spec: ModelSpec, guide: GuideState, num_draws: int, *, rng_key,
                   names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """Joint draws of constrained parameters, ``(num_draws, *block_shape)`` per name.

    ``rng_key`` is a JAX PRNG key, or a Python int seed standing for
    ``jax.random.PRNGKey(seed)`` (the same draws; the key is then made inside the compiled
    program, which saves a fresh process two small programs).

    Every subject is drawn independently (the joint posterior of the factors), twins
    included: the read-outs pool the statistics of subjects whose factors are identical
    (:func:`engine.readout.ranking.rank_stats`, ``pooled_statistics``, ``pooled_pairs``).
    """
    names = names or spec.names
    seeded = isinstance(rng_key, (int, np.integer))
    key = np.int64(rng_key) if seeded else rng_key
    params = tuple(spec.param(name) for name in names)
    locs = tuple(to_device(np.asarray(guide.loc[name])) for name in names)
    log_scales = tuple(to_device(guide.log_scale[name]) for name in names)
    shapes = tuple((num_draws,) + np.shape(guide.loc[name])[:1] for name in names)
    values = sum(int(np.prod(sh)) * int(np.prod(np.shape(lc)[1:])) for sh, lc in zip(shapes, locs))
    draw = _blocks_draws_quick if values <= _QUICK_DRAWS else _blocks_draws
    out = draw(params, key, seeded, locs, log_scales, shapes)
    return {name: np.asarray(v) for name, v in zip(names, out)}


def _draw_blocks(params, key, seeded, locs, log_scales, shapes):
    """Every block's constrained draws in one compiled program (one a process, not one a
    block: the 2PL's seven blocks at LSAT7's shape, a warm first call 0.51 -> 0.29 s, the
    same draws to the bit): block ``i``'s noise from the ``i``-th of ``len(params)`` keys
    split from ``key`` (a seed where ``seeded``); ``shapes[i]`` is ``(draws, owners)``."""
    keys = jax.random.split(jax.random.PRNGKey(key) if seeded else key, len(params))
    out = []
    for i, (param, loc, log_scale, shape) in enumerate(zip(params, locs, log_scales, shapes)):
        eps = jax.random.normal(keys[i], shape + loc.shape[1:], jnp.float32)
        out.append(param.constrain(loc + jnp.exp(log_scale) * eps))
    return tuple(out)


_STATIC = ("params", "seeded", "shapes")
_blocks_draws = jax.jit(_draw_blocks, static_argnames=_STATIC)
# Up to _QUICK_DRAWS values the program is compiled fast: LSAT7's 1,000 draws of 32 distinct
# abilities, 0.25-0.3 s less to compile (one loaded core), 6 ms against 0.4 ms to run; at
# `ability`'s 1,199 it would run 0.15 s against 0.02 s, each warm process
_QUICK_DRAWS = 1 << 18
_blocks_draws_quick = jax.jit(_draw_blocks, static_argnames=_STATIC,
                              compiler_options=QUICK_COMPILE)


def within_owner_scales(spec: ModelSpec, guide: GuideState, owner: str,
                        cross: dict) -> dict[str, np.ndarray]:
    """Marginal posterior sds of ``owner``'s coupled scalar blocks (linear response).

    The mean-field guide's precision of, say, an item's difficulty is its conditional
    precision; the item's difficulty and discrimination are correlated in the posterior, so
    their marginal sds are wider. Per owner, the ``k x k`` precision (guide precisions on the
    diagonal, minus the likelihood's cross curvatures ``cross["a|b"]`` off it) is inverted;
    owners where it is not finite or not positive definite keep the mean-field sds.
    """
    pairs = [(tuple(k.split("|")), np.asarray(v, np.float64)) for k, v in cross.items()]
    coupled = {n for (a, b), _ in pairs for n in (a, b)}
    names = [p.name for p in spec.by_owner(owner) if p.shape == () and p.name in coupled]
    if not names:
        return {}
    at = {n: i for i, n in enumerate(names)}
    prec = np.stack([np.exp(-2.0 * np.asarray(guide.log_scale[n], np.float64)) for n in names], -1)
    eye = np.eye(len(names))
    diag = prec[:, :, None] * eye
    full = diag.copy()
    for (a, b), h in pairs:
        if a in at and b in at:
            full[:, at[a], at[b]] = full[:, at[b], at[a]] = -h
    finite = np.isfinite(full).all(axis=(-2, -1))
    full = np.where(finite[:, None, None], full, diag)
    ok = finite & (np.linalg.eigvalsh(full).min(axis=-1) > 0)
    cov = np.linalg.inv(np.where(ok[:, None, None], full, diag))
    return {n: np.sqrt(cov[:, i, i]).astype(np.float32) for n, i in at.items()}


@lru_cache(maxsize=1)
def _hermite() -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' Gauss-Hermite rule for ``E[f(loc + scale Z)]``, ``Z ~ N(0, 1)``, a smooth
    ``f``: float32 nodes and float64 weights summing to 1 (the outer weights are 3e-49, 0 in
    float32). With 64 nodes (in float64, against scipy) a log-normal's mean and sd are exact
    to 1e-9 for scales up to 4, a logistic-normal's mean to 5e-6 at scale 5 and 3e-5 at 10."""
    from numpy.polynomial.hermite_e import hermegauss

    nodes, weights = hermegauss(64)
    return nodes.astype(np.float32), weights / weights.sum()


@partial(jax.jit, static_argnames=("transform",))
def _through(transform: str, x):
    """``x`` through the elementwise ``transform`` (one small program per transform and
    shape: the read-out's moments are summed on the host, which compiles faster)."""
    return TRANSFORMS[transform](x)


def _constrained(transform: str, loc, scale, low, high, *scales):
    """``(mean, sd, q05, q95)`` of a block whose unconstrained value is Gaussian with
    location ``loc`` and scale ``scale``, with 90% bounds ``low``, ``high`` on the
    unconstrained scale, through its elementwise ``transform``; then the sd under each of
    ``scales``. Mean and sd are the constrained value's posterior moments, by Gauss-Hermite
    quadrature about ``transform(loc)`` (so a small sd keeps its digits); the bounds map
    exactly through the monotone transform."""
    if transform == "identity":
        return (loc, scale, low, high) + scales
    nodes, w = _hermite()
    scales = (scale,) + scales
    cols = [a[..., None] for a in (loc, low, high)] + [
        loc[..., None] + s[..., None] * nodes for s in scales]
    value = np.asarray(_through(transform, to_device(np.concatenate(cols, axis=-1))), np.float64)
    centre, q = value[..., 0], len(nodes)
    shifts, sds = [], []
    for j in range(len(scales)):
        d = value[..., 3 + j * q:3 + (j + 1) * q] - centre[..., None]
        with np.errstate(invalid="ignore"):  # a value past float32's range: mean and sd inf
            shift = d @ w
            sd = np.sqrt(np.maximum((d * d) @ w - shift * shift, 0.0))
        shifts.append(shift)
        sds.append(np.where(np.isfinite(shift), sd, np.inf))
    out = (centre + shifts[0], sds[0], value[..., 1], value[..., 2], *sds[1:])
    return tuple(np.asarray(a, np.float32) for a in out)


def summarize(spec: ModelSpec, guide: GuideState, owner: str,
              cross: dict | None = None) -> pd.DataFrame:
    """:func:`summary_columns` as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(summary_columns(spec, guide, owner, cross))


def interval_90(loc, scale, sampled=None) -> tuple[np.ndarray, np.ndarray]:
    """The 90% interval of an unconstrained value: the sampled 5% and 95% quantiles
    ``sampled`` ``(2, ...)`` (``FitResult.intervals``) where given and finite, else the
    Gaussian's ``loc -+ Z90 scale``."""
    low, high = loc - Z90 * scale, loc + Z90 * scale
    if sampled is not None:
        given = np.asarray(sampled, np.asarray(low).dtype)
        low = np.where(np.isfinite(given[0]), given[0], low)
        high = np.where(np.isfinite(given[1]), given[1], high)
    return low, high


def result_columns(res, owner: str) -> dict[str, np.ndarray]:
    """A fit's per-owner table as its run's subjects / items tables report it: a sampler's
    draws summarised (:func:`draw_summary_columns`, NUTS), else the guide's
    (:func:`summary_columns`), the items with the fit's within-item couplings, sampled or
    importance-weighted quantiles and sampled moments, the subjects with a quadrature fit's
    exact ability quantiles."""
    if res.draws:
        return draw_summary_columns(res.spec, res.draws, owner)
    if owner == "item":
        return summary_columns(res.spec, res.guide, owner, cross=res.cross,
                               intervals=res.intervals, moments=res.moments)
    # a quadrature fit's abilities: each pattern's exact posterior quantiles
    return summary_columns(res.spec, res.guide, owner, intervals=res.intervals)


def summary_columns(spec: ModelSpec, guide: GuideState, owner: str,
                    cross: dict | None = None, intervals: dict | None = None,
                    moments: dict | None = None) -> dict[str, np.ndarray]:
    """Per-owner table: ``{name}_mean``, ``_sd``, ``_q05``, ``_q95`` for each scalar block,
    and ``{name}_{skill}_mean`` ... for each component of a ``(D,)`` block.

    Mean and sd are the posterior moments of the reported (constrained) value: for a
    transformed block under its Gaussian, ``E[exp(z)]`` and ``sd(exp(z))`` for a log-normal
    discrimination, not seed 003's ``exp(mu)`` and delta-method sd (the posterior median
    and its slope; ``exp(mu)`` stays the interval's centre on the log scale). So a fit's
    columns and a sampler's (:func:`draw_summary_columns`, the draws' mean and sd) are the
    same quantities. Quantiles map the Gaussian's exactly through the monotone transform.
    With ``moments`` (``FitResult.moments``: sampled constrained means and sds, split
    R-hats, effective draws and the sds' Monte Carlo standard errors, ``(5, ...)``) a
    block's mean and sd are those, where finite, and ``{name}_rhat``, ``{name}_ess`` and
    ``{name}_mcse_sd`` give the diagnostics (NaN where the block was not sampled). With ``cross``
    (``FitResult.cross``) blocks coupled within an owner get their marginal sds
    (:func:`within_owner_scales`) and keep the guide's in ``{name}_sd_meanfield``. With
    ``intervals`` (``FitResult.intervals``: sampled 5% and 95% quantiles of the
    unconstrained value, ``(2, ...)``) a block's quantiles are those, where finite.
    """
    cols = {}
    masks = spec.masks_of(guide.loc, axis=0, owner=owner)
    marginal = within_owner_scales(spec, guide, owner, cross) if cross else {}
    for p in spec.by_owner(owner):
        if len(p.shape) > 1:
            continue
        loc = np.asarray(guide.loc[p.name], np.float32)
        meanfield = np.exp(np.asarray(guide.log_scale[p.name], np.float32))
        scale = np.asarray(marginal.get(p.name, meanfield), np.float32)
        low, high = interval_90(loc, scale, (intervals or {}).get(p.name))
        value, sd, low, high, *meanfield_sd = _constrained(
            p.transform, loc, scale, low, high, *([meanfield] if p.name in marginal else []))
        drawn = (moments or {}).get(p.name)
        if drawn is not None:  # the sampler's own moments, where it sampled the block
            drawn = np.asarray(drawn, np.float32)
            value = np.where(np.isfinite(drawn[0]), drawn[0], value)
            sd = np.where(np.isfinite(drawn[1]), drawn[1], sd)
        keep = masks.get(p.name, 1.0)  # effective value: zero where a declared mask is zero
        # (D,) blocks get one column set per component, named by the model's skills
        labels = [""] if p.shape == () else [
            f"_{s}" for s in (spec.skills if len(spec.skills) == p.shape[0] else range(p.shape[0]))]
        for d, label in enumerate(labels):
            pick = (lambda a: a) if p.shape == () else (lambda a, d=d: a[:, d])
            name = f"{p.name}{label}"
            cols[f"{name}_mean"] = np.asarray(pick(keep * value))
            cols[f"{name}_sd"] = np.asarray(pick(keep * sd))
            cols[f"{name}_q05"] = np.asarray(pick(keep * low))
            cols[f"{name}_q95"] = np.asarray(pick(keep * high))
            if drawn is not None:
                cols[f"{name}_rhat"], cols[f"{name}_ess"] = (np.asarray(pick(a)) for a in drawn[2:4])
                if len(drawn) > 4:  # the sd's Monte Carlo error (moments of older fits: none)
                    cols[f"{name}_mcse_sd"] = np.asarray(pick(keep * drawn[4]))
            if p.name in marginal:
                cols[f"{name}_sd_meanfield"] = np.asarray(pick(keep * meanfield_sd[0]))
    return cols


def summarize_draws(spec: ModelSpec, draws: dict, owner: str) -> pd.DataFrame:
    """:func:`draw_summary_columns` as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(draw_summary_columns(spec, draws, owner))


def draw_summary_columns(spec: ModelSpec, draws: dict, owner: str) -> dict[str, np.ndarray]:
    """:func:`summary_columns`'s table from a sampler's constrained draws ``(chains, draws,
    *full_shape)`` per block (NUTS): posterior mean, sd and 5% / 95% quantiles of the draws,
    and each value's split R-hat, effective draws and its sd's Monte Carlo standard error
    (``_rhat``, ``_ess``, ``_mcse_sd``: ArviZ's ``rhat(method="split")``,
    ``ess(method="mean")`` and ``mcse(method="sd")``).
    """
    from engine.infer.sampler import effective_draws, sd_standard_error, split_rhat

    cols = {}
    masks = spec.masks_of(draws, axis=2, owner=owner)
    for p in spec.by_owner(owner):
        if len(p.shape) > 1:
            continue
        chained = np.asarray(draws[p.name], np.float64)
        d = chained.reshape((-1,) + chained.shape[2:]) * masks.get(p.name, 1.0)
        q05, q95 = np.quantile(d, [0.05, 0.95], axis=0)
        stats = {"mean": d.mean(axis=0), "sd": d.std(axis=0, ddof=1), "q05": q05, "q95": q95,
                 "rhat": split_rhat(chained), "ess": effective_draws(chained),
                 "mcse_sd": sd_standard_error(chained * masks.get(p.name, 1.0))}
        if p.name in masks:  # a pinned entry (0 in every draw) was not sampled: no diagnostics
            for stat in ("rhat", "ess", "mcse_sd"):
                stats[stat] = np.where(masks[p.name] != 0, stats[stat], np.nan)
        labels = [""] if p.shape == () else [
            f"_{s}" for s in (spec.skills if len(spec.skills) == p.shape[0] else range(p.shape[0]))]
        for k, label in enumerate(labels):
            for stat, v in stats.items():
                cols[f"{p.name}{label}_{stat}"] = (v if p.shape == () else v[:, k]).astype(np.float32)
    return cols
