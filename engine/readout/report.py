"""A static HTML report of a run: one page, plots inline as base64 PNG, no external assets.

Sections: the leaderboard with 90% intervals (plot, and a table sortable by any column),
the P(beats) matrix as a heat map (the top ``MAX_HEAT`` subjects), item characteristic
curves of informative items spread over difficulty, the difficulty x discrimination
scatter (for a model without a discrimination, abilities and difficulties on one scale)
with only the flagged items marked, the items ranked for review and those set aside, and,
where their directories are given and hold the files, the model comparison, ranking
stability and scree made by the other commands. Every plot is also written as a PNG
beside the page; ids are drawn as literal text (never read as math).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from engine.atomic import atomic_write  # noqa: E402
from engine.errors import SettingsError  # noqa: E402
from engine.readout.items import (FLAG_THRESHOLD, SET_ASIDE_NOTE, item_bank, item_flags,  # noqa: E402
                                  item_readouts_unavailable, review_order)
from engine.readout.leaderboard import (MEAN_RESPONSE_LABEL, fallback_notes, fit_notes,  # noqa: E402
                                        leaderboard, rank_key, response_kind)
from engine.readout.vector_rank import board_note, run_vector_board  # noqa: E402

__all__ = ["write_report", "report_plots"]

MAX_BARS = 60  # subjects drawn in the leaderboard plot (the table lists all)
MAX_HEAT = 30  # subjects in the P(beats) heat map
_LITERAL = {"text.parse_math": False, "text.usetex": False}  # ids are text, never math


def _literal(fn):
    """Run a plotting function with mathtext off, so an id such as ``$x$`` is drawn as is."""
    def wrapped(*args, **kwargs):
        with plt.rc_context(_LITERAL):
            return fn(*args, **kwargs)
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


def plot_label(name, width: int) -> str:
    """``name`` in at most ``width`` characters for a plot's tick: a longer one keeps its
    start and end about an ellipsis, since ids of one family often differ only at the end
    (checkpoints ``...-1M-1_best``, ``...-1M-2_best``), which cutting the end would hide."""
    text = str(name)
    if len(text) <= width:
        return text
    tail = (width - 1) // 2
    return f"{text[:width - 1 - tail]}\u2026{text[len(text) - tail:]}"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


_KEY_LABEL = {"ability": "ability", "score": "expected score"}  # what a board ranks by


def _key_label(board: pd.DataFrame) -> str:
    """What ``board`` ranks by, in words: ability, or a model's expected score."""
    return _KEY_LABEL[rank_key(board)]


@_literal
def _leaderboard_plot(board: pd.DataFrame) -> bytes:
    key = rank_key(board)  # ability, or the expected score of a model ranked by it
    b = board.head(MAX_BARS).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(b) + 1.2))
    y = np.arange(len(b))
    mean = b[f"{key}_mean"]
    ax.errorbar(mean, y, xerr=[mean - b[f"{key}_q05"], b[f"{key}_q95"] - mean],
                fmt="o", ms=3, lw=1, capsize=2)
    ax.set_yticks(y, [plot_label(s, 32) for s in b["subject"]], fontsize=7)
    ax.set_xlabel(f"{_key_label(board)} (posterior mean, 90% interval)")
    shown = (f"first {len(b)} of {len(board)}" if _cut_in_tie(board, len(b))
             else f"top {len(b)} of {len(board)}")  # a cut among equal ranks: not "the best"
    ax.set_title(f"leaderboard ({shown})")
    return _png(fig)


def _ranks(board: pd.DataFrame) -> np.ndarray:
    """The board's ranks (equal abilities share one); a table without them, its order."""
    return board["rank"].to_numpy() if "rank" in board else np.arange(1, len(board) + 1)


def _cut_in_tie(board: pd.DataFrame, k: int) -> bool:
    """Whether the board's first ``k`` rows end among subjects of one rank."""
    ranks = _ranks(board)
    return 0 < k < len(ranks) and ranks[k] == ranks[k - 1]


