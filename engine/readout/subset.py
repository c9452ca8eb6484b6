"""Tiny informative subsets (seed 004 section 3.3): K items that maximise test
information over a target ability range, and how well they preserve the ranking.

Selection is greedy on ``sum_g log(prior_precision + I_S(theta_g))`` over a grid of the
target range, where ``I_S`` is the subset's test information (the sum of its items'
Fisher information). The log gives diminishing returns, so once one region of the range
is measured well the next item goes where the standard error is still large; summing
raw information instead would just pick the top-K most informative items. The objective
is monotone submodular, so greedy is within ``1 - 1/e`` of the best subset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from engine.errors import SettingsError
from engine.readout.items import ItemBank

__all__ = ["select_informative", "SubsetEvaluation", "evaluate_subsets", "target_grid"]


def target_grid(abilities: np.ndarray, ability_range: tuple[float, float] | None = None,
                num_grid: int = 41) -> np.ndarray:
    """Abilities to measure well: ``num_grid`` evenly spaced points of ``(lo, hi)`` when a
    range is given, else ``num_grid`` quantiles of the run's subject abilities (so the
    grid is dense where subjects are, and ranks among them are what the subset keeps).
    """
    if ability_range is None:
        return np.quantile(np.asarray(abilities, np.float64), np.linspace(0.0, 1.0, num_grid))
    lo, hi = ability_range
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise SettingsError(f"ability range {lo},{hi}: need two finite abilities")
    if not lo <= hi:
        raise SettingsError(f"ability range {lo},{hi}: need LO <= HI")
    return np.linspace(lo, hi, num_grid)


def select_informative(bank: ItemBank, size: int, grid: np.ndarray, *, prior_precision: float = 1.0,
                       candidates: np.ndarray | None = None) -> np.ndarray:
    """Greedily choose ``size`` items maximising summed log test information on ``grid``.

    Parameters
    ----------
    bank : the run's item bank; grid : target abilities (see ``target_grid``).
    prior_precision : information already held about every ability (the N(0, 1) prior's 1).
    candidates : item indices allowed (all when None), e.g. items not flagged for review.

    Returns
    -------
    Item indices in the order chosen.
    """
    pool = np.arange(bank.num_items) if candidates is None else np.asarray(candidates)
    if not 1 <= size <= len(pool):
        raise SettingsError(f"subset size {size}: need 1 <= K <= {len(pool)} (the candidate items)")
    grid = np.asarray(grid, np.float64)
    info = bank.subset(pool).information(grid).astype(np.float64)  # (g, n)
    total = np.full(grid.shape[0], prior_precision, np.float64)
    taken = np.zeros(len(pool), bool)
    chosen = []
    for _ in range(size):
        gain = np.log1p(info / total[:, None]).sum(axis=0)
        gain[taken] = -np.inf
        j = int(np.argmax(gain))
        chosen.append(j)
        taken[j] = True
        total += info[:, j]
    return pool[np.asarray(chosen)]


@dataclass
class SubsetEvaluation:
    """Kendall tau of rankings from item subsets to the full ranking."""

    tau: dict[str, float]  # subset name -> tau ("informative", "top_discrimination")
    tau_random: np.ndarray  # one per random subset of the same size
    abilities: dict[str, np.ndarray] = field(repr=False)

    def summary(self) -> pd.DataFrame:
        r = self.tau_random
        rows = [{"subset": k, "kendall_tau": v} for k, v in self.tau.items()]
        if r.size:
            rows.append({"subset": f"random (mean of {r.size})", "kendall_tau": float(r.mean()),
                         "q05": float(np.quantile(r, 0.05)), "q95": float(np.quantile(r, 0.95))})
        return pd.DataFrame(rows)


def evaluate_subsets(run, y: np.ndarray, subsets: dict[str, np.ndarray], *, num_random: int = 20,
                     seed: int = 0, settings=None) -> SubsetEvaluation:
    """Rescore every subject on each subset (items frozen) and compare rankings.

    All subsets, including ``num_random`` uniformly random ones of the first subset's
    size, are scored in one frozen fit: each subset is a copy of the subjects that sees
    only its items, so a single fit gives every subset's abilities.
    """
    from engine.score import score_responses

    rng = np.random.default_rng(seed)
    S, N = y.shape
    size = len(next(iter(subsets.values())))
    named = dict(subsets)
    for r in range(num_random):
        named[f"random{r}"] = rng.choice(N, size=size, replace=False)
    union = np.unique(np.concatenate(list(named.values())))
    col = {int(j): c for c, j in enumerate(union)}
    stacked = np.full((S * len(named), len(union)), -1, np.int8)
    for r, idx in enumerate(named.values()):
        cols = [col[int(j)] for j in idx]
        stacked[r * S:(r + 1) * S, cols] = y[:, idx]
    res = score_responses(run, stacked, item_idx=union, settings=settings)
    theta = res.means()["ability"].reshape(len(named), S)
    full = run.subjects["ability_mean"].to_numpy()
    taus = {k: float(kendalltau(theta[r], full).statistic) for r, k in enumerate(named)}
    abilities = {k: theta[r] for r, k in enumerate(named)}
    random = np.array([taus.pop(f"random{r}") for r in range(num_random)])
    return SubsetEvaluation({k: v for k, v in taus.items()}, random, abilities)
