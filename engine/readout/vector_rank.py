"""Leaderboards from vector abilities, all from joint posterior draws (seed 000 section 11.5).

Five declared meanings of "better": per-skill boards, Pareto fronts (non-dominated
sorting), linear scalarisation with printed weights, lexicographic order, and posterior
probabilistic dominance with ties where no subject dominates with high posterior mass.
Draws are ``(T, S, D)``: T joint draws, S subjects, D skills; larger is better.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.errors import SettingsError
from engine.readout.ranking import (competition_ranks, pooled_pairs, pooled_statistics, rank_stats,
                                     tie_groups)

__all__ = ["non_dominated_sort", "dominance_matrix", "dominance_layers", "RankSpec", "parse_rank",
           "skill_board", "pareto_board", "weighted_board", "lexicographic_board", "dominance_board",
           "vector_leaderboard", "format_vector_board", "run_vector_board", "board_note"]


# ---- non-dominated sorting -----------------------------------------------------------

class _PrefixMax:
    """Fenwick tree over positions 0..n-1: raise a value, query the max over a prefix."""

    def __init__(self, n: int):
        self.tree = [-1] * (n + 1)

    def raise_to(self, pos: int, value: int) -> None:
        i = pos + 1
        while i < len(self.tree):
            if self.tree[i] < value:
                self.tree[i] = value
            i += i & -i

    def query(self, pos: int) -> int:
        i, best = pos + 1, -1
        while i > 0:
            if self.tree[i] > best:
                best = self.tree[i]
            i -= i & -i
        return best


class _Sorter:
    """Generalised Jensen non-dominated sorting (Buzdalov and Shalyto 2014), minimising.

    Points are distinct and sorted lexicographically, so "p precedes q" stands in for
    objective 0; ``rank[p]`` ends as the 0-based front of p. O(N log^(M-1) N) for M
    objectives: O(N log N) for two.
    """

    def __init__(self, points: np.ndarray):
        self.p = points
        self.rank = np.zeros(points.shape[0], np.int64)

    def _dominates_upto(self, a: int, b: int, k: int) -> bool:
        return a < b and bool(np.all(self.p[a, 1:k + 1] <= self.p[b, 1:k + 1]))

    def _sweep_a(self, s: np.ndarray) -> None:
        values = np.unique(self.p[s, 1])
        pos = np.searchsorted(values, self.p[s, 1])
        tree, rank = _PrefixMax(values.size), self.rank
        for p, j in zip(s.tolist(), pos.tolist()):
            best = tree.query(j)
            if best + 1 > rank[p]:
                rank[p] = best + 1
            tree.raise_to(j, int(rank[p]))

    def _sweep_b(self, low: np.ndarray, high: np.ndarray) -> None:
        values = np.unique(self.p[np.concatenate([low, high]), 1])
        tree, rank, i = _PrefixMax(values.size), self.rank, 0
        low_pos = np.searchsorted(values, self.p[low, 1]).tolist()
        low_list = low.tolist()
        for h, j in zip(high.tolist(), np.searchsorted(values, self.p[high, 1]).tolist()):
            while i < len(low_list) and low_list[i] < h:
                tree.raise_to(low_pos[i], int(rank[low_list[i]]))
                i += 1
            best = tree.query(j)
            if best + 1 > rank[h]:
                rank[h] = best + 1

    @staticmethod
    def _split(s: np.ndarray, values: np.ndarray, m):
        return s[values < m], s[values == m], s[values > m]

    def helper_a(self, s: np.ndarray, k: int) -> None:
        if s.size < 2:
            return
        if s.size == 2:
            a, b = s.tolist()
            if self._dominates_upto(a, b, k):
                self.rank[b] = max(self.rank[b], self.rank[a] + 1)
            return
        if k == 1:
            self._sweep_a(s)
            return
        values = self.p[s, k]
        if values.min() == values.max():
            self.helper_a(s, k - 1)
            return
        m = np.partition(values, values.size // 2)[values.size // 2]
        low, mid, high = self._split(s, values, m)
        self.helper_a(low, k)
        self.helper_b(low, mid, k - 1)
        self.helper_a(mid, k - 1)
        self.helper_b(np.sort(np.concatenate([low, mid])), high, k - 1)
        self.helper_a(high, k)

    def helper_b(self, low: np.ndarray, high: np.ndarray, k: int) -> None:
        """Raise ranks in ``high`` by dominators in ``low`` (final ranks), objectives 0..k;
        every point of ``low`` is <= every point of ``high`` in objectives above k."""
        if low.size == 0 or high.size == 0:
            return
        if low.size == 1 or high.size == 1:
            for h in high.tolist():
                for a in low.tolist():
                    if self._dominates_upto(a, h, k):
                        self.rank[h] = max(self.rank[h], self.rank[a] + 1)
            return
        if k == 1:
            self._sweep_b(low, high)
            return
        lv, hv = self.p[low, k], self.p[high, k]
        if lv.max() <= hv.min():
            self.helper_b(low, high, k - 1)
            return
        if lv.min() > hv.max():
            return
        both = np.concatenate([lv, hv])
        m = np.partition(both, both.size // 2)[both.size // 2]
        l1, m1, h1 = self._split(low, lv, m)
        l2, m2, h2 = self._split(high, hv, m)
        self.helper_b(l1, l2, k)
        self.helper_b(l1, m2, k - 1)
        self.helper_b(m1, m2, k - 1)
        self.helper_b(np.sort(np.concatenate([l1, m1])), h2, k - 1)
        self.helper_b(h1, h2, k)


def non_dominated_sort(points: np.ndarray) -> np.ndarray:
    """Pareto front number of each point, 1 = undominated, larger is better on every axis.

    ``s`` dominates ``s'`` when it is >= on every axis and > on at least one; identical
    points share a front. Fronts peel as in NSGA-II: front 2 is the undominated set once
    front 1 is removed, and so on. O(N log N) for two axes, O(N log^(D-1) N) for D.

    Parameters
    ----------
    points : ``(N, D)`` values.

    Returns
    -------
    ``(N,)`` int front numbers starting at 1.
    """
    x = -np.asarray(points, np.float64)  # minimise
    if x.ndim != 2:
        raise ValueError(f"points must be (N, D), got shape {x.shape}")
    if x.shape[0] == 0:
        return np.zeros(0, np.int64)
    unique, inverse = np.unique(x, axis=0, return_inverse=True)  # lexicographically sorted
    inverse = inverse.reshape(-1)
    if unique.shape[1] == 1:
        return inverse.astype(np.int64) + 1
    sorter = _Sorter(unique)
    sorter.helper_a(np.arange(unique.shape[0]), unique.shape[1] - 1)
    return sorter.rank[inverse] + 1


# ---- probabilistic dominance ----------------------------------------------------------

def dominance_matrix(draws: np.ndarray, chunk: int = 64) -> np.ndarray:
    """``P[s, s'] = Pr(theta_s Pareto-dominates theta_s')``: the share of joint draws in
    which s is >= s' on every skill and > on at least one. ``draws`` is ``(T, S, D)``."""
    draws = np.asarray(draws)
    T, S, _ = draws.shape
    out = np.empty((S, S), np.float64)
    for start in range(0, S, chunk):
        a = draws[:, start:start + chunk, None, :]
        b = draws[:, None, :, :]
        dom = np.all(a >= b, axis=-1) & np.any(a > b, axis=-1)
        out[start:start + chunk] = dom.mean(axis=0)
    return out


