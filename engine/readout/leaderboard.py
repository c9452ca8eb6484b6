"""A readable leaderboard with tie groups where 90% intervals overlap.

The board is computed on columns (NumPy arrays), so it takes a pandas DataFrame, a pyarrow
Table or a mapping of column name to array, and returns the same kind: the everyday
``irt-engine leaderboard`` reads the run's table with pyarrow into columns
(:func:`table_columns`) and never imports pandas (building a pyarrow Table does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.readout.ranking import competition_ranks, tie_groups
from engine.terminal import escape_controls

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["leaderboard", "format_leaderboard", "rank_key", "table_columns", "fit_notes",
           "fallback_notes"]


def _is_arrow(table: Any) -> bool:
    return hasattr(table, "schema") and hasattr(table, "column_names")


def table_columns(table: Any) -> dict[str, np.ndarray]:
    """Name -> NumPy array of a DataFrame, a pyarrow Table (strings as object arrays, read
    without pandas) or a mapping of arrays."""
    if isinstance(table, Mapping):
        return {k: np.asarray(v) for k, v in table.items()}
    if _is_arrow(table):
        import pyarrow as pa

        from engine.data.arrow import to_numbers

        out = {}
        for name in table.column_names:
            col = table.column(name)
            kind = col.type
            if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
                exact = np.bool_ if pa.types.is_boolean(kind) else np.int64
                out[name] = to_numbers(col, np.float64 if col.null_count else exact)
            elif pa.types.is_floating(kind):
                out[name] = to_numbers(col, np.float64)
            else:  # strings and anything else: Python values
                out[name] = np.array(col.to_pylist(), dtype=object)
        return out
    return {name: table[name].to_numpy() for name in table.columns}


def _like(table: Any, cols: dict[str, np.ndarray]):
    """``cols`` as the kind of table ``table`` is."""
    if isinstance(table, Mapping):
        return cols
    if _is_arrow(table):
        import pyarrow as pa

        # from_arrays: pa.table(dict) imports pandas to check for a DataFrame
        return pa.Table.from_arrays([pa.array(v.tolist() if v.dtype == object else v)
                                     for v in cols.values()], names=list(cols))
    import pandas as pd

    return pd.DataFrame(cols)


def _rank_key(cols: dict[str, np.ndarray]) -> str:
    has = "score_mean" in cols and not np.isnan(np.asarray(cols["score_mean"], np.float64)).any()
    return "score" if has else "ability"


def _floats(table: Any, name: str) -> np.ndarray:
    """One column as float64, NaN where missing."""
    if isinstance(table, Mapping):
        return np.asarray(table[name], np.float64)
    if _is_arrow(table):
        return np.asarray(table_columns(table.select([name]))[name], np.float64)
    return table[name].to_numpy(np.float64, na_value=np.nan)  # pandas, nullable dtypes too


def rank_key(subjects: pd.DataFrame) -> str:
    """``score`` when the table has expected scores (a model declaring ``ModelSpec.score``,
    :mod:`engine.readout.expected`), else ``ability``: the column set a board ranks by."""
    names = (list(subjects) if isinstance(subjects, Mapping) else
             subjects.column_names if _is_arrow(subjects) else subjects.columns)
    if "score_mean" not in names:
        return "ability"
    return _rank_key({"score_mean": _floats(subjects, "score_mean")})


def leaderboard(subjects: pd.DataFrame, top_k: int | None = None) -> pd.DataFrame:
    """Subjects sorted by posterior mean expected score where the table has one, else by
    posterior mean ability, with a ``rank`` column first (equal means share a rank:
    :func:`engine.readout.ranking.competition_ranks`) and a ``tie_group`` column.

    Takes and returns a pandas DataFrame, a pyarrow Table or a mapping of arrays. A
    DataFrame keeps its columns' dtypes and ``attrs`` (``tie_group`` set, then ``rank``
    inserted first: a table that already has ``rank`` is refused, as pandas refuses it). A
    Table or mapping is rebuilt from NumPy columns: ``rank`` first, ``tie_group`` last
    (replacing any already there), nullable integers as floats, other types as Python
    values."""
    frame = not isinstance(subjects, Mapping) and not _is_arrow(subjects)  # a DataFrame
    table = subjects if frame else table_columns(subjects)  # each column converted once
    key = rank_key(table)
    mean = _floats(table, f"{key}_mean")
    ties = tie_groups(mean, _floats(table, f"{key}_q05"), _floats(table, f"{key}_q95"))
    order = np.argsort(-mean, kind="stable")  # descending, ties in table order, NaN last
    rank = competition_ranks(mean[order])
    values, counts = np.unique(rank, return_counts=True)
    shared = [int(v) for v in values[counts > 1]]  # over the whole board, before any cut
    if frame:
        df = subjects.copy()
        df["tie_group"] = ties
        df = df.iloc[order].reset_index(drop=True)
        df.insert(0, "rank", rank)
        df.attrs["shared_ranks"] = shared
        return df.head(top_k) if top_k else df
    if top_k:
        order, rank = order[:top_k], rank[:top_k]
    board = {"rank": rank}
    board |= {k: v[order] for k, v in table.items() if k not in ("rank", "tie_group")}
    board["tie_group"] = ties[order]
    return _like(subjects, board)


# the subjects table's ``accuracy`` (the mean response) named for the responses' kind
MEAN_RESPONSE_LABEL = {"binary": "accuracy", "unit": "mean", "nonnegative": "mean err"}


def response_kind(info: dict | None) -> str | None:
    """The kind of the responses a run was fitted to (fit.json's ``data.kind``: 0/1 data
    fitted by a model of scores is still binary), or None where fit.json does not say."""
    return ((info or {}).get("data") or {}).get("kind")


def format_leaderboard(board: pd.DataFrame, kind: str | None = None) -> str:
    """Plain-text table: rank, tie group, subject, ability (or expected score) [90% interval],
    rank interval, P(top-1), and the mean response, headed by ``kind`` (accuracy for binary
    responses, the mean score or mean error otherwise; accuracy where unknown). Takes any
    kind of board :func:`leaderboard` returns."""
    cols = table_columns(board)
    key = _rank_key(cols)
    names = [escape_controls(str(v)) for v in cols["subject"]]
    name_w = max(7, min(40, max((len(n) for n in names), default=0)))
    ptop = [c for c in cols if c.startswith("p_top") and c != "p_top1"]
    head = (f"{'rank':>4} {'tie':>3}  {'subject':<{name_w}} {key:>8} {'90% interval':>17} "
            f"{'rank 90%':>9} {'P(top1)':>7}" + (f" {ptop[0].replace('p_', 'P('):>7})" if ptop else "")
            + f" {MEAN_RESPONSE_LABEL.get(kind, 'accuracy'):>8} {'n':>7}")
    lines = [head, "-" * len(head)]
    nan = np.full(len(names), np.nan)
    p_top1 = cols.get("p_top1", nan)
    rank = np.asarray(cols["rank"]).astype(np.int64)
    values, counts = np.unique(rank, return_counts=True)
    # ranks shared on the whole board (a DataFrame cut by top_k keeps them), else on these rows
    whole = getattr(board, "attrs", {}).get("shared_ranks")
    shared = np.isin(rank, whole if whole is not None else values[counts > 1])
    for i, name in enumerate(names):
        interval = f"[{cols[f'{key}_q05'][i]:+.2f}, {cols[f'{key}_q95'][i]:+.2f}]"
        # to the nearest rank: a group's pooled quantiles may fall between two
        ranks = (f"{cols['rank_q05'][i]:.0f}-{cols['rank_q95'][i]:.0f}" if "rank_q05" in cols
                 else "-")
        line = (f"{str(rank[i]) + ('=' if shared[i] else ''):>4} {int(cols['tie_group'][i]):>3}  "
                f"{name[:name_w]:<{name_w}} {cols[f'{key}_mean'][i]:>+8.3f} {interval:>17} "
                f"{ranks:>9} {p_top1[i]:>7.3f}")
        if ptop:
            line += f" {cols[ptop[0]][i]:>8.3f}"
        line += f" {cols['accuracy'][i]:>8.3f} {int(cols['n_responses'][i]):>7}"
        lines.append(line)
    if shared.any():
        lines.append(f"rank: subjects of equal posterior mean {key} share one, marked =")
    lines.append(f"tie: subjects share a group while their 90% {key} intervals overlap the group leader's")
    if key == "score":
        lines.append("score: the model's expected score averaged over the items (posterior mean and 90% "
                     "interval); ranks follow it")
    return "\n".join(lines)


def fallback_notes(table) -> list[str]:
    """One line per model of a ``compare`` table whose default fit's quadrature route gave
    up, so that its row scores the mean-field fit, or NUTS's on a small matrix (``fit_note``:
    why; NLU rte, 2PL: 41 s of 500 passes), and one per model whose scored fit did not
    converge (``converged``). A table written before a column has none of its lines."""
    notes = table["fit_note"] if "fit_note" in table else [""] * len(table)
    methods = table["fit_method"] if "fit_method" in table else ["mean-field"] * len(table)
    converged = table["converged"] if "converged" in table else [True] * len(table)
    out = [f"{model}: the quadrature fit (abilities integrated out) did not converge ({why}); "
           f"its row scores the {'NUTS' if method == 'nuts' else 'mean-field'} fit"
           for model, why, method in zip(table["model"], notes, methods) if why]
    # a row whose fit (the one it scores) did not converge either, said once per model
    out += [f"{model}: the fit its row scores did not converge ("
            + ("NUTS: R-hat over 1.01; `irt-engine fit --method nuts` on the training data shows it"
               if method == "nuts" else "it stopped at --max-passes")
            + "); read its scores with care"
            for model, method, ok in zip(table["model"], methods, converged) if not bool(ok)]
    return out


def fit_notes(info: Mapping, convergence: bool = True) -> list[str]:
    """What a reader of a run's leaderboard should know about how it was fitted, from its
    fit.json ``info``: a fit that did not converge, and a default (``auto``) fit whose
    quadrature route did not converge, so that the board holds the mean-field fit's
    intervals (on the 18-subject NLU rte leaderboard, 2PL, 0.46-0.77 of NUTS's sds;
    BENCHMARKS.md) or, on a small matrix, NUTS's draws. ``convergence``: include the first
    (the fit command says it already)."""
    notes = []
    factor = info.get("ability_factor") or {}
    if factor.get("quadrature_not_converged"):
        spent = factor.get("quadrature_wall_s")
        head = ("note: the quadrature fit (abilities integrated out) did not converge"
                + (f" in {spent:.1f} s" if isinstance(spent, (int, float)) else ""))
        if factor.get("method") == "nuts":  # a small matrix: sampled instead
            notes.append(head + "; NUTS sampled the posterior instead (fit.json "
                         "ability_factor.quadrature_not_converged says why; its R-hat, ESS "
                         "and divergences are fit.json's rhat_max, ess_bulk_min, divergences)")
        else:
            notes.append(head + "; these are the mean-field fit's intervals, which can be "
                         "narrower than the posterior's where subjects are few (fit.json "
                         "ability_factor.quadrature_not_converged says why); `irt-engine fit "
                         "--method nuts` samples the exact posterior")
    first = (info.get("coordinates") or {}).get("restarted_from")
    if first:  # NUTS sampled again with the items standardised (engine.infer.nuts)
        shrunk = first.get("shrinkage_over")  # the blocks that sent the restart
        if shrunk is None:  # recorded from 2026-12-05; before, the threshold was 0.5
            shrunk = {k: v for k, v in (info["coordinates"].get("shrinkage") or {}).items()
                      if isinstance(v, (int, float)) and v > 0.5}
        notes.append(f"note: NUTS's first run did not converge (R-hat {first['rhat_max']:.3f}, "
                     f"{first['wall_s']:.0f} s) and its item draws were mostly their pools' "
                     f"prior (" + ", ".join(f"{k} shrinkage {v:.2f}" for k, v in sorted(
                         shrunk.items())) + "), so it sampled again from the start with the "
                     "item blocks standardised; these are the second run's draws (fit.json "
                     "`coordinates`)")
    divergent = info.get("divergences") or 0
    if divergent and (info.get("method") == "nuts" or factor.get("method") == "nuts"):
        of = info.get("transitions")
        target = info.get("target_accept")
        notes.append(f"note: {divergent}" + (f" of {of}" if of else "") + " NUTS transitions "
                     "diverged" + (f" (target acceptance {target:g})" if target else "")
                     + ": where the posterior curves sharply the chains may have missed some "
                     "of it; refit with `fit --method nuts --target-accept 0.95` (smaller "
                     "steps) and compare (fit.json `divergences`)")
    if convergence and info.get("converged") is False:
        fallback = factor.get("method") == "nuts"  # a default fit: the option is not given
        notes.append("note: the fit did not converge (fit.json `converged`): refit with "
                     + ("`fit --method nuts` and " if fallback else "") + "more "
                     + ("--warmup/--samples (R-hat over "
                        f"{info['max_rhat']})" if info.get("method") == "nuts" and "max_rhat" in info
                        else "--max-passes") + " before reading the board")
    return notes
