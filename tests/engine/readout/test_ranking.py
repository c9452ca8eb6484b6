import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata

from engine.readout.ranking import (competition_ranks, identical_subjects, pairwise_beats, pooled_pairs,
                                    pooled_statistics, rank_stats, ranks_from_draws, tie_groups)


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


def test_twins_drawn_apart_rank_as_the_exact_posterior_says():
    """Gaussian posteriors, three subjects sharing one, two another: each subject's P(top-1)
    against scipy's integral of its density times everyone else's CDF, its expected rank
    and P(beats) against the closed form, pooled twins read alike, and the board's
    probabilities add up (one first, three in the top three)."""
    from scipy import integrate, stats

    mu = np.array([1.0, 1.0, 1.0, 0.6, 0.6, 0.9, -0.2, 1.3])
    sd = np.array([0.5, 0.5, 0.5, 0.3, 0.3, 0.2, 1.0, 0.8])
    S, T = mu.size, 200_000
    draws = mu + sd * np.random.default_rng(3).standard_normal((T, S))
    groups = identical_subjects(mu, sd)
    assert groups is not None and np.unique(groups).size == 5
    got = rank_stats(draws, 3, groups)

    def p_top1(s):
        others = [t for t in range(S) if t != s]
        f = lambda x: stats.norm.pdf(x, mu[s], sd[s]) * np.prod(
            [stats.norm.cdf(x, mu[t], sd[t]) for t in others])
        return integrate.quad(f, -10, 10, epsabs=1e-10)[0]

    exact = np.array([p_top1(s) for s in range(S)])
    assert exact.sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(got["p_top1"], exact, atol=0.004)
    beats = stats.norm.cdf((mu[:, None] - mu[None, :]) / np.hypot(sd[:, None], sd[None, :]))
    np.fill_diagonal(beats, 0.0)
    np.testing.assert_allclose(got["rank_mean"], 1 + beats.sum(axis=0), atol=0.02)
    assert got["p_top1"].sum() == pytest.approx(1.0)
    assert got["p_top3"].sum() == pytest.approx(3.0)
    for members in ([0, 1, 2], [3, 4]):
        for k, v in got.items():
            assert np.unique(v[members]).size == 1, k
    p = pairwise_beats(draws.astype(np.float32), groups=groups)
    off = ~np.eye(S, dtype=bool)
    np.testing.assert_allclose(p[off], beats[off], atol=0.005)
    assert p[0, 1] == p[1, 2] == p[4, 3] == 0.5 and np.all(np.diag(p) == 0)
    np.testing.assert_array_equal(p[0, 3:], p[1, 3:])  # twins' rows alike outside their block
    np.testing.assert_array_equal(p[3:, 0], p[3:, 2])
    # any subjects asked for, in any order: the whole table's values (a twin whose group's
    # first member is not asked for still reads that member's draws)
    for columns in ([4, 1, 6], [2, 1], [7, 3, 4, 0], [5]):
        np.testing.assert_array_equal(
            pairwise_beats(draws.astype(np.float32), groups=groups, columns=columns),
            p[np.ix_(columns, columns)])
        np.testing.assert_array_equal(pairwise_beats(draws, columns=columns),
                                      pairwise_beats(draws)[np.ix_(columns, columns)])
    # a subject asked twice: 0 against itself, as on the diagonal; none asked: an empty table
    twice = pairwise_beats(draws, groups=groups, columns=[0, 1, 0, 4])
    np.testing.assert_array_equal(twice, p[np.ix_([0, 1, 0, 4], [0, 1, 0, 4])])
    assert twice[0, 2] == twice[2, 0] == 0 and twice[0, 1] == 0.5
    assert pairwise_beats(draws, groups=groups, columns=[]).shape == (0, 0)
    # sharing the twins' draws instead (one column a posterior) ties them in every draw:
    # the board's P(top-1) then adds to more than one
    shared = draws[:, [0, 0, 0, 3, 3, 5, 6, 7]]
    assert rank_stats(shared, 3)["p_top1"].sum() > 1.2