def dominance_layers(p_dominates: np.ndarray, threshold: float) -> np.ndarray:
    """Layers of the relation "s dominates s' with posterior mass >= threshold", 1 = top.

    Layer 1 holds the subjects nobody dominates with high mass; subjects within a layer
    are tied. Should the relation hold a cycle (possible for low thresholds), the
    remaining subjects form one tied layer.
    """
    if not 0.5 < threshold <= 1.0:
        raise SettingsError(f"dominance threshold must be in (0.5, 1], got {threshold}")
    strong = p_dominates >= threshold
    np.fill_diagonal(strong, False)
    S = strong.shape[0]
    layer = np.zeros(S, np.int64)
    left, current = np.ones(S, bool), 0
    while left.any():
        current += 1
        beaten = strong[left][:, left].any(axis=0)
        top = np.flatnonzero(left)[~beaten]
        if top.size == 0:
            top = np.flatnonzero(left)
        layer[top] = current
        left[top] = False
    return layer


# ---- rank specifications --------------------------------------------------------------

@dataclass(frozen=True)
class RankSpec:
    """How a vector leaderboard orders subjects.

    mode : ``skill``, ``pareto``, ``weights``, ``lexicographic`` or ``dominance``.
    skill : the skill of a ``skill`` board; weights : one per skill for ``weights``.
    threshold : posterior mass for dominance to count (``dominance``).
    """

    mode: str
    skill: str | None = None
    weights: tuple[float, ...] = ()
    threshold: float = 0.9

    def __post_init__(self):
        if self.mode not in ("skill", "pareto", "weights", "lexicographic", "dominance"):
            raise SettingsError(f"unknown ranking {self.mode!r}; use pareto, weights=W1,W2,..., "
                                "lexicographic, dominance or skill=NAME")
        if not 0.5 < self.threshold <= 1.0:
            raise SettingsError(f"dominance threshold must be in (0.5, 1], got {self.threshold}")


