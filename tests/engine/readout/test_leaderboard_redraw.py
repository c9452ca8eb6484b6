"""`leaderboard --draws/--seed` and `--rank` on a one-ability run read the run's own posterior:
the same draws as the fit's rank statistics, not the mean-field guide's Gaussian."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.api import fit
from engine.cli import main
from engine.infer.settings import FitSettings
from engine.readout.ranking import rank_stats
from engine.run import load_run, ranking_draws, save_run

RANK_COLUMNS = ["rank_mean", "rank_q05", "rank_q95", "p_top1", "p_top3"]


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    """A default (quadrature) 2PL run whose abilities are each subject's exact posterior,
    with identical answer sheets (six answers: many subjects share one)."""
    rng = np.random.default_rng(5)
    theta = rng.normal(size=300)
    y = (rng.random((300, 6)) < 1 / (1 + np.exp(-(theta[:, None] - rng.normal(size=6))))
         ).astype(np.int8)
    path = tmp_path_factory.mktemp("redraw") / "run"
    save_run(fit(y, model="2pl", settings=FitSettings(seed=0)), path)
    run = load_run(path)
    assert "ability" in run.quantile_functions  # the exact posterior is what boards read
    return path, y


def _printed_board(out: str) -> pd.DataFrame:
    lines = [line for line in out.splitlines()[2:] if line[:4].strip().rstrip("=").isdigit()]
    return pd.DataFrame([line.split() for line in lines]).iloc[:, [2, 6, 7, 8]].set_axis(
        ["subject", "rank90", "p_top1", "p_top3"], axis=1)


def test_draws_and_seed_redraw_the_scalar_board(exact_run, capsys):
    exact_run, y = exact_run
    run = load_run(exact_run)
    readout = run.info["readout"]
    # the fit's own draws again: the table the fit wrote, to the bit
    again = run.subjects_redrawn(readout["num_draws"], readout["seed"])
    pd.testing.assert_frame_equal(again, run.subjects)
    capsys.readouterr()
    assert main(["leaderboard", str(exact_run)]) == 0
    stored = capsys.readouterr().out
    assert main(["leaderboard", str(exact_run), "--seed", str(readout["seed"])]) == 0
    assert capsys.readouterr().out == stored
    # more draws, another seed: the statistics of those draws, not the table's
    assert main(["leaderboard", str(exact_run), "--draws", "4000", "--seed", "7"]) == 0
    printed = _printed_board(capsys.readouterr().out)
    draws, groups = ranking_draws(run.spec, run.guide, run.quantile_functions, 4000, 7)
    assert draws.shape == (4000, 300)
    expected = rank_stats(draws, 3, groups)
    by_subject = dict(zip(run.subjects["subject"].astype(str), range(300)))
    rows = [by_subject[s] for s in printed["subject"]]
    np.testing.assert_allclose(printed["p_top1"].astype(float), expected["p_top1"][rows],
                               atol=5e-4)
    assert printed["p_top1"].astype(float).sum() == pytest.approx(1.0, abs=0.01)
    assert not np.allclose(expected["p_top1"], run.subjects["p_top1"])  # other draws
    # identical sheets read alike on the redrawn board too
    sheet = pd.Series(["".join(map(str, row)) for row in y[rows]], index=printed.index)
    assert len(printed) == 300 and sheet.duplicated().sum() > 200
    assert (printed.drop(columns="subject").groupby(sheet.to_numpy()).nunique() == 1).all().all()


def test_rank_board_of_a_scalar_run_reads_its_exact_posterior(exact_run, capsys):
    """``--rank skill=ability`` ranks from the draws the fit's table was read from (each
    subject's exact posterior), so its rank statistics equal the table's; before, it drew
    from the mean-field guide and disagreed with the run's own board."""
    exact_run, _ = exact_run
    run = load_run(exact_run)
    capsys.readouterr()
    assert main(["leaderboard", str(exact_run), "--rank", "skill=ability", "--top-k", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[1].split()
    board = pd.DataFrame([line.split() for line in lines[2:302]], columns=head)
    board = board.astype({c: float for c in head if c != "subject"}).set_index("subject")
    table = run.subjects.assign(subject=run.subjects["subject"].astype(str)).set_index("subject")
    board = board.loc[table.index]
    for column in ("rank_mean", "rank_q05", "rank_q95", "p_top1", "p_top3"):
        np.testing.assert_allclose(board[column], table[column], atol=1e-3 + 1e-5 * 300)
    # the abilities' ends are the exact posterior's, to Monte Carlo error of 1,000 draws
    spread = (table["ability_q95"] - table["ability_q05"]).to_numpy()
    assert np.abs(board["ability_q05"] - table["ability_q05"]).max() < 0.1 * spread.max()