def _cut_note(board: pd.DataFrame, k: int, what: str) -> str:
    """What drawing the first ``k`` rows of ``board`` shows; where the cut falls among
    subjects of one rank (equal abilities), it says so: which of them are drawn is then
    only the table's order."""
    ranks = _ranks(board)
    text = f"the {what} draws the first {k} of {len(board)} subjects"
    if _cut_in_tie(board, k):
        tied = int((ranks == ranks[k - 1]).sum())
        text += (f"; the cut falls among {tied} subjects of equal {_key_label(board)} (rank "
                 f"{ranks[k - 1]}), of whom the first {int((ranks[:k] == ranks[k - 1]).sum())} in "
                 f"table order are drawn")
    return text + "."


@_literal
def _heatmap(p_beats: np.ndarray, board: pd.DataFrame) -> bytes:
    """P(beats) among the board's first :data:`MAX_HEAT` subjects (``p_beats``, in board
    order)."""
    top = board["subject"].head(MAX_HEAT)
    n = len(top)
    m = np.array(p_beats, np.float64)
    np.fill_diagonal(m, np.nan)  # a subject against itself: left blank
    size = 3.0 + 0.22 * n
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    im = ax.imshow(m, vmin=0, vmax=1, cmap="RdBu_r")
    labels = [plot_label(s, 24) for s in top]
    ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    if n <= 15:  # few enough to print each probability
        for i in range(n):
            for j in range(n):
                if i != j:
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(m[i, j] - 0.5) > 0.35 else "black")
    shown = (f"all {n}" if len(board) <= n else
             f"first {n} of {len(board)}" if _cut_in_tie(board, n)
             else f"top {n} of {len(board)}")
    ax.set_title(f"P(row beats column), leaderboard order ({shown} subjects)")
    fig.colorbar(im, ax=ax, shrink=0.8)
    return _png(fig)


def _fit_status(info: dict) -> str:
    """How the fit ended, in its own terms: a sampler's R-hat and draws, else the passes."""
    state = "converged" if info.get("converged") else "NOT converged"
    rhat = info.get("rhat_max")
    if info.get("method") == "nuts" and isinstance(rhat, (int, float)):
        said = (f"largest R-hat {rhat:.3f}, bound {info.get('max_rhat', 1.01)}"
                if math.isfinite(rhat) else "R-hat undefined: one chain")
        return (f"NUTS {state} ({said}; {info.get('num_chains')} chains x "
                f"{info.get('num_samples')} draws)")
    return f"{state} after {info.get('num_passes')} passes"


def log_size_axis(ax, sizes) -> None:
    """A log x axis whose ticks are ``sizes`` themselves, as plain numbers (with mathtext
    off, the log scale's own labels print as "$\\mathdefault{10^{2}}$", and 3 x 10^1 where
    a size is 30)."""
    import matplotlib.ticker

    sizes = np.unique(np.asarray(sizes, dtype=float))
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sizes))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{v:g}" for v in sizes]))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _informative(run, flags: pd.DataFrame | None) -> np.ndarray:
    """Items with information: not set aside by the fit (nor, given responses, constant)."""
    keep = np.ones(len(run.items), bool)
    if "constant_response" in run.items:
        keep &= ~run.items["constant_response"].to_numpy(bool)
    if flags is not None:
        keep &= ~flags["set_aside"].to_numpy(bool)
    return keep


def spread_items(difficulty: np.ndarray, informative: np.ndarray, num: int) -> np.ndarray:
    """``num`` informative items at difficulties evenly spaced between the informative items'
    5% and 95% quantiles, each the nearest not yet taken, in order of difficulty."""
    idx = np.flatnonzero(informative)
    if len(idx) <= num:
        return idx[np.argsort(difficulty[idx], kind="stable")]
    d = difficulty[idx]
    chosen: list[int] = []
    lo, hi = np.quantile(d, [0.05, 0.95])
    for target in np.linspace(lo, hi, num):
        for k in np.argsort(np.abs(d - target), kind="stable"):
            if idx[k] not in chosen:
                chosen.append(int(idx[k]))
                break
    return np.asarray(sorted(chosen, key=lambda j: difficulty[j]))


