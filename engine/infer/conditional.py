"""Abilities of new subjects given frozen item factors: the exact mean-field update on a grid.

With every item and global factor of a fitted guide held fixed, the subjects are
conditionally independent, and the optimal mean-field factor of one subject's scalar
ability is (coordinate-ascent VI)

    q*(theta_s)  proportional to  p(theta_s) exp( sum_n E_q(item n)[ log p(y_sn | theta_s, item n) ] ).

For binary responses the expected log-likelihood of a cell only takes two values per
ability, ``E1[g, n]`` (y = 1) and ``E0[g, n]`` (y = 0). Tabulated on a grid of abilities
(once per item, independent of the subjects), the log of q* for every subject is one
matrix product, ``(y == 1) @ E1.T + (y == 0) @ E0.T``: a single pass over the responses.
The item expectations use deterministic sigma points of each item's Gaussian factor.
A cubic spline through the grid values then gives q*'s mean and sd (the Gaussian factor
reported is moment-matched), whether q* is broad (few responses) or much narrower than
the grid (tens of thousands).

Only the declared structure is read: one scalar subject block, binary responses. Other
models are scored by the general frozen fit (:func:`engine.score.score_responses`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from scipy.interpolate import CubicSpline

from engine.errors import ModelError
from engine.infer.guide import GuideState
from engine.models.spec import ModelSpec

__all__ = ["GridSettings", "conditional_applies", "conditional_abilities", "sigma_points"]


@dataclass(frozen=True)
class GridSettings:
    """Settings of the grid update.

    grid_size : ability grid points (the spline's knots); 48 resolve posteriors of sd 0.01
        on a 20-unit grid to 1% of their sd (measured against 600 points).
    margin : the grid spans the run's abilities widened by this many units each side; it
        is widened further for subjects whose posterior reaches an edge.
    item_chunk : items tabulated per compiled call (bounds memory).
    window : the posterior is integrated over this many spline widths around its mode.
    """

    grid_size: int = 48
    margin: float = 2.0
    item_chunk: int = 16384
    window: float = 12.0
    max_widen: int = 6


def conditional_applies(spec: ModelSpec) -> bool:
    """True when the model has one scalar subject block and binary responses."""
    subject = spec.by_owner("subject")
    return spec.kind == "binary" and len(subject) == 1 and subject[0].shape == () \
        and subject[0].in_likelihood


def sigma_points(num_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit sigma points ``(P, d)`` and weights ``(P,)`` of a standard d-variate normal.

    ``2d + 1`` points (the unscented transform with ``kappa = max(3 - d, 0)``): exact
    expectations of polynomials up to degree 3 and of the fourth moment per axis for d <= 3.
    """
    kappa = max(3.0 - num_dims, 0.0)
    spread = np.sqrt(num_dims + kappa)
    points = np.zeros((2 * num_dims + 1, num_dims))
    for i in range(num_dims):
        points[1 + 2 * i, i], points[2 + 2 * i, i] = spread, -spread
    weights = np.full(2 * num_dims + 1, 0.5 / (num_dims + kappa))
    weights[0] = kappa / (num_dims + kappa)
    return points, weights


def _item_points(spec: ModelSpec, guide: GuideState, item_idx) -> tuple[dict, np.ndarray]:
    """Sigma points of every item block's factor: ``{name: (P, n[, *shape])}`` unconstrained,
    with their weights; global blocks at their locations."""
    blocks = [p for p in spec.likelihood_params if p.owner == "item"]
    loc = {p.name: np.asarray(guide.loc[p.name], np.float32) for p in blocks}
    scale = {p.name: np.exp(np.asarray(guide.log_scale[p.name], np.float32)) for p in blocks}
    if item_idx is not None:
        loc = {k: v[item_idx] for k, v in loc.items()}
        scale = {k: v[item_idx] for k, v in scale.items()}
    sizes = [int(np.prod(p.shape, dtype=int)) for p in blocks]
    units, weights = sigma_points(sum(sizes))
    points, start = {}, 0
    for p, size in zip(blocks, sizes):
        u = units[:, start:start + size].reshape((-1, 1) + tuple(p.shape)).astype(np.float32)
        points[p.name] = loc[p.name][None] + scale[p.name][None] * u
        start += size
    return points, weights.astype(np.float32)


@partial(jax.jit, static_argnames=("spec",))
def _expected_loglik(spec: ModelSpec, grid, points, weights, globals_):
    """``(E1, E0, log prior)``: ``(n, g)`` sigma-point expectations of the per-cell
    log-likelihood for y = 1 and y = 0 at each grid ability, and the ability prior's log
    density on the grid (globals at their locations)."""
    (subject,) = spec.by_owner("subject")
    env = {p.name: p.constrain(globals_[p.name]) for p in spec.params if p.owner == "global"}

    def at_point(pt):
        params = {}
        for p in spec.likelihood_params:
            if p.owner == "subject":
                params[p.name] = p.constrain(grid)[:, None]
            elif p.owner == "item":
                params[p.name] = p.constrain(pt[p.name])[None, :]
            else:
                params[p.name] = p.constrain(globals_[p.name])
        ones = jnp.ones((grid.shape[0], next(iter(pt.values())).shape[0]), jnp.float32)
        return spec.loglik(params, ones, ones), spec.loglik(params, 0.0 * ones, ones)

    e1, e0 = jax.lax.map(at_point, points)  # (P, g, n) each
    return (jnp.tensordot(weights, e1, 1).T, jnp.tensordot(weights, e0, 1).T,
            subject.prior.log_prob(grid, env))


def _tables(spec, guide, grid, item_idx, chunk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    points, weights = _item_points(spec, guide, item_idx)
    globals_ = {p.name: np.asarray(guide.loc[p.name], np.float32) for p in spec.params
                if p.owner == "global"}
    n = next(iter(points.values())).shape[1]
    chunk = -(-n // -(-n // chunk))  # equal chunks: little padding
    e1 = np.empty((n, len(grid)), np.float32)
    e0 = np.empty_like(e1)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        # pad the last chunk to the same width: one compiled program per call shape
        part = {k: np.pad(v[:, start:stop], [(0, 0), (0, chunk - (stop - start))] +
                          [(0, 0)] * (v.ndim - 2), mode="edge") for k, v in points.items()}
        a, b, prior = _expected_loglik(spec, np.asarray(grid, np.float32), part, weights, globals_)
        e1[start:stop], e0[start:stop] = np.asarray(a)[:stop - start], np.asarray(b)[:stop - start]
    return e1, e0, np.asarray(prior, np.float64)


def _spline_eval(cs, x: np.ndarray) -> np.ndarray:
    """Evaluate a piecewise polynomial over subjects (``cs.c`` is ``(k, g-1, s)``: a spline
    or one of its derivatives) at per-subject points ``x`` ``(s, w)``."""
    knots = cs.x
    idx = np.clip(np.searchsorted(knots, x) - 1, 0, len(knots) - 2)
    dx = x - knots[idx]
    rows = np.arange(x.shape[0])[:, None]
    out = np.zeros_like(dx)
    for coef in cs.c:  # Horner, highest power first
        out = out * dx + coef[idx, rows]
    return out


def _moments(grid: np.ndarray, logpost: np.ndarray, window: float) -> tuple[np.ndarray, ...]:
    """Mean, sd and log normaliser of each row's density ``exp(logpost)`` on ``grid``, and
    whether its mass reaches the grid's edge."""
    cs = CubicSpline(grid, logpost.T, axis=0)
    fine = np.linspace(grid[0], grid[-1], 8 * len(grid))
    values = cs(fine).T  # (s, f)
    top = np.argmax(values, axis=1)
    mode = fine[top]
    curv = -_spline_eval(cs.derivative(2), mode[:, None])[:, 0]  # each subject at its own mode
    step = fine[1] - fine[0]
    width = 1.0 / np.sqrt(np.maximum(curv, 1.0 / (grid[-1] - grid[0]) ** 2))
    width = np.maximum(width, 0.5 * step)
    lo = np.maximum(mode - window * width, grid[0])
    hi = np.minimum(mode + window * width, grid[-1])
    x = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, 801)[None, :]
    lp = _spline_eval(cs, x)
    peak = lp.max(axis=1, keepdims=True)
    w = np.exp(lp - peak)
    dx = (hi - lo) / 800.0
    mass = w.sum(axis=1) - 0.5 * (w[:, 0] + w[:, -1])
    mean = (w * x).sum(axis=1) / w.sum(axis=1)
    var = (w * (x - mean[:, None]) ** 2).sum(axis=1) / w.sum(axis=1)
    log_norm = peak[:, 0] + np.log(mass * dx)
    # the density at an edge the window was cut at is not negligible: widen the grid
    edge = ((lo <= grid[0]) & (w[:, 0] > 1e-6)) | ((hi >= grid[-1]) & (w[:, -1] > 1e-6))
    return mean, np.sqrt(var), log_norm, edge


def conditional_abilities(spec: ModelSpec, guide: GuideState, y: np.ndarray, *,
                          item_idx: np.ndarray | None = None,
                          settings: GridSettings = GridSettings()) -> tuple[GuideState, dict]:
    """The optimal mean-field factor of each new subject's ability, item factors frozen.

    Parameters
    ----------
    guide : the fitted guide; its item and global blocks are used, its subject block only
        to place the grid.
    y : int8 ``(s, n)`` responses, -1 missing; column ``j`` is item ``item_idx[j]`` of the
        guide (all items in order when None).

    Returns
    -------
    ``(GuideState with the subject block only, info)``: the moment-matched Gaussian
    (unconstrained location and log-scale) and ``{"log_normalizer": (s,), "grid": (lo, hi),
    "widened": count}``; the log normaliser is each subject's ELBO term at the optimum.
    """
    if not conditional_applies(spec):
        raise ModelError(f"model {spec.name!r}: the grid update needs one scalar subject block "
                         f"and binary responses; use the frozen fit")
    (subject,) = spec.by_owner("subject")
    y = np.asarray(y)
    ones = (y == 1).astype(np.float32)
    zeros = (y == 0).astype(np.float32)
    fitted = np.asarray(guide.loc[subject.name], np.float64)
    lo, hi = float(fitted.min()) - settings.margin, float(fitted.max()) + settings.margin
    todo = np.arange(y.shape[0])
    mean = np.zeros(y.shape[0])
    sd, log_norm = np.zeros_like(mean), np.zeros_like(mean)
    widened = 0
    for attempt in range(settings.max_widen + 1):
        grid = np.linspace(lo, hi, settings.grid_size)
        e1, e0, log_prior = _tables(spec, guide, grid, item_idx, settings.item_chunk)
        logpost = (ones[todo] @ e1 + zeros[todo] @ e0).astype(np.float64) + log_prior[None, :]
        m, s, z, edge = _moments(grid, logpost, settings.window)
        done = ~edge if attempt < settings.max_widen else np.ones_like(edge)
        mean[todo[done]], sd[todo[done]], log_norm[todo[done]] = m[done], s[done], z[done]
        todo = todo[~done]
        if todo.size == 0:
            break
        widened += int(todo.size)
        lo, hi = lo - (hi - lo) / 2, hi + (hi - lo) / 2
    guide_out = GuideState({subject.name: mean.astype(np.float32)},
                           {subject.name: np.log(sd).astype(np.float32)})
    return guide_out, {"log_normalizer": log_norm, "grid": (lo, hi), "widened": widened}
