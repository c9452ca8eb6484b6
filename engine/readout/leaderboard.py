"""A readable leaderboard with tie groups where 90% intervals overlap."""

from __future__ import annotations

import pandas as pd

from engine.readout.ranking import tie_groups
from engine.terminal import escape_controls

__all__ = ["leaderboard", "format_leaderboard", "rank_key"]


def rank_key(subjects: pd.DataFrame) -> str:
    """``score`` when the table has expected scores (a model declaring ``ModelSpec.score``,
    :mod:`engine.readout.expected`), else ``ability``: the column set a board ranks by."""
    has = "score_mean" in subjects.columns and subjects["score_mean"].notna().all()
    return "score" if has else "ability"


def leaderboard(subjects: pd.DataFrame, top_k: int | None = None) -> pd.DataFrame:
    """Subjects sorted by posterior mean expected score where the table has one, else by
    posterior mean ability, with a ``tie_group`` column."""
    df = subjects.copy()
    key = rank_key(df)
    df["tie_group"] = tie_groups(df[f"{key}_mean"].to_numpy(), df[f"{key}_q05"].to_numpy(),
                                 df[f"{key}_q95"].to_numpy())
    df = df.sort_values(f"{key}_mean", ascending=False, kind="stable").reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df.head(top_k) if top_k else df


def format_leaderboard(board: pd.DataFrame) -> str:
    """Plain-text table: rank, tie group, subject, ability (or expected score) [90% interval],
    rank interval, P(top-1)."""
    key = rank_key(board)
    names = board["subject"].astype(str).map(escape_controls)
    name_w = max(7, min(40, names.str.len().max()))
    ptop = [c for c in board.columns if c.startswith("p_top") and c != "p_top1"]
    head = (f"{'rank':>4} {'tie':>3}  {'subject':<{name_w}} {key:>8} {'90% interval':>17} "
            f"{'rank 90%':>9} {'P(top1)':>7}" + (f" {ptop[0].replace('p_', 'P('):>7})" if ptop else "")
            + f" {'accuracy':>8} {'n':>7}")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(board.itertuples(index=False)):
        row = r._asdict()
        interval = f"[{row[f'{key}_q05']:+.2f}, {row[f'{key}_q95']:+.2f}]"
        ranks = f"{int(row['rank_q05'])}-{int(row['rank_q95'])}" if "rank_q05" in row else "-"
        line = (f"{row['rank']:>4} {row['tie_group']:>3}  {names.iloc[i][:name_w]:<{name_w}} "
                f"{row[f'{key}_mean']:>+8.3f} {interval:>17} {ranks:>9} "
                f"{row.get('p_top1', float('nan')):>7.3f}")
        if ptop:
            line += f" {row[ptop[0]]:>8.3f}"
        line += f" {row['accuracy']:>8.3f} {int(row['n_responses']):>7}"
        lines.append(line)
    lines.append(f"tie: subjects share a group while their 90% {key} intervals overlap the group leader's")
    if key == "score":
        lines.append("score: the model's expected score averaged over the items (posterior mean and 90% "
                     "interval); ranks follow it")
    return "\n".join(lines)