@_literal
def _icc_plot(run, chosen: np.ndarray) -> bytes:
    bank = item_bank(run.spec, run.guide)
    ability = run.subjects["ability_mean"].to_numpy()
    diff = run.items["difficulty_mean"].to_numpy()[chosen]
    lo = min(np.min(ability), np.min(diff, initial=0.0)) - 1.0
    hi = max(np.max(ability), np.max(diff, initial=0.0)) + 1.0
    grid = np.linspace(lo, hi, 201)
    p = bank.subset(chosen).prob(grid)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k, j in enumerate(chosen):
        ax.plot(grid, p[:, k], label=f"{plot_label(run.items['item'].iloc[j], 30)} (difficulty {diff[k]:+.2f})")
    ax.plot(ability, np.zeros_like(ability), "|", color="k", ms=10, label="subjects' abilities")
    ax.set_xlabel("ability")
    ax.set_ylabel("P(correct)")
    ax.set_ylim(-0.03, 1)
    ax.legend(fontsize=7)
    ax.set_title("item characteristic curves (informative items across the difficulty range)")
    return _png(fig)


@_literal
def _scatter(run, flags: pd.DataFrame | None) -> bytes:
    """Difficulty x discrimination of the informative items, flagged ones marked; for a
    model without a discrimination, abilities and difficulties on one scale (a Wright map)."""
    items = run.items
    keep = _informative(run, flags)
    x = items["difficulty_mean"].to_numpy()
    flagged = np.zeros(len(items), bool) if flags is None else flags["flagged"].to_numpy(bool)
    flag_label = f"flagged (review score > {FLAG_THRESHOLD:.2f}): {int(flagged.sum())}"
    aside = f"; {int((~keep).sum())} set-aside items not drawn" if (~keep).any() else ""
    if "discrimination_mean" in items:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        yv = items["discrimination_mean"].to_numpy()
        ax.scatter(x[keep & ~flagged], yv[keep & ~flagged], s=6, alpha=0.5, label="items")
        if flagged.any():
            ax.scatter(x[flagged], yv[flagged], s=20, c="red", label=flag_label)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("difficulty")
        ax.set_ylabel("discrimination")
        ax.legend(fontsize=7)
    else:
        fig, (top, ax) = plt.subplots(2, 1, figsize=(6.5, 4.8), sharex=True, height_ratios=(1, 2))
        ability = run.subjects["ability_mean"].to_numpy()
        bins = np.histogram_bin_edges(np.concatenate([x[keep], ability]), bins=40)
        top.hist(ability, bins=bins, color="tab:green")
        top.set_ylabel("subjects")
        ax.hist(x[keep], bins=bins, color="tab:blue", alpha=0.8, label="items")
        if flagged.any():  # a red tick under the axis per flagged item, never hidden by a bar
            top_count = ax.get_ylim()[1]
            ax.plot(x[flagged], np.full(int(flagged.sum()), -0.05 * top_count), "|", color="red",
                    ms=12, mew=1.5, label=flag_label)
            ax.set_ylim(-0.1 * top_count, top_count)
            ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("ability / difficulty (same scale: P(correct) = 1/2 where they meet)")
        ax.set_ylabel("items")
        ax.legend(fontsize=7)
        top.set_title("abilities and difficulties (the model has no discrimination)" + aside, fontsize=9)
        return _png(fig)
    ax.set_title("items" + (" (no responses: flags not computed)" if flags is None else "") + aside, fontsize=9)
    return _png(fig)


_TAU_LABELS = {"tau_between_mean": "tau between two samples' rankings (mean)",
               "tau_full_mean": "tau against the full data's ranking (mean)"}


