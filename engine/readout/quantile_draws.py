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

Every subject is drawn independently, twins (identical answer sheets) included: their
posteriors are the same, their abilities are not, so they rank among each other as any two
subjects do. The rank read-outs pool such subjects' statistics
(:func:`engine.readout.ranking.rank_stats` with ``groups``), so they still read alike.
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
                   chunk: int = 2048) -> np.ndarray:
    """``(num_draws, S)`` float32 draws of ``S`` scalar abilities, independent across
    subjects (identical posteriors included): ``loc + scale g(e)`` with ``e`` standard
    normal (NumPy's generator seeded with ``seed``) and ``g`` each subject's standardised
    quantile function (module docstring) from the table ``values`` ``(J, S)`` at normal
    scores ``z`` ``(J,)``; without a table, ``g`` is the identity (the Gaussian
    ``loc + scale e``)."""
    loc, scale = np.asarray(loc, np.float64), np.asarray(scale, np.float64)
    S = loc.size
    if values is None:
        z, table = np.array([-1.0, 1.0]), np.array([[-1.0], [1.0]]) * np.ones((1, S))
    else:
        z, table = np.asarray(z, np.float64), standardised_table(z, values, loc, scale)
    # any integer seed, as the fit takes it (``--seed -1``); drawn a subject a row, so that
    # each subject's draws lie together in memory
    eps = np.random.default_rng(int(seed) % 2 ** 32).standard_normal((S, num_draws),
                                                                      dtype=np.float32)
    out = np.empty((S, num_draws), np.float32)
    J = z.size
    # in float32, as the draws are kept: each segment's value at its start node and slope,
    # (S, J - 1), in the position's units
    zf = z.astype(np.float32)
    starts = (loc[:, None] + scale[:, None] * table[:-1].T).astype(np.float32)
    slopes = (scale[:, None] * (np.diff(table, axis=0) / np.diff(z)[:, None]).T).astype(np.float32)
    for a in range(0, S, chunk):
        rows = slice(a, min(a + chunk, S))
        e = eps[rows]
        k = np.zeros(e.shape, np.intp)  # each draw's segment: the inner nodes at or below
        for node in zf[1:-1]:  # it (a comparison a node: a tenth of a binary search's time)
            k += e >= node
        at = k + (J - 1) * np.arange(e.shape[0])[:, None]  # in the rows' flattened tables
        out[rows] = starts[rows].ravel()[at] + slopes[rows].ravel()[at] * (e - zf[k])
    return np.ascontiguousarray(out.T)
