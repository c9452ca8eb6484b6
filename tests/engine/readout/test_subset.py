"""Tiny informative subsets: greedy test information, ranking agreement vs. random."""

import numpy as np
import pytest

from engine.errors import SettingsError
from engine.models import get_model
from engine.readout.items import ItemBank, item_bank
from engine.readout.subset import evaluate_subsets, select_informative, target_grid

from _item_runs import MEAN_FIELD, fit_run, simulate_2pl


def test_greedy_spreads_information_over_the_range():
    """Ten sharp items at b=-2 and ten slightly flatter at b=+2: top-K discrimination (and
    top-K summed information) takes only the first group; the greedy log-information
    objective covers both ends of the range."""
    b = np.r_[np.full(10, -2.0), np.full(10, 2.0)]
    a = np.r_[np.full(10, 2.0), np.full(10, 1.8)] + np.linspace(0, 0.01, 20)
    bank = ItemBank(get_model("2pl"), {"difficulty": b, "discrimination": a}, 20)
    grid = target_grid(None, (-2.5, 2.5))
    chosen = select_informative(bank, 4, grid)
    assert sorted((chosen >= 10).tolist()) == [False, False, True, True]
    summed = bank.information(grid).sum(0)
    assert set(np.argsort(-summed)[:4]) <= set(range(10))
    # test information after greedy beats top-K's at its worst grid point
    worst = lambda idx: bank.subset(idx).information(grid).sum(1).min()
    assert worst(chosen) > worst(np.argsort(-summed)[:4])
    with pytest.raises(SettingsError, match="subset size 21"):
        select_informative(bank, 21, grid)
    with pytest.raises(SettingsError, match="LO <= HI"):
        target_grid(None, (1.0, -1.0))


@pytest.fixture(scope="module")
def run_and_y(tmp_path_factory):
    # seed 2: the fit converges in 15 passes (seed 4 took 112); seeds 0-6 all pass with
    # informative - random mean >= 0.2 at both sizes
    y, _, _ = simulate_2pl(60, 300, seed=2, log_a_sd=0.6, b_sd=1.5)
    return fit_run(tmp_path_factory.mktemp("subset"), y, settings=MEAN_FIELD), y


def test_informative_subset_beats_random_subsets(run_and_y):
    run, y = run_and_y
    bank = item_bank(run.spec, run.guide)
    grid = target_grid(run.subjects["ability_mean"].to_numpy())
    out = {}
    for k in (5, 10):
        ev = evaluate_subsets(run, y, {"informative": select_informative(bank, k, grid)}, num_random=20, seed=k)
        out[k] = (ev.tau["informative"], ev.tau_random.mean(), np.quantile(ev.tau_random, 0.9))
        assert ev.tau_random.shape == (20,)
    print("tau informative, random mean, random q90:", out)  # measured k=5: .84 .50 .62; k=10: .89 .64 .72
    for k, (informative, random_mean, random_q90) in out.items():
        assert informative > random_mean + 0.1
        assert informative > random_q90
