"""Draws of scalar abilities from each subject's own posterior quantile function.

Rank statistics and pairwise probabilities are read from joint draws of the abilities. A
quadrature fit knows each answer pattern's exact ability posterior (skewed on a short test:
a sheet of all ones is bounded below by its answers and above only by the prior) and
reports its quantiles at the probabilities of some normal scores ``z``
(:data:`engine.infer.ability_quantiles.Z_NODES`). A draw here is a standard normal ``e``
mapped through that table: ``mean + sd g(e)``, ``g`` the standardised quantiles
``(q(Phi(z)) - mean) / sd`` interpolated linearly in ``z`` (and extended beyond the end
nodes along the end segments). A Gaussian posterior's ``g`` is the identity, so a subject
without a table is drawn as ``mean + sd e``. The 90% interval of the draws is the table's,
which ``subjects.parquet`` reports, so the rank statistics and the intervals read the same
posterior.

Subjects whose posterior location and scale are identical (identical answer sheets) share
their draws, so they tie in every draw and rank alike.
"""

from __future__ import annotations

import numpy as np

__all__ = ["standardised_table", "quantile_draws"]


def standardised_table(z: np.ndarray, values: np.ndarray, loc: np.ndarray,
                       scale: np.ndarray) -> np.ndarray:
    """``(J, S)``: quantiles ``values`` ``(J, S)`` at the normal scores ``z`` ``(J,)`` as
    ``(value - loc) / scale``, ready to interpolate: non-decreasing down each column; a
    column's missing (NaN) nodes extended along its outermost finite segment; a column
    with fewer than two finite nodes is the Gaussian's (``z`` itself)."""
    z = np.asarray(z, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = (np.asarray(values, np.float64) - loc[None, :]) / scale[None, :]
    finite = np.isfinite(s)
    gaussian = finite.sum(axis=0) < 2
    s[:, gaussian] = z[:, None]
    for col in np.flatnonzero(~finite.all(axis=0) & ~gaussian):  # rare: nodes off the grid
        ok = np.flatnonzero(finite[:, col])
        lo, hi = ok[0], ok[-1]
        low_slope = (s[ok[1], col] - s[lo, col]) / (z[ok[1]] - z[lo])
        high_slope = (s[hi, col] - s[ok[-2], col]) / (z[hi] - z[ok[-2]])
        s[:lo, col] = s[lo, col] + low_slope * (z[:lo] - z[lo])
        s[hi + 1:, col] = s[hi, col] + high_slope * (z[hi + 1:] - z[hi])
        inner = ~finite[lo:hi + 1, col]
        if inner.any():  # a missing node between finite ones: linear between them
            s[lo:hi + 1, col][inner] = np.interp(z[lo:hi + 1][inner], z[ok], s[ok, col])
    return np.maximum.accumulate(s, axis=0)


def quantile_draws(loc: np.ndarray, scale: np.ndarray, num_draws: int, seed: int,
                   z: np.ndarray | None = None, values: np.ndarray | None = None,
                   chunk: int = 4096) -> np.ndarray:
    """``(num_draws, S)`` float32 draws of ``S`` scalar abilities, independent across
    subjects: ``loc + scale g(e)`` with ``e`` standard normal (NumPy's generator seeded with
    ``seed``) and ``g`` each subject's standardised quantile function (module docstring)
    from the table ``values`` ``(J, S)`` at normal scores ``z`` ``(J,)``; without a table,
    ``g`` is the identity (the Gaussian ``loc + scale e``). Subjects of one location and
    scale share their draws (and the first one's table)."""
    loc, scale = np.asarray(loc, np.float64), np.asarray(scale, np.float64)
    if values is None:
        z, table = np.array([-1.0, 1.0]), np.array([[-1.0], [1.0]]) * np.ones((1, loc.size))
    else:
        z, table = np.asarray(z, np.float64), standardised_table(z, values, loc, scale)
    # one posterior a location and scale (identical sheets; under the 1PL every sheet of a
    # score on the same items): its first subject's table stands for all
    _, first, inverse = np.unique(np.stack([loc, scale], 1), axis=0, return_index=True,
                                  return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    # any integer seed, as the fit takes it (``--seed -1``)
    eps = np.random.default_rng(int(seed) % 2 ** 32).standard_normal((num_draws, first.size),
                                                                      dtype=np.float32)
    out = np.empty((num_draws, first.size), np.float32)
    J = z.size
    slopes = np.diff(table[:, first], axis=0) / np.diff(z)[:, None]  # (J - 1, U)
    for start in range(0, first.size, chunk):
        cols = slice(start, start + chunk)
        e = eps[:, cols].astype(np.float64)
        k = np.clip(np.searchsorted(z, e) - 1, 0, J - 2)  # each draw's segment
        base = np.take_along_axis(table[:, first[cols]], k, axis=0)
        g = base + np.take_along_axis(slopes[:, cols], k, axis=0) * (e - z[k])
        out[:, cols] = loc[first[cols]] + scale[first[cols]] * g
    return out[:, inverse]
