import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata

from engine.readout.ranking import pairwise_beats, rank_stats, ranks_from_draws, tie_groups


@pytest.fixture
def draws():
    rng = np.random.default_rng(0)
    return rng.normal(size=(400, 7)) + np.linspace(-1, 1, 7)


def test_ranks_match_scipy_rankdata(draws):
    ranks = ranks_from_draws(draws)
    expected = np.stack([rankdata(-row, method="ordinal") for row in draws])
    np.testing.assert_array_equal(ranks, expected)


def test_rank_stats_are_probabilities(draws):
    st = rank_stats(draws, top_k=3)
    assert st["p_top1"].sum() == pytest.approx(1.0)
    assert st["p_top3"].sum() == pytest.approx(3.0)
    assert np.all(st["rank_q05"] <= st["rank_mean"]) and np.all(st["rank_mean"] <= st["rank_q95"])
    assert np.argmax(st["p_top1"]) == 6  # the highest mean wins most often


def test_pairwise_beats_equals_direct_count(draws):
    p = pairwise_beats(draws, chunk=3)
    direct = np.array([[np.mean(draws[:, i] > draws[:, j]) for j in range(7)] for i in range(7)])
    np.testing.assert_allclose(p, direct)
    off = ~np.eye(7, dtype=bool)
    np.testing.assert_allclose((p + p.T)[off], 1.0)


def test_tie_groups_split_where_intervals_separate():
    mean = np.array([3.0, 2.9, 1.0, 0.95, -2.0])
    q05, q95 = mean - 0.2, mean + 0.2
    np.testing.assert_array_equal(tie_groups(mean, q05, q95), [1, 1, 2, 2, 3])


def test_tied_draws_share_the_best_rank():
    rng = np.random.default_rng(1)
    draws = np.round(rng.normal(size=(300, 9)), 1)  # many ties within each draw
    draws[:, 5] = draws[:, 2]  # two subjects tied in every draw (one answer sheet)
    expected = np.stack([rankdata(-row, method="min") for row in draws])
    np.testing.assert_array_equal(ranks_from_draws(draws), expected)
    st = rank_stats(draws, top_k=3)
    for k, v in st.items():
        assert v[5] == v[2], k


def test_pairwise_beats_of_shared_draws_equals_the_direct_count():
    """Identical answer sheets share their draws: compared once, expanded exactly."""
    rng = np.random.default_rng(3)
    distinct = rng.normal(size=(300, 20)).astype(np.float32)
    draws = distinct[:, rng.integers(0, 20, 700)]  # 700 subjects, 20 distinct columns
    direct = (draws[:, :, None] > draws[:, None, :]).mean(axis=0)
    np.testing.assert_array_equal(pairwise_beats(draws), direct.astype(np.float32))


def test_pairwise_beats_counts_ties_in_single_draws_as_no_win():
    """Distinct subjects that tie in some draws (values on a grid), a draw count that is not
    a multiple of the block of draws, and rows over several blocks: equal to the direct mean."""
    rng = np.random.default_rng(4)
    draws = np.round(rng.normal(size=(11, 40)), 1).astype(np.float32)
    draws[:, 7] = draws[:, 3]  # one shared sheet beside the ties
    direct = (draws[:, :, None] > draws[:, None, :]).mean(axis=0)
    np.testing.assert_array_equal(pairwise_beats(draws, chunk=6), direct.astype(np.float32))


@pytest.mark.parametrize("cores", [1, 3])
def test_pairwise_beats_counted_on_several_cores_equals_the_direct_count(cores, monkeypatch):
    """A table large enough to be counted in threads (here 3 cores: rows in three shares,
    the last one short; ties included) equals the direct mean, as on one core."""
    import engine.readout.ranking as ranking

    monkeypatch.setattr(ranking, "usable_cores", lambda: cores)
    rng = np.random.default_rng(5)
    draws = np.round(rng.normal(size=(1003, 301)), 2).astype(np.float32)
    direct = np.stack([(draws[:, i:i + 1] > draws).mean(axis=0) for i in range(301)])
    np.testing.assert_array_equal(pairwise_beats(draws), direct.astype(np.float32))


def test_pairwise_beats_of_no_draws_is_unknown():
    p = pairwise_beats(np.zeros((0, 4), np.float32))
    assert p.shape == (4, 4) and np.isnan(p).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 600), st.integers(1, 12), st.integers(0, 2 ** 32 - 1), st.booleans())
def test_pairwise_beats_and_rank_quantiles_equal_the_direct_computation(T, S, seed, grid):
    """Any number of draws (across the 8-bit counters' flush every 255 draws), ties on a
    coarse grid, and shared columns: the pairwise table equals the direct float mean, and
    the rank interval equals ``np.quantile`` of the ranks, to the bit."""
    rng = np.random.default_rng(seed)
    draws = rng.normal(size=(T, S)).astype(np.float32)
    if grid:
        draws = np.round(draws)
    if S > 2:
        draws[:, -1] = draws[:, 0]
    direct = (draws[:, :, None] > draws[:, None, :]).mean(axis=0)
    np.testing.assert_array_equal(pairwise_beats(draws, chunk=5), direct.astype(np.float32))
    ranks = ranks_from_draws(draws)
    stats = rank_stats(draws)
    np.testing.assert_array_equal(stats["rank_q05"], np.quantile(ranks, 0.05, axis=0))
    np.testing.assert_array_equal(stats["rank_q95"], np.quantile(ranks, 0.95, axis=0))


def test_pairwise_beats_with_a_nan_draw_compares_the_values():
    """A NaN value has no order: it neither wins nor loses, as the direct comparison says."""
    rng = np.random.default_rng(6)
    draws = rng.normal(size=(50, 6)).astype(np.float32)
    draws[3, 2] = np.nan
    direct = (draws[:, :, None] > draws[:, None, :]).mean(axis=0)
    np.testing.assert_array_equal(pairwise_beats(draws), direct.astype(np.float32))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.integers(1, 30), st.integers(1, 12), st.integers(0, 2 ** 32 - 1),
       st.booleans())
def test_rank_stats_of_shared_columns_equal_ranking_every_column(T, S, U, seed, grid):
    """Subjects sharing draws (identical answer sheets) ranked once and repeated: every
    statistic equals the one from ranking all the columns, to the bit, with ties between
    distinct columns on a coarse grid too."""
    rng = np.random.default_rng(seed)
    distinct = rng.normal(size=(T, U)).astype(np.float32)
    if grid:
        distinct = np.round(distinct)
    draws = distinct[:, rng.integers(0, U, S)]
    ranks = ranks_from_draws(draws)
    expected = {"rank_mean": ranks.mean(axis=0),
                "rank_q05": np.quantile(ranks, 0.05, axis=0),
                "rank_q95": np.quantile(ranks, 0.95, axis=0),
                "p_top1": (ranks == 1).mean(axis=0), "p_top3": (ranks <= 3).mean(axis=0)}
    stats = rank_stats(draws)
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(stats[key], value, err_msg=key)


def test_rank_stats_with_a_nan_draw_rank_every_column():
    """A NaN has no order: with one in the draws, the columns are ranked as they are."""
    rng = np.random.default_rng(7)
    draws = rng.normal(size=(40, 3)).astype(np.float32)[:, [0, 1, 1, 2, 0]]
    draws[5, 1] = np.nan
    ranks = ranks_from_draws(draws)
    np.testing.assert_array_equal(rank_stats(draws)["rank_mean"], ranks.mean(axis=0))
