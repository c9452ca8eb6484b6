"""The items' marginal posterior sampled: data augmentation on one shared ability grid.

Where importance sampling from the Laplace approximation keeps too few draws, the quadrature
fit would report the Laplace approximation itself, and for the asymptote models it is
wrong: a 3PL item's guessing and difficulty bend round each other (a hard item's correct
answers are explained by a high guessing or by a lower difficulty), so the mode sits away
from the posterior's mass. At 1,000 x 50 its 90% intervals for the guessing were half a
width off NUTS's. This module draws from that posterior instead, by Gibbs sampling the
complete data, several chains at once (``jax.vmap``), each sweep:

1. a collapsed move along one of the likelihood's symmetries (``ModelSpec.symmetries``,
   with the hyper-parameters they carry), or a pooled block's items spread about their
   pool's location as its precision falls (each in turn): the items moved along it and
   accepted on the marginal likelihood, the abilities integrated on the grid. Given the
   abilities a common shift or scale of the items is pinned, and given the items a pool's
   precision, so without these moves a chain crawls along them;
2. every subject's ability from its posterior given the items, on the evenly spaced grid of
   :class:`engine.infer.marginal._DrawNodes` (the rule the fit integrates with). That grid
   spans the patterns' posteriors at the items' mode, and the items' uncertainty widens
   them: where some pattern's posterior puts more than :data:`EDGE_MASS` on the grid's end
   points in a call's sweeps, the grid is widened to its mean +- 8 sds over those sweeps
   (fit.json ``item_moments.sampler.grid_widened``; the kept draws are drawn again where it
   happens there);
3. every item's values given the abilities by random-walk Metropolis steps, all items at
   once (given the abilities they are independent), shaped by each item's covariance
   (adapted during the warm-up), one step in five four times longer so that a chain
   reaches along a long ridge; with the abilities on the grid an item's log-likelihood is
   ``sum_g n1_g log P(1 | grid_g) + n0_g log P(0 | grid_g)``: ``G`` cells, not one a subject;
4. the globals (a pooled prior's hyper-parameters) by a Metropolis step on their prior terms.

After a fifth of the warm-up a pilot compares the draws with the Laplace approximation;
where they agree (:data:`LAPLACE_SHIFT`, :data:`LAPLACE_SD`) the fit keeps that, at a
fraction of the sampler's cost. Otherwise split R-hat and effective sample sizes of every
item value are recorded, and the fit uses the draws' moments where at most
``MarginalSettings.sampler_unmixed_share`` of the values have a split R-hat over
``sampler_rhat_max``, listing those. The kept draws are extended by as many again (at
most ``sampler_extend_max`` times) while some split R-hat is over ``sampler_rhat_max`` or
some value keeps fewer than ``sampler_ess_min`` effective draws, of its mean or of the tails
its 90% interval's ends are read from (:func:`tail_effective_draws`).
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from engine.exported import exported_jit
from engine.models.spec import ModelSpec, pool_of

__all__ = ["sample_items", "split_rhat", "effective_draws", "tail_effective_draws",
           "sd_standard_error"]

WARMUP_CALLS = 20
PHASE_ENDS = (0, 1, 5, 9, 19)  # the calls that end a warm-up phase (5, 5, 20, 20, 50%)
TARGET_ACCEPTANCE = 0.3  # the globals' random walk (Gelman et al. 1996: 0.44-0.23)
LONG_STEP, LONG_STEP_SHARE = 4.0, 0.2
# the pilot's draws agree with the Laplace approximation where, in every item block, the
# median distance of their means from the mode is under LAPLACE_SHIFT Laplace sds and
# the median ratio of their sds within a factor LAPLACE_SD: issue 16's tolerance for
# agreement with NUTS, on the median value (2PL at 200 x 400 and 50 x 1,000: 0.04-0.05
# and 1.02-1.12; 3PL at 1,000 x 50: 0.47-0.92 and 0.97-1.61)
LAPLACE_SHIFT, LAPLACE_SD = 0.25, 1.25
SYMMETRY_ACCEPTANCE = 0.4  # a move along one symmetry (one value)
# a pattern's ability posterior with more than this mass on the grid's two end points, in
# some sweep, is cut off by the grid: the grid is widened (at most MAX_WIDEN times). The grid
# spans the patterns' posteriors at the items' mode; the items' uncertainty widens them
# (feas at 50 x 1,000: 0.05 at the mode, 0.17-0.36 sampled), and a grid ending at -3.34
# under a subject at -3.13 +- 0.36 pulled the sampled scale 4% in, every ability with it.
EDGE_MASS = 1e-5
MAX_WIDEN = 3
MAX_LISTED = 20  # values not mixed listed in the record


def _towards(rate, target):
    """The factor for a random walk's scale after a phase accepting ``rate``: larger where
    it accepted more than ``target``, within [1/2, 2] a phase."""
    return np.clip(np.exp(2.0 * (np.asarray(rate) - target)), 0.5, 2.0)


def split_rhat(draws: np.ndarray) -> np.ndarray:
    """Split R-hat (Gelman et al. 2013) of ``draws`` ``(chains, draws, ...)`` per value."""
    halves = _split_chains(draws)
    m = halves.shape[1]
    within = halves.var(axis=1, ddof=1).mean(axis=0)
    between = m * halves.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(((m - 1) / m * within + between / m) / within)
    return np.where(within > 0, r, 1.0)


def _split_chains(draws: np.ndarray) -> np.ndarray:
    """Each chain of ``draws`` ``(chains, draws, ...)`` split in two halves, ``(2 chains,
    draws // 2, ...)``, as ArviZ splits them (an odd count leaves out the middle draw)."""
    half = draws.shape[1] // 2
    return np.concatenate([draws[:, :half], draws[:, -half:]], axis=0)


def effective_draws(draws: np.ndarray) -> np.ndarray:
    """Effective sample size of ``draws`` ``(chains, draws, ...)`` per value, as Stan and
    ArviZ (``ess(method="mean")``) compute it: the chains' autocorrelations combined with
    the between-chain variance, summed in pairs up to the first pair that is not positive
    (Geyer's initial positive sequence), each pair capped by the one before (initial
    monotone sequence), each chain split in halves as for R-hat. Values are taken in
    chunks of about ``2^22`` draws (the transforms' memory: 10,000 subjects' 4 x 1,000 NUTS
    draws would take 1.3 GB at once)."""
    values = int(np.prod(draws.shape[2:], dtype=np.int64))
    chunk = _values_chunk(draws)
    if values > chunk:
        flat = draws.reshape(draws.shape[:2] + (values,))
        return np.concatenate([_effective_draws(flat[:, :, i:i + chunk])
                               for i in range(0, values, chunk)]).reshape(draws.shape[2:])
    return _effective_draws(draws)


def sd_standard_error(draws: np.ndarray) -> np.ndarray:
    """Monte Carlo standard error of each value's posterior sd from ``draws`` ``(chains,
    draws, ...)``, as ArviZ's ``mcse(method="sd")`` defines it: the delta method on the
    squared deviations, with their mean's effective draws (:func:`effective_draws`). Where a
    value's posterior has a long tail the sd rests on a few far draws, and this says so
    where the mean's R-hat and ESS do not (the 4PL's discriminations at 2,000 x 12: one
    chain's sd 2.28 against 0.32-0.37 in three others, with split R-hat 1.022). A value
    with a NaN draw gets NaN, as in ArviZ; a constant one 0 (its sd is known exactly, where
    ArviZ gives NaN). In chunks of values, as :func:`effective_draws`."""
    flat = np.asarray(draws).reshape(np.shape(draws)[:2] + (-1,))
    chunk, out = _values_chunk(flat), []
    for i in range(0, flat.shape[2], chunk):
        x = flat[:, :, i:i + chunk].astype(np.float64)
        squared = (x - x.mean(axis=(0, 1))) ** 2
        evar = squared.mean(axis=(0, 1))
        steady = evar > 0  # NaN compares False: set below
        ess = effective_draws(np.where(steady, squared, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            varvar = ((squared ** 2).mean(axis=(0, 1)) - evar ** 2) / ess
            out.append(np.where(steady, np.sqrt(varvar / evar / 4),
                                np.where(np.isnan(evar), np.nan, 0.0)))
    return np.concatenate(out).reshape(np.shape(draws)[2:])


def _values_chunk(draws: np.ndarray) -> int:
    """How many values of ``draws`` ``(chains, draws, ...)`` the ESS takes at once: about
    ``2^22`` draws in all."""
    return max(1, (1 << 22) // max(draws.shape[0] * draws.shape[1], 1))


def tail_effective_draws(draws: np.ndarray) -> np.ndarray:
    """Tail effective sample size of ``draws`` ``(chains, draws, ...)`` per value, as ArviZ
    (``ess(method="tail")``, Vehtari et al. 2021) computes it: the lesser of the effective
    draws of the indicators of a draw at or below the 5% and at or below the 95% quantile
    (R's type 7, NumPy's default): how many draws a 90% interval's ends rest on, which
    the mean's ESS does not say. In chunks of values, as
    :func:`effective_draws`."""
    flat = draws.reshape(draws.shape[:2] + (-1,))
    chunk = _values_chunk(draws)
    out = []
    for i in range(0, flat.shape[2], chunk):
        part = flat[:, :, i:i + chunk]
        q = np.quantile(part, [0.05, 0.95], axis=(0, 1))
        out.append(np.minimum(effective_draws((part <= q[0]).astype(np.float64)),
                              effective_draws((part <= q[1]).astype(np.float64))))
    return np.concatenate(out).reshape(draws.shape[2:])


def _effective_draws(draws: np.ndarray) -> np.ndarray:
    """:func:`effective_draws` of one chunk."""
    draws = _split_chains(draws)
    c, d = draws.shape[:2]
    x = draws.reshape(c, d, -1).astype(np.float64)
    x = x - x.mean(axis=1, keepdims=True)
    f = np.fft.rfft(x, n=2 * d, axis=1)
    acov = np.fft.irfft(f * np.conj(f), n=2 * d, axis=1)[:, :d] / d  # (c, d, values)
    mean_var = acov[:, 0].mean(axis=0) * d / (d - 1.0)
    var_plus = mean_var * (d - 1.0) / d
    if c > 1:
        var_plus = var_plus + draws.reshape(c, d, -1).mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus  # (d, values)
    rho[0] = 1.0
    m = (d - 2) // 2  # pairs (rho_2t, rho_2t+1) within reach
    pairs = rho[0:2 * m:2] + rho[1:2 * m:2]
    alive = np.cumprod(np.concatenate([np.ones((1, pairs.shape[1]), bool), pairs[1:] > 0]),
                       axis=0).astype(bool)
    capped = np.minimum.accumulate(np.where(alive, pairs, np.inf), axis=0)
    count = alive.sum(axis=0)  # pairs kept; the next even lag adds itself where positive
    after = rho[np.minimum(2 * count, d - 1), np.arange(rho.shape[1])]
    tau = -1.0 + 2.0 * np.where(alive, capped, 0.0).sum(axis=0) + np.where(
        (2 * count < d) & (after > 0), after, 0.0)
    ess = c * d / np.maximum(tau, 1.0 / np.log10(c * d))
    return np.where(var_plus > 0, ess, float(c * d)).reshape(draws.shape[2:])


def _against_laplace(dx: np.ndarray, mode: np.ndarray, sd: np.ndarray, names: list[str],
                     answered: np.ndarray) -> dict:
    """Per item block, the median distance of the draws' means ``dx`` ``(chains, draws, n, k)``
    from the mode in Laplace sds ``sd`` ``(n, k)``, and the median ratio of their sds to
    those, over the ``answered`` items ``(n,)`` bool (items nobody answered stay put: counted,
    they made the medians 0 where most items were set aside, and such a pilot never agreed);
    ``agrees`` where every block is within ``LAPLACE_SHIFT`` and ``LAPLACE_SD``."""
    if not np.any(answered):  # every answered item set aside (a 2PL at 100 x 8 whose
        # subjects all answered every item right): nothing to compare, no median of nothing
        return {"shift_median": {}, "sd_ratio_median": {}, "agrees": False,
                "because": "no fitted item to compare"}
    flat = dx.reshape(-1, *dx.shape[2:])[:, answered]
    mode, sd = mode[answered], sd[answered]
    shift = np.median(np.abs(flat.mean(axis=0) - mode) / sd, axis=0)
    ratio = np.median(flat.std(axis=0) / sd, axis=0)
    with np.errstate(divide="ignore"):  # a ratio of 0 (chains that never moved) disagrees
        agrees = bool((shift < LAPLACE_SHIFT).all()
                      and (np.abs(np.log(ratio)) < np.log(LAPLACE_SD)).all())
    return {"shift_median": dict(zip(names, shift.round(3).tolist())),
            "sd_ratio_median": dict(zip(names, ratio.round(3).tolist())), "agrees": agrees}


def _factor(cov: np.ndarray) -> np.ndarray:
    """A Cholesky factor of each ``(k, k)`` block of ``cov`` ``(n, k, k)``, its eigenvalues
    floored at 1e-8 of the block's largest (1e-8 where that is not positive); a block that is
    not finite gets the identity times 1e-4 (such an item barely moves)."""
    sym = 0.5 * (cov + np.swapaxes(cov, 1, 2))
    finite = np.isfinite(sym).all(axis=(1, 2))
    sym = np.where(finite[:, None, None], sym, 1e-8 * np.eye(cov.shape[1]))
    w, v = np.linalg.eigh(sym)
    floor = np.maximum(1e-8 * w.max(axis=1, keepdims=True), 1e-8)
    w = np.maximum(w, floor)
    return np.linalg.cholesky(np.einsum("nij,nj,nkj->nik", v, w, v))


def _value(v: int, n: int, k: int, names: list[str], hyper: list[str]) -> dict:
    """Which item value or global the flat index ``v`` of an item-major draw is."""
    return {"item": v // k, "block": names[v % k]} if v < n * k else {"global": hyper[v - n * k]}


def _symmetry_moves(spec: ModelSpec, names: list[str], hyper: list[str]):
    """Each collapsed move as ``(name, item moves (k, 3), global moves (h, 2))``: per item
    block the ``(m, v, c)`` of ``c + (x - c) exp(t m) + t v``, ``c`` the value of global
    number ``c`` (none, 0, where ``c`` is -1), and per global the ``(m, v)`` of
    ``g exp(t m) + t v`` (zeros where it does not move).

    First each symmetry of the likelihood, the pooled hyper-parameters carried along
    (``Symmetry.with_hypers``). Then, for each pooled block ``x ~ N(mu, 1/u)``, its items
    spread about ``mu`` by ``exp(t)`` while ``log u`` falls by ``2 t``: the prior's
    density keeps its shape and the likelihood decides. Given the items, ``u`` is pinned
    by their spread, and given ``u`` each item by it; where the data say little (a 2PL
    of 18 subjects) the chains then sat at a narrow pool for the whole warm-up (split
    R-hat 150), a funnel that this move walks along."""
    def still():  # no block moves, and none is centred on a global
        items = np.zeros((len(names), 3))
        items[:, 2] = -1
        return items, np.zeros((len(hyper), 2))

    out = []
    for sym in spec.symmetries:
        moves = sym.plain_moves(spec.params)
        if moves is None:  # per component, or scaled and shifted at once: its moves by t
            continue  # and by -t would not undo each other, so a random walk in t is not symmetric
        items, globs = still()
        for name, m, v in moves:
            if name in names:
                items[names.index(name), :2] = (m, v)
            elif name in hyper:
                globs[hyper.index(name)] = (m, v)
        out.append((sym.name, items, globs))
    by_name = {p.name: p for p in spec.params}
    for j, name in enumerate(names):
        loc, prec = pool_of(by_name[name], by_name)
        if loc in hyper and prec in hyper:
            items, globs = still()
            items[j] = (1.0, 0.0, hyper.index(loc))
            globs[hyper.index(prec)] = (0.0, -2.0)
            out.append((f"pool {name}", items, globs))
    return out


@exported_jit(static_argnames=("spec", "steps", "thin", "item_steps", "complete"))
def _chains(spec: ModelSpec, steps: int, thin: int, item_steps: int, complete: bool, data,
            keys, x, g, chol, g_chol, sym_sd):
    """The chains: ``(x, g, (draws of x, of g, acceptance rates), (sums of each pattern's
    ability mean and second moment, and the most posterior mass it had on the grid's two
    end points))`` after ``steps`` kept sweeps, each after ``thin - 1``
    more, vmapped over chains (``keys``, ``x``, ``g``). ``complete``: every pattern answers
    every item that anyone answers (``y0 = 1 - y1`` there; the items nobody answers, such
    as the padding to a bucketed number, count in no pattern), which saves two matrix
    products.

    ``data`` is ``(grid (G,), log_base (G,), y1 (U, n), y0 (U, n), counts (U,), rows (S,),
    row_weight (S,), moves)``: arguments, not constants of the program, so that another data
    set of the same (bucketed) sizes runs the same program, in this process or from the
    compilation cache. ``rows`` is each subject's pattern, padded to a bucketed count with
    rows of weight 0."""
    from engine.infer.marginal import (_env, _grid_curves, _grid_log_weights, _item_blocks,
                                       _log_prior, _pattern_moments)

    grid, log_base, y1, y0, counts, rows, row_weight, moves = data
    blocks = _item_blocks(spec)
    n, G = y1.shape[1], grid.shape[0]
    U = y1.shape[0]
    by_subject = rows.shape[0] < G

    def item_log_prior(x, g):  # (n,)
        env = _env(spec, g)
        return sum(p.prior.log_prob(x[:, j], env) for j, p in enumerate(blocks))

    # items nobody answered stay put (only their prior would move them), and their prior
    # terms are left out (integrated out): held at one value they would pin a pooled
    # prior's location and precision to it (a 2PL at 30 x 20 with 10 such items: the
    # pool's precision 3.5 times NUTS's, the items' sds half of NUTS's)
    answered_items = ((y1 + y0).sum(axis=0) > 0).astype(y1.dtype)  # (n,)
    answered = answered_items[:, None]  # (n, 1)

    def log_weights(x):  # (U, G): each pattern's log-likelihood on the grid + log base
        return _grid_log_weights(spec, x, grid, log_base, y1, None if complete else y0,
                                 answered_items if complete else None)

    def log_prior(x, g):
        return _log_prior(spec, x, g, answered_items)

    def marginal(lw, x, g):  # the items' and globals' log marginal posterior
        return counts @ jax.nn.logsumexp(lw, axis=1) + log_prior(x, g)

    def moved(x, g, t, mv):
        (mi, gi) = mv
        m, v = answered * mi[:, 0], answered * mi[:, 1]  # (n, k)
        centre = (jnp.where(mi[:, 2] >= 0, g[jnp.maximum(mi[:, 2], 0).astype(jnp.int32)], 0.0)
                  if g.shape[0] else jnp.zeros(mi.shape[0], x.dtype))  # (k,)
        # values the move leaves alone stay bit for bit (c + (x - c) is not x in floats,
        # and an unanswered item's chains, alike to the bit, would read as unmixed)
        scaled = jnp.where(m != 0, centre + (x - centre) * jnp.exp(t * m), x)
        return (scaled + t * v, g * jnp.exp(t * gi[:, 0]) + t * gi[:, 1],
                t * (m.sum() + gi[:, 0].sum()))

    mi_all = jnp.stack([mv[0] for mv in moves]) if moves else None  # (S, k, 3)
    gi_all = jnp.stack([mv[1] for mv in moves]) if moves else None  # (S, h, 2)

    def sweep(carry, key, chol, g_chol, sym_sd):
        x, g, s1, s2, edge, count = carry
        keys = jax.random.split(key, 8)
        lw = log_weights(x)
        sym_acc = jnp.zeros(len(moves), jnp.float32)
        if moves:  # a collapsed move along one symmetry a sweep, in turn
            j = count % len(moves)
            t = sym_sd[j] * jax.random.normal(keys[6])
            x2, g2, log_jac = moved(x, g, t, (mi_all[j], gi_all[j]))
            lw2 = log_weights(x2)
            ok = (jnp.log(jax.random.uniform(keys[7]))
                  < marginal(lw2, x2, g2) - marginal(lw, x, g) + log_jac)
            x, g, lw = jnp.where(ok, x2, x), jnp.where(ok, g2, g), jnp.where(ok, lw2, lw)
            sym_acc = sym_acc.at[j].set(ok.astype(jnp.float32))
        # the abilities: one grid point per subject (by the inverse of each pattern's
        # distribution function on the grid), each pattern's subjects counted there
        _, m1, m2 = _pattern_moments(lw, grid)
        post = jax.nn.softmax(lw, axis=1)
        # each answered pattern's posterior mass on the grid's two end points: where it is
        # not negligible the grid cuts the posterior off (sample_items widens it); padding
        # patterns, counted zero times, answer nothing and would read the prior's tails
        edge = jnp.maximum(edge, jnp.where(counts > 0, post[:, 0] + post[:, -1], 0.0))
        cdf = jnp.cumsum(post, axis=1)
        u = jax.random.uniform(keys[0], rows.shape) * cdf[rows, -1]
        idx = jnp.minimum(jnp.sum(cdf[rows] < u[:, None], axis=1), G - 1)
        if by_subject:  # fewer subjects than grid points: each item at each subject's
            at_theta = grid[idx][:, None]  # ability (50 x 1,000: 50 cells an item, not 160)
            ones, zeros = y1[rows] * row_weight[:, None], y0[rows] * row_weight[:, None]

            def item_ll(xx):
                one, zero = _grid_curves(spec, xx, at_theta[:, 0])
                return jnp.sum(ones * one + zeros * zero, axis=0)
        else:  # each pattern's subjects counted at their grid points
            at = jnp.zeros((U, G), y1.dtype).at[rows, idx].add(row_weight)
            n1 = at.T @ y1  # (G, n)
            n0 = (at.sum(axis=0)[:, None] - n1) if complete else at.T @ y0

            def item_ll(xx):
                one, zero = _grid_curves(spec, xx, grid)
                return jnp.sum(n1 * one + n0 * zero, axis=0)

        def item_log_post(xx):  # (n,): each item's log posterior given the abilities
            return item_ll(xx) + item_log_prior(xx, g)

        def mh(c, kk):  # a random-walk step of every item at once
            xx, lp = c
            kz, kw, kb = jax.random.split(kk, 3)
            # one step in LONG_STEP_SHARE LONG_STEP times longer: a symmetric mixture that
            # reaches along a long ridge (a 3PL item whose answers a guessing explains)
            long = jnp.where(jax.random.uniform(kw, (n, 1)) < LONG_STEP_SHARE, LONG_STEP, 1.0)
            prop = xx + long * jnp.einsum("nij,nj->ni", chol, jax.random.normal(kz, xx.shape))
            lp2 = item_log_post(prop)
            ok = jnp.log(jax.random.uniform(kb, (n,))) < lp2 - lp
            kept = (jnp.where(ok[:, None], prop, xx), jnp.where(ok, lp2, lp))
            return kept, ok.astype(jnp.float32)

        (x, _), item_acc = jax.lax.scan(mh, (x, item_log_post(x)),
                                        jax.random.split(keys[1], item_steps))
        g_acc = jnp.float32(0.0)
        if g.shape[0]:  # the globals given the items: their prior terms only
            kg, ku = jax.random.split(keys[2])
            g2 = g + g_chol @ jax.random.normal(kg, g.shape)
            ok = jnp.log(jax.random.uniform(ku)) < log_prior(x, g2) - log_prior(x, g)
            g, g_acc = jnp.where(ok, g2, g), ok.astype(jnp.float32)
        stats = jnp.concatenate([item_acc.mean(axis=0), g_acc[None], sym_acc])
        return (x, g, s1 + m1, s2 + m2, edge, count + 1), stats

    def kept(carry, key, chol, g_chol, sym_sd):
        carry, stats = jax.lax.scan(lambda c, k: sweep(c, k, chol, g_chol, sym_sd), carry,
                                    jax.random.split(key, thin))
        return carry, (carry[0], carry[1], stats.mean(axis=0))

    def chain(key, x, g, chol, g_chol, sym_sd):
        zero = jnp.zeros(U, jnp.float32)
        (x, g, s1, s2, edge, _), out = jax.lax.scan(
            lambda c, k: kept(c, k, chol, g_chol, sym_sd), (x, g, zero, zero, zero, 0),
            jax.random.split(key, steps))
        return x, g, out, (s1, s2, edge)

    return jax.vmap(chain, in_axes=(0, 0, 0, None, None, None))(keys, x, g, chol, g_chol, sym_sd)


def sample_items(spec: ModelSpec, x: np.ndarray, g: np.ndarray, item_cov: np.ndarray,
                 g_cov: np.ndarray, grid: np.ndarray, log_base: np.ndarray, y1: np.ndarray,
                 y0: np.ndarray, counts: np.ndarray, settings, seed: int = 0,
                 judged: np.ndarray | None = None, grid_max: int | None = None,
                 sweep_cells: float | None = None):
    """Draws of the items' (and globals') marginal posterior from ``settings.sampler_chains``
    chains started around the mode ``x`` ``(n, k)``, ``g`` ``(h,)`` (spread by the within-item
    Laplace blocks ``item_cov`` ``(n, k, k)`` and ``g_cov``), the abilities on ``grid``
    ``(G,)`` with ``log_base`` (log prior + log rule weight); ``y1``, ``y0`` ``(U, n)`` each
    pattern's observed ones and zeros, ``counts`` ``(U,)`` how many subjects gave it.

    Returns ``(moments, record)``: ``moments`` is ``(item mean (n, k), globals mean (h,),
    within-item covariances (n, k, k), globals covariance (h, h), each pattern's ability
    mean and variance (U,), the items' 5% and 95% quantiles (2, n, k), and per item value
    the mean and sd of its constrained value (through its block's transform), its split
    R-hat, its effective draws and its sd's Monte Carlo standard error
    (:func:`sd_standard_error`) (5, n, k), and the kept draws on their grid
    (:class:`~engine.infer.ability_quantiles.AbilityDraws`))`` over the kept
    draws, or ``None`` where the pilot agrees with the Laplace approximation or the chains
    did not mix. ``judged`` ``(n,)`` bool: the items the pilot compares with it (all
    answered ones by default; items the fit set aside have no Laplace approximation, and
    400 of them agreeing with their read-out outvoted 150 answered items that did not).
    ``grid_max``: the most points a widened grid may have (the caller's cells bound; by
    default ``settings.sampler_grid_max``, or the grid's own size where it has more).
    ``sweep_cells``: what one chain's sweep costs in cells on ``grid`` (the caller's count;
    a wider grid's in proportion to its points): an extension of the kept draws beyond the
    first one on R-hat is made only where every sweep run, a redraw's included, and the
    extension's stay within ``settings.sampler_cells_max`` (None: no bound)."""
    from engine.infer.fit import bucket_size
    from engine.infer.marginal import _host_constrain, _item_blocks

    t0 = time.perf_counter()
    n, k = x.shape
    h = g.size
    names = [p.name for p in _item_blocks(spec)]
    hyper = [p.name for p in spec.by_owner("global")]
    moves = _symmetry_moves(spec, names, hyper)
    chains, warmup, keep = settings.sampler_chains, settings.sampler_warmup, settings.sampler_draws
    # the program's items padded to a bucketed number with items nobody answers (held still,
    # their prior terms left out, cut off its draws): boards of similar size run one program
    N = bucket_size(n) if settings.bucket_patterns else n

    def grow(a, axis):  # (.., n, ..) -> (.., N, ..), the padding zero
        width = [(0, 0)] * np.ndim(a)
        width[axis] = (0, N - n)
        return np.pad(a, width) if N > n else a

    whole = np.rint(counts).astype(np.int64)
    rows = np.repeat(np.arange(len(counts)), np.maximum(whole, 0))
    row_weight = np.ones(bucket_size(len(rows)))
    row_weight[len(rows):] = 0.0  # padding: counted nowhere
    rows = np.concatenate([rows, np.zeros(len(row_weight) - len(rows), rows.dtype)])

    def f32(a):  # on the host: an eager cast or copy to the device is one more program per shape
        return np.asarray(a, np.float32)

    complete = bool(np.all(y1 + y0 == 1.0))
    grid, log_base = np.asarray(grid, np.float64), np.asarray(log_base, np.float64)
    # kept draws thinned to at most sampler_values item values a chain
    thin = max(1, int(np.ceil(keep * (N * k + h) / settings.sampler_values)))
    # every call runs one program of `chunk` sweeps: the warm-up is WARMUP_CALLS of them,
    # adapting after those ending a phase (PHASE_ENDS), the pilot after the third phase
    # (its draws: 20% of the warm-up); the kept draws take as many calls as they need
    chunk = max(warmup // WARMUP_CALLS, 2)
    calls = -(-max(keep // thin, 2) // chunk)
    keep = calls * chunk

    def programs(grid, log_base):  # the warm-up's and the kept draws' programs on this grid
        data = (f32(grid), f32(log_base), f32(grow(y1, 1)), f32(grow(y0, 1)), f32(counts),
                rows.astype(np.int32), f32(row_weight),
                tuple((f32(mi), f32(gi)) for _, mi, gi in moves))
        return tuple(partial(_chains, spec, chunk, t, settings.sampler_item_steps, complete,
                             data) for t in (1, thin))

    warm_program, keep_program = programs(grid, log_base)

    rng = np.random.default_rng(seed)
    # items nobody answered (set aside as constant) stay at their values: only their prior
    # would move them, and a vague one sends a chain far away for nothing
    answered = (y1 + y0).sum(axis=0) > 0
    block_chol = _factor(item_cov) * answered[:, None, None]
    xs = x[None] + np.einsum("nij,cnj->cni", block_chol, rng.standard_normal((chains, n, k)))
    block_chol = 0.5 * block_chol  # given the abilities an item is narrower than the Laplace
    g_sd = np.sqrt(np.maximum(np.diag(g_cov), 1e-12)) if h else np.zeros(0)
    gs = g[None] + g_sd * rng.standard_normal((chains, h))
    # each item's random walk shaped by its covariance (half the Laplace block's sds, then
    # the warm-up's draws), at the optimal scale for that shape
    scale = 2.38 / np.sqrt(k)  # the random walk's optimal scale (Gelman et al. 1996)
    g_scale = 0.5 * 2.38 / np.sqrt(max(h, 1))
    shape_chol, g_shape = block_chol, np.diag(g_sd)
    # a symmetry's step starts small (its ridge is long and flat); a pool's spread by a
    # tenth (adapted from there: at most twice or half a phase)
    sym_sd = np.array([0.1 if (mi[:, 2] >= 0).any() else 0.02 for _, mi, _ in moves])
    # the kept draws may be drawn again (on a wider grid) and extended sampler_extend_max times
    total = WARMUP_CALLS + (2 + max(settings.sampler_extend_max, 0)) * calls
    # the keys on the host: iterating over a device array compiles an unstacking program
    # with one output a call (1.3 s at 100 calls on 2 cores), for the same keys
    keys = iter(np.asarray(jax.random.split(jax.random.PRNGKey(seed), total * chains)).reshape(
        total, chains, 2))
    record = {"method": "sampled", "chains": chains, "warmup": WARMUP_CALLS * chunk, "draws": keep,
              "thin": thin, "item_steps": settings.sampler_item_steps,
              "grid_points": int(grid.size)}

    spent, points = 0.0, grid.size  # cells run; the caller's sweep_cells are on this grid

    def cells(t: int) -> float:
        """What a call of ``chunk`` draws thinned by ``t`` costs on the current grid (a
        sweep's cost grows with its points)."""
        return chains * chunk * t * (sweep_cells or 0.0) * grid.size / points

    def call(program):
        nonlocal spent
        spent += cells(thin if program is keep_program else 1)
        out = program(next(keys), f32(grow(xs, 1)), f32(gs), f32(grow(scale * shape_chol, 0)),
                      f32(g_scale * g_shape), f32(sym_sd))
        # back on the host: every call then gets uncommitted arrays alike (a committed
        # argument would make JAX compile the exported program a second time); the
        # padding's values and acceptance rates cut off there
        dx, dg, stats = (np.asarray(a, np.float64) for a in out[2])
        stats = np.concatenate([stats[..., :n], stats[..., N:]], axis=-1)
        sums = tuple(np.asarray(a, np.float64) for a in out[3])  # (chains, U) each
        return np.asarray(out[0])[:, :n], np.asarray(out[1]), (dx[:, :, :n], dg, stats), sums

    widened = []

    def widen(sums, sweeps: int, when: str) -> bool:
        """Where some pattern's posterior had more than EDGE_MASS on the grid's end
        points in these sweeps (``sums`` of a call), a wider grid at the same spacing or
        finer, spanning each pattern's mean +- SPAN of its sd over these sweeps (the items'
        uncertainty in it), a quarter of its width further at least, and the programs on it;
        within ``grid_max`` points, so coarser where it would need more (the record gives
        the spacing). False where none did, or it was widened MAX_WIDEN times."""
        nonlocal grid, log_base, warm_program, keep_program
        edge = float(sums[2].max())
        if not edge > EDGE_MASS or len(widened) >= MAX_WIDEN:
            return False
        from engine.infer.marginal import wider_grid

        step = grid[1] - grid[0]
        grid, log_base = wider_grid(
            spec, grid, sums[0].sum(axis=0) / sweeps, sums[1].sum(axis=0) / sweeps, counts,
            reach=0.25, max_points=settings.sampler_grid_max if grid_max is None else grid_max)
        warm_program, keep_program = programs(grid, log_base)
        widened.append({"at": when, "edge_mass": edge, "points": int(grid.size),
                        "span": [round(float(grid[0]), 3), round(float(grid[-1]), 3)],
                        "spacing": round(float(grid[1] - grid[0]), 4),
                        "spacing_before": round(float(step), 4)})
        return True

    phase, lap_sd = [], np.sqrt(np.maximum(np.diagonal(item_cov, axis1=1, axis2=2), 1e-24))
    for i in range(WARMUP_CALLS):
        xs, gs, draws, sums = call(warm_program)
        widen(sums, chains * chunk, f"warm-up call {i + 1} of {WARMUP_CALLS}")
        phase.append(draws)
        if i not in PHASE_ENDS:
            continue
        dx, dg, stats = (np.concatenate(a, axis=1) for a in zip(*phase))
        phase = []
        if i == PHASE_ENDS[2]:  # the pilot: do its draws depart from the Laplace approximation?
            pilot = _against_laplace(dx, x, lap_sd, names,
                                     answered if judged is None else answered & judged)
            record["pilot"] = pilot
            if settings.sampler_check_laplace and pilot["agrees"]:
                return None, record | {"method": "laplace", "because": (
                    "the pilot's draws agree with the Laplace approximation"),
                    "seconds": round(time.perf_counter() - t0, 2)}
        if i == PHASE_ENDS[-1]:  # the last phase: chains this far apart will not mix in time
            apart = split_rhat(np.concatenate([dx.reshape(chains, dx.shape[1], -1), dg], axis=2))
            record["warmup_rhat_max"] = round(float(apart.max()), 3)
            far = int((apart > settings.sampler_rhat_max + 0.5).sum())
            if far > settings.sampler_unmixed_share * apart.size:
                return None, record | {"because": (
                    f"{far} values with split R-hat over {settings.sampler_rhat_max + 0.5} in "
                    "the warm-up's last phase: too far apart to mix in the kept draws"),
                    "seconds": round(time.perf_counter() - t0, 2)}
            continue
        rate = stats.mean(axis=(0, 1))  # items (n,), globals, moves
        tail = dx[:, dx.shape[1] // 2:].reshape(-1, n, k)
        centred = tail - tail.mean(axis=0)
        cov = np.einsum("dni,dnj->nij", centred, centred) / max(len(tail) - 1, 1)
        shape_chol = _factor(cov) * answered[:, None, None]
        if h:
            gt = dg[:, dg.shape[1] // 2:].reshape(-1, h)
            g_shape = _factor(np.cov(gt.T).reshape(1, h, h))[0]
            g_scale = g_scale * _towards(rate[n], TARGET_ACCEPTANCE)
        sym_sd = sym_sd * _towards(rate[n + 1:] * len(moves), SYMMETRY_ACCEPTANCE)
    kept, s1, s2, edge = [], 0.0, 0.0, 0.0
    redrawn, extended = False, []
    while True:  # the kept draws: again on a wider grid where it cut them off (once), and
        for _ in range(calls):  # as many more while they have not mixed or keep too few
            xs, gs, draws, sums = call(keep_program)
            kept.append(draws)
            s1, s2, edge = s1 + sums[0], s2 + sums[1], max(edge, float(sums[2].max()))
        if not redrawn and not extended and widen(
                (s1, s2, np.asarray(edge)), chains * len(kept) * chunk * thin, "the kept draws"):
            redrawn, (kept, s1, s2, edge) = True, ([], 0.0, 0.0, 0.0)  # all on the wider grid
            continue
        dx, dg, stats = (np.concatenate(a, axis=1) for a in zip(*kept))  # (chains, keep, ...)
        keep = dx.shape[1]
        values = np.concatenate([dx.reshape(chains, keep, -1), dg], axis=2)
        rhat, ess, tail = split_rhat(values), effective_draws(values), tail_effective_draws(values)
        short = [f"split R-hat {rhat.max():.3f} over {settings.sampler_rhat_max}"
                 ] if rhat.max() > settings.sampler_rhat_max else []
        short += [f"{ess.min():.0f} effective draws under {settings.sampler_ess_min:g}"
                  ] if ess.min() < settings.sampler_ess_min else []
        short += [f"{tail.min():.0f} tail effective draws under {settings.sampler_ess_min:g}"
                  ] if tail.min() < settings.sampler_ess_min else []
        if not short or len(extended) >= settings.sampler_extend_max:
            break
        cost = spent + calls * cells(thin)
        if (extended or rhat.max() <= settings.sampler_rhat_max) and (
                cost > settings.sampler_cells_max):
            record["not_extended"] = (f"{'; '.join(short)}: another {calls * chunk} draws would "
                                      f"take the sampler to {cost:.3g} cells, over "
                                      "sampler_cells_max")
            break
        extended.append({"at_draws": keep, "because": "; ".join(short)})
    record |= {"draws": keep, "extended": extended, "grid_points": int(grid.size),
               "grid_edge_mass": float(f"{edge:.3g}"), **({"grid_widened": widened} if widened else {})}
    rate = stats.mean(axis=(0, 1))
    flat = dx.reshape(-1, n, k)
    mean = flat.mean(axis=0)
    centred = flat - mean
    cov = np.einsum("dni,dnj->nij", centred, centred) / (len(flat) - 1)
    gflat = dg.reshape(chains * keep, h)
    g_mean = gflat.mean(axis=0)
    g_cov = np.cov(gflat.T).reshape(h, h) if h else np.zeros((0, 0))
    sweeps = chains * keep * thin
    ability_mean = s1.sum(axis=0) / sweeps
    ability_var = np.maximum(s2.sum(axis=0) / sweeps - ability_mean ** 2, 1e-24)
    record |= {"rhat_max": round(float(rhat.max()), 4),
               "rhat_worst": _value(int(np.argmax(rhat)), n, k, names, hyper),
               "rhat_over_1_01": int((rhat > 1.01).sum()),
               "ess_min": round(float(ess.min()), 1),
               "ess_median": round(float(np.median(ess)), 1),
               "ess_tail_min": round(float(tail.min()), 1),
               "ess_tail_median": round(float(np.median(tail)), 1),
               "acceptance": {"items_median": round(float(np.median(rate[:n])), 3),
                              "items_min": round(float(rate[:n].min()), 3),
                              **({"globals": round(float(rate[n]), 3)} if h else {}),
                              **{mv[0]: round(float(r) * len(moves), 3)
                                 for mv, r in zip(moves, rate[n + 1:])}},
               "seconds": round(time.perf_counter() - t0, 2)}
    unmixed = np.flatnonzero(~(rhat <= settings.sampler_rhat_max))
    if len(unmixed) > settings.sampler_unmixed_share * rhat.size:
        return None, record | {"because": (
            f"{len(unmixed)} of {rhat.size} values with split R-hat over "
            f"{settings.sampler_rhat_max} (largest {rhat.max():.3f})")}
    if len(unmixed):  # reported all the same: a few values whose chains disagree, most
        # often an item whose answers a guessing can explain, its difficulty on a long ridge
        record["not_mixed"] = [_value(int(v), n, k, names, hyper) | {
            "rhat": round(float(rhat[v]), 3)} for v in unmixed[:MAX_LISTED]]
    quantiles = np.quantile(flat, [0.05, 0.95], axis=0)  # (2, n, k): skewed items' ends
    value = np.stack([_host_constrain(p, flat[:, :, j].astype(np.float64))
                      for j, p in enumerate(_item_blocks(spec))], axis=-1)
    constrained = np.stack([value.mean(axis=0), value.std(axis=0, ddof=1),
                            rhat[:n * k].reshape(n, k), ess[:n * k].reshape(n, k),
                            sd_standard_error(value.reshape((chains, keep) + value.shape[1:]))])
    from engine.infer.ability_quantiles import AbilityDraws

    # the kept draws on the grid they ended on, for the abilities' exact quantiles
    kept_draws = AbilityDraws(flat, np.full(len(flat), 1.0 / len(flat)), grid, log_base, y1, y0)
    return (mean, g_mean, cov, g_cov, ability_mean, ability_var, quantiles, constrained,
            kept_draws), record
