"""Annotation-error flags, item information and the quartile table."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import bernoulli

from engine.errors import DataFormatError, StoreNotFoundError
from engine.models import get_model
from engine.readout.items import (ItemBank, item_flags, load_run_responses, quartile_table,
                                  review_items)

from _item_runs import fit_run, simulate_2pl

PLANTED = np.array([3, 17, 40, 58, 71])


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """2PL data, 120 x 80, with the labels of five items flipped (every response inverted)."""
    y, truth, _ = simulate_2pl(120, 80, seed=11)
    y[:, PLANTED] = 1 - y[:, PLANTED]
    return y, tmp_path_factory.mktemp("planted")


@pytest.fixture(scope="module")
def planted_run(planted):
    """The run of ``model`` (with ``options``) fitted to the planted data, fitted once per
    module: the tests below read the same fits (each fit takes seconds)."""
    y, tmp = planted
    runs = {}

    def get(model, **options):
        key = (model, tuple(sorted(options.items())))
        if key not in runs:
            runs[key] = fit_run(tmp, y, model, name=f"{model}{len(options)}", **options)
        return runs[key]

    return get


@pytest.mark.parametrize("model, options", [("1pl", {}), ("2pl", {}),
                                            ("2pl", {"signed_discrimination": True})])
def test_planted_label_errors_rank_at_the_top(planted, planted_run, model, options):
    y, tmp = planted
    run = planted_run(model, **options)
    flags = item_flags(run.spec, run.guide, load_run_responses(run))
    top = np.argsort(-flags["review_score"].to_numpy())[: len(PLANTED)]
    assert set(top) == set(PLANTED), flags.iloc[top]
    if options:  # a signed discrimination is confidently negative only on flipped items
        p_neg = flags["p_negative_discrimination"].to_numpy()
        print("P(a < 0) on planted items", p_neg[PLANTED].round(3))
        # Measured: some flipped items stay at a small positive a (the fit does not cross
        # a = 0 from its start at 1); their residuals still rank them first.
        assert p_neg[PLANTED].max() > 0.99
        assert np.delete(p_neg, PLANTED).max() < 0.5
    else:
        assert "p_negative_discrimination" not in flags
    # the review table lists the planted items first, each with disagreeing subjects
    table = review_items(run, y, top=len(PLANTED), num_subjects=2)
    assert set(table["item_index"]) == set(PLANTED)
    assert all(s.count("(y=") == 2 for s in table["disagreeing"])


def test_low_feasibility_is_flagged_from_the_block():
    """A run with a feasibility block gets P(feasibility < 0.5) from its guide (vague
    priors: a guide without hyper-parameters)."""
    spec = get_model("feas", prior="vague")
    loc = {"ability": np.zeros(4, np.float32), "difficulty": np.zeros(3, np.float32),
           "discrimination": np.zeros(3, np.float32), "feasibility": np.array([3.0, 0.0, -3.0], np.float32)}
    scale = {k: np.full_like(v, np.log(0.5)) for k, v in loc.items()}
    from engine.infer.guide import GuideState

    y = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], np.int8)  # no item answered alike
    flags = item_flags(spec, GuideState(loc, scale), y)
    np.testing.assert_allclose(flags["p_low_feasibility"], [0.0, 0.5, 1.0], atol=1e-6)


def test_probabilities_and_information_match_closed_forms():
    """2PL: P from scipy's Bernoulli, information a^2 P (1 - P) (seed 002 eq. 2); 3PL by formula."""
    rng = np.random.default_rng(0)
    a, b, c = rng.uniform(0.3, 2.5, 7), rng.normal(size=7), rng.uniform(0.05, 0.3, 7)
    theta = np.linspace(-4, 4, 9)
    bank = ItemBank(get_model("2pl"), {"difficulty": b, "discrimination": a}, 7)
    p = 1 / (1 + np.exp(-a * (theta[:, None] - b)))
    np.testing.assert_allclose(bank.prob(theta), bernoulli.pmf(1, p), rtol=1e-5)
    np.testing.assert_allclose(bank.information(theta), a ** 2 * p * (1 - p), rtol=1e-4, atol=1e-6)
    bank3 = ItemBank(get_model("3pl"), {"difficulty": b, "discrimination": a, "guessing": c}, 7)
    p3 = c + (1 - c) * p
    dp3 = (1 - c) * a * p * (1 - p)
    np.testing.assert_allclose(bank3.information(theta), dp3 ** 2 / (p3 * (1 - p3)), rtol=1e-4, atol=1e-6)


