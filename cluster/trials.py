"""Trials: frozen specs and the pure functions that turn a batch of them into result rows.

A trial is ``TrialSpec(group, index, seed)``; trials of one group share array shapes, so a
batch of them is fitted at once with ``engine.infer.batch.fit_batch`` (``jax.vmap``). Each
function here is pure given its context and specs: the runner may call it in this process or
in a Ray task and gets the same rows. Contexts hold the data and the full fit used as warm
start; they are plain arrays and names, cheap to ship to a Ray object store. A matrix larger
than the memory budget is held by reference (``cluster.columns.StoreColumns``): each trial
reads the items it samples from the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import jax
import numpy as np
from scipy.stats import kendalltau

from cluster.columns import StoreColumns, columns
from engine.api import set_aside_constant
from engine.errors import SettingsError
from engine.infer.batch import fit_batch, slice_guide
from engine.infer.guide import GuideState
from engine.infer.settings import FitSettings
from engine.models.registry import get_model
from engine.models.spec import ModelSpec
from engine.readout.ranking import ranks_from_draws

__all__ = ["TrialSpec", "FitContext", "StabilityContext", "trial_seed", "subject_accuracy",
           "ability_of", "stability_batch", "bootstrap_batch", "shuffle_batch", "ShuffleContext",
           "kendall"]


@dataclass(frozen=True, order=True)
class TrialSpec:
    """One trial: ``group`` (shared shapes, e.g. a sample size), ``index`` within it, its seed."""

    group: int
    index: int
    seed: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.group, self.index)


def trial_fit_settings(fit_settings: FitSettings) -> FitSettings:
    """The settings of a trial command's full fit: mean-field, as its trials' batched refits
    are (``auto`` resolves to ``gaussian``), so the full fit and the trials share one scale.

    Raises
    ------
    SettingsError : ``ability_factor="quadrature"`` was asked for.
    """
    if fit_settings.ability_factor == "quadrature":
        raise SettingsError("trial commands refit by mean-field variational inference (their "
                            "trials are batched); use --ability-factor auto or gaussian")
    return fit_settings.replace(ability_factor="gaussian")


def trial_seed(base: int, group: int, index: int) -> int:
    """A seed for trial (group, index) that is independent of every other trial's."""
    return int(np.random.SeedSequence([base, group, index]).generate_state(1)[0])


@lru_cache(maxsize=16)
def _spec(model: str, options: tuple) -> ModelSpec:
    # One spec object per model, so the batched program compiles once per shape and process.
    return get_model(model, **dict(options))


@dataclass(frozen=True)
class FitContext:
    """The data and the full fit a family of trials refits from."""

    y: np.ndarray | StoreColumns  # int8 (subjects, items), -1 missing; or the store by reference
    model: str
    model_options: tuple  # sorted (name, value) pairs for get_model
    guide: GuideState  # the full fit's posterior (numpy), the warm start
    settings: FitSettings = field(default_factory=FitSettings)
    passes: int = 20

    @property
    def spec(self) -> ModelSpec:
        return _spec(self.model, self.model_options)


def ability_of(spec: ModelSpec, loc: dict) -> np.ndarray:
    """Posterior-mean ability (the scalar subject block named ``ability``) from a guide's
    locations, per subject (along the last axis when ``loc`` holds a batch of fits)."""
    p = spec.param("ability")
    if p.owner != "subject" or p.shape != ():
        raise ValueError("ranking needs a scalar per-subject 'ability' block")
    return np.asarray(p.constrain(np.asarray(loc["ability"])))


