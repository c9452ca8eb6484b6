"""Bootstrap intervals beside the variational ones (in-process runner; Ray is tested elsewhere)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cluster.bootstrap import bootstrap_intervals, run_bootstrap
from cluster.settings import BootstrapSettings, RunnerSettings
from tests.cluster.conftest import simulate_2pl


def test_bootstrap_intervals_beside_variational(tmp_path):
    y = simulate_2pl(24, 120, seed=3)
    res = run_bootstrap(y, tmp_path, BootstrapSettings(replicates=8, passes=12),
                        RunnerSettings(backend="inprocess", batch_size=4, progress=False))
    reps = pd.read_parquet(tmp_path / "bootstrap.parquet")
    assert len(reps) == 8 * 24 and set(reps["replicate"]) == set(range(8))
    # Ranks are a permutation within every replicate.
    assert all(sorted(g["rank"]) == list(range(1, 25)) for _, g in reps.groupby("replicate"))
    iv = pd.read_parquet(tmp_path / "intervals.parquet")
    assert len(iv) == 24
    assert (iv["boot_ability_lo"] <= iv["boot_ability_hi"]).all()
    assert iv["ability_overlap"].between(0, 1).all()
    # Resampled items move abilities by about their posterior sd: most full-fit means lie
    # inside the bootstrap interval and the widths are of the same order.
    inside = (iv["ability_mean"] >= iv["boot_ability_lo"]) & (iv["ability_mean"] <= iv["boot_ability_hi"])
    assert inside.mean() >= 0.7
    assert 0.3 < iv["sd_ratio"].median() < 3.0
    assert res.intervals.equals(iv)
    # 24 x 120 cells: the full fit took the automatic 16 draws per step, and so did every
    # replicate
    info = json.loads((tmp_path / "bootstrap.json").read_text())
    assert info["mc_draws_per_step"] == 16


def test_variational_intervals_read_identical_sheets_alike_and_rank_them_apart():
    """Subjects of one posterior (four identical sheets) drawn apart: their variational
    ability and rank intervals alike to the bit, pooled from the group's draws, and their
    mean ranks those of distinct places (the S ranks add to S (S + 1) / 2; shared draws
    would tie them at their best rank)."""
    from cluster.bootstrap import _variational
    from engine.api import fit
    from engine.infer.settings import FitSettings

    y = simulate_2pl(30, 25, seed=0)
    y[[1, 2, 3]] = y[0]
    full = fit(y, "2pl", FitSettings(seed=0))
    var = _variational(full, 0.9, 0, full.extra["subjects"])
    twins = var.iloc[:4].drop(columns="subject")
    assert (twins.nunique() == 1).all()
    assert var["rank_mean"].sum() == pytest.approx(30 * 31 / 2, rel=1e-9)
    assert twins["rank_lo"].iloc[0] < twins["rank_hi"].iloc[0]


def test_overlap_of_identical_and_disjoint_intervals():
    var = pd.DataFrame({"ability_mean": [0.0, 0.0], "ability_lo": [-1.0, -1.0],
                        "ability_hi": [1.0, 1.0], "rank_lo": [1, 1], "rank_hi": [2, 2]})
    reps = pd.DataFrame({"subject": [0, 0, 1, 1], "ability": [-1.0, 1.0, 2.0, 3.0],
                         "rank": [1, 2, 1, 1]})
    out = bootstrap_intervals(reps, var, level=0.999999)
    assert np.isclose(out["ability_overlap"][0], 1.0, atol=1e-4) and out["ability_overlap"][1] == 0


def test_replicates_set_constant_items_aside_as_the_full_fit_does(tmp_path):
    """A small leaderboard with many items every subject got wrong: the full fit fits them as
    unobserved, so the replicates must too, or their abilities drift away from the full fit's
    (all their intervals missed the variational ones on the 10-system demo)."""
    from cluster.trials import FitContext, TrialSpec, bootstrap_batch
    from engine.api import constant_columns, fit, set_aside_constant
    from engine.infer.settings import FitSettings

    y = np.concatenate([simulate_2pl(10, 150, seed=4), np.zeros((10, 400), np.int8)], axis=1)
    y[0, -1] = -1  # constant among the observed cells
    assert constant_columns(y).sum() >= 400
    assert constant_columns(np.stack([y, 1 - np.maximum(y, 0)])).shape == (2, y.shape[1])
    aside, const = set_aside_constant(y), constant_columns(y)
    assert (aside[:, const] == -1).all() and (aside[:, ~const] == y[:, ~const]).all()

    full = fit(y, "1pl", FitSettings(seed=0))
    assert full.extra["data"]["constant_items"] >= 400
    ctx = FitContext(y, "1pl", (), full.guide, FitSettings(), passes=20)
    rows = pd.DataFrame(bootstrap_batch(ctx, [TrialSpec(0, i, 100 + i) for i in range(8)]))
    boot = rows.groupby("subject")["ability"].mean().to_numpy()
    # within a fraction of the abilities' spread of the full fit's means (measured: at most
    # 0.68 for a spread of 1.08, mean 0.05; 0.32 of 1.22 while the full fit set them aside
    # too, where it now integrates them out as NUTS does and the replicates' short
    # mean-field refits still set them aside); fitted as observed, the 400 constant items
    # pulled every replicate's abilities down by 1.6-2.6
    shift, spread = boot - full.means()["ability"], np.std(full.means()["ability"])
    assert np.abs(shift).max() < 0.75 * spread and abs(shift.mean()) < 0.2 * spread


def test_intervals_name_a_stores_subjects_by_their_ids(tmp_path):
    """A store held in memory is fitted as its matrix (subjects numbered 0, 1, ...), so
    intervals.parquet named them by position: "0", "1", ... where the store says "m0",
    "m1", ..., and, on a store whose ids skip a number, every later row one subject off."""
    from engine.data import write_store

    y = simulate_2pl(20, 60, seed=4)
    ids = [f"m{i}" for i in range(20)]
    store = write_store(y.astype(np.int8), ids, [f"q{j}" for j in range(60)], tmp_path / "s.zarr")
    run_bootstrap(str(store.path), tmp_path / "boot", BootstrapSettings(replicates=3, passes=5),
                  RunnerSettings(backend="inprocess", batch_size=3, progress=False))
    iv = pd.read_parquet(tmp_path / "boot" / "intervals.parquet")
    assert iv["subject"].tolist() == ids
    reps = pd.read_parquet(tmp_path / "boot" / "bootstrap.parquet")  # rows by position
    assert sorted(set(reps["subject"])) == list(range(20))


def test_cli_notes_replicates_stopped_before_converging(tmp_path, capsys):
    """Replicates cut at --passes before converging lean towards the full fit they start
    from; the command says how many, and the remedy."""
    from engine.cli import main
    from engine.data import write_store

    y = simulate_2pl(20, 30, seed=6)
    write_store(y.astype(np.int8), [f"s{i}" for i in range(20)], [f"q{j}" for j in range(30)],
                tmp_path / "s.zarr")
    assert main(["bootstrap", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "b"),
                 "--replicates", "2", "--passes", "1", "--backend", "inprocess"]) == 0
    out = capsys.readouterr().out
    assert "note: 2 of 2 replicates stopped at --passes 1 before converging" in out


def test_identical_sheets_read_alike_in_the_bootstrap_intervals(tmp_path):
    """Twins (identical answer sheets) are resampled alike in every replicate; their refits
    differ by Monte Carlo jitter and their ranks by the order ties fall in, so their
    bootstrap intervals are read from all their rows together: equal to the bit."""
    y = simulate_2pl(24, 40, seed=8)
    y[[3, 9, 15]] = y[0]
    run_bootstrap(y, tmp_path, BootstrapSettings(replicates=4, passes=6),
                  RunnerSettings(backend="inprocess", batch_size=4, progress=False))
    iv = pd.read_parquet(tmp_path / "intervals.parquet")
    twins = iv.iloc[[0, 3, 9, 15]].drop(columns="subject")
    assert (twins.nunique() == 1).all(), twins
    reps = pd.read_parquet(tmp_path / "bootstrap.parquet")  # the rows themselves as refitted
    assert reps[reps["subject"].isin([0, 3, 9, 15])].groupby("replicate")["rank"].nunique().max() > 1