@_literal
def _stability_plot(directory: Path) -> tuple[bytes | None, str]:
    """Kendall tau against sample size from ``summary.parquet`` (else ``stability.parquet``)."""
    for name in ("summary.parquet", "stability.parquet"):
        f = directory / name
        if f.is_file():
            df = pd.read_parquet(f)
            break
    else:
        return None, f"no summary.parquet or stability.parquet in {directory}"
    xcol = next((c for c in ("sample_size", "size", "num_items", "n") if c in df), None)
    ycols = [c for c in df.columns if "tau" in c and pd.api.types.is_numeric_dtype(df[c])]
    ycols = [c for c in ycols if c.endswith("_mean")] or ycols[:1]  # e.g. tau_between_mean, tau_full_mean
    if xcol is None or not ycols:
        return None, f"{f.name}: columns {list(df.columns)[:8]} hold no sample size and tau"
    group = next((c for c in ("method", "ranking", "strategy") if c in df), None)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, part in (df.groupby(group) if group else [("", df)]):
        part = part.groupby(xcol)[ycols].mean().reset_index()
        for c in ycols:
            ax.plot(part[xcol], part[c], marker="o", label=f"{key}: {_TAU_LABELS.get(c, c)}"
                    if key != "" else _TAU_LABELS.get(c, c))
    log_size_axis(ax, df[xcol])
    ax.set_xlabel("items sampled per trial")
    ax.set_ylabel("Kendall tau")
    ax.legend(fontsize=7)
    ax.set_title("ranking stability")
    return _png(fig), f"from {f}"


_SCREE_LABELS = {"observed": "observed (correlation eigenvalues)",
                 "envelope_mean": "shuffled data, mean (parallel analysis)",
                 "envelope_q95": "shuffled data, 95% (parallel analysis)",
                 "residual": "residuals after a one-skill fit",
                 "residual_null_mean": "residuals of simulated one-skill data, mean",
                 "residual_null_q95": "residuals of simulated one-skill data, 95%"}
# each curve beside the reference it is read against: one colour, the reference dashed
_SCREE_STYLES = {"observed": {"color": "C0"}, "envelope_mean": {"ls": ":", "color": "C0"},
                 "envelope_q95": {"ls": "--", "color": "C0"}, "residual": {"color": "C1"},
                 "residual_null_mean": {"ls": ":", "color": "C1"},
                 "residual_null_q95": {"ls": "--", "color": "C1"}}


@_literal
def _scree_plot(directory: Path) -> tuple[bytes | None, str]:
    """Eigenvalues (and any reference columns) from ``eigenvalues.parquet``; ``summary.json`` noted."""
    f = directory / "eigenvalues.parquet"
    note = ""
    if (directory / "summary.json").is_file():
        try:
            summary = json.loads((directory / "summary.json").read_text())
            note = "; ".join(f"{k}: {v}" for k, v in summary.items() if not isinstance(v, (list, dict)))
            steps = (summary.get("details") or {}).get("residual_steps") or []
            if steps:  # what the count rests on: the sequential test, not the curves drawn
                note += (". The residual count reads the sequential residual test, not the "
                         "curves above: " + "; ".join(
                             f"after {st['skills']} skill(s), statistic {st['statistic']:.1f} "
                             f"against simulated data's 95% {st['null_q95']:.1f} "
                             f"({'a further skill' if st['above'] else 'none further'})"
                             for st in steps))
        except json.JSONDecodeError as err:
            note = f"summary.json unreadable ({err})"
    if not f.is_file():
        return None, f"no eigenvalues.parquet in {directory}" + (f"; {note}" if note else "")
    df = pd.read_parquet(f)
    num = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])
           and c not in ("component", "index", "k", "rank")]
    if not num:
        return None, f"{f.name}: no numeric eigenvalue columns"
    xcol = next((c for c in ("component", "index", "k") if c in df), None)
    xs = df[xcol] if xcol else np.arange(1, len(df) + 1)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for c in num:
        style = _SCREE_STYLES.get(c, {})
        ax.plot(xs, df[c], marker="o", ms=3, label=_SCREE_LABELS.get(c, c), **style)
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue")
    ax.legend(fontsize=7)
    ax.set_title("scree")
    return _png(fig), note


