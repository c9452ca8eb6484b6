"""Tests for engine.readout.vector_rank: non-dominated sorting against a brute-force
reference, dominance probabilities against direct counting, the five boards, and the
``leaderboard --rank`` command end to end on a multidimensional run."""

import json

import numpy as np
import pandas as pd
import pytest

from engine.errors import SettingsError
from engine.readout.ranking import rank_stats
from engine.readout.vector_rank import (
    RankSpec, dominance_layers, dominance_matrix, format_vector_board, non_dominated_sort, parse_rank,
    vector_leaderboard,
)


def brute_force_fronts(x: np.ndarray) -> np.ndarray:
    """O(N^2 D) reference: peel the undominated set repeatedly (NSGA-II's definition)."""
    n = x.shape[0]
    dominates = np.zeros((n, n), bool)
    for a in range(n):
        for b in range(n):
            dominates[a, b] = np.all(x[a] >= x[b]) and np.any(x[a] > x[b])
    front, left, f = np.zeros(n, int), np.ones(n, bool), 0
    while left.any():
        f += 1
        top = [s for s in np.flatnonzero(left) if not dominates[left, s].any()]
        front[top] = f
        left[top] = False
    return front


def test_non_dominated_sort_matches_brute_force_on_random_points():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, d = int(rng.integers(1, 45)), int(rng.integers(1, 5))
        if trial % 3 == 0:  # coarse grid: many ties and exact duplicates
            x = rng.integers(0, 3, size=(n, d)).astype(float)
        else:
            x = rng.normal(size=(n, d))
        np.testing.assert_array_equal(non_dominated_sort(x), brute_force_fronts(x), err_msg=f"trial {trial}")


def test_non_dominated_sort_known_cases():
    x = np.array([[3, 1], [1, 3], [2, 2], [1, 1], [0, 0], [2, 2], [0, 5]], float)
    assert non_dominated_sort(x).tolist() == [1, 1, 1, 2, 3, 1, 1]
    chain = np.arange(6)[:, None] * np.ones((1, 3))
    assert non_dominated_sort(chain).tolist() == [6, 5, 4, 3, 2, 1]
    assert non_dominated_sort(np.zeros((0, 2))).tolist() == []


def test_dominance_matrix_matches_direct_counting():
    rng = np.random.default_rng(2)
    draws = rng.normal(size=(50, 7, 3))
    draws[:, 3] = draws[:, 2]  # identical draws: neither dominates
    draws[:10, 5] = np.round(draws[:10, 5])
    draws[:10, 6] = np.round(draws[:10, 6])  # some exact ties on single skills
    p = dominance_matrix(draws, chunk=3)
    for s in range(7):
        for t in range(7):
            count = sum(np.all(draws[k, s] >= draws[k, t]) and np.any(draws[k, s] > draws[k, t])
                        for k in range(50))
            assert p[s, t] == pytest.approx(count / 50)
    assert np.all(np.diag(p) == 0) and p[2, 3] == 0 and p[3, 2] == 0
    assert np.all(p + p.T <= 1 + 1e-12)


def test_dominance_layers_declare_ties():
    p = np.array([[0.0, 0.97, 0.99, 0.99],
                  [0.01, 0.0, 0.6, 0.95],
                  [0.0, 0.2, 0.0, 0.93],
                  [0.0, 0.0, 0.0, 0.0]])
    assert dominance_layers(p, 0.9).tolist() == [1, 2, 2, 3]  # 1 vs 2: 0.6 < 0.9, a tie
    assert dominance_layers(p, 0.96).tolist() == [1, 2, 2, 2]
    with pytest.raises(SettingsError, match=r"threshold must be in \(0.5, 1\]"):
        dominance_layers(p, 0.4)