def test_quartile_table_counts_accuracy_per_bin():
    rng = np.random.default_rng(3)
    items = pd.DataFrame({"difficulty_mean": np.arange(8.0), "discrimination_mean": [1, 2, -1, 3, 4, 5, 6, 7.0]})
    subjects = pd.DataFrame({"subject": ["a", "b"], "ability_mean": [1.0, -1.0]})
    y = rng.integers(0, 2, (2, 8)).astype(np.int8)
    y[1, 0] = -1
    t = quartile_table(items, subjects, y, np.array([0, 1]))
    keep = [0, 1, 3, 4, 5, 6, 7]  # item 2 has negative discrimination
    assert t.attrs == {"num_items": 7, "excluded_negative_discrimination": 1}
    d = items["difficulty_mean"].to_numpy()[keep]
    cuts = np.quantile(d, [0.25, 0.5, 0.75])
    for k, label in enumerate(["low", "med-low", "med-high", "high"]):
        cols = np.array(keep)[np.searchsorted(cuts, d, side="right") == k]
        for row in range(2):
            v = y[row, cols]
            assert t[f"difficulty:{label}"][row] == pytest.approx(v[v >= 0].mean())
    # an item every subject answered alike is left out although the fit kept it (a NUTS
    # run under pooled priors: constant_response False), as the review's set-aside list is
    y[:, 5] = 1
    items["mean_response"] = np.nanmean(np.where(y >= 0, y, np.nan), axis=0)
    items["constant_response"] = False
    t = quartile_table(items, subjects, y, np.array([0, 1]))
    alike = np.isin(items["mean_response"], (0.0, 1.0))
    assert alike[5] and 0 < alike.sum() < 8
    assert t.attrs["num_items"] == int((~alike & (items["discrimination_mean"] >= 0)).sum())


def test_run_responses_refuse_a_different_store(planted, planted_run, tmp_path):
    from engine.data import write_store

    y, tmp = planted
    run = planted_run("1pl")  # fitted to all 120 x 80 responses
    # another store (its first 30 x 30 cells): only the store is read, so no fit is needed
    other = write_store(y[:30, :30], [f"s{i}" for i in range(30)], [f"i{j}" for j in range(30)],
                        tmp_path / "other.zarr")
    with pytest.raises(DataFormatError, match="differ from run"):
        load_run_responses(run, other.path)
    with pytest.raises(StoreNotFoundError, match="--store"):
        load_run_responses(run, tmp_path / "nowhere")


def _guide(ability, num_items):
    """A 1PL guide with known abilities and difficulties at 0 (tight scales)."""
    from engine.infer.guide import GuideState

    loc = {"ability": np.asarray(ability, np.float32), "difficulty": np.zeros(num_items, np.float32)}
    return GuideState(loc, {k: np.full_like(v, -5.0) for k, v in loc.items()})


