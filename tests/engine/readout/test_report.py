"""The static HTML report: sections, item choice, flags, literal ids, large leaderboards.

The rendering in a real browser (headless Chromium) is in ``test_report_browser.py``.
"""

import json
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.readout.leaderboard import rank_key
from engine.readout.items import FLAG_THRESHOLD, item_flags
from engine.readout.report import (MAX_HEAT, _cut_note, _heatmap, _leaderboard_plot, plot_label,
                                   spread_items, write_report)

from _item_runs import fit_run, simulate_2pl


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    y, _, _ = simulate_2pl(40, 30, seed=8)
    y[:, 4] = 1 - y[:, 4]  # one mislabelled item, drawn as flagged
    y[:, 7] = 1  # one item every subject answered alike: set aside
    return fit_run(tmp, y, "2pl"), tmp


def cluster_outputs(tmp):
    """Directories shaped like the outputs of `stability`, `dimensions` and `compare`."""
    stab, dims, cmp = tmp / "stability", tmp / "dims", tmp / "cmp"
    for d in (stab, dims, cmp):
        d.mkdir(exist_ok=True)
    pd.DataFrame({"size": [10, 10, 100, 100], "method": ["irt", "accuracy"] * 2,
                  "tau_between_mean": [0.5, 0.4, 0.8, 0.7], "tau_between_q05": [0.3, 0.2, 0.7, 0.6],
                  "tau_full_mean": [0.6, 0.5, 0.9, 0.8]}).to_parquet(stab / "summary.parquet")
    pd.DataFrame({"index": [1, 2, 3], "observed": [3.0, 1.1, 0.6], "residual": [1.2, 0.9, 0.7],
                  "envelope_q95": [1.4, 1.2, 1.0]}).to_parquet(dims / "eigenvalues.parquet")
    (dims / "summary.json").write_text(json.dumps({"n_factors": 1, "details": {"x": 1}}))
    pd.DataFrame({"model": ["2pl", "1pl"], "heldout_loglik": [-0.512345, -0.534567],
                  "auc": [0.81, 0.79]}).to_parquet(cmp / "compare.parquet")
    return stab, dims, cmp