@pytest.fixture
def draws():
    rng = np.random.default_rng(3)
    centre = np.array([[2.0, 0.0, 1.0], [0.0, 2.0, 1.0], [1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [1.9, -0.1, 0.9]])
    return centre[None] + 0.3 * rng.normal(size=(400, 5, 3)), ["a", "b", "c", "d", "e"], ["x", "y", "z"]


def test_weighted_board_prints_normalised_weights(draws):
    d, subjects, skills = draws
    board = vector_leaderboard(d, subjects, skills, parse_rank("weights=2,1,1"))
    w = np.array([0.5, 0.25, 0.25])
    assert board.attrs["weights"] == {"x": 0.5, "y": 0.25, "z": 0.25}
    by_subject = board.set_index("subject")
    np.testing.assert_allclose(by_subject.loc[subjects, "score_mean"], (d @ w).mean(axis=0))
    np.testing.assert_allclose(by_subject.loc[subjects, "p_top1"], rank_stats(d @ w)["p_top1"])
    assert board["subject"].iloc[0] == "a"
    text = format_vector_board(board)
    assert "weights x=0.5, y=0.25, z=0.25" in text
    with pytest.raises(SettingsError, match="need 3 non-negative weights"):
        vector_leaderboard(d, subjects, skills, parse_rank("weights=1,1"))


def test_skill_and_lexicographic_boards(draws):
    d, subjects, skills = draws
    y = vector_leaderboard(d, subjects, skills, parse_rank("skill=y"))
    assert y["subject"].tolist()[:2] == ["b", "c"]
    np.testing.assert_allclose(y.set_index("subject").loc[subjects, "rank_mean"], rank_stats(d[:, :, 1])["rank_mean"])
    lex = vector_leaderboard(d, subjects, skills, parse_rank("lexicographic"))
    # a and e tie on x (overlapping intervals); the next skill y breaks the tie for a
    assert lex["subject"].tolist()[:2] == ["a", "e"]
    assert lex.loc[0, "x_group"] == lex.loc[1, "x_group"]
    with pytest.raises(SettingsError, match="unknown skill 'w'"):
        vector_leaderboard(d, subjects, skills, parse_rank("skill=w"))


def test_pareto_board_from_draws(draws):
    d, subjects, skills = draws
    board = vector_leaderboard(d, subjects, skills, parse_rank("pareto")).set_index("subject")
    np.testing.assert_array_equal(board.loc[subjects, "front"], brute_force_fronts(d.mean(axis=0)))
    per_draw = np.stack([brute_force_fronts(x) for x in d[:40]])
    sub = vector_leaderboard(d[:40], subjects, skills, parse_rank("pareto")).set_index("subject")
    np.testing.assert_allclose(sub.loc[subjects, "p_front1"], (per_draw == 1).mean(axis=0))
    assert board.loc["d", "front"] > 1 and board.loc["d", "p_front1"] == 0


def test_dominance_board_ties(draws):
    d, subjects, skills = draws
    board = vector_leaderboard(d, subjects, skills, parse_rank("dominance", threshold=0.95)).set_index("subject")
    assert board.loc["d", "layer"] > board.loc["c", "layer"]  # c dominates d with high mass
    assert board.loc["a", "layer"] == board.loc["b", "layer"] == 1  # incomparable: a tie
    # one layer, one rank (the board calls a layer a tie): ranks follow the layers
    assert board.loc["a", "rank"] == board.loc["b", "rank"] == 1
    assert (board.groupby("layer")["rank"].nunique() == 1).all()
    assert "posterior mass >= 0.95" in format_vector_board(vector_leaderboard(
        d, subjects, skills, RankSpec("dominance", threshold=0.95)))


def test_multi_skill_boards_read_twins_from_independent_draws():
    """Four subjects of one posterior (two independent standard normal skills), drawn apart,
    and two far below: of n points drawn independently with independent continuous
    coordinates, H_n (the harmonic number) are undominated on average, so each twin is on
    the Pareto front with probability H_4 / 4 = 25/48, and one twin dominates another with
    probability 1/4. Every board reads the twins alike. With their draws shared the twins
    would tie: always on the front, never dominating each other."""
    rng = np.random.default_rng(5)
    T = 20000
    draws = rng.normal(size=(T, 6, 2))
    draws[:, 4:] -= 20.0
    groups = np.array([0, 0, 0, 0, 1, 2])
    subjects = list("abcdef")
    skills = ["x", "y"]
    pareto = vector_leaderboard(draws, subjects, skills, parse_rank("pareto"), groups=groups)
    pareto = pareto.set_index("subject")
    twins = pareto.loc[list("abcd")]
    assert twins["p_front1"].to_numpy() == pytest.approx(25 / 48, abs=0.01)
    assert (twins.drop(columns="rank").nunique() == 1).all()
    assert pareto.loc["e", "p_front1"] < 0.01
    dom = vector_leaderboard(draws, subjects, skills, parse_rank("dominance", threshold=0.9),
                             groups=groups).set_index("subject")
    assert dom.loc[list("abcd"), "max_p_dominated"].to_numpy() == pytest.approx(0.25, abs=0.01)
    assert (dom.loc[list("abcd")].drop(columns="rank").nunique() == 1).all()
    assert dom.loc["e", "max_p_dominated"] == 1.0  # the twins dominate the two far below
    lex = vector_leaderboard(draws, subjects, skills, parse_rank("lexicographic"),
                             groups=groups).set_index("subject")
    assert (lex.loc[list("abcd")].drop(columns="rank").nunique() == 1).all()
    assert lex.loc["a", "x_mean"] == pytest.approx(draws[:, :4, 0].mean(), abs=1e-6)
    shared = draws[:, [0, 0, 0, 0, 4, 5]]
    tied = vector_leaderboard(shared, subjects, skills, parse_rank("pareto")).set_index("subject")
    assert (tied.loc[list("abcd"), "p_front1"] == 1.0).all()


def test_parse_rank_errors():
    with pytest.raises(SettingsError, match="unknown ranking 'best'"):
        parse_rank("best")
    with pytest.raises(SettingsError, match="weights must be numbers"):
        parse_rank("weights=a,b")
    with pytest.raises(SettingsError, match="only skill=NAME and weights"):
        parse_rank("pareto=1")
    assert parse_rank("skill=math").skill == "math"


def test_cli_fit_dims_q_matrix_and_vector_leaderboards(tmp_path, capsys):
    from engine.cli import main
    from scipy.special import expit

    rng = np.random.default_rng(4)
    th = rng.normal(size=(40, 2))
    q = np.zeros((60, 2))
    q[:30, 0], q[30:, 1] = 1, 1
    p = expit(np.sum(q * th[:, None, :], axis=-1) - rng.normal(size=60))
    y = (rng.random(p.shape) < p).astype(int)
    y[6:9] = y[5]  # four identical answer sheets
    items = [f"i{j}" for j in range(60)]
    pd.DataFrame(y, columns=items, index=[f"s{i}" for i in range(40)]).rename_axis("subject").reset_index() \
        .to_csv(tmp_path / "wide.csv", index=False)
    qdf = pd.DataFrame(q.astype(int), columns=["syntax", "semantics"])
    qdf.insert(0, "item", items)
    qdf.iloc[::-1].to_csv(tmp_path / "q.csv", index=False)  # any row order
    assert main(["ingest", str(tmp_path / "wide.csv"), "--out", str(tmp_path / "store")]) == 0
    assert main(["fit", str(tmp_path / "store"), "--out", str(tmp_path / "run"), "--model", "mirt-comp",
                 "--q-matrix", str(tmp_path / "q.csv"), "--quiet", "--max-passes", "60", "--draws", "200"]) == 0
    subjects = pd.read_parquet(tmp_path / "run" / "subjects.parquet")
    assert {"ability_syntax_mean", "ability_semantics_q95"} <= set(subjects.columns)
    twins = subjects.set_index("subject").loc[["s5", "s6", "s7", "s8"]]
    assert (twins.nunique() == 1).all()  # one posterior for identical sheets, every skill
    capsys.readouterr()
    for rank in ("pareto", "dominance", "lexicographic", "weights=0.7,0.3", "skill=semantics"):
        assert main(["leaderboard", str(tmp_path / "run"), "--rank", rank, "--draws", "200"]) == 0
        out = capsys.readouterr().out
        assert "leaderboard" in out and "s0" in out
        if rank.startswith("weights"):
            assert "weights syntax=0.7, semantics=0.3" in out
        lines = out.splitlines()
        head = lines[1].split()
        rows = pd.DataFrame([line.split() for line in lines[2:42]], columns=head).set_index("subject")
        twins = rows.loc[["s5", "s6", "s7", "s8"]]
        assert (twins.nunique() == 1).all(), (rank, twins)  # identical sheets read alike, one rank
    # the report of a multi-skill run: the Pareto board, notes where item read-outs need one
    # scalar ability (it was an internal KeyError)
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "page" / "r.html")]) == 0
    page = (tmp_path / "page" / "r.html").read_text()
    assert "pareto board: front: Pareto front" in page and "items not reviewed: model &#x27;mirt-comp" in page
    assert page.count('class="leaderboard-row"') == 40 and "<img" not in page
    # no P(beats) for several skills without a score, in runs whose fit.json says so in
    # other words (before 2026-12-06 `readout.rank_draws` was absent, or a text)
    from engine import runfiles
    from engine.run import load_run

    assert load_run(tmp_path / "run").pairwise() is None
    info = json.loads((tmp_path / "run" / "fit.json").read_text())
    for older in (None, "the posterior mean + sd x N(0, 1)"):
        readout = {k: v for k, v in info["readout"].items() if k != "rank_draws"}
        runfiles.seal(tmp_path / "run", info | {"readout": readout | (
            {} if older is None else {"rank_draws": older})})
        assert load_run(tmp_path / "run").pairwise() is None
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path / "run"), "--rank", "weights=1"]) == 2
    assert "need 2 non-negative weights" in capsys.readouterr().err
    assert main(["fit", str(tmp_path / "store"), "--out", str(tmp_path / "run2"), "--model", "mirt-noncomp",
                 "--dims", "2", "--quiet", "--max-passes", "20"]) == 0
    (tmp_path / "bad.csv").write_text("item,a\ni0,2\n")
    assert main(["fit", str(tmp_path / "store"), "--out", str(tmp_path / "run3"), "--model", "mirt-comp",
                 "--q-matrix", str(tmp_path / "bad.csv"), "--quiet"]) == 2
    assert "bad.csv line 2, column 'a': got 2; expected 0 or 1" in capsys.readouterr().err