def test_reversal_statistic_is_calibrated_for_items_unrelated_to_ability():
    """Items whose responses ignore ability (the null, a = 0) pass the flag threshold about 5%
    of the time (normal tail at n = 300); items that work (a > 0) almost never do."""
    rng = np.random.default_rng(21)
    ability = rng.normal(size=300)
    null = (rng.random((300, 2000)) < rng.uniform(0.2, 0.8, 2000)).astype(np.int8)
    p = 1 / (1 + np.exp(-0.5 * (ability[:, None] - rng.normal(size=500))))  # a = 0.5, weak items
    working = (rng.random(p.shape) < p).astype(np.int8)
    y = np.concatenate([null, working], axis=1)
    flags = item_flags(get_model("1pl", prior="vague"), _guide(ability, y.shape[1]), y)
    share_null = flags["flagged"].to_numpy()[:2000].mean()
    print("flagged share: null items", share_null, "working items", flags["flagged"][2000:].mean())
    assert 0.035 < share_null < 0.065  # binomial sd of the share: 0.005
    assert flags["flagged"].to_numpy()[2000:].mean() < 0.002


def test_small_items_get_the_exact_permutation_p_value():
    """With 9 subjects the p-value is the permutation test's, checked by enumerating every
    arrangement of the item's correct responses (itertools), not the normal tail."""
    from itertools import combinations

    ability = np.array([-1.6, -0.9, -0.5, -0.1, 0.2, 0.4, 1.0, 1.7, 2.5])
    y = np.array([[1, 1, 0, 1], [1, 0, 0, 1], [0, 1, 1, 1], [1, 0, 0, 0], [0, 1, 1, 0],
                  [0, 0, 1, 1], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 1]], np.int8)
    flags = item_flags(get_model("1pl", prior="vague"), _guide(ability, 4), y, num_draws=4000, seed=3)
    theta = ability - ability.mean()
    for j in range(4):
        k = int(y[:, j].sum())
        t_obs = theta[y[:, j] == 1].sum()
        sums = np.array([theta[list(c)].sum() for c in combinations(range(9), k)])
        exact = (sums <= t_obs + 1e-9).mean()  # P(T* <= T): responses falling with ability
        assert 1 - flags["p_reversed"][j] == pytest.approx(exact, abs=0.025), j
    assert flags["p_reversed"][0] > 0.95  # the lowest four answered it: reversed


def test_clean_items_are_rarely_flagged_and_set_aside_items_never_ranked(tmp_path):
    """A clean 2PL matrix: at most 5% of items flagged. Items every subject answered alike
    get no score, are never ranked and are listed apart."""
    y, _, _ = simulate_2pl(120, 80, seed=12)
    y[:, 5], y[:, 9] = 0, 1
    run = fit_run(tmp_path, y, "2pl", name="clean")
    flags = item_flags(run.spec, run.guide, y)
    assert flags["set_aside"].to_numpy().nonzero()[0].tolist() == [5, 9]
    assert flags.loc[[5, 9], "review_score"].isna().all() and not flags.loc[[5, 9], "flagged"].any()
    print("clean 2PL: flagged share", flags["flagged"].mean())
    assert flags["flagged"].mean() <= 0.05
    table = review_items(run, y, top=None)
    assert len(table) == 78 and not table["item"].isin(["i5", "i9"]).any()
    assert table.attrs["set_aside"] == ["i5", "i9"] and table.attrs["num_informative"] == 78
    full = review_items(run, y, top=None, include_set_aside=True)
    assert full["item"].tolist()[-2:] == ["i5", "i9"] and full["set_aside"].tolist()[-2:] == [True, True]
    # the quartile table leaves the set-aside items (at the prior) out
    assert quartile_table(run.items, run.subjects, y, np.arange(3)).attrs["num_items"] == 78


def test_planted_errors_are_the_flagged_items(planted, planted_run):
    """The five flipped items are flagged, and no more than 5% of the others."""
    y, tmp = planted
    run = planted_run("2pl", signed_discrimination=True)  # the signed fit ranked above
    flags = item_flags(run.spec, run.guide, y)
    assert flags["flagged"][PLANTED].all()
    assert np.delete(flags["flagged"].to_numpy(), PLANTED).mean() <= 0.05
