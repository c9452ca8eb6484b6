"""Exact ability intervals: each pattern's 5% and 95% posterior quantiles on the shared grid.

A quadrature fit reports each answer pattern's ability posterior mean and sd, averaged over
the items' posterior (importance-weighted or sampled item draws). On a short test that
posterior is skewed (eight items: a pattern of all ones is bounded below by its answers
and above only by the prior), and ``mean -+ 1.645 sd`` is not its 90% interval:
simulation-based calibration of the 2PL's abilities at 100 x 8 read p 0.03 on two
independent halves of 400 replicates against those Gaussians, and 0.18 against the exact
posterior below.

The exact posterior of a pattern's ability is the mixture over item draws ``x_d`` (weights
``w_d``) of ``p(theta | y_u, x_d)``, each known on the fit's evenly spaced grid up to its
normalising constant. Their weighted sum on the grid is the mixture's density there; its
distribution function between the grid points is that of the density's cardinal-series
(Whittaker) interpolant,

    F(t) = sum_g m_g (1/2 + Si(pi (t - theta_g) / h) / pi),

``m_g`` the normalised masses at the points ``theta_g`` of spacing ``h`` and ``Si`` the sine
integral. For a smooth density sampled at its sd or finer the quantiles are within about
0.007 sd (2PL posteriors of 1-12 items on grids of spacing 0.8-1.0 sd, 200 cases, against
scipy integration; a normal's, 0.003 sd at spacing one sd); interpolating the density
linearly instead is 0.2 sd off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from engine.exported import exported_jit
from engine.host import to_device

__all__ = ["MIXTURE_DRAWS", "Z_NODES", "PROBABILITIES", "INTERVAL_ROWS", "AbilityDraws",
           "grid_quantiles", "resampled"]

# item draws the mixture averages over (:meth:`AbilityDraws.mixture`), placed at the moments
# over all the draws (:meth:`AbilityDraws.quantiles`): at least 64, which put each pattern's
# quantiles within 0.004 sd of all 1,895 weighted draws' on the `ability` data set
# (unplaced, 256 within 0.014), and as many more, in powers of two up to 2,048, as
# MIXTURE_CELLS (draws x patterns x grid points x items, what the grid's weights cost)
# allows. On a 2PL at 30 x 20 whose 8,000 item draws were sampled, against all of them on
# a fine grid (four patterns, sampler seeds 1 and 4): 64 draws up to 0.047 sd off (the
# patterns' shapes, which the placing does not correct), as far as the Gaussian's
# 0.04-0.07; 1,024 up to 0.007; 2,048 up to 0.005. LSAT7's 12,000 importance draws cost
# 0.16 s all together, 2,048 of them about 0.03 s
MIXTURE_DRAWS = 64
MIXTURE_DRAWS_MAX = 2048
MIXTURE_CELLS = 2 ** 26
STEP_CELLS = 2 ** 20  # the draws' cells the grid's weights take a step (see ``_mass``)
SUBSTEPS = 4  # points a grid spacing at which the distribution function is tabulated

# each pattern's posterior quantile function is tabulated at the probabilities of these
# normal scores: the 90% interval's ends (5% and 95%, exactly) and the scores from -3 to 3
# by a half, through which the rank statistics' draws are mapped
# (:func:`engine.readout.quantile_draws.quantile_draws`)
_Z05 = -1.6448536269514729  # the standard normal's 5% quantile
Z_NODES = (-3.0, -2.5, -2.0, _Z05, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, -_Z05, 2.0, 2.5, 3.0)
PROBABILITIES = tuple(0.05 if z == _Z05 else 0.95 if z == -_Z05 else
                      0.5 * math.erfc(-z / math.sqrt(2.0)) for z in Z_NODES)
INTERVAL_ROWS = (Z_NODES.index(_Z05), Z_NODES.index(-_Z05))  # the 5% and 95% rows


def resampled(w: np.ndarray, count: int = MIXTURE_DRAWS, seed: int = 0) -> np.ndarray:
    """Indices of ``count`` draws picked by systematic resampling under the normalised weights
    ``w`` ``(D,)`` (Kitagawa 1996): each draw about ``count w_d`` times, every pick equally
    weighted. Equal weights pick evenly spaced draws."""
    w = np.asarray(w, np.float64)
    cumulative = np.cumsum(w / w.sum())
    start = np.random.default_rng(seed).uniform()
    return np.minimum(np.searchsorted(cumulative, (np.arange(count) + start) / count),
                      len(w) - 1)


def _sine_integral_over_pi(u: np.ndarray, per_unit: int) -> np.ndarray:
    """``Si(pi u) / pi`` at ``u``, multiples of ``1 / per_unit`` (the trapezoid rule on
    ``sinc`` at a 64th of that spacing with its Euler-Maclaurin end correction: error about
    1e-12; no scipy in a fit's process)."""
    step = 1.0 / (64 * per_unit)
    top = int(np.ceil(np.abs(u).max() / step))
    x = np.arange(top + 1) * step
    f = np.sinc(x)
    with np.errstate(invalid="ignore", divide="ignore"):  # sinc' at 0 is 0
        slope = np.where(x > 0, (np.cos(np.pi * x) - f) / np.where(x > 0, x, 1.0), 0.0)
    table = np.concatenate([[0.0], np.cumsum(0.5 * step * (f[1:] + f[:-1]))])
    table -= step ** 2 / 12 * slope  # the trapezoid's leading error (sinc' is 0 at 0)
    at = np.rint(np.abs(u) / step).astype(np.int64)
    return np.sign(u) * table[at]


def grid_quantiles(grid: np.ndarray, mass: np.ndarray, qs=(0.05, 0.95),
                   rows: int = 512) -> np.ndarray:
    """``(len(qs), U)``: the quantiles ``qs`` of each row's density sampled on the evenly
    spaced ``grid`` ``(G,)`` as masses ``mass`` ``(U, G)`` (any positive scale), under the
    cardinal-series distribution function (module docstring). A row of no finite positive
    mass, or whose quantile lies beyond the grid's first point, gets NaN.

    ``F`` and its density at ``SUBSTEPS`` points a spacing are products with Toeplitz
    matrices of the sine integral and ``sinc`` at the offsets (``(2G - 1) SUBSTEPS`` values,
    not one per pattern and grid point); the quantile is solved on the cubic Hermite
    interpolant between the two points that straddle ``q``. ``rows`` patterns at a time."""
    grid = np.asarray(grid, np.float64)
    G, h = grid.size, float(grid[1] - grid[0])
    frac = np.arange(SUBSTEPS) / SUBSTEPS
    offsets = np.arange(-(G - 1), G)[:, None] + frac[None, :]  # (2G - 1, S): j + s - g
    lag = np.arange(G)[None, :] - np.arange(G)[:, None] + G - 1  # (g, j)
    cdf_kernel = (0.5 + _sine_integral_over_pi(offsets, SUBSTEPS))[lag].reshape(G, -1)
    pdf_kernel = (np.sinc(offsets) / h)[lag].reshape(G, -1)
    points = grid[0] + (np.arange(G)[:, None] + frac[None, :]).reshape(-1) * h  # increasing
    delta = h / SUBSTEPS
    out = np.full((len(qs), np.shape(mass)[0]), np.nan)
    for start in range(0, np.shape(mass)[0], rows):
        block = np.asarray(mass[start:start + rows], np.float64)
        total = block.sum(axis=1, keepdims=True)
        ok = np.isfinite(total[:, 0]) & (total[:, 0] > 0)
        m = np.where(ok[:, None], block / np.where(ok, total[:, 0], 1.0)[:, None], 0.0)
        F, f = m @ cdf_kernel, m @ pdf_kernel  # (rows, G S): at ``points``
        for j, q in enumerate(qs):
            reached = F >= q
            i = reached.argmax(axis=1)  # the first point at or past q
            found = ok & reached.any(axis=1) & (i > 0)
            i = np.maximum(i, 1)[:, None]
            F0, F1 = np.take_along_axis(F, i - 1, 1)[:, 0], np.take_along_axis(F, i, 1)[:, 0]
            d0, d1 = (delta * np.take_along_axis(f, c, 1)[:, 0] for c in (i - 1, i))
            tau = np.clip((q - F0) / np.where(F1 > F0, F1 - F0, 1.0), 0.0, 1.0)
            for _ in range(4):  # Newton on the cubic Hermite interpolant, tau in [0, 1]
                t2, t3 = tau * tau, tau * tau * tau
                value = ((2 * t3 - 3 * t2 + 1) * F0 + (t3 - 2 * t2 + tau) * d0
                         + (3 * t2 - 2 * t3) * F1 + (t3 - t2) * d1)
                slope = ((6 * t2 - 6 * tau) * (F0 - F1) + (3 * t2 - 4 * tau + 1) * d0
                         + (3 * t2 - 2 * tau) * d1)
                tau = np.clip(tau - (value - q) / np.where(slope > 0, slope, np.inf), 0.0, 1.0)
            out[j, start:start + rows] = np.where(found, points[i[:, 0] - 1] + tau * delta, np.nan)
    return out


def _grid_moments(grid: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mean and sd under masses ``mass`` ``(U, G)`` at the points ``grid``
    (NaN for a row of no mass)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        total = mass.sum(axis=1)
        mean = mass @ grid / total
        return mean, np.sqrt(np.maximum(mass @ grid ** 2 / total - mean ** 2, 0.0))


@exported_jit(static_argnames=("spec",))
def _grid_mixture(spec, xs, w, grid, log_base, y1, y0):
    """``(U, G)``: ``sum_d w_d p(theta_g | y_u, x_d)``, each pattern's ability posterior
    weights on the shared grid ``grid`` ``(G,)`` (``log_base``: log prior + log rule weight)
    given item draws ``xs`` ``(S, B, n, k)``, averaged under weights ``w`` ``(S, B)``;
    ``y1``, ``y0`` ``(U, n)`` each pattern's observed ones and zeros. ``B`` draws a step,
    the sum carried: ``B U G`` of memory whatever the draws."""
    from engine.infer.marginal import _grid_log_weights

    weights = jax.vmap(lambda x: _grid_log_weights(spec, x, grid, log_base, y1, y0))

    def step(total, xw):
        x, wd = xw
        return total + jnp.einsum("b,bug->ug", wd, jax.nn.softmax(weights(x), axis=2)), None

    zero = jnp.zeros((y1.shape[0], grid.shape[0]), jnp.float32)
    return jax.lax.scan(step, zero, (xs, w))[0]


def _draws_within(cells: int, per_draw: int) -> int:
    """The largest power of two of draws of ``per_draw`` cells each within ``cells`` (at
    least one)."""
    return 1 << max(0, (cells // max(per_draw, 1)).bit_length() - 1)


@dataclass(frozen=True)
class AbilityDraws:
    """The item draws a quadrature fit's ability moments were averaged over, and where:
    ``xs`` ``(D, n, k)`` with normalised weights ``w`` ``(D,)`` (equal for a sampler's), the
    evenly spaced shared ``grid`` ``(G,)`` with ``log_base`` (log prior + log rule weight),
    and each pattern's observed ones ``y1`` and zeros ``y0`` ``(U, n)``."""

    xs: np.ndarray
    w: np.ndarray
    grid: np.ndarray
    log_base: np.ndarray
    y1: np.ndarray
    y0: np.ndarray

    def quantiles(self, spec, mean: np.ndarray, sd: np.ndarray, seed: int = 0,
                  qs=(0.05, 0.95)) -> np.ndarray:
        """``(len(qs), U)``: each pattern's ability posterior quantiles ``qs``: the shape of
        its posterior over the draws :meth:`mixture` picks, on the grid
        (:func:`grid_quantiles`), placed at its posterior ``mean`` and ``sd`` ``(U,)`` over
        all of them (the moments the fit reports). The resampling's Monte Carlo error is
        mostly a shift and a stretch, which that removes (the `ability` data set, 1,280
        patterns, the largest difference from the quantiles over all 1,895 weighted draws,
        in the patterns' median sd, over four seeds: 0.039-0.045 unplaced and 0.002-0.004
        placed with 64 draws; 0.012-0.014 unplaced with 256)."""
        mass = self._mass(spec, *self.mixture(seed))
        at, spread = _grid_moments(self.grid, mass)
        with np.errstate(invalid="ignore", divide="ignore"):  # padding patterns: no mass
            stretch = sd / spread
            # a stretch far from 1 is no Monte Carlo error: a posterior the grid does not
            # resolve (NaN: the read-out's mean -+ 1.645 sd instead)
            stretch = np.where((stretch > 0.5) & (stretch < 2.0), stretch, np.nan)
            return mean + (grid_quantiles(self.grid, mass, qs) - at) * stretch

    @property
    def _draw_cells(self) -> int:
        """What one draw's grid weights cost: patterns x items x grid points."""
        return int(np.prod(np.shape(self.y1))) * int(np.size(self.grid))

    def mixture(self, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(pick, weight)``: the draws the quantiles average over, a power of two of them,
        at least ``MIXTURE_DRAWS`` and as many as ``MIXTURE_CELLS`` allows, up to
        ``MIXTURE_DRAWS_MAX``. Where that is
        every draw, each at its weight (padded with zero weights: a program for each power
        of two), not some drawn twice; else resampled (:func:`resampled`) and equally
        weighted."""
        room = max(MIXTURE_DRAWS, min(MIXTURE_DRAWS_MAX, _draws_within(MIXTURE_CELLS,
                                                                    self._draw_cells)))
        draws = len(self.w)
        if draws > room:
            return resampled(self.w, room, seed), np.full(room, 1.0 / room)
        count = max(MIXTURE_DRAWS, 1 << (draws - 1).bit_length())
        pick = np.arange(count) % draws
        return pick, np.where(np.arange(count) < draws, np.asarray(self.w)[pick], 0.0)

    def _mass(self, spec, pick: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """``(U, G)`` float64: the draws ``pick`` averaged under ``weight`` on the grid,
        a power of two of them a step, as many as fit ``STEP_CELLS`` (at least one; the
        last step padded with zero weights)."""
        block = min(_draws_within(STEP_CELLS, self._draw_cells),
                    1 << (len(pick) - 1).bit_length())
        pad = -len(pick) % block
        pick = np.concatenate([pick, np.zeros(pad, int)]).reshape(-1, block)
        weight = np.concatenate([weight, np.zeros(pad)]).reshape(-1, block)
        return np.asarray(_grid_mixture(spec, to_device(np.asarray(self.xs)[pick], jnp.float32),
                                        to_device(weight, jnp.float32),
                                        to_device(self.grid, jnp.float32),
                                        to_device(self.log_base, jnp.float32),
                                        to_device(np.asarray(self.y1, np.float32)),
                                        to_device(np.asarray(self.y0, np.float32))), np.float64)

    def moments(self, spec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(mean, sd, edge)`` ``(U,)``: each pattern's posterior mean and sd over every draw
        at its weight (the mixture on the grid: the moments the fit reports, to float
        precision), and the share of its mass on the grid's two outermost points at each
        end (a grid too narrow for the pattern where it is not small)."""
        mass = self._mass(spec, np.arange(len(self.w)), np.asarray(self.w, np.float64))
        mean, sd = _grid_moments(self.grid, mass)
        with np.errstate(invalid="ignore", divide="ignore"):
            edge = (mass[:, :2].sum(axis=1) + mass[:, -2:].sum(axis=1)) / mass.sum(axis=1)
        return mean, sd, edge

    def arrays(self) -> dict[str, np.ndarray]:
        """The item draws and the grid, to save with a run: float32 draws (what the fit
        computed with), float64 weights (the resampling reads their sums), and the patterns
        as int8 responses (1, 0, -1 unobserved)."""
        ones, zeros = np.asarray(self.y1) > 0, np.asarray(self.y0) > 0
        return {"xs": np.asarray(self.xs, np.float32), "w": np.asarray(self.w, np.float64),
                "grid": np.asarray(self.grid, np.float64),
                "log_base": np.asarray(self.log_base, np.float64),
                "patterns": np.where(ones, 1, np.where(zeros, 0, -1)).astype(np.int8)}

    @classmethod
    def of(cls, arrays: dict, responses: np.ndarray) -> "AbilityDraws":
        """Saved :meth:`arrays` for the answer patterns ``responses`` ``(U, n)``, coded as
        :meth:`arrays` codes them (1, 0, -1 unobserved)."""
        responses = np.asarray(responses)
        mask = (responses >= 0).astype(np.float32)
        ones = (responses == 1).astype(np.float32)
        return cls(arrays["xs"], arrays["w"], arrays["grid"], arrays["log_base"], ones,
                   mask - ones)

    @property
    def record(self) -> str:
        """How the quantiles are obtained, for fit.json."""
        used = int(np.count_nonzero(self.mixture()[1]))
        return (f"exact: each pattern's 5% and 95% posterior quantiles on the {self.grid.size}"
                f"-point ability grid, averaged over {used} of the items' {len(self.w)} draws")