def report_plots(run, y: np.ndarray | None = None, *, items: list[str] | None = None,
                 stability: str | Path | None = None, dimensions: str | Path | None = None,
                 num_curves: int = 6, board: pd.DataFrame | None = None,
                 ) -> tuple[dict[str, bytes], dict[str, str], pd.DataFrame | None]:
    """Make the report's PNGs: ``({name: png}, {name: note}, item flags or None)``.

    ``items`` names the items whose curves are drawn; by default ``num_curves`` informative
    items spread over the difficulty range (never set-aside ones). ``board``: the run's
    board (:func:`run_board`) where the caller has it. A run the item read-outs do not
    apply to (several skills, continuous responses) gets notes in place of item plots.
    """
    board = run_board(run) if board is None else board
    pngs, notes = {}, {}
    if "ability_mean" in board:
        pngs["leaderboard"] = _leaderboard_plot(board)
    else:
        notes["leaderboard"] = (f"a board of {len(run.spec.skills) or 1} skills ranks by "
                                f"{board.attrs.get('rank', '')}: the table below; each skill's "
                                f"abilities are in subjects.parquet")
    top = board["subject"].head(MAX_HEAT).astype(str).tolist() if "subject" in board else []
    p_beats = run.pairwise(top) if top else None
    if p_beats is not None:
        pngs["p_beats"] = _heatmap(p_beats, board)
    else:
        notes["p_beats"] = ("the run has no pairwise probabilities (several skills without a "
                            "score: nothing orders the subjects)")
    unavailable = item_readouts_unavailable(run.spec)
    if unavailable is not None:  # e.g. a multi-skill or a continuous-response model
        if items:
            raise SettingsError(f"--items: item curves are not drawn for run {run.path}: "
                                f"{unavailable}")
        notes["item_curves"] = notes["items_scatter"] = f"not drawn: {unavailable}"
        return _analysis_plots(pngs, notes, stability, dimensions), notes, None
    flags = item_flags(run.spec, run.guide, y) if y is not None else None
    ids = run.items["item"].astype(str).tolist()
    if items:
        missing = [i for i in items if i not in ids]
        if missing:
            raise SettingsError(f"--items {missing}: not items of run {run.path}; e.g. {', '.join(ids[:3])}")
        chosen = np.asarray([ids.index(i) for i in items])
    else:
        chosen = spread_items(run.items["difficulty_mean"].to_numpy(), _informative(run, flags), num_curves)
    pngs["item_curves"] = _icc_plot(run, chosen)
    pngs["items_scatter"] = _scatter(run, flags)
    return _analysis_plots(pngs, notes, stability, dimensions), notes, flags


def run_board(run) -> pd.DataFrame:
    """The board ``irt-engine leaderboard`` prints by default: one ability's (or expected
    score's) ranking, or for several skills the Pareto board."""
    if run.spec.param("ability").shape == ():
        return leaderboard(run.subjects)
    return run_vector_board(run)