@given(T=st.integers(1, 40), S=st.integers(1, 12), G=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_pooled_statistics_read_each_group_as_one_column(T, S, G, seed):
    """A group's statistics are the ones of all its members' draws side by side, equal for
    every member; a subject alone keeps the column-wise statistic's value, to the bit."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(T, S))
    groups = rng.integers(0, G, S)
    fns = {"mean": lambda v: v.mean(axis=0), "q": lambda v: np.quantile(v, 0.3, axis=0)}
    got = pooled_statistics(values, groups, fns)
    for s in range(S):
        members = np.flatnonzero(groups == groups[s])
        pooled = values[:, members].reshape(-1)
        if members.size == 1:
            assert got["mean"][s] == fns["mean"](values)[s] and got["q"][s] == fns["q"](values)[s]
        else:
            assert got["mean"][s] == pytest.approx(pooled.mean(), rel=1e-12, abs=1e-12)
            assert got["q"][s] == pytest.approx(np.quantile(pooled, 0.3), rel=1e-12, abs=1e-12)
            assert np.unique(got["mean"][members]).size == 1
    assert identical_subjects(np.arange(S)) is None
    assert pooled_statistics(values, None, fns)["mean"].tolist() == values.mean(axis=0).tolist()


@given(S=st.integers(1, 12), G=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_pooled_pairs_read_each_two_groups_as_one_pair(S, G, seed):
    """Each entry is the mean over all pairs of the two groups' members (two distinct
    members within one group), the same for every member; the diagonal is kept, and pairs
    of two subjects alone keep their value to the bit."""
    rng = np.random.default_rng(seed)
    p = rng.random((S, S)).astype(np.float32)
    groups = rng.integers(0, G, S)
    got = pooled_pairs(p, groups)
    assert got.dtype == p.dtype and got.shape == p.shape
    for s in range(S):
        assert got[s, s] == p[s, s]
        a = np.flatnonzero(groups == groups[s])
        for t in range(S):
            if t == s:
                continue
            b = np.flatnonzero(groups == groups[t])
            cells = [p[i, j] for i in a for j in b if i != j]
            if len(a) == len(b) == 1:
                assert got[s, t] == p[s, t]
            else:
                assert got[s, t] == pytest.approx(np.mean(np.float64(cells)), rel=1e-6)
                assert {got[i, j] for i in a for j in b if i != j} == {got[s, t]}
    assert pooled_pairs(p, None) is p
    with pytest.raises(ValueError, match="pooled_pairs"):
        pooled_pairs(np.zeros((S + 1, S + 1)), groups)


@given(T=st.integers(1, 30), S=st.integers(2, 10), G=st.integers(1, 5), top_k=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1), grid=st.sampled_from([None, 0.5]))
@settings(max_examples=60, deadline=None)
def test_grouped_rank_stats_equal_the_pooled_ranks_statistics(T, S, G, top_k, seed, grid):
    """Each group's rank statistics equal NumPy's mean, linear quantiles and frequencies of
    all its members' ranks side by side, to the bit (ties on a coarse grid included); a
    subject alone keeps its column's."""
    rng = np.random.default_rng(seed)
    draws = rng.normal(size=(T, S))
    if grid:
        draws = np.round(draws / grid) * grid
    groups = rng.integers(0, G, S)
    got = rank_stats(draws, top_k, groups)
    ranks = ranks_from_draws(draws)
    alone = rank_stats(draws, top_k)
    for s in range(S):
        members = np.flatnonzero(groups == groups[s])
        r = ranks[:, members].reshape(-1)
        want = {"rank_mean": r.mean(), "rank_q05": np.quantile(r, 0.05),
                "rank_q95": np.quantile(r, 0.95), "p_top1": (r == 1).mean(),
                f"p_top{top_k}": (r <= top_k).mean()}
        for k, v in want.items():
            if members.size == 1:
                assert got[k][s] == alone[k][s], k
            assert got[k][s] == v, k


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.5, 1.0, 1.0 + 1e-9, 2.0, float("nan")]), max_size=12))
def test_competition_ranks_match_scipy_min_ranks(values):
    """Equal means share the best rank among them ("1224"), as scipy's rankdata(method="min")
    of the negated values; a NaN is never equal (each its own rank, last)."""
    v = np.asarray(values, float)
    order = np.argsort(-v, kind="stable")
    got = competition_ranks(v[order])
    finite = ~np.isnan(v[order])
    expected = rankdata(-v[order][finite], method="min")
    np.testing.assert_array_equal(got[finite], expected)
    np.testing.assert_array_equal(got[~finite], np.flatnonzero(~finite) + 1)


def test_leaderboard_ranks_equal_abilities_alike_and_marks_them():
    from engine.readout.leaderboard import format_leaderboard, leaderboard

    import pandas as pd

    subjects = pd.DataFrame({"subject": list("abcde"), "ability_mean": [0.2, 0.9, 0.2, 0.2, -1.0],
                             "ability_q05": [-1.0, 0.0, -1.0, -1.0, -2.0],
                             "ability_q95": [1.0, 1.5, 1.0, 1.0, 0.0],
                             "accuracy": [0.5, 0.9, 0.5, 0.5, 0.1], "n_responses": [5] * 5})
    board = leaderboard(subjects)
    assert board["rank"].tolist() == [1, 2, 2, 2, 5] and board["subject"].tolist() == list("bacde")
    text = format_leaderboard(board)
    assert [line.split()[0] for line in text.splitlines()[2:7]] == ["1", "2=", "2=", "2=", "5"]
    assert "share one, marked =" in text
    assert "marked =" not in format_leaderboard(leaderboard(subjects.iloc[:2]))
    # a --top-k cut inside the shared rank still marks it: the sharing is the whole board's
    cut = format_leaderboard(leaderboard(subjects, top_k=2))
    assert [line.split()[0] for line in cut.splitlines()[2:4]] == ["1", "2="] and "marked =" in cut
