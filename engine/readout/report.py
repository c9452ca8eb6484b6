"""A static HTML report of a run: one page, plots inline as base64 PNG, no external assets.

Sections: the leaderboard with 90% intervals (table and plot), the P(beats) matrix as a
heat map, item characteristic curves of chosen items, the difficulty x discrimination
scatter with items flagged for review, and, where their directories are given and hold
the files, ranking-stability and scree plots made by the cluster commands. Every plot is
also written as a PNG beside the page.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from engine.errors import SettingsError  # noqa: E402
from engine.readout.items import item_bank, item_flags  # noqa: E402
from engine.readout.leaderboard import leaderboard  # noqa: E402

__all__ = ["write_report", "report_plots"]

MAX_BARS = 60  # subjects drawn in the leaderboard plot and heat map (the table lists all)
REVIEW_CUT = 0.9  # review_score above which an item is drawn as flagged


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _leaderboard_plot(board: pd.DataFrame) -> bytes:
    b = board.head(MAX_BARS).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(b) + 1.2))
    y = np.arange(len(b))
    ax.errorbar(b["ability_mean"], y, xerr=[b["ability_mean"] - b["ability_q05"], b["ability_q95"] - b["ability_mean"]],
                fmt="o", ms=3, lw=1, capsize=2)
    ax.set_yticks(y, [str(s)[:32] for s in b["subject"]], fontsize=7)
    ax.set_xlabel("ability (posterior mean, 90% interval)")
    ax.set_title(f"leaderboard (top {len(b)} of {len(board)})")
    return _png(fig)


def _heatmap(p_beats: np.ndarray, board: pd.DataFrame, index: dict) -> bytes:
    order = [index[s] for s in board["subject"].head(MAX_BARS)]
    m = p_beats[np.ix_(order, order)].astype(np.float64)
    np.fill_diagonal(m, np.nan)  # a subject against itself: left blank
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    im = ax.imshow(m, vmin=0, vmax=1, cmap="RdBu_r")
    labels = [str(s)[:20] for s in board["subject"].head(MAX_BARS)]
    if len(order) <= 40:
        ax.set_xticks(range(len(order)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(order)), labels, fontsize=6)
    ax.set_title("P(row beats column), leaderboard order")
    fig.colorbar(im, ax=ax, shrink=0.8)
    return _png(fig)


def _icc_plot(run, chosen: np.ndarray) -> bytes:
    bank = item_bank(run.spec, run.guide)
    grid = np.linspace(-4, 4, 161)
    p = bank.subset(chosen).prob(grid)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k, j in enumerate(chosen):
        ax.plot(grid, p[:, k], label=str(run.items["item"].iloc[j])[:30])
    ax.set_xlabel("ability")
    ax.set_ylabel("P(correct)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("item characteristic curves")
    return _png(fig)


def _scatter(run, flags: pd.DataFrame | None) -> bytes:
    items = run.items
    x = items["difficulty_mean"].to_numpy()
    has_disc = "discrimination_mean" in items
    yv = items["discrimination_mean"].to_numpy() if has_disc else items["mean_response"].to_numpy()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    flagged = np.zeros(len(items), bool) if flags is None else flags["review_score"].to_numpy() > REVIEW_CUT
    ax.scatter(x[~flagged], yv[~flagged], s=6, alpha=0.5, label="items")
    if flagged.any():
        ax.scatter(x[flagged], yv[flagged], s=18, c="red", label=f"flagged (review score > {REVIEW_CUT})")
    ax.set_xlabel("difficulty")
    ax.set_ylabel("discrimination" if has_disc else "mean response")
    ax.legend(fontsize=7)
    ax.set_title("items" + ("" if flags is not None else " (no responses: flags not computed)"))
    return _png(fig)


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
            ax.plot(part[xcol], part[c], marker="o", label=f"{key} {c}".strip())
    ax.set_xscale("log")
    ax.set_xlabel(xcol)
    ax.set_ylabel("Kendall tau")
    ax.legend(fontsize=7)
    ax.set_title("ranking stability")
    return _png(fig), f"from {f}"


def _scree_plot(directory: Path) -> tuple[bytes | None, str]:
    """Eigenvalues (and any reference columns) from ``eigenvalues.parquet``; ``summary.json`` noted."""
    f = directory / "eigenvalues.parquet"
    note = ""
    if (directory / "summary.json").is_file():
        try:
            summary = json.loads((directory / "summary.json").read_text())
            note = "; ".join(f"{k}: {v}" for k, v in summary.items() if not isinstance(v, (list, dict)))
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
        ax.plot(xs, df[c], marker="o", ms=3, label=c)
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue")
    ax.legend(fontsize=7)
    ax.set_title("scree")
    return _png(fig), note


def report_plots(run, y: np.ndarray | None = None, *, items: list[str] | None = None,
                 stability: str | Path | None = None, dimensions: str | Path | None = None,
                 num_curves: int = 6) -> tuple[dict[str, bytes], dict[str, str], pd.DataFrame | None]:
    """Make the report's PNGs: ``({name: png}, {name: note}, item flags or None)``.

    ``items`` names the items whose curves are drawn; by default the ``num_curves`` with the
    highest review score (when responses are given) or else the most discriminating.
    """
    board = leaderboard(run.subjects)
    pngs, notes = {"leaderboard": _leaderboard_plot(board)}, {}
    p_beats = run.pairwise()
    if p_beats is not None:
        index = {s: k for k, s in enumerate(run.subjects["subject"])}
        pngs["p_beats"] = _heatmap(p_beats, board, index)
    else:
        notes["p_beats"] = "the run has no pairwise.npz (too many subjects or a vector ability)"
    flags = item_flags(run.spec, run.guide, y) if y is not None else None
    ids = run.items["item"].astype(str).tolist()
    if items:
        missing = [i for i in items if i not in ids]
        if missing:
            raise SettingsError(f"--items {missing}: not items of run {run.path}; e.g. {', '.join(ids[:3])}")
        chosen = np.asarray([ids.index(i) for i in items])
    elif flags is not None:
        chosen = np.argsort(-flags["review_score"].to_numpy(), kind="stable")[:num_curves]
    else:
        key = "discrimination_mean" if "discrimination_mean" in run.items else "difficulty_mean"
        chosen = np.argsort(-run.items[key].to_numpy(), kind="stable")[:num_curves]
    pngs["item_curves"] = _icc_plot(run, chosen)
    pngs["items_scatter"] = _scatter(run, flags)
    for name, directory, fn in (("stability", stability, _stability_plot), ("scree", dimensions, _scree_plot)):
        if directory is None:
            notes[name] = "not requested"
            continue
        directory = Path(directory)
        png, note = fn(directory) if directory.is_dir() else (None, f"{directory} does not exist")
        if png is not None:
            pngs[name] = png
        notes[name] = note
    return pngs, notes, flags


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;font-size:.85em}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}
td.s,th.s{text-align:left}img{max-width:100%}.note{color:#666;font-size:.9em}h2{margin-top:1.6em}"""