def _analysis_plots(pngs: dict, notes: dict, stability, dimensions) -> dict[str, bytes]:
    """The stability and scree plots of the folders asked for, into ``pngs``/``notes``."""
    for name, option, directory, fn in (("stability", "stability", stability, _stability_plot),
                                        ("scree", "dimensions", dimensions, _scree_plot)):
        if directory is None:
            notes[name] = "not requested"
            continue
        directory = Path(directory)
        png, note = fn(directory) if directory.is_dir() else (None, f"{directory} does not exist")
        if png is None:  # asked for and not there: an error, as --compare's, not a page note
            raise SettingsError(f"--{option} {directory}: {note}; pass the --out of "
                                f"irt-engine {option}")
        pngs[name] = png
        notes[name] = note
    return pngs


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;font-size:.85em}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}
td.s,th.s{text-align:left}img{max-width:100%}.note{color:#666;font-size:.9em}h2{margin-top:1.6em}
#leaderboard th{cursor:pointer;user-select:none;background:#f4f4f4}
#leaderboard th[aria-sort=ascending]::after{content:" \\25B2"}
#leaderboard th[aria-sort=descending]::after{content:" \\25BC"}
.scroll{max-height:32em;overflow:auto}.wide{overflow-x:auto}"""

# Sort the leaderboard by a header click (numbers by data-value); no external assets.
_SORT_JS = """document.querySelectorAll('#leaderboard th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = document.querySelector('#leaderboard tbody');
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    document.querySelectorAll('#leaderboard th').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.value, y = b.cells[col].dataset.value;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});"""


def _board_explained(board: pd.DataFrame) -> str:
    if "ability_mean" in board:
        what = _key_label(board)
        return (f"rank: subjects of equal {what} share one. tie: subjects share a group while "
                f"their 90% {what} intervals overlap the group leader's.")
    return f"{board.attrs.get('rank', '')} board: {board_note(board)}."


def _board_table(board: pd.DataFrame, kind: str | None = None) -> str:
    """The sortable table: ranked by the board's key (ability or expected score), with
    the mean response headed by the responses' ``kind`` (:data:`MEAN_RESPONSE_LABEL`)."""
    key = rank_key(board)
    cols = [("rank", "rank", "{}"), ("tie_group", "tie", "{}"), ("subject", "subject", "{}"),
            (f"{key}_mean", _key_label(board), "{:+.3f}"), (f"{key}_q05", "q05", "{:+.3f}"),
            (f"{key}_q95", "q95", "{:+.3f}"), ("rank_q05", "rank q05", "{:.0f}"),
            ("rank_q95", "rank q95", "{:.0f}"), ("p_top1", "P(top1)", "{:.3f}"),
            ("accuracy", MEAN_RESPONSE_LABEL.get(kind, "accuracy"), "{:.3f}"),
            ("n_responses", "n", "{}")]
    if "ability_mean" not in board:  # a board of several skills: its own columns
        cols = [(c, c, "{}" if pd.api.types.is_integer_dtype(board[c]) or c == "subject"
                 else "{:.3f}") for c in board.columns]
    cols = [c for c in cols if c[0] in board]
    head = "".join(f'<th class="{"s" if k == "subject" else ""}" title="sort by {html.escape(t)}">'
                   f'{html.escape(t)}</th>' for k, t, _ in cols)
    rows = []
    for r in board.to_dict("records"):
        cells = "".join(f'<td class="{"s" if k == "subject" else ""}" data-value="{html.escape(str(r[k]))}">'
                        f'{html.escape(f.format(r[k]))}</td>' for k, _, f in cols)
        rows.append(f'<tr class="leaderboard-row" data-subject="{html.escape(str(r["subject"]))}">{cells}</tr>')
    return (f'<div class="scroll"><table id="leaderboard"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _flag_section(run, flags: pd.DataFrame, top: int = 15) -> str:
    """The items ranked for review (informative only) and the short list of set-aside ones."""
    order = review_order(flags)
    informative, flagged = len(order), int(flags["flagged"].sum())
    df = pd.concat([run.items[["item"]].reset_index(drop=True), flags], axis=1).iloc[order[:top]]
    keep = ["item", "review_score", "flagged", "reversal_z"] + \
        [c for c in ("p_negative_discrimination", "p_low_feasibility") if c in df] + \
        ["mean_response", "expected_mean", "residual_corr", "n"]
    out = (f'<p id="review-summary">{flagged} of {informative} informative items flagged (review score '
           f'&gt; {FLAG_THRESHOLD:.2f}: an item that works, whatever its difficulty, passes that at '
           f'most {1 - FLAG_THRESHOLD:.0%} of the time). The {min(top, informative)} with the '
           f'highest scores:</p>' +
           df[keep].to_html(index=False, float_format=lambda v: f"{v:.3f}", classes="flags", border=0))
    aside = run.items["item"].astype(str).to_numpy()[flags["set_aside"].to_numpy(bool)]
    if len(aside):
        shown = ", ".join(html.escape(i) for i in aside[:20]) + (", ..." if len(aside) > 20 else "")
        out += (f'<h3>Set aside</h3><p id="set-aside">{len(aside)} items: {SET_ASIDE_NOTE}. The fit '
                f'treats them as unobserved (prior only), so they carry no evidence and are not '
                f'ranked: {shown}</p>')
    return out


def _compare_section(directory: Path | None) -> str:
    """The table ``irt-engine compare`` wrote, or a note."""
    if directory is None:
        return '<p class="note">not requested (irt-engine compare ... --out DIR; report --compare DIR)</p>'
    f = Path(directory) / "compare.parquet"
    if not f.is_file():
        return f'<p class="note">no compare.parquet in {html.escape(str(directory))}</p>'
    table = pd.read_parquet(f).dropna(axis=1, how="all")
    notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in fallback_notes(table))
    table = table.drop(columns=[c for c in ("fit_note",) if c in table])
    return (f'<p class="note">from {html.escape(str(f))}; held-out cells, best held-out '
            f'log-likelihood first</p>' +
            '<div class="wide">' + table.to_html(index=False, float_format=lambda v: f"{v:.4g}",
                                                 classes="compare", border=0) + '</div>' + notes)


