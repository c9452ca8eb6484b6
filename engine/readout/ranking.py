"""Rank statistics from joint posterior draws (seed 003 section 4.1)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine.memory import usable_cores
from engine.rows import identical_rows

__all__ = ["ranks_from_draws", "rank_stats", "pairwise_beats", "tie_groups", "competition_ranks",
           "identical_subjects", "pooled_statistics", "pooled_pairs"]


def identical_subjects(*columns) -> np.ndarray | None:
    """Group of each subject (``(S,)`` integers) where some subjects' posteriors are the same:
    every array of ``columns`` (rows: subjects; e.g. each subject block's posterior
    location and scale) equal byte for byte after a cast to float64. Identical answer sheets
    give such subjects (under the 1PL, also equal scores on the same items). None where
    every subject's posterior is its own."""
    S = np.shape(columns[0])[0]
    parts = [np.asarray(c, np.float64).reshape(S, -1) for c in columns]
    first, inverse, _ = identical_rows(np.concatenate(parts, axis=1))
    return None if first.size == S else inverse


def _group_runs(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(order, starts, sizes)`` of the labels ``groups`` ``(S,)``: the subjects sorted by
    label (stable), and where each label's run starts in that order and how long it is."""
    order = np.argsort(groups, kind="stable")
    ordered = groups[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    return order, starts, np.diff(np.r_[starts, groups.size])


def _group_members(groups: np.ndarray) -> list[np.ndarray]:
    """The members of each group of ``groups`` ``(S,)`` that has more than one."""
    order, starts, sizes = _group_runs(np.asarray(groups).reshape(-1))
    return [order[a:a + n] for a, n in zip(starts, sizes) if n > 1]


def pooled_statistics(values: np.ndarray, groups: np.ndarray | None,
                      statistics: dict) -> dict[str, np.ndarray]:
    """``{name: fn(values)}``, each ``fn`` taking draws ``(T, S)`` to one number a column
    ``(S,)``, with the columns of each group of ``groups`` read as one pooled column of all
    its members' draws ``(T k, 1)``: subjects whose posteriors are the same
    (:func:`identical_subjects`) are exchangeable, so each member's statistic is the
    group's, the same to the bit for all of them and with a k-th of the Monte Carlo
    variance. ``groups`` None: every column on its own."""
    out = {k: np.asarray(fn(values), np.float64) for k, fn in statistics.items()}
    for members in ([] if groups is None else _group_members(groups)):
        pooled = np.asarray(values)[:, members].reshape(-1, 1)
        for k, fn in statistics.items():
            out[k][members] = np.asarray(fn(pooled), np.float64)[0]
    return out


def pooled_pairs(p: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """A pairwise matrix ``p`` ``(S, S)`` (e.g. ``P[s, s'] = Pr(s dominates s')`` counted
    from draws in which every subject is drawn apart) with the pairs of each two groups of
    ``groups`` (:func:`identical_subjects`) read as one: every entry for a member of group g
    against a member of group h is the mean of ``p`` over all such pairs (two distinct
    members where g is h), the same to the bit for all of them. The diagonal is kept.
    ``groups`` None: ``p`` itself."""
    p = np.asarray(p)
    if groups is None:
        return p
    groups = np.asarray(groups).reshape(-1)
    if p.shape != (groups.size, groups.size):
        raise ValueError(f"pooled_pairs: a ({groups.size}, {groups.size}) matrix for "
                         f"{groups.size} groups' labels, got {p.shape}")
    order, starts, sizes = _group_runs(groups)
    sizes = sizes.astype(np.float64)
    label = (np.searchsorted(starts, np.arange(groups.size), side="right") - 1)[np.argsort(order)]
    inner = p.astype(np.float64)[np.ix_(order, order)]
    sums = np.add.reduceat(np.add.reduceat(inner, starts, axis=0), starts, axis=1)
    pairs = np.outer(sizes, sizes)
    own = np.diag(p).astype(np.float64)[order]  # a subject against itself is no pair
    sums[np.diag_indices_from(sums)] -= np.add.reduceat(own, starts)
    pairs[np.diag_indices_from(pairs)] -= sizes
    means = np.divide(sums, pairs, out=np.zeros_like(sums), where=pairs > 0)
    out = means[np.ix_(label, label)].astype(p.dtype)
    np.fill_diagonal(out, np.diag(p))
    return out


def ranks_from_draws(draws: np.ndarray) -> np.ndarray:
    """Rank of each subject in each draw, 1 = highest ability: ``(T, S)`` -> ``(T, S)``.

    Equal values share the best rank among them (1 + the number of strictly higher values),
    so subjects that tie in a draw (values on a grid, or shared draws) rank alike. (The
    order among equal values does not matter, so the sort need not be stable: NumPy's
    default sort took `ability`'s 1,000 x 1,525 in a third of a stable sort's time.)
    """
    draws = np.asarray(draws)
    order = np.argsort(-draws, axis=1)
    ordered = np.take_along_axis(draws, order, axis=1)
    position = np.broadcast_to(np.arange(draws.shape[1])[None, :], order.shape)
    starts = np.ones(order.shape, bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    # no ties (continuous draws): each value's rank is its position in the order
    best = position if starts.all() else np.maximum.accumulate(np.where(starts, position, 0),
                                                                axis=1)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, best + 1, axis=1)
    return ranks


def _quantiles(values: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """``np.quantile(values, q, axis=0)`` (its default, linear method, to the bit) for each
    ``q``, from one sort of ``values`` where ``np.quantile`` partitions once per ``q``."""
    ordered = np.sort(values, axis=0)
    n, out = ordered.shape[0], []
    for q in qs:
        at = q * (n - 1)
        below = int(np.floor(at))
        above, t = min(below + 1, n - 1), at - below
        a, b = ordered[below].astype(np.float64), ordered[above].astype(np.float64)
        diff = b - a  # NumPy's interpolation, from the nearer end
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out


def _weighted_ranks(distinct: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`ranks_from_draws` of the draws whose distinct columns are ``distinct`` ``(T, U)``,
    column ``u`` standing for ``counts[u]`` subjects: each distinct column's rank among all
    the subjects (1 + how many subjects are strictly higher in the draw), without the
    repeated columns."""
    order = np.argsort(-distinct, axis=1)
    ordered = np.take_along_axis(distinct, order, axis=1)
    weights = counts[order]
    above = np.cumsum(weights, axis=1) - weights  # subjects earlier in the draw's order
    starts = np.ones(order.shape, bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    best = np.maximum.accumulate(np.where(starts, above, 0), axis=1)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, best + 1, axis=1)
    return ranks


def rank_stats(draws: np.ndarray, top_k: int = 3,
               groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Expected rank, 90% rank interval, P(top-1) and P(top-k) per subject.

    ``draws`` ``(T, S)`` are joint draws of the subjects' abilities. ``groups``
    (:func:`identical_subjects`): subjects whose posteriors are the same, drawn
    independently (not sharing draws: twins rank among each other as any two subjects
    do, so P(top-1) sums to one over the board); each one's statistics are read from the
    ranks of all the group's members together (:func:`_pooled_rank_stats`), identical to
    the bit.

    Without ``groups``, columns that are identical are ties in every draw (best rank):
    ranked once and their statistics repeated, the same numbers, to the bit, as ranking
    every column. Draws with a NaN (no order) rank every column."""
    draws = np.asarray(draws)
    if groups is not None:
        ranks = ranks_from_draws(draws)
        together = _group_members(groups)
        alone = np.ones(draws.shape[1], bool)
        for members in together:
            alone[members] = False
        own = _rank_columns(ranks[:, alone], top_k)  # a subject on its own
        stats = {k: np.full(draws.shape[1], np.nan) for k in own}
        for k, v in own.items():
            stats[k][alone] = v
        for members in together:  # from all the group's ranks
            for k, v in _pooled_rank_stats(ranks[:, members], top_k).items():
                stats[k][members] = v
        return stats
    first, inverse, counts = identical_rows(draws.T) if draws.shape[0] else (None, None, None)
    if first is not None and first.size < draws.shape[1] and not np.isnan(draws).any():
        ranks = _weighted_ranks(draws[:, first], counts)
    else:
        ranks, inverse = ranks_from_draws(draws), None
    stats = _rank_columns(ranks, top_k)
    return stats if inverse is None else {k: v[inverse] for k, v in stats.items()}


def _rank_columns(ranks: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    """:func:`rank_stats`' columns of ranks ``(T, S)``, each column on its own."""
    q05, q95 = _quantiles(ranks, (0.05, 0.95))
    return {"rank_mean": ranks.mean(axis=0), "rank_q05": q05, "rank_q95": q95,
            "p_top1": (ranks == 1).mean(axis=0), f"p_top{top_k}": (ranks <= top_k).mean(axis=0)}


def _pooled_rank_stats(ranks: np.ndarray, top_k: int) -> dict[str, float]:
    """:func:`rank_stats`' numbers of all of ``ranks`` (a group's columns) pooled: NumPy's
    mean and linear quantiles of them, and the share of ranks at most 1 and ``top_k``, to
    the bit, from one sort of the group's own ``T k`` ranks (arrays as long as the board,
    one a group, took a third of a minute over 25,000 groups of 100,000 subjects)."""
    r = np.sort(ranks.reshape(-1))
    n = r.size
    q05, q95 = _quantiles(r[:, None], (0.05, 0.95))
    return {"rank_mean": float(r.mean()), "rank_q05": float(q05[0]), "rank_q95": float(q95[0]),
            "p_top1": np.searchsorted(r, 1, side="right") / n,
            f"p_top{top_k}": np.searchsorted(r, top_k, side="right") / n}


def pairwise_beats(draws: np.ndarray, chunk: int = 256,
                   groups: np.ndarray | None = None,
                   columns: np.ndarray | None = None) -> np.ndarray:
    """``P[s, s'] = Pr(ability_s > ability_s')`` over draws, ``(S, S)``; with ``columns``
    (positions of ``draws``' columns, ``(k,)``) only among those, ``(k, k)`` in their order,
    each value as in the whole table.

    ``groups`` (:func:`identical_subjects`): subjects whose posteriors are the same. Two
    members of one group are exchangeable, so each beats the other with probability one
    half; against anyone else a member's probability is its group's, counted from the
    group's first member's draws (a pair's probability needs only the two marginals), so a
    questionnaire of 1,000 subjects with 32 distinct sheets costs a 32 x 32 count. The
    diagonal is 0.

    Without ``groups``, subjects whose draws are identical are compared once (ties: no
    win). Each draw's values are replaced by their order in the draw (16-bit integers where
    there are fewer than 32,768 columns: the same comparisons, twice as many to a vector
    instruction), and the count runs one draw at a time into 8-bit counters (rows in
    blocks of ``chunk``), so no ``draws x chunk x S`` comparison is held and no float is
    summed: `ability`'s 1,199 distinct columns x 1,000 draws in 0.10 s where 32-bit floats
    compared four draws at a time took 0.20 s (two cores).
    """
    draws = np.asarray(draws)
    T, S = draws.shape
    columns = np.arange(S) if columns is None else np.asarray(columns, np.int64).reshape(-1)
    if T == 0 or columns.size == 0:  # no draws, no probabilities
        return np.full((columns.size,) * 2, np.nan, np.float32)
    if groups is None:  # subjects whose columns are identical are counted once
        draws = draws[:, columns]
        first, inverse, _ = identical_rows(draws.T)
        if first.size == columns.size:
            return _count_beats(_order_codes(draws), chunk)
        return _count_beats(_order_codes(draws[:, first]), chunk)[np.ix_(inverse, inverse)]
    groups = np.asarray(groups).reshape(-1)
    first, inverse, _ = identical_rows(groups[:, None])  # each group's first member, of all
    needed, inverse = np.unique(inverse[columns], return_inverse=True)
    p = _count_beats(_order_codes(draws[:, first[needed]]), chunk)[np.ix_(inverse, inverse)]
    p[inverse[:, None] == inverse[None, :]] = 0.5  # two members of one group
    p[columns[:, None] == columns[None, :]] = 0.0  # a subject against itself (asked twice too)
    return p


def _order_codes(draws: np.ndarray) -> np.ndarray:
    """Integers ordered as each draw's values (higher value, higher code; equal values,
    equal codes), or the values themselves where some are NaN (no order)."""
    if not np.isfinite(draws).all():
        return draws
    S = draws.shape[1]
    return (S - ranks_from_draws(draws)).astype(np.int16 if S < 1 << 15 else np.int32)


def _count_beats(codes: np.ndarray, chunk: int = 256) -> np.ndarray:
    """The direct count behind :func:`pairwise_beats`, over every pair of columns. Blocks of
    rows are counted on the machine's cores (NumPy's comparisons and sums release the GIL)."""
    codes = np.ascontiguousarray(codes)  # a strided view counts ten times slower
    T, S = codes.shape
    count = np.zeros((S, S), np.uint16 if T < 2 ** 16 else np.uint32)

    def rows(start: int) -> None:
        out = count[start : start + chunk]
        wins, tally = np.empty(out.shape, bool), np.zeros(out.shape, np.uint8)
        for t in range(T):
            row = codes[t]
            np.greater(row[start : start + chunk, None], row[None, :], out=wins)
            tally += wins.view(np.uint8)
            if t % 255 == 254:  # before an 8-bit counter can overflow
                out += tally
                tally[:] = 0
        out += tally

    workers = min(usable_cores(), 8) if S * S * T > 1 << 26 else 1
    chunk = min(chunk, -(-S // workers))  # every core a share
    starts = range(0, S, chunk)
    if workers > 1 and len(starts) > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(rows, starts))
    else:
        for start in starts:
            rows(start)
    return (count / T).astype(np.float32)


def competition_ranks(*sorted_keys) -> np.ndarray:
    """Ranks 1, 2, 2, 4, ... of rows sorted best first by ``sorted_keys`` (arrays of one
    length): rows equal in every key (identical answer sheets read the same posterior)
    share the best rank among them; NaN is never equal."""
    keys = [np.asarray(k) for k in sorted_keys]
    n = keys[0].size
    starts = np.ones(n, bool)
    if n > 1:
        starts[1:] = np.any([k[1:] != k[:-1] for k in keys], axis=0)
    return np.maximum.accumulate(np.where(starts, np.arange(1, n + 1), 0)).astype(np.int64)


def tie_groups(mean: np.ndarray, q05: np.ndarray, q95: np.ndarray) -> np.ndarray:
    """Tie group per subject (1 = top). Walking down by mean, a subject joins the current
    group while its 90% interval overlaps the group leader's; otherwise it starts a new one.
    """
    order = np.argsort(-mean, kind="stable")
    groups = np.empty(mean.shape[0], np.int64)
    group, leader_low = 0, None
    for s in order:
        if leader_low is None or q95[s] < leader_low:
            group += 1
            leader_low = q05[s]
        groups[s] = group
    return groups
