"""`score` reads an answer sheet the run has already read as the run read it, whichever way
the run was fitted (issue 16, part 4: identical sheets, identical read-outs)."""

import numpy as np
import pytest

from engine.api import fit, fit_nuts
from engine.infer.nuts import NutsSettings
from engine.infer.settings import FitSettings
from engine.rows import sheet_digests
from engine.run import load_run, save_run
from engine.score import score

COLUMNS = ["ability_mean", "ability_sd", "ability_q05", "ability_q95", "rank_mean", "rank_q05",
           "rank_q95", "p_top1", "p_top3"]


def _responses(S: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=S), rng.normal(size=n)
    return (rng.random((S, n)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(np.int8)


def _run(tmp_path, route: str):
    if route == "gaussian":  # mean-field abilities
        y = _responses(60, 40, 1)
        y[np.random.default_rng(2).random(y.shape) < 0.1] = -1
        res = fit(y, model="2pl", settings=FitSettings(seed=0, ability_factor="gaussian"))
    elif route == "nuts":  # abilities and intervals from NUTS's draws
        y = _responses(16, 5, 3)
        res = fit_nuts(y, "2pl", NutsSettings(num_chains=2, num_warmup=150, num_samples=150))
    else:  # a quadrature fit with an item everyone answered right, set aside: no item draws
        y = _responses(80, 8, 4)
        y[:, 0] = 1
        res = fit(y, model="2pl", settings=FitSettings(seed=0))
        assert res.extra["data"]["constant_items"] == 1
        assert res.extra["ability_factor"]["method"] == "quadrature"
    return y, load_run(save_run(res, tmp_path / "run", num_draws=300).path)


@pytest.mark.parametrize("route", ["gaussian", "nuts", "set-aside"])
def test_a_sheet_the_run_has_takes_the_runs_read_out(tmp_path, route):
    y, run = _run(tmp_path, route)
    if route == "set-aside":
        assert run.ability_draws() is None  # score could not read these sheets exactly
    rows = [2, 5, 7]
    other = y[5].copy()
    other[0] = 1 - other[0]  # one cell apart (for set-aside: the item everyone passed)
    missing = y[7].copy()
    missing[1] = -1  # the same answers with one left unanswered: another sheet
    board, res = score(run, np.vstack([y[rows], other, missing]), num_draws=300)
    np.testing.assert_array_equal(res.extra["run_twins"], rows + [-1, -1])
    assert "3 of 5 answer sheet(s) the run's own" in res.extra["abilities"]
    new, old = board[board["new"]].reset_index(drop=True), board[~board["new"]]
    for i, s in enumerate(rows):  # to the bit, rank statistics pooled with its twin's
        for col in COLUMNS:
            assert new.loc[i, col] == old.loc[s, col], (route, s, col)
    assert new.loc[3, "ability_mean"] != old.loc[5, "ability_mean"]
    assert new.loc[4, "ability_mean"] != old.loc[7, "ability_mean"]
    assert board["p_top1"].sum() == pytest.approx(1.0)
    assert board["rank_mean"].sum() == pytest.approx(len(board) * (len(board) + 1) / 2)


def test_without_sheets_score_reads_every_sheet_anew(tmp_path):
    """A run with no sheets.npz (written before it existed): nothing is looked up."""
    y, run = _run(tmp_path, "gaussian")
    run.info = {**run.info, "files": {k: v for k, v in run.info["files"].items()
                                      if k != "sheets.npz"}}
    assert run.sheet_digests() is None
    board, res = score(run, y[:2], num_draws=100)
    assert "run_twins" not in res.extra
    assert board[board["new"]]["ability_mean"].iloc[0] != board["ability_mean"].iloc[0]


def test_sheet_digests_read_one_sheet_whatever_carries_it():
    """Binary sheets: int8 with -1 and float with NaN (or -1) give one digest; one cell
    apart, or answered against unanswered, another. Continuous: float32 and float64 alike."""
    y = np.array([[1, 0, -1], [1, 0, 0], [1, 0, -1]], np.int8)
    f = np.where(y < 0, np.nan, y).astype(np.float64)
    d = sheet_digests(y, "binary")
    np.testing.assert_array_equal(d, sheet_digests(f, "binary"))
    np.testing.assert_array_equal(d, sheet_digests(y.astype(np.int64), "binary"))
    assert d.shape == (3, 16) and d.dtype == np.uint8
    assert (d[0] == d[2]).all() and not (d[0] == d[1]).all()
    c = np.array([[0.25, np.nan], [0.25, 0.5]])
    np.testing.assert_array_equal(sheet_digests(c, "unit"), sheet_digests(c.astype(np.float32), "unit"))
    assert not (sheet_digests(c, "unit")[0] == sheet_digests(c, "unit")[1]).all()