def check_report_paths(out: str | Path, compare=None, stability=None, dimensions=None) -> None:
    """Refuse a report's paths that cannot work (``--out`` not an .html file, a missing
    ``--compare``, ``--stability`` or ``--dimensions`` folder) before anything is read."""
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise SettingsError(f"--out {out}: the report is one .html page (its PNGs are written "
                            f"beside it); end the path in .html, e.g. --out {out.with_suffix('.html')}")
    if compare is not None and not Path(compare).is_dir():
        raise SettingsError(f"--compare {compare}: not a directory; pass the --out of irt-engine compare")
    if compare is not None and not (Path(compare) / "compare.parquet").is_file():
        raise SettingsError(f"--compare {compare}: no compare.parquet in it; pass the --out of "
                            f"irt-engine compare")
    for option, folder in (("stability", stability), ("dimensions", dimensions)):
        if folder is not None and not Path(folder).is_dir():  # before any plot is drawn
            raise SettingsError(f"--{option} {folder}: {folder} does not exist; pass the --out "
                                f"of irt-engine {option}")


def write_report(run, out: str | Path, y: np.ndarray | None = None, *, compare: str | Path | None = None,
                 **plot_options) -> dict[str, Path]:
    """Write ``out`` (one self-contained HTML page) and the PNGs beside it.

    ``compare`` is a directory written by ``irt-engine compare``; ``plot_options`` go to
    ``report_plots``. Returns the written paths ``{"html": ..., name: png path}``. Files are
    written to temporary names and renamed into place.
    """
    out = Path(out)
    check_report_paths(out, compare, plot_options.get("stability"),
                       plot_options.get("dimensions"))
    for option, folder in (("compare", compare), ("stability", plot_options.get("stability")),
                           ("dimensions", plot_options.get("dimensions"))):
        if folder is not None:
            _check_same_responses(run, option, Path(folder))
    board = run_board(run)
    pngs, notes, flags = report_plots(run, y, board=board, **plot_options)
    out.parent.mkdir(parents=True, exist_ok=True)  # after every check: a refused page leaves nothing
    img = lambda name: (f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(pngs[name]).decode()}">'
                        if name in pngs else f'<p class="note">{html.escape(notes.get(name, ""))}</p>')
    note = lambda name: (f'<p class="note">{html.escape(notes[name])}</p>' if name in pngs and notes.get(name) else "")
    info = run.info
    heat_note = (f'<p class="note">{html.escape(_cut_note(board, MAX_HEAT, "heat map"))} The '
                 f'sortable table lists all.</p>' if len(board) > MAX_HEAT and "p_beats" in pngs else "")
    bars_note = (f'<p class="note">{html.escape(_cut_note(board, MAX_BARS, "plot"))}</p>'
                 if len(board) > MAX_BARS and "leaderboard" in pngs else "")
    unavailable = item_readouts_unavailable(run.spec)
    review = (_flag_section(run, flags) if flags is not None else
              f'<p class="note">items not reviewed: {html.escape(unavailable)}</p>' if unavailable else
              '<p class="note">no responses (store not found): items not reviewed</p>')
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>irt-engine report: {html.escape(run.path.name)}</title>
<style>{_CSS}</style></head><body>
<h1>irt-engine report: {html.escape(run.path.name)}</h1>
<p>model <b>{html.escape(str(info.get("model")))}</b> ({html.escape(run.spec.description)}),
{len(run.subjects)} subjects x {len(run.items)} items, {html.escape(_fit_status(info))}.</p>
{"".join(f'<p class="note">{html.escape(n)}</p>' for n in fit_notes(info, convergence=False))}
<h2 id="sec-leaderboard">Leaderboard</h2>{img("leaderboard")}{bars_note}
<p class="note">click a column header to sort. {html.escape(_board_explained(board))}</p>
{_board_table(board, response_kind(info) or run.spec.kind)}
<h2 id="sec-p-beats">P(beats)</h2>{img("p_beats")}{heat_note}
<h2 id="sec-items">Items for review</h2>{review}
<h2 id="sec-item-curves">Item characteristic curves</h2>{img("item_curves")}
<h2 id="sec-item-map">{"Difficulty and discrimination" if "discrimination_mean" in run.items
                         else "Abilities and difficulties"}</h2>{img("items_scatter")}