def subject_accuracy(y: np.ndarray) -> np.ndarray:
    """Mean observed response per subject along the last axis (NaN where none observed)."""
    observed = y >= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(observed, y, 0).sum(axis=-1) / observed.sum(axis=-1)


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b, ignoring subjects missing from either ranking."""
    return float(kendalltau(a, b, nan_policy="omit").statistic)


def _refit(ctx: FitContext, ys: np.ndarray, item_sets, seeds):
    """Warm-started batched refits of ``ctx.model`` on matrices ``ys`` with item sets given.

    Each matrix's constant items (every subject answered alike) are fitted as unobserved, as
    ``engine.fit`` fits them in the full fit: observed, the hundreds of such items of a small
    leaderboard pulled every replicate's abilities away from the full fit's (by about 2 on
    the 10-system demo, with no overlap of the intervals).
    """
    spec = ctx.spec
    inits = [slice_guide(spec, ctx.guide, items=it) for it in item_sets]
    init = jax.tree.map(lambda *a: np.stack(a), *inits)
    return fit_batch(spec, set_aside_constant(ys), init, seeds, ctx.passes, ctx.settings)


@dataclass(frozen=True)
class StabilityContext:
    """Stability trials: the full fit plus the full-data rankings to compare samples with."""

    fit: FitContext
    full_ability: np.ndarray
    full_accuracy: np.ndarray


def stability_batch(ctx: StabilityContext, trials: list[TrialSpec]) -> list[dict]:
    """Ranking-stability trials of one sample size (``group``): two disjoint item samples
    each, subjects ranked on each by IRT ability and by accuracy.

    Returns two rows per trial (``method`` irt and accuracy) with Kendall's tau between the
    two samples and from each sample to the full data.
    """
    y = ctx.fit.y
    size = trials[0].group
    if any(t.group != size for t in trials):
        raise ValueError("a stability batch holds trials of one size")
    samples = []
    for t in trials:
        perm = np.random.default_rng(t.seed).permutation(y.shape[1])
        samples += [np.sort(perm[:size]), np.sort(perm[size : 2 * size])]
    ys = np.stack([columns(y, s) for s in samples])  # from the store when y is by reference
    seeds = [t.seed + half for t in trials for half in (0, 1)]
    res = _refit(ctx.fit, ys, samples, seeds)
    spec = ctx.fit.spec
    abilities = ability_of(spec, res.guide.loc)  # (2 x trials, subjects)
    accuracy = subject_accuracy(ys)
    rows = []
    for n, t in enumerate(trials):
        a, b = 2 * n, 2 * n + 1
        scores = {"irt": (abilities[a], abilities[b], ctx.full_ability),
                  "accuracy": (accuracy[a], accuracy[b], ctx.full_accuracy)}
        for method, (sa, sb, full) in scores.items():
            ta, tb = kendall(sa, full), kendall(sb, full)
            rows.append({
                "size": size, "trial": t.index, "method": method, "seed": t.seed,
                "tau_between": kendall(sa, sb), "tau_full": 0.5 * (ta + tb),
                "tau_full_a": ta, "tau_full_b": tb,
                "converged": bool(res.converged[a] and res.converged[b]) if method == "irt" else True,
            })
    return rows


def bootstrap_batch(ctx: FitContext, trials: list[TrialSpec]) -> list[dict]:
    """Bootstrap replicates: items resampled with replacement, abilities and ranks refitted.

    Returns one row per (replicate, subject) with the replicate's ability and rank (1 = best).
    """
    y = ctx.y
    N = y.shape[1]
    picks = [np.random.default_rng(t.seed).integers(0, N, N) for t in trials]
    ys = np.stack([columns(y, p) for p in picks])
    res = _refit(ctx, ys, picks, [t.seed for t in trials])
    abilities = ability_of(ctx.spec, res.guide.loc)  # (trials, subjects)
    ranks = ranks_from_draws(abilities)
    rows = []
    for n, t in enumerate(trials):
        for s in range(y.shape[0]):
            rows.append({"replicate": t.index, "subject": s, "ability": float(abilities[n, s]),
                         "rank": int(ranks[n, s]), "converged": bool(res.converged[n])})
    return rows


@dataclass(frozen=True)
class ShuffleContext:
    """Parallel analysis: the raw matrix and how many leading eigenvalues to keep."""

    y: np.ndarray
    num_eigenvalues: int


def shuffle_batch(ctx: ShuffleContext, trials: list[TrialSpec]) -> list[dict]:
    """Column-permuted shuffles (never rows); one row per (shuffle, eigenvalue index)."""
    from engine.readout.dimensions import shuffle_eigenvalues

    eig = shuffle_eigenvalues(ctx.y, [t.seed for t in trials], k=ctx.num_eigenvalues)
    return [{"shuffle": t.index, "index": i + 1, "eigenvalue": float(v)}
            for t, row in zip(trials, eig) for i, v in enumerate(row)]