def test_skill_board_of_a_run_with_twins_ranks_them_apart(tmp_path, capsys):
    """``leaderboard --rank skill=ability`` on a run with identical answer sheets: the twins
    are drawn apart and read alike, so one subject is first in each draw (P(top-1) adds to
    one over the board) and the expected ranks are those of 1..S."""
    from engine.api import fit
    from engine.cli import main
    from engine.infer.settings import FitSettings
    from engine.run import save_run

    rng = np.random.default_rng(2)
    y = (rng.random((30, 6)) < 0.6).astype(np.int8)
    y[10:16] = 1  # six perfect sheets
    save_run(fit(y, model="2pl", settings=FitSettings(seed=0, ability_factor="gaussian")),
             tmp_path / "run", num_draws=200)
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path / "run"), "--rank", "skill=ability", "--draws", "400",
                 "--top-k", "30"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[1].split()
    rows = pd.DataFrame([line.split() for line in lines[2:32]], columns=head)
    rows = rows.astype({c: float for c in head if c != "subject"})
    assert len(rows) == 30
    assert rows["p_top1"].sum() == pytest.approx(1.0, abs=0.01)  # printed to 3 decimals
    assert rows["rank_mean"].sum() == pytest.approx(30 * 31 / 2, abs=0.1)
    twins = rows[rows["subject"].isin([str(s) for s in range(10, 16)])]
    assert len(twins) == 6 and (twins.drop(columns=["rank", "subject"]).nunique() == 1).all()