<h2 id="sec-compare">Model comparison</h2>{_compare_section(compare)}
<h2 id="sec-stability">Ranking stability</h2>{img("stability")}{note("stability")}
<h2 id="sec-scree">Dimensions (scree)</h2>{img("scree")}{note("scree")}
<script>{_SORT_JS}</script>
</body></html>
"""
    written = {}
    for name, data in pngs.items():
        written[name] = _atomic_write(out.with_name(f"{out.stem}_{name}.png"), data)
    written["html"] = _atomic_write(out, page.encode("utf-8"))
    return written


# Where each analysis folder records the responses it read: (file, keys to the checksum).
_DATA_RECORDS = {"compare": ("compare.json", ("checksum",)),
                 "stability": ("stability.json", ("data", "checksum")),
                 "dimensions": ("summary.json", ("data", "checksum"))}


def _check_same_responses(run, option: str, folder: Path) -> None:
    """Refuse an analysis folder whose record names other responses than the run's store.

    Both sides record the store's checksum (fit.json's ``data``; the folder's record). A
    side without one (an in-memory array, a folder without its record) is not checked.
    """
    name, keys = _DATA_RECORDS[option]
    try:
        theirs = json.loads((folder / name).read_text())
        for key in keys:
            theirs = theirs.get(key) if isinstance(theirs, dict) else None
    except (OSError, ValueError):  # missing or unreadable: the plot's own check names it
        return
    data = run.info.get("data") or {}
    ours = data.get("checksum")
    if isinstance(theirs, str) and isinstance(ours, str) and theirs != ours:
        raise SettingsError(
            f"--{option} {folder}: {name} records responses with checksum {theirs[:12]}..., "
            f"but run {run.path} was fitted to {data.get('store') or 'a store'} (checksum "
            f"{ours[:12]}...); pass the --out of irt-engine {option} run on the run's store")


def _atomic_write(path: Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))