def test_report_sections_flags_and_set_aside_items(run_dir, capsys):
    run, tmp = run_dir
    stab, dims, cmp = cluster_outputs(tmp)
    out = tmp / "site" / "report.html"
    assert main(["report", str(run.path), "--out", str(out), "--stability", str(stab),
                 "--dimensions", str(dims), "--compare", str(cmp)]) == 0
    assert "6 PNGs" in capsys.readouterr().out
    page = out.read_text()
    for section in ("leaderboard", "p-beats", "items", "item-curves", "item-map", "compare", "stability", "scree"):
        assert f'id="sec-{section}"' in page
    rows = re.findall(r'<tr class="leaderboard-row" data-subject="([^"]+)"', page)
    assert rows == run.subjects.sort_values("ability_mean", ascending=False)["subject"].tolist()
    assert page.count('src="data:image/png;base64,') == 6
    assert "n_factors: 1" in page and "-0.5123" in page  # scree note, compare table
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched at view time
    # the review table: informative items only, the flipped one first, the constant one apart
    flags = item_flags(run.spec, run.guide, np.asarray(run_responses(run)))
    summary = re.search(r'<p id="review-summary">(\d+) of (\d+) informative', page)
    aside = run.items["item"][flags["set_aside"]].tolist()
    assert "i7" in aside and "i4" not in aside
    assert summary.groups() == (str(int(flags["flagged"].sum())), str(30 - len(aside)))
    review = page[page.index('id="review-summary"'):page.index('id="set-aside"')]
    assert re.findall(r"<td>(i\d+)</td>", review)[0] == "i4"
    assert not any(f"<td>{i}</td>" in review for i in aside)
    listed = re.search(r'id="set-aside">(\d+) items: no information: every subject answered alike.*: (.*)</p>', page)
    assert listed.group(1) == str(len(aside)) and listed.group(2).split(", ") == aside
    for name in ("leaderboard", "p_beats", "item_curves", "items_scatter", "stability", "scree"):
        assert out.with_name(f"report_{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def run_responses(run):
    from engine.readout.items import load_run_responses

    return load_run_responses(run)


def test_item_curves_spread_over_difficulty_and_skip_set_aside_items():
    difficulty = np.array([-3.0, -2.0, -1.0, -0.5, 0.0, 0.0, 0.0, 0.1, 0.2, 1.0, 2.0, 3.0, 0.007])
    informative = np.ones(len(difficulty), bool)
    informative[[4, 5, 6, 12]] = False  # set aside: all at the prior's difficulty
    chosen = spread_items(difficulty, informative, 5)
    assert len(chosen) == 5 and informative[chosen].all()
    assert (np.diff(difficulty[chosen]) > 0).all()
    assert difficulty[chosen].min() <= -2.0 and difficulty[chosen].max() >= 2.0
    assert spread_items(difficulty, informative, 20).tolist() == [0, 1, 2, 3, 7, 8, 9, 10, 11]


def test_ids_are_drawn_as_literal_text():
    """An id like `$\\foo$` is mathtext to matplotlib (drawing it fails); the report's
    plots draw it as it is."""
    fig, ax = plt.subplots()
    ax.set_title(r"$\foo$")
    with pytest.raises(ValueError):
        fig.savefig(__import__("io").BytesIO(), format="png")
    plt.close(fig)
    board = pd.DataFrame({"subject": [r"$\foo$", "a$b", "plain"], "ability_mean": [1.0, 0.0, -1.0],
                          "ability_q05": [0.5, -0.5, -1.5], "ability_q95": [1.5, 0.5, -0.5]})
    assert _leaderboard_plot(board)[:4] == b"\x89PNG"
    p = np.array([[0.5, 0.9, 0.99], [0.1, 0.5, 0.8], [0.01, 0.2, 0.5]])
    assert _heatmap(p, board)[:4] == b"\x89PNG"


def test_long_ids_keep_their_ends_on_the_plots():
    """The NLU leaderboard's checkpoints differ only at the end of ids longer than the
    heat map's 24 characters: cut at the end, three read "roberta-med-small-1M-x_b"
    apart only by one digit, and ids differing later read alike. Kept at both ends about
    an ellipsis, they stay apart; short ids are drawn whole."""
    ids = [f"roberta-med-small-1M-{k}_best" for k in (1, 2, 3)] + \
          [f"a-family-of-checkpoints-at-step-{k}" for k in (1000, 2000)]
    for width in (24, 30, 32):
        labels = [plot_label(i, width) for i in ids]
        assert all(len(label) <= width for label in labels)
        assert len(set(labels)) == len(ids), labels
        assert all(label.startswith(i[:8]) and label.endswith(i[-6:]) for i, label in zip(ids, labels))
    assert len({i[:24] for i in ids}) < len(ids)  # what the end cut drew
    assert plot_label("roberta-large_best", 24) == "roberta-large_best"
    assert plot_label(17, 24) == "17"


def test_large_leaderboard_heat_map_shows_the_top_with_a_note(tmp_path):
    y, _, _ = simulate_2pl(120, 15, seed=5)
    run = fit_run(tmp_path, y, "1pl", name="wide")
    page = write_report(run, tmp_path / "r.html", y)["html"].read_text()
    assert f"the heat map draws the first {MAX_HEAT} of 120 subjects" in page
    assert page.count("leaderboard-row") == 120
    assert "review score &gt; " + f"{FLAG_THRESHOLD:.2f}" in page


def test_report_without_cluster_outputs_or_store(run_dir, tmp_path, capsys):
    run, _ = run_dir
    written = write_report(run, tmp_path / "r.html", None, items=["i4", "i0"])
    page = written["html"].read_text()
    assert "not requested" in page and "items not reviewed" in page
    assert set(written) == {"html", "leaderboard", "p_beats", "item_curves", "items_scatter"}
    assert page.count("leaderboard-row") == len(run.subjects)
    capsys.readouterr()
    assert main(["report", str(run.path), "--out", str(tmp_path / "r.txt")]) == 2
    assert f"e.g. --out {tmp_path / 'r.html'}" in capsys.readouterr().err
    # the paths are checked before the run is read
    assert main(["report", str(tmp_path / "no-run"), "--out", str(tmp_path / "r.txt")]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["report", str(run.path), "--out", str(tmp_path / "r2.html"), "--items", "zz"]) == 2
    assert main(["report", str(run.path), "--out", str(tmp_path / "r3.html"), "--compare",
                 str(tmp_path / "nowhere")]) == 2
    assert not (tmp_path / "r2.html").exists() and not (tmp_path / "r3.html").exists()
    # a stability or dimensions folder asked for and absent, or holding other outputs: an
    # error naming the option (it was a note on a page written with exit status 0)
    (tmp_path / "other").mkdir()
    for option, folder, said in (("--stability", "absent", "absent does not exist"),
                                 ("--dimensions", "absent", "absent does not exist"),
                                 ("--stability", "other", "no summary.parquet or stability.parquet"),
                                 ("--dimensions", "other", "no eigenvalues.parquet")):
        out = tmp_path / f"r-{option[2:]}-{folder}.html"
        assert main(["report", str(run.path), "--out", str(out), option,
                     str(tmp_path / folder)]) == 2
        assert said in capsys.readouterr().err and not out.exists()


def test_report_refuses_analysis_folders_of_other_responses(run_dir, tmp_path, capsys):
    """A stability, dimensions or compare folder whose record names another store's
    checksum is refused by option; the run's own checksum, or none recorded, is read."""
    run, _ = run_dir
    ours = run.info["data"]["checksum"]
    assert isinstance(ours, str) and len(ours) > 12
    stab, dims, cmp = cluster_outputs(tmp_path)
    records = {"--stability": (stab / "stability.json", lambda c: {"data": {"checksum": c}}),
               "--dimensions": (dims / "summary.json", lambda c: {"n_factors": 1, "data": {"checksum": c}}),
               "--compare": (cmp / "compare.json", lambda c: {"checksum": c})}
    for option, (record, content) in records.items():
        record.write_text(json.dumps(content("f" * 64)))
        out = tmp_path / f"other-{option[2:]}.html"
        assert main(["report", str(run.path), "--out", str(out), option, str(record.parent)]) == 2
        err = capsys.readouterr().err
        assert f"{option} {record.parent}: {record.name} records responses with checksum ffffffffffff" in err
        assert ours[:12] in err and f"irt-engine {option[2:]}" in err and not out.exists()
        record.write_text(json.dumps(content(ours)))
        assert main(["report", str(run.path), "--out", str(out), option, str(record.parent)]) == 0
        assert out.exists()


def test_report_says_when_the_board_holds_auto_s_mean_field_fallback(run_dir, tmp_path):
    """A run whose quadrature fit did not converge holds the mean-field fit's intervals: the
    page says so under its header, as the leaderboard command does (``fit_notes``)."""
    run, _ = run_dir
    plain = write_report(run, tmp_path / "plain.html", None)["html"].read_text()
    assert "did not converge" not in plain
    factor = run.info.get("ability_factor") or {}
    run.info["ability_factor"] = factor | {
        "method": "gaussian", "quadrature_wall_s": 3.25,
        "quadrature_not_converged": "2 iterations; the mean-field fit was run instead"}
    try:
        page = write_report(run, tmp_path / "fallback.html", None)["html"].read_text()
    finally:
        run.info["ability_factor"] = factor
    assert ('<p class="note">note: the quadrature fit (abilities integrated out) did not converge '
            "in 3.2 s; these are the mean-field fit&#x27;s intervals") in page


def test_a_cut_among_equal_ranks_is_named_not_called_the_best():
    """LSAT7's 308 perfect sheets share rank 1: the first 60 drawn are a slice of the tie in
    table order, which "the 60 best" misread."""
    board = pd.DataFrame({"rank": [1] * 70 + [71, 72], "subject": [f"s{i}" for i in range(72)]})
    note = _cut_note(board, 60, "plot")
    assert note == ("the plot draws the first 60 of 72 subjects; the cut falls among 70 subjects "
                    "of equal ability (rank 1), of whom the first 60 in table order are drawn.")
    board["rank"] = np.arange(1, 73)
    assert _cut_note(board, 60, "plot") == "the plot draws the first 60 of 72 subjects."


def test_report_of_a_continuous_response_run_leaves_the_item_read_outs_out(tmp_path):
    """A beta run (scores in (0, 1)): the leaderboard and P(beats) are drawn; the item
    curves and review, which need binary responses, are notes (the report had failed)."""
    from engine.api import fit
    from engine.infer.settings import FitSettings
    from engine.run import save_run

    rng = np.random.default_rng(3)
    y = np.clip(rng.beta(2, 3, size=(25, 12)), 0.01, 0.99).astype(np.float32)
    run = save_run(fit(y, model="beta", settings=FitSettings(seed=0, max_passes=30)), tmp_path / "run",
                   num_draws=200)
    assert main(["report", str(run.path), "--out", str(tmp_path / "r.html"), "--items", "0"]) == 2
    written = write_report(run, tmp_path / "r.html")
    page = written["html"].read_text()
    assert set(written) == {"html", "leaderboard", "p_beats"}
    assert "items not reviewed: model &#x27;beta&#x27;" in page and page.count("leaderboard-row") == 25
    assert "not drawn: model &#x27;beta&#x27;" in page
    # the mean response is headed by the responses' kind: a mean score, not an accuracy
    head = page[page.index('<table id="leaderboard">'):page.index("</thead>")]
    assert ">mean</th>" in head and ">accuracy</th>" not in head and ">ability</th>" in head


def test_the_mean_response_is_headed_by_the_datas_kind_not_the_models(tmp_path):
    """0/1 data fitted by a model of errors (gamma): the mean response is an accuracy, as
    ``leaderboard`` heads it (fit.json's ``data.kind``), not a mean error."""
    from engine.api import fit
    from engine.infer.settings import FitSettings
    from engine.run import save_run

    y = (np.random.default_rng(4).random((20, 8)) < 0.6).astype(np.int8)
    run = save_run(fit(y, model="gamma", settings=FitSettings(seed=0, max_passes=20)),
                   tmp_path / "run", num_draws=100)
    assert run.info["data"]["kind"] == "binary" and run.spec.kind == "nonnegative"
    page = write_report(run, tmp_path / "r.html")["html"].read_text()
    head = page[page.index('<table id="leaderboard">'):page.index("</thead>")]
    assert ">accuracy</th>" in head and ">mean err</th>" not in head


def test_a_board_ranked_by_expected_score_is_labelled_so_in_the_report(monkeypatch):
    """Models ranked by expected score (gamma with inflation, beta3): the page's table, its
    note and the plot read the score columns, and the mean error is headed as one."""
    from engine.readout.leaderboard import leaderboard
    from engine.readout.report import _board_explained, _board_table

    rng = np.random.default_rng(0)
    ability = rng.normal(size=6)
    score = np.array([0.2, 0.9, 0.5, 0.1, 0.7, 0.3])  # an order the abilities do not share
    subjects = pd.DataFrame({
        "subject": [f"s{k}" for k in range(6)], "ability_mean": ability,
        "ability_q05": ability - 1, "ability_q95": ability + 1, "score_mean": score,
        "score_q05": score - 0.05, "score_q95": score + 0.05, "accuracy": score * 2,
        "n_responses": 10})
    board = leaderboard(subjects)
    assert rank_key(board) == "score" and board["subject"].iloc[0] == "s1"
    table = _board_table(board, "nonnegative")
    head = table[:table.index("</thead>")]
    assert ">expected score</th>" in head and ">mean err</th>" in head
    assert ">ability</th>" not in head and ">accuracy</th>" not in head
    first = table[table.index('class="leaderboard-row"'):]
    assert 'data-value="0.9"' in first[:first.index("</tr>")]  # the best score's row, its score
    assert "subjects of equal expected score share one" in _board_explained(board)
    assert "90% expected score intervals" in _board_explained(board)
    tied = leaderboard(subjects.assign(score_mean=0.5))  # one rank: a cut among equal scores
    assert "subjects of equal expected score (rank 1)" in _cut_note(tied, 3, "plot")
    import engine.readout.report as report

    drawn = {}
    monkeypatch.setattr(report, "_png", lambda fig: drawn.setdefault("ax", fig.axes[0]) and b"")
    _leaderboard_plot(board)
    ax = drawn["ax"]
    assert ax.get_xlabel() == "expected score (posterior mean, 90% interval)"
    top = ax.lines[0].get_xdata()[-1]  # drawn bottom-up: the last point is the best row's
    assert top == pytest.approx(0.9)


def test_report_refuses_a_compare_folder_without_its_table_and_makes_no_folder(run_dir, tmp_path, capsys):
    run, _ = run_dir
    (tmp_path / "empty").mkdir()
    out = tmp_path / "new" / "r.html"
    assert main(["report", str(run.path), "--out", str(out), "--compare", str(tmp_path / "empty")]) == 2
    assert "no compare.parquet in it; pass the --out of irt-engine compare" in capsys.readouterr().err
    assert main(["report", str(run.path), "--out", str(out), "--stability", str(tmp_path / "empty")]) == 2
    assert not (tmp_path / "new").exists()  # the page's folder is made only once every check passed


def test_the_page_says_how_a_sampler_ended_not_passes_it_never_made():
    """A NUTS run's page had read "converged after 0 passes"; it gives the R-hat rule."""
    from engine.readout.report import _fit_status

    nuts = {"method": "nuts", "converged": False, "rhat_max": 1.0234, "max_rhat": 1.01,
            "num_chains": 4, "num_samples": 1000, "num_passes": 0}
    assert _fit_status(nuts) == ("NUTS NOT converged (largest R-hat 1.023, bound 1.01; 4 chains "
                                 "x 1000 draws)")
    assert _fit_status({"method": "vi", "converged": True, "num_passes": 21}) == \
        "converged after 21 passes"


def test_stability_plots_tick_the_sizes_as_numbers(tmp_path, monkeypatch):
    """stability.png's x axis read 3 x 10^1 and $\\mathdefault{10^{2}}$ where the sizes
    were 30 and 100; its ticks are now the sizes, as the report's stability plot has them."""
    import cluster.stability as stability

    seen = {}
    monkeypatch.setattr(stability, "write_plot_atomic", lambda fig, path: seen.update(fig=fig))
    rows = [{"method": m, "size": n, **{f"{c}_{s}": 0.5 for c in ("tau_between", "tau_full")
                                         for s in ("mean", "q05", "q95")}}
            for m in ("irt", "accuracy") for n in (30, 100, 300)]
    stability.plot_stability(pd.DataFrame(rows), tmp_path / "stability.png")
    for ax in seen["fig"].axes:
        seen["fig"].canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels == ["30", "100", "300"]
        assert not ax.xaxis.get_minor_ticks() or not any(
            t.label1.get_text() for t in ax.xaxis.get_minor_ticks())