def _board_table(board: pd.DataFrame) -> str:
    cols = [("rank", "rank", "{}"), ("tie_group", "tie", "{}"), ("subject", "subject", "{}"),
            ("ability_mean", "ability", "{:+.3f}"), ("ability_q05", "q05", "{:+.3f}"),
            ("ability_q95", "q95", "{:+.3f}"), ("rank_q05", "rank q05", "{:.0f}"),
            ("rank_q95", "rank q95", "{:.0f}"), ("p_top1", "P(top1)", "{:.3f}"),
            ("accuracy", "accuracy", "{:.3f}"), ("n_responses", "n", "{}")]
    cols = [c for c in cols if c[0] in board]
    head = "".join(f'<th class="{"s" if k == "subject" else ""}">{html.escape(t)}</th>' for k, t, _ in cols)
    rows = []
    for r in board.to_dict("records"):
        cells = "".join(f'<td class="{"s" if k == "subject" else ""}">{html.escape(f.format(r[k]))}</td>'
                        for k, _, f in cols)
        rows.append(f'<tr class="leaderboard-row" data-subject="{html.escape(str(r["subject"]))}">{cells}</tr>')
    return f'<table id="leaderboard"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _flag_table(run, flags: pd.DataFrame, top: int = 15) -> str:
    order = np.argsort(-flags["review_score"].to_numpy(), kind="stable")[:top]
    df = pd.concat([run.items[["item"]].reset_index(drop=True), flags], axis=1).iloc[order]
    keep = ["item", "review_score"] + [c for c in ("p_negative_discrimination", "p_low_feasibility") if c in df] + \
        ["mean_response", "expected_mean", "residual_corr"]
    return df[keep].to_html(index=False, float_format=lambda v: f"{v:.3f}", classes="flags", border=0)


def write_report(run, out: str | Path, y: np.ndarray | None = None, **plot_options) -> dict[str, Path]:
    """Write ``out`` (one self-contained HTML page) and the PNGs beside it.

    Returns the written paths ``{"html": ..., name: png path}``. Files are written to
    temporary names and renamed into place.
    """
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise SettingsError(f"--out {out}: the report is an .html file")
    out.parent.mkdir(parents=True, exist_ok=True)
    pngs, notes, flags = report_plots(run, y, **plot_options)
    board = leaderboard(run.subjects)
    img = lambda name: (f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(pngs[name]).decode()}">'
                        if name in pngs else f'<p class="note">{html.escape(notes.get(name, ""))}</p>')
    note = lambda name: (f'<p class="note">{html.escape(notes[name])}</p>' if name in pngs and notes.get(name) else "")
    info = run.info
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>irt-engine report: {html.escape(run.path.name)}</title>
<style>{_CSS}</style></head><body>
<h1>irt-engine report: {html.escape(run.path.name)}</h1>
<p>model <b>{html.escape(str(info.get("model")))}</b> ({html.escape(run.spec.description)}),
{len(run.subjects)} subjects x {len(run.items)} items, {"converged" if info.get("converged") else "NOT converged"}
after {info.get("num_passes")} passes.</p>
<h2>Leaderboard</h2>{img("leaderboard")}
<p class="note">tie: subjects share a group while their 90% ability intervals overlap the group leader's.</p>
{_board_table(board)}
<h2>P(beats)</h2>{img("p_beats")}
<h2>Item characteristic curves</h2>{img("item_curves")}
<h2>Difficulty and discrimination</h2>{img("items_scatter")}
{"<h3>Items ranked for review</h3>" + _flag_table(run, flags) if flags is not None else ""}
<h2>Ranking stability</h2>{img("stability")}{note("stability")}
<h2>Dimensions (scree)</h2>{img("scree")}{note("scree")}
</body></html>
"""
    written = {}
    for name, data in pngs.items():
        written[name] = _atomic_write(out.with_name(f"{out.stem}_{name}.png"), data)
    written["html"] = _atomic_write(out, page.encode("utf-8"))
    return written


def _atomic_write(path: Path, data: bytes) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
