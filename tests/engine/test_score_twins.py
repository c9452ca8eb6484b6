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


def test_a_transformed_ability_and_sheets_that_need_no_fit(tmp_path):
    """beta3 (a sigmoid ability, unit scores): a run sheet scored back takes the run's
    interval on the fit's own (unconstrained) scale, so score_responses' result reports the
    run's numbers; a batch of only the run's sheets is not fitted at all, and a run sheet a
    fresh fit could not take (every response 0 or 1) is read all the same."""
    from engine.readout.posterior import result_columns
    from engine.score import score_responses

    rng = np.random.default_rng(5)
    y = rng.beta(2.0, 2.0, size=(40, 8)).astype(np.float32)
    y[3] = np.where(np.arange(8) % 2, 1.0, 0.0)  # a sheet of boundary scores only
    y[7, 2] = np.nan
    res = fit(y, model="beta3", settings=FitSettings(seed=0, max_passes=200))
    run = load_run(save_run(res, tmp_path / "run", num_draws=200).path)
    assert run.spec.param("ability").transform == "sigmoid"
    again = score_responses(run, y[[3, 7]])
    assert again.extra["method"] == "the run's read-outs"
    cols = result_columns(again, "subject")
    for col in ("ability_mean", "ability_q05", "ability_q95"):
        np.testing.assert_allclose(cols[col], run.subjects[col].to_numpy()[[3, 7]], rtol=1e-5)
    other = y[7].copy()
    other[2] = 0.5
    board, mixed = score(run, np.vstack([y[3], other]), num_draws=200)
    np.testing.assert_array_equal(mixed.extra["run_twins"], [3, -1])
    new = board[board["new"]].reset_index(drop=True)
    for col in ("ability_mean", "ability_q05", "ability_q95", "rank_mean", "p_top1"):
        assert new.loc[0, col] == board.loc[3, col], col
    assert board["p_top1"].sum() == pytest.approx(1.0)


def test_digests_of_missing_and_signed_zero_floats_are_canonical():
    """A negative NaN (0/0 on some paths), a negative missing code and -0.0 read as the
    NaN and 0.0 the fit stored."""
    row = np.array([[0.25, np.nan, 0.0]], np.float64)
    odd = np.array([[0.25, -np.nan, -0.0]], np.float64)
    coded = np.array([[0.25, -1.0, 0.0]], np.float64)
    for other in (odd, coded):
        np.testing.assert_array_equal(sheet_digests(row, "unit"), sheet_digests(other, "unit"))


def test_identical_new_sheets_read_alike_when_the_items_are_held(tmp_path):
    """``score`` by a fit with the items held (a model with several subject blocks: the
    beta model's per-subject zero and one inflation) reads two identical new sheets alike,
    their subject blocks pooled as a fit's are, and draws them apart on the board."""
    rng = np.random.default_rng(2)
    y = rng.beta(2, 2, size=(40, 12)).astype(np.float32)
    y[rng.random(y.shape) < 0.12] = 0.0
    y[rng.random(y.shape) < 0.1] = np.nan
    res = fit(y, "beta", FitSettings(seed=0), model_options={"inflation_owner": "subject"})
    assert len(res.spec.by_owner("subject")) > 1
    run = save_run(res, tmp_path / "run", num_draws=300)
    new = np.where(np.isnan(y[:2]), np.nan, 0.5).astype(np.float32)
    new[1] = new[0]
    board, scored = score(run, new, method="fit")
    assert not scored.extra.get("run_twins")
    rows = board.iloc[[40, 41]].drop(columns="subject")
    assert (rows.nunique(dropna=False) == 1).all()
    assert board["p_top1"].sum() == pytest.approx(1.0, abs=1e-6)


def test_twins_are_not_pooled_where_a_subject_block_is_held():
    """A subject block held at given values may differ between twins, so their posteriors
    may too: no subject block is pooled then; held item blocks pool the subject blocks."""
    from engine.infer.guide import GuideState
    from engine.infer.marginal import pool_identical_rows
    from engine.models import get_model

    spec = get_model("beta", inflation_owner="subject")
    names = [p.name for p in spec.by_owner("subject")]
    y = np.full((3, 4), 0.5, np.float32)
    guide = GuideState({n: np.array([0.1, 0.2, 0.3], np.float32) for n in names},
                       {n: np.array([-1.0, -1.1, -1.2], np.float32) for n in names})
    held = pool_identical_rows(spec, guide, y, frozen=frozenset({names[0]}))
    assert held is guide
    items_held = pool_identical_rows(spec, guide, y, frozen=frozenset({"difficulty"}))
    for n in names:
        assert np.unique(items_held.loc[n]).size == 1 and np.unique(items_held.log_scale[n]).size == 1