def parse_rank(text: str, threshold: float = 0.9) -> RankSpec:
    """``pareto``, ``lexicographic``, ``dominance``, ``skill=NAME`` or ``weights=0.5,0.3,0.2``."""
    head, _, rest = text.partition("=")
    if head == "skill" and rest:
        return RankSpec("skill", skill=rest, threshold=threshold)
    if head == "weights" and rest:
        try:
            weights = tuple(float(w) for w in rest.split(","))
        except ValueError:
            raise SettingsError(f"--rank {text}: weights must be numbers like weights=0.5,0.3,0.2") from None
        return RankSpec("weights", weights=weights, threshold=threshold)
    if rest:
        raise SettingsError(f"--rank {text}: only skill=NAME and weights=W1,W2,... take a value")
    return RankSpec(head, threshold=threshold)


# ---- boards ---------------------------------------------------------------------------

def _summary(values: np.ndarray, prefix: str, groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    return pooled_statistics(values, groups, {
        f"{prefix}_mean": lambda v: v.mean(axis=0),
        f"{prefix}_q05": lambda v: np.quantile(v, 0.05, axis=0),
        f"{prefix}_q95": lambda v: np.quantile(v, 0.95, axis=0)})


def _scalar_board(scores: np.ndarray, subjects, column: str, top_k: int,
                  groups: np.ndarray | None = None) -> pd.DataFrame:
    df = pd.DataFrame({"subject": list(subjects), **_summary(scores, column, groups)})
    df["tie_group"] = tie_groups(df[f"{column}_mean"].to_numpy(), df[f"{column}_q05"].to_numpy(),
                                 df[f"{column}_q95"].to_numpy())
    for k, v in rank_stats(scores, top_k, groups).items():
        df[k] = v
    df = df.sort_values(f"{column}_mean", ascending=False, kind="stable").reset_index(drop=True)
    return _with_ranks(df, [f"{column}_mean"])


def skill_board(draws, subjects, skills, skill: str, top_k: int = 3,
                groups: np.ndarray | None = None) -> pd.DataFrame:
    """One skill's leaderboard: posterior mean, 90% interval, tie group and rank statistics.
    ``groups`` (:func:`engine.readout.ranking.identical_subjects`): subjects of one posterior,
    drawn apart, whose numbers are read from the group's draws together (:func:`rank_stats`)."""
    if skill not in skills:
        raise SettingsError(f"unknown skill {skill!r}; this run's skills are {', '.join(skills)}")
    return _scalar_board(draws[:, :, list(skills).index(skill)], subjects, skill, top_k, groups)


def weighted_board(draws, subjects, skills, weights, top_k: int = 3,
                   groups: np.ndarray | None = None) -> pd.DataFrame:
    """Rank by ``w . theta`` per draw, weights normalised to sum 1 (kept in ``attrs``);
    ``groups`` as in :func:`skill_board`."""
    w = np.asarray(weights, np.float64)
    if w.shape != (len(skills),) or (w < 0).any() or w.sum() <= 0:
        raise SettingsError(f"need {len(skills)} non-negative weights (one per skill: {', '.join(skills)}), "
                            f"not all zero; got {list(weights)}")
    w = w / w.sum()
    df = _scalar_board(np.asarray(draws) @ w, subjects, "score", top_k, groups)
    df.attrs["weights"] = dict(zip(skills, w.tolist()))
    return df


def _pooled_means(draws: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """Each subject's posterior mean per skill ``(S, D)`` from draws ``(T, S, D)``, a group's
    (:func:`engine.readout.ranking.identical_subjects`) from all its members' draws."""
    return np.stack([pooled_statistics(draws[:, :, d], groups, {"m": lambda v: v.mean(axis=0)})["m"]
                     for d in range(draws.shape[2])], axis=1)


def pareto_board(draws, subjects, skills, groups: np.ndarray | None = None) -> pd.DataFrame:
    """Pareto fronts of the posterior means, and per subject the distribution of its front
    over draws (``front_mean``, ``p_front1``); ``groups`` as in :func:`skill_board`."""
    draws = np.asarray(draws)
    means = _pooled_means(draws, groups)
    per_draw = np.stack([non_dominated_sort(d) for d in draws])
    fronts = pooled_statistics(per_draw, groups, {"front_mean": lambda v: v.mean(axis=0),
                                                  "p_front1": lambda v: (v == 1).mean(axis=0)})
    df = pd.DataFrame({"subject": list(subjects), "front": non_dominated_sort(means), **fronts})
    for d, name in enumerate(skills):
        df[f"{name}_mean"] = means[:, d]
    df = df.sort_values(["front", "front_mean"], kind="stable").reset_index(drop=True)
    return _with_ranks(df, ["front", "front_mean"])


def lexicographic_board(draws, subjects, skills, groups: np.ndarray | None = None) -> pd.DataFrame:
    """Rank by the first skill; where 90% intervals tie, by the second, and so on;
    ``groups`` as in :func:`skill_board`."""
    draws = np.asarray(draws)
    cols, keys = {"subject": list(subjects)}, []
    for d, name in enumerate(skills):
        summ = _summary(draws[:, :, d], name, groups)
        cols.update(summ)
        group = tie_groups(summ[f"{name}_mean"], summ[f"{name}_q05"], summ[f"{name}_q95"])
        cols[f"{name}_group"] = group
        keys.append(group)
    df = pd.DataFrame(cols)
    order = np.lexsort([-df[f"{skills[0]}_mean"].to_numpy()] + keys[::-1])
    df = df.iloc[order].reset_index(drop=True)
    return _with_ranks(df, [f"{skills[0]}_mean", *(f"{name}_group" for name in skills)])


def dominance_board(draws, subjects, skills, threshold: float = 0.9,
                    groups: np.ndarray | None = None) -> pd.DataFrame:
    """Layers of posterior probabilistic dominance; one layer is one tie. ``groups`` as in
    :func:`skill_board`: a pair's dominance is read from all pairs of the two groups'
    members (:func:`engine.readout.ranking.pooled_pairs`)."""
    draws = np.asarray(draws)
    p = pooled_pairs(dominance_matrix(draws), groups)
    layer = dominance_layers(p, threshold)
    q = p.copy()
    np.fill_diagonal(q, 0.0)
    means = _pooled_means(draws, groups)
    df = pd.DataFrame({"subject": list(subjects), "layer": layer,
                       "dominated_by": (q >= threshold).sum(axis=0), "dominates": (q >= threshold).sum(axis=1),
                       "max_p_dominated": q.max(axis=0), "p_dominates_any": q.max(axis=1)})
    for d, name in enumerate(skills):
        df[f"{name}_mean"] = means[:, d]
    df = df.sort_values(["layer", "dominates"], ascending=[True, False], kind="stable").reset_index(drop=True)
    df = _with_ranks(df, ["layer"])  # a layer is a tie (the board's declaration)
    df.attrs["threshold"] = threshold
    return df


def _with_ranks(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``df`` (sorted best first by ``keys``) with a ``rank`` column first: rows equal in
    every key share the best rank among them (:func:`competition_ranks`)."""
    df.insert(0, "rank", competition_ranks(*(df[k].to_numpy() for k in keys)))
    return df


def vector_leaderboard(draws, subjects, skills, spec: RankSpec, top_k: int = 3,
                       groups: np.ndarray | None = None) -> pd.DataFrame:
    """The board ``spec`` declares, from ``(T, S, D)`` joint posterior draws.

    Draw subjects of one posterior (identical answer sheets) apart and give their
    ``groups`` (:func:`engine.readout.ranking.identical_subjects`): every board then reads
    such subjects from all their draws together, so they read alike, and they rank, take
    fronts and dominate among each other as any two subjects do."""
    draws = np.asarray(draws)
    if draws.ndim == 2:
        draws = draws[:, :, None]
    skills = list(skills)
    if draws.shape[2] != len(skills):
        raise SettingsError(f"{draws.shape[2]} skills in the draws but {len(skills)} names")
    if spec.mode == "skill":
        df = skill_board(draws, subjects, skills, spec.skill, top_k, groups)
    elif spec.mode == "weights":
        df = weighted_board(draws, subjects, skills, spec.weights, top_k, groups)
    elif spec.mode == "pareto":
        df = pareto_board(draws, subjects, skills, groups)
    elif spec.mode == "lexicographic":
        df = lexicographic_board(draws, subjects, skills, groups)
    else:
        df = dominance_board(draws, subjects, skills, spec.threshold, groups)
    df.attrs["rank"] = spec.mode
    return df


def run_vector_board(run, rank: str | None = None, *, threshold: float | None = None,
                     num_draws: int | None = None, seed: int | None = None) -> pd.DataFrame:
    """The board ``rank`` declares (default ``pareto``) of a run's abilities, read as the
    run's own board reads them: a sampler's run from its own draws (identical sheets drawn
    apart), a quadrature fit from each subject's exact posterior, else the Gaussian;
    subjects of one posterior (identical sheets) from their draws pooled. ``num_draws``
    (default 1,000) and ``seed`` (default 0) are ``leaderboard --draws/--seed``."""
    from engine.run import ranking_draws

    spec = parse_rank(rank or "pareto", **({} if threshold is None else {"threshold": threshold}))
    draws, groups = ranking_draws(run.spec, run.guide, run.quantile_functions,
                                  1000 if num_draws is None else num_draws,
                                  0 if seed is None else seed,
                                  sampled=run.sampler_draws("ability"), by_score=False)
    skills = list(run.spec.skills) or ["ability"]
    return vector_leaderboard(draws, run.subjects["subject"].tolist(), skills, spec, groups=groups)


BOARD_NOTES = {
    "skill": "one skill's leaderboard; tie: 90% intervals overlap the group leader's",
    "pareto": "front: Pareto front of posterior means (1 = nobody better on every skill); "
              "front_mean, p_front1: over joint posterior draws",
    "lexicographic": "ranked by the first skill; tied groups (overlapping 90% intervals) by the next",
}


def board_note(df: pd.DataFrame) -> str:
    """The board's declaration of "better" (weights and thresholds included)."""
    mode = df.attrs.get("rank", "")
    if mode == "weights":
        return "ranked by w . theta per draw; weights " + ", ".join(
            f"{k}={v:.3g}" for k, v in df.attrs.get("weights", {}).items())
    if mode == "dominance":
        return (f"layer: nobody in a layer is dominated by anyone left with posterior mass >= "
                f"{df.attrs.get('threshold', float('nan')):g}; subjects in one layer are tied")
    return BOARD_NOTES.get(mode, "")


def format_vector_board(df: pd.DataFrame, top_k: int | None = None) -> str:
    """Plain text, with the declaration of "better" first (weights and thresholds included)."""
    shown = df.head(top_k) if top_k else df
    body = shown.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    return f"{df.attrs.get('rank', '')} leaderboard: {board_note(df)}\n{body}"
