"""How many skills? Residual eigenvalues and parallel analysis (seed 000 section 11.4).

Correlation matrices here are item by item (N x N), but with many more items than
subjects their spectrum is computed from the subject-by-subject Gram matrix (S x S), which
has the same non-zero eigenvalues; an N x N matrix is never formed when S < N.

Missing cells and constant items
--------------------------------
Each item (column) is standardised over its observed cells (mean 0, sd 1, ``ddof=0``),
divided by the square root of its observed count, and set to 0 where missing, giving
``Z``. The correlation matrix is ``R = Z^T Z``: on complete data it is exactly the Pearson
(phi, for binary items) correlation; with missing cells each entry sums the products over
the subjects who answered both items, normalised by each item's own count, so ``R`` stays
positive semi-definite with a unit diagonal (trace = number of items). Items without
variation (all observed answers equal) have no correlation and are left out; items with
no observed answer are an error.

Parallel analysis
-----------------
Each item's column is permuted independently (never rows): each item keeps its multiset of
answers (and of missing cells), while the links between items are destroyed. Standardised
values are permutation-invariant per column, so a shuffle only re-arranges ``Z``; the
sampler is in :mod:`engine.readout.column_shuffle`.

Choosing the number of skills
-----------------------------
Phi correlations of binary items carry difficulty factors, so raw parallel analysis
over-counts (one-skill 2PL data typically give 2, two-skill data 3-4). It is kept as the
upper bound. The lower bound is a sequential residual test: the one-skill fit's residuals,
then those of models with skills added on the logit scale, each against data simulated
from the model tested. See :func:`suggest_n_factors`.

Examples
--------
The whole reading; the two ``seeds`` loops are the parts to spread over Ray tasks
(each call is a pure function of its seeds):

>>> observed = correlation_eigenvalues(y, k=30)  # doctest: +SKIP
>>> shuffled = shuffle_eigenvalues(y, range(1000), k=30)  # or batches of seeds, stacked
>>> env_mean, env_q95 = envelope(shuffled)
>>> p = fitted_probabilities(engine.api.fit(y, model="2pl"))
>>> residual = residual_eigenvalues(y, p, k=30)
>>> null = envelope(residual_null_eigenvalues(p, range(100), k=30, observed=y != -1))
>>> upper = max(count_above(observed, env_q95), 1)
>>> steps = residual_steps(y, p, range(100), max_skills=upper)
>>> n_factors, reading = suggest_n_factors(observed, residual, env_mean, env_q95,
...                                        residual_envelope=null, steps=steps)
>>> table = dimensions_table(observed, residual, env_mean, env_q95, residual_envelope=null)
>>> scree_plot(table, "scree.png", n_factors=n_factors)
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from engine.atomic import atomic_write
from engine.errors import DataFormatError, ModelError, SettingsError
from engine.readout.column_shuffle import Levels, argsort_permute, arrange_levels, count_levels

__all__ = [
    "correlation_eigenvalues",
    "standardized_residuals",
    "residual_eigenvalues",
    "residual_null_eigenvalues",
    "shuffle_columns",
    "shuffle_eigenvalues",
    "envelope",
    "count_above",
    "suggest_n_factors",
    "fitted_probabilities",
    "extra_skill_probabilities",
    "ResidualStep",
    "residual_step",
    "residual_steps",
    "dimensions_table",
    "scree_plot",
    "TABLE_COLUMNS",
]

_P_CLIP = 1e-6  # fitted probabilities are clipped to [eps, 1 - eps] for residuals


# ---------------------------------------------------------------- input and standardising


def _read(y, what: str = "responses") -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(values float64 with NaN missing, observed mask)`` of a response matrix."""
    arr = np.asarray(y)
    if arr.ndim != 2:
        raise DataFormatError(
            f"{what} must be a 2-D subjects x items array (one row per subject, one column per "
            f"item); got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise DataFormatError(f"{what} must be numeric (int8 with -1 missing, or float with NaN "
                              f"missing); got dtype {arr.dtype}")
    if arr.shape[0] < 2:
        raise DataFormatError(
            f"{what} has {arr.shape[0]} subject row(s); item correlations need at least 2 subjects")
    if arr.dtype.kind == "f":
        x = arr.astype(np.float64)
        if np.isinf(x).any():
            r, c = np.argwhere(np.isinf(x))[0]
            raise DataFormatError(f"{what} row {r}, column {c} is infinite; use NaN for missing")
        observed = ~np.isnan(x)
    else:
        observed = arr != -1
        x = np.where(observed, arr, np.nan).astype(np.float64)
    empty = np.flatnonzero(~observed.any(axis=0))
    if empty.size:
        raise DataFormatError(
            f"{what} item column(s) {empty[:5].tolist()}{' ...' if empty.size > 5 else ''} "
            f"({empty.size} in all) have no observed responses; drop those items first")
    return x, observed


class _Stats(NamedTuple):
    kept: np.ndarray  # (N,) bool: items whose observed answers vary
    mean: np.ndarray  # (N',) mean over observed cells, kept items
    scale: np.ndarray  # (N',) sd * sqrt(observed count), kept items


def _kept_stats(n, mean, var, mean_sq, what: str) -> _Stats:
    kept = var > 1e-12 * np.maximum(mean_sq, 1e-300)
    if kept.sum() < 2:
        raise DataFormatError(
            f"{what}: only {int(kept.sum())} item column(s) vary across subjects; correlations "
            "need at least 2 items whose observed answers are not all equal")
    return _Stats(kept, mean[kept], np.sqrt(var[kept] * n[kept]))


def _standardize(x: np.ndarray, observed: np.ndarray, what: str) -> tuple[np.ndarray, _Stats]:
    """``Z`` (S, N') of the varying items, and their statistics."""
    n = observed.sum(axis=0)
    filled = np.where(observed, x, 0.0)
    mean = filled.sum(axis=0) / n
    centred = np.where(observed, x - mean, 0.0)
    st = _kept_stats(n, mean, (centred**2).sum(axis=0) / n, (filled**2).sum(axis=0) / n, what)
    return np.compress(st.kept, centred, axis=1) / st.scale, st


def _level_stats(lv: Levels, what: str) -> _Stats:
    """The same statistics from level counts (no pass over the cells)."""
    answered = ~np.isnan(lv.values)
    c, v = lv.counts[answered], lv.values[answered][:, None]
    n = c.sum(axis=0)
    mean = (c * v).sum(axis=0) / n
    return _kept_stats(n, mean, (c * (v - mean) ** 2).sum(axis=0) / n, (c * v**2).sum(axis=0) / n, what)


def _num_eigen(k: int | None, num_subjects: int, num_items: int) -> int:
    """How many eigenvalues to return: ``k`` (at most the item count) or all non-zero ones."""
    if k is None:
        return min(num_subjects, num_items)
    if int(k) < 1:
        raise SettingsError(f"k must be a positive number of eigenvalues, got {k}")
    return min(int(k), num_items)


def _eigenvalues(z: np.ndarray, k: int | None) -> np.ndarray:
    return _gram_eigenvalues(z, _num_eigen(k, *z.shape))


def _gram_eigenvalues(z: np.ndarray, k: int, *, float32: bool = False) -> np.ndarray:
    """Top ``k`` eigenvalues (descending, zero-padded) of ``z^T z`` via the smaller Gram matrix."""
    S, N = z.shape
    if float32:
        from scipy.linalg.blas import ssyrk

        # BLAS syrk on the Fortran-ordered z^T (no copy): lower triangle of the smaller of
        # z z^T (trans=1) and z^T z (trans=0).
        g = ssyrk(1.0, z.T, trans=1 if S <= N else 0, lower=1)
        w = np.linalg.eigvalsh(g.astype(np.float64), UPLO="L")
    else:
        g = z @ z.T if S <= N else z.T @ z
        w = np.linalg.eigvalsh(g)
    w = np.clip(w[::-1], 0.0, None)  # PSD: tiny negatives are round-off
    out = np.zeros(k)
    out[: min(k, w.size)] = w[:k]
    return out


# ---------------------------------------------------------------- observed spectra


def correlation_eigenvalues(y, k: int | None = None) -> np.ndarray:
    """Eigenvalues of the item-by-item (phi) correlation matrix, largest first.

    Parameters
    ----------
    y : ``(subjects, items)`` responses, int8 with -1 missing (or float with NaN missing).
    k : how many to return (default ``min(subjects, varying items)``, all non-zero ones).

    Returns
    -------
    ``(k,)`` float64, descending; they sum to the number of varying items when all are kept.

    Raises
    ------
    DataFormatError
        Not 2-D, fewer than 2 subjects, an item with no observed answer, or fewer than 2
        items that vary.
    """
    x, observed = _read(y)
    return _eigenvalues(_standardize(x, observed, "responses")[0], k)


def standardized_residuals(y, p) -> np.ndarray:
    """``(y - p) / sqrt(p (1 - p))`` on observed cells, NaN where missing.

    ``p`` is clipped to ``[1e-6, 1 - 1e-6]`` so a confident miss stays finite.
    """
    x, observed = _read(y)
    p = _read_probabilities(p, x.shape)
    return np.where(observed, (x - p) / np.sqrt(p * (1.0 - p)), np.nan)


def _read_probabilities(p, shape) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.shape != shape:
        raise DataFormatError(f"fitted probabilities have shape {p.shape}; the responses have "
                              f"{shape}; pass one probability per (subject, item) cell")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise DataFormatError("fitted probabilities must be finite and within [0, 1]")
    return np.clip(p, _P_CLIP, 1.0 - _P_CLIP)


def check_residual_model(spec) -> None:
    """Raise unless ``spec`` is a one-skill binary model, whose P(correct) the residual
    eigenvalues read (checked before an analysis writes anything)."""
    ability = next((p for p in spec.by_owner("subject") if p.name == "ability"), None)
    if spec.kind != "binary" or ability is None or ability.shape != ():
        what = spec.kind if spec.kind != "binary" else "a multi-skill model"
        raise ModelError(f"model {spec.name!r} is {what}; residual eigenvalues need a one-skill "
                         "binary model's P(correct) (--model 1pl, 2pl, 3pl, 4pl or feas, on "
                         "binary responses)")


def residual_eigenvalues(y, p, k: int | None = None) -> np.ndarray:
    """Eigenvalues of the item-by-item correlation of standardised residuals (seed 000 11.4.1).

    Parameters
    ----------
    y : ``(subjects, items)`` binary responses, -1 missing.
    p : ``(subjects, items)`` fitted P(correct) of a one-skill fit (see
        :func:`fitted_probabilities`).
    k : how many to return (default all non-zero ones).
    """
    r = standardized_residuals(y, p)
    return _eigenvalues(_standardize(r, ~np.isnan(r), "residuals")[0], k)


def residual_null_eigenvalues(p, seeds: Sequence[int], k: int | None = None, *,
                              observed=None) -> np.ndarray:
    """Residual eigenvalues of data simulated from the fitted one-skill model itself.

    For each seed, ``y* ~ Bernoulli(p)`` on the observed cells and the residual spectrum of
    ``y*`` against the same ``p`` is computed: what :func:`residual_eigenvalues` looks like
    when one skill explains everything. ``observed`` is the mask of observed cells
    (``y != -1``; default all). Returns ``(len(seeds), k)``.
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2:
        raise DataFormatError(f"fitted probabilities must be 2-D, got shape {p.shape}")
    mask = np.ones(p.shape, bool) if observed is None else np.asarray(observed, bool)
    p = _read_probabilities(p, mask.shape)
    sd = np.sqrt(p * (1.0 - p))
    rows = []
    with threadpool_limits(limits=1, user_api="blas"):
        for seed in seeds:
            rng = np.random.default_rng(seed)
            y_sim = (rng.random(p.shape) < p).astype(np.float64)
            r = np.where(mask, (y_sim - p) / sd, np.nan)
            rows.append(_eigenvalues(_standardize(r, mask, "simulated residuals")[0], k))
    return _stack(rows)


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    width = max((r.size for r in rows), default=0)
    out = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


# ---------------------------------------------------------------- column shuffles


def shuffle_columns(y, seed: int) -> np.ndarray:
    """``y`` with each item column permuted independently (parallel analysis' null data).

    The same sampler and seed as :func:`shuffle_eigenvalues`, which shuffles standardised
    values instead. Every column keeps its multiset of answers and missing cells.
    """
    arr = np.asarray(y)
    x, observed = _read(arr)
    rng = np.random.default_rng(seed)
    lv = count_levels(x, observed)
    if lv is None:
        return argsort_permute(arr, rng)
    K, (S, N) = lv.values.size, arr.shape
    idx = np.empty((S, N), np.uint32)
    arrange_levels(lv, np.repeat(np.arange(K, dtype=np.uint32)[:, None], N, axis=1), rng, idx)
    missing = np.nan if arr.dtype.kind == "f" else -1
    return np.where(np.isnan(lv.values), missing, lv.values).astype(arr.dtype)[idx]


def shuffle_eigenvalues(y, seeds: Sequence[int], k: int | None = None) -> np.ndarray:
    """Correlation eigenvalues of column-shuffled copies of ``y`` (parallel analysis, 11.4.2).

    Each shuffle uses ``np.random.default_rng(seed)``: the same seed gives the same
    eigenvalues, and equals :func:`correlation_eigenvalues` of ``shuffle_columns(y, seed)``
    (to float32 precision). Level counts, standardised values and buffers are shared by
    all seeds; each shuffle is one sampling pass, one float32 BLAS ``syrk`` for the S x S
    Gram matrix and an S x S ``eigvalsh``. BLAS runs single-threaded here
    (``threadpoolctl``): parallelism comes from running batches of seeds in separate
    processes (Ray tasks).

    Parameters
    ----------
    y : ``(subjects, items)`` responses, int8 with -1 missing (or float with NaN missing).
    seeds : one seed per shuffle.
    k : eigenvalues per shuffle (default all non-zero ones).

    Returns
    -------
    ``(len(seeds), k)`` float64, each row descending.
    """
    x, observed = _read(y)
    lv = count_levels(x, observed)
    if lv is None:
        z, st = _standardize(x, observed, "responses")
        z32 = z.astype(np.float32)
    else:
        st = _level_stats(lv, "responses")
        lv = lv.columns(st.kept)
        # Standardised value of every level in every kept column, as float32 bit patterns.
        rows = [np.zeros(st.mean.size) if np.isnan(v) else (v - st.mean) / st.scale for v in lv.values]
        table = np.stack(rows).astype(np.float32).view(np.uint32)
    S, N = x.shape[0], int(st.kept.sum())
    out = np.empty((len(seeds), _num_eigen(k, S, N)))
    buf = np.empty((S, N), np.uint32)
    with threadpool_limits(limits=1, user_api="blas"):
        for i, seed in enumerate(seeds):
            rng = np.random.default_rng(seed)
            if lv is None:
                zs = argsort_permute(z32, rng)
            else:
                arrange_levels(lv, table, rng, buf)
                zs = buf.view(np.float32)
            out[i] = _gram_eigenvalues(zs, out.shape[1], float32=True)
    return out


# ---------------------------------------------------------------- reading the spectra


def envelope(shuffled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95th percentile of each eigenvalue index over shuffles: ``(k,), (k,)``."""
    a = np.asarray(shuffled, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1:
        raise DataFormatError(f"shuffled eigenvalues must be (shuffles, k), got shape {a.shape}")
    return a.mean(axis=0), np.quantile(a, 0.95, axis=0)


def count_above(eigenvalues: np.ndarray, threshold: np.ndarray) -> int:
    """Leading eigenvalues above their threshold, counted from the largest until one is not."""
    e, t = np.asarray(eigenvalues, float), np.asarray(threshold, float)
    n = min(e.size, t.size)
    below = np.flatnonzero(~(e[:n] > t[:n]))
    return int(below[0]) if below.size else n


def fitted_probabilities(result, *, max_cells: int = 1 << 22) -> np.ndarray:
    """P(correct) per (subject, item) cell at the posterior means of a binary model's fit.

    Works for any binary ``ModelSpec`` without knowing its name: the probability is
    ``exp(loglik(params, y=1))`` with every likelihood block at its constrained posterior
    mean. Computed in row chunks of at most ``max_cells`` cells.

    Parameters
    ----------
    result : a ``FitResult`` (``engine.api.fit``) of a one-skill binary model.

    Returns
    -------
    ``(subjects, items)`` float64.
    """
    from engine.readout.items import response_probabilities

    spec = result.spec
    check_residual_model(spec)
    means = result.means()
    S, N = result.num_subjects, result.num_items
    rows = min(S, max(1, max_cells // max(N, 1)))
    blocks = {p.name: np.asarray(means[p.name], np.float32) for p in spec.likelihood_params}
    subject = {p.name for p in spec.likelihood_params if p.owner == "subject"}
    params = {k: v for k, v in blocks.items() if k not in subject}
    out = np.empty((S, N))
    for start in range(0, S, rows):
        stop = min(start + rows, S)
        # the last chunk padded with its last row: every chunk runs one program
        chunk = {k: np.concatenate([blocks[k][start:stop],
                                    np.repeat(blocks[k][stop - 1:stop], rows - (stop - start),
                                              axis=0)]) for k in subject}
        prob = response_probabilities(spec, N, params, chunk)
        out[start:stop] = np.asarray(prob, np.float64)[:stop - start]
    return out


# ---------------------------------------------------------------- more skills on the logit scale


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _weighted_grams(w: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A[i] = sum_j w[i, j] B[j] B[j]^T`` for every row ``i`` of ``w``, as one matrix product."""
    r = B.shape[1]
    return (w @ (B[:, :, None] * B[:, None, :]).reshape(B.shape[0], r * r)).reshape(-1, r, r)


def extra_skill_probabilities(y, p, extra: int, *, iters: int = 30, ridge: float = 1.0,
                              offset_ridge: float = 0.1, max_step: float = 1.0) -> np.ndarray:
    """P(correct) of the one-skill fit plus ``extra`` compensatory skills on the logit scale.

    ``logit P = logit p + c_n + u_s . v_n`` with ``u`` (S, extra), ``v`` (N, extra) and an
    item offset ``c``, fitted by alternating Newton (IRLS) steps with ridge penalties
    (``ridge`` on ``u`` and ``v``, ``offset_ridge`` on ``c``; each step clipped to
    ``max_step`` logits), started from the top singular vectors of the standardised
    residuals. Compensatory MIRT is linear in the skills on the logit scale, so this
    removes a missed skill together with the curvature its logistic link leaves in linear
    residual correlations (which would otherwise show up as spurious extra eigenvalues,
    like difficulty factors).

    Parameters
    ----------
    y : ``(subjects, items)`` binary responses, -1 missing.
    p : ``(subjects, items)`` P(correct) of the one-skill fit, kept as an offset.
    extra : skills to add (0 returns ``p`` clipped).

    Returns
    -------
    ``(subjects, items)`` float64 probabilities.
    """
    x, observed = _read(y)
    p = _read_probabilities(p, x.shape)
    if extra < 1:
        return p
    S, N = x.shape
    eta = np.log(p) - np.log1p(-p)
    yf, m = np.where(observed, x, 0.0), observed.astype(np.float64)
    e = np.where(observed, (x - p) / np.sqrt(p * (1.0 - p)), 0.0)
    u_svd = np.linalg.svd(e, full_matrices=False)[0]
    U = np.concatenate([np.ones((S, 1)), u_svd[:, :extra] * np.sqrt(S)], axis=1)
    V = np.zeros((N, extra + 1))
    penalty = np.diag([offset_ridge] + [ridge] * extra)
    for _ in range(iters):
        q = _sigmoid(eta + U @ V.T)
        w, z = q * (1.0 - q) * m, (yf - q) * m
        A = _weighted_grams(w.T, U) + penalty
        step = np.linalg.solve(A, (U.T @ z - penalty @ V.T).T[..., None])[..., 0]
        V += np.clip(step, -max_step, max_step)  # damped Newton: no blow-up on extreme items
        q = _sigmoid(eta + U @ V.T)
        w, z = q * (1.0 - q) * m, (yf - q) * m
        Us, Vs = U[:, 1:], V[:, 1:]
        A = _weighted_grams(w, Vs) + ridge * np.eye(extra)
        step = np.linalg.solve(A, (z @ Vs - ridge * Us)[..., None])[..., 0]
        U[:, 1:] += np.clip(step, -max_step, max_step)
    return np.clip(_sigmoid(eta + U @ V.T), _P_CLIP, 1.0 - _P_CLIP)


class ResidualStep(NamedTuple):
    """One step of the sequential residual test: is there structure beyond ``skills`` skills?"""

    skills: int  # skills in the model whose residuals are tested
    statistic: float  # sum of the top `top` residual eigenvalues of the data
    null_mean: float  # its mean over data simulated from that model
    null_q95: float  # and 95th percentile
    above: bool  # a further skill is supported
    top: int = 3


def _beats(value: float, mean: float, q95: float, min_excess: float) -> bool:
    return bool(value > q95 and value - mean > min_excess)


def residual_step(y, p, skills: int, seeds: Sequence[int], *, top: int = 3,
                  min_excess: float = 1.0) -> ResidualStep:
    """Test the residuals of a ``skills``-skill model against data simulated from it.

    ``skills = 1`` uses ``p`` (the one-skill fit) as is; larger values add ``skills - 1``
    logit-scale skills with :func:`extra_skill_probabilities`. The statistic is the sum of
    the ``top`` largest residual eigenvalues, compared with its distribution over
    ``len(seeds)`` data sets simulated from the same model; a further skill is supported
    when it beats the null's 95th percentile and its mean by more than ``min_excess``
    (1.0 = one item's worth of shared variance).

    Why a sum: with near-deterministic cells (large discriminations, as on benchmark
    data) rare surprises co-occur in the same subjects and make one large eigenvalue in
    the data and in every simulated null alike; a missed skill smaller than it shows only
    at the second or third index. On the NLU matrix after 3 added skills the top residual
    eigenvalues are 3768, 2180, 1753 against null means 3819, 1762, 1475: the top one
    alone says "no further skill", the sum of three (7701 against a q95 of 7086) does not.
    """
    if skills < 1 or top < 1:
        raise SettingsError(f"skills and top must be >= 1, got skills={skills}, top={top}")
    _, observed = _read(y)
    pm = p if skills == 1 else extra_skill_probabilities(y, p, skills - 1)
    value = float(residual_eigenvalues(y, pm, k=top).sum())
    null = residual_null_eigenvalues(pm, seeds, k=top, observed=observed).sum(axis=1)
    mean, q95 = float(null.mean()), float(np.quantile(null, 0.95))
    return ResidualStep(skills, value, mean, q95, _beats(value, mean, q95, min_excess), top)


def residual_steps(y, p, seeds: Sequence[int], *, max_skills: int, top: int = 3,
                   min_excess: float = 1.0) -> list[ResidualStep]:
    """:func:`residual_step` for 1, 2, ... skills until a step finds nothing or ``max_skills``.

    ``max_skills`` is the parallel-analysis upper bound: steps stop below it, since the
    answer cannot exceed it.
    """
    steps: list[ResidualStep] = []
    for skills in range(1, max_skills):
        steps.append(residual_step(y, p, skills, seeds, top=top, min_excess=min_excess))
        if not steps[-1].above:
            break
    return steps


def suggest_n_factors(observed, residual, env_mean, env_q95, *, residual_envelope=None,
                      steps: Sequence[ResidualStep] | None = None,
                      min_excess: float = 1.0) -> tuple[int, dict]:
    """The number of skills, reading parallel analysis and residuals together (seed 000 11.4.3).

    Upper bound: parallel analysis, the leading observed correlation eigenvalues above the
    shuffled envelope's 95th percentile (at least 1). On binary items it over-counts: phi
    correlations carry difficulty factors (one-skill 2PL data give 2, two-skill data 3-4).
    Lower bound: 1 + the missed skills the residual diagnostic finds after the one-skill
    fit; ``n_factors`` is the lower bound, capped by the upper.

    The residual reading uses, in order of preference:

    - ``steps`` (:func:`residual_steps`): each further skill must show in the residuals of a
      model that already has the skills found so far (added on the logit scale), against
      data simulated from that model. Robust to the curvature a missed skill leaves.
    - ``residual_envelope`` = ``(mean, q95)`` of :func:`residual_null_eigenvalues` of the
      one-skill fit: the leading residual eigenvalues that beat it, index by index. Can
      over-count when difficulties spread widely and skills are weakly correlated
      (curvature companions of a missed skill).

    An eigenvalue (or a step's statistic) counts when it beats the null's 95th percentile
    and the null's mean by more than ``min_excess`` (1.0: at least one item's worth of
    shared variance beyond noise).

    Returns
    -------
    ``(n_factors, reading)``, ``reading`` a JSON-ready dict with both bounds and how they
    were obtained.
    """
    observed, env_mean, env_q95 = (np.asarray(a, float) for a in (observed, env_mean, env_q95))
    pa = count_above(observed, env_q95)
    upper = max(pa, 1)
    reading: dict = {
        "parallel_analysis": pa,
        "parallel_analysis_above_mean": count_above(observed, env_mean),
        "upper_bound": upper,
        "min_excess": float(min_excess),
    }
    if steps:
        found = 0
        for st in steps:
            if not _beats(st.statistic, st.null_mean, st.null_q95, min_excess):
                break
            found += 1
        lower = 1 + found
        # Every step found a further skill but the steps ended below the upper bound.
        reading["residual_steps_cut_short"] = found == len(steps) and lower < upper
        # Every step found a further skill and the steps stopped at the upper bound: the
        # residual count is capped there, not confirmed by it.
        reading["capped_at_upper_bound"] = found == len(steps) and lower == upper
        reading["residual_method"] = "sequential residual test, skills added on the logit scale"
        reading["residual_steps"] = [{k: (v if isinstance(v, (bool, int)) else float(v))
                                      for k, v in st._asdict().items()} for st in steps]
    elif residual_envelope is not None:
        rm, rq = (np.asarray(a, float) for a in residual_envelope)
        r = np.asarray(residual, float)
        n = min(r.size, rm.size, rq.size)
        found = next((i for i in range(n) if not _beats(r[i], rm[i], rq[i], min_excess)), n)
        lower = 1 + found
        reading["residual_method"] = "one-skill residual eigenvalues against simulated one-skill data"
    else:
        lower = None
        reading["residual_method"] = None
    reading["lower_bound"] = lower
    n_factors = upper if lower is None else min(lower, upper)
    reading["n_factors"] = n_factors
    reading["text"] = _explain(n_factors, pa, lower, capped=reading.get("capped_at_upper_bound", False))
    stopped = steps[found] if steps and found < len(steps) else None
    if stopped is not None and stopped.statistic > stopped.null_q95:  # over the 95th, not counted
        reading["text"] += (f"; the residual step after {stopped.skills} skill(s) is over its "
                            f"null's 95th percentile ({stopped.statistic:.2f} > "
                            f"{stopped.null_q95:.2f}) but within min_excess {min_excess:g} of "
                            f"the null's mean ({stopped.null_mean:.2f}): under one item's worth "
                            f"of shared variance, not counted as a skill")
    if reading.get("residual_steps_cut_short"):
        reading["text"] += (f"; every residual step found a further skill, so {lower} is a "
                            "floor: run more steps (up to the upper bound)")
    return n_factors, reading


def _explain(n: int, pa: int, lower: int | None, *, capped: bool = False) -> str:
    if lower is None:
        return (f"parallel analysis finds {pa} factor(s) above the shuffled 95% envelope; with no "
                f"residual test this is only an upper bound (binary items add difficulty factors)")
    text = (f"after a one-skill fit the residuals support {lower - 1} further skill(s) "
            f"(lower bound {lower}); parallel analysis finds {pa} (upper bound)")
    if lower == pa and capped:
        text += (f"; every residual step found a further skill up to that bound, where the steps "
                 f"stop: n_factors = {n} is the bound, not a count the residuals ended on")
    elif lower == pa:
        text += "; the two agree"
    elif lower > pa:
        text += f"; the residual count exceeds parallel analysis, so n_factors is capped at {n}"
    elif pa > lower:
        text += ("; the surplus in parallel analysis matches difficulty factors of binary items, "
                 f"so n_factors = {n}")
    return text


# ---------------------------------------------------------------- outputs


TABLE_COLUMNS = ["index", "observed", "residual", "envelope_mean", "envelope_q95"]


def dimensions_table(observed, residual, env_mean, env_q95, *, residual_envelope=None) -> pd.DataFrame:
    """The ``eigenvalues.parquet`` table: one row per eigenvalue index (1 = largest).

    Columns ``index, observed, residual, envelope_mean, envelope_q95`` (plus
    ``residual_null_mean, residual_null_q95`` when ``residual_envelope`` is given); shorter
    series are padded with NaN.
    """
    cols = {"observed": observed, "residual": residual, "envelope_mean": env_mean,
            "envelope_q95": env_q95}
    if residual_envelope is not None:
        cols["residual_null_mean"], cols["residual_null_q95"] = residual_envelope
    cols = {k: np.asarray(v, np.float64).ravel() for k, v in cols.items()}
    n = max(v.size for v in cols.values())
    out = {"index": np.arange(1, n + 1, dtype=np.int64)}
    for k, v in cols.items():
        out[k] = np.concatenate([v, np.full(n - v.size, np.nan)])
    return pd.DataFrame(out)


def scree_plot(table: pd.DataFrame, path, *, n_factors: int | None = None,
               max_index: int = 30) -> None:
    """Write a scree plot (PNG) of a :func:`dimensions_table`: observed and residual
    eigenvalues against the shuffled envelope. Written to a temporary file, then renamed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise DataFormatError(f"eigenvalue table lacks column(s) {missing}; build it with "
                              "dimensions_table(...)")
    t = table.iloc[:max_index]
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = t["index"].to_numpy()
    ax.fill_between(x, t["envelope_mean"], t["envelope_q95"], color="0.85",
                    label="shuffled: mean to 95th percentile")
    ax.plot(x, t["envelope_q95"], color="0.5", lw=1)
    ax.plot(x, t["observed"], "o-", color="C0", label="observed (phi correlations)")
    ax.plot(x, t["residual"], "s-", color="C1", ms=4, label="residuals after one skill")
    if "residual_null_q95" in t.columns:
        ax.plot(x, t["residual_null_q95"], "--", color="C1", lw=1,
                label="residuals of simulated one-skill data, 95th percentile")
    values = t[["observed", "residual", "envelope_mean"]].to_numpy()
    values = values[np.isfinite(values) & (values > 0)]
    if values.size and values.max() / values.min() > 10:
        ax.set_yscale("log")
    if n_factors is not None:
        ax.axvline(n_factors + 0.5, color="C3", ls=":", label=f"n_factors = {n_factors}")
    ax.set_xlabel("eigenvalue index")
    ax.set_ylabel("eigenvalue")
    ax.set_title("How many skills? Scree against parallel analysis")
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
