"""Bootstrap intervals beside the variational ones (in-process runner; Ray is tested elsewhere)."""

from __future__ import annotations

import numpy as np
import pandas as pd

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


def test_overlap_of_identical_and_disjoint_intervals():
    var = pd.DataFrame({"ability_mean": [0.0, 0.0], "ability_lo": [-1.0, -1.0],
                        "ability_hi": [1.0, 1.0], "rank_lo": [1, 1], "rank_hi": [2, 2]})
    reps = pd.DataFrame({"subject": [0, 0, 1, 1], "ability": [-1.0, 1.0, 2.0, 3.0],
                         "rank": [1, 2, 1, 1]})
    out = bootstrap_intervals(reps, var, level=0.999999)
    assert np.isclose(out["ability_overlap"][0], 1.0, atol=1e-4) and out["ability_overlap"][1] == 0
