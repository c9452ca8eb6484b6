"""Draws through each subject's posterior quantile function, against scipy's distributions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from engine.infer.ability_quantiles import INTERVAL_ROWS, PROBABILITIES, Z_NODES
from engine.readout.quantile_draws import quantile_draws, standardised_table

Z, P = np.array(Z_NODES), np.array(PROBABILITIES)


def test_the_nodes_hold_the_interval_ends_exactly():
    assert [PROBABILITIES[i] for i in INTERVAL_ROWS] == [0.05, 0.95]
    np.testing.assert_allclose(P, stats.norm.cdf(Z), rtol=1e-12)
    assert np.all(np.diff(Z) > 0)


@settings(max_examples=12, deadline=None)
@given(alpha=st.floats(-8, 8), loc=st.floats(-3, 3), scale=st.floats(0.2, 3))
def test_draws_follow_a_skewed_distribution_tabulated_at_the_nodes(alpha, loc, scale):
    """A skew-normal tabulated at the nodes: the draws' quantiles from 2% to 98% are scipy's
    within 0.03 sd (measured up to 0.018: Monte Carlo and the interpolation between nodes),
    their mean and sd its own."""
    d = stats.skewnorm(alpha, loc, scale)
    x = quantile_draws(np.array([d.mean()]), np.array([d.std()]), 200_000, 3, Z,
                       d.ppf(P)[:, None])[:, 0]
    qs = np.linspace(0.02, 0.98, 25)
    assert np.abs(np.quantile(x, qs) - d.ppf(qs)).max() < 0.03 * d.std()
    assert abs(x.mean() - d.mean()) < 0.02 * d.std()
    assert abs(x.std() / d.std() - 1) < 0.02


def test_without_a_table_the_draws_are_gaussian_and_independent_twins_included():
    loc, scale = np.array([0.0, 1.0, 1.0, -2.0]), np.array([1.0, 0.5, 0.5, 2.0])
    x = quantile_draws(loc, scale, 100_000, 0)
    assert x.dtype == np.float32 and x.shape == (100_000, 4)
    for s in range(4):
        assert stats.kstest((x[:, s] - loc[s]) / scale[s], "norm").pvalue > 1e-3
    # independent across subjects, identical factors too: twins are two abilities
    assert abs(np.corrcoef(x[:, 0], x[:, 3])[0, 1]) < 0.02
    assert abs(np.corrcoef(x[:, 1], x[:, 2])[0, 1]) < 0.02
    assert abs((x[:, 1] > x[:, 2]).mean() - 0.5) < 0.01


def test_each_subject_is_drawn_through_its_own_table():
    """Subjects out of sorted order, one twice: each column's draws follow its own
    distribution (scipy's quantiles within 0.03 sd), the repeated one's independently."""
    dists = [stats.skewnorm(6, 2.0, 1.0), stats.norm(-1.0, 0.5), stats.skewnorm(-4, 0.5, 2.0),
             stats.skewnorm(6, 2.0, 1.0), stats.norm(3.0, 0.2)]
    loc = np.array([d.mean() for d in dists])
    scale = np.array([d.std() for d in dists])
    table = np.stack([d.ppf(P) for d in dists], axis=1)
    x = quantile_draws(loc, scale, 100_000, 1, Z, table)
    assert abs(np.corrcoef(x[:, 0], x[:, 3])[0, 1]) < 0.02
    qs = np.array([0.05, 0.25, 0.5, 0.75, 0.95])
    for s, d in enumerate(dists):
        assert np.abs(np.quantile(x[:, s], qs) - d.ppf(qs)).max() < 0.03 * d.std(), s
    assert abs(np.corrcoef(x[:, 0], x[:, 2])[0, 1]) < 0.02


def test_a_negative_seed_is_taken_as_the_fit_takes_it():
    np.testing.assert_array_equal(quantile_draws(np.zeros(2), np.ones(2), 10, -1),
                                  quantile_draws(np.zeros(2), np.ones(2), 10, 2 ** 32 - 1))


def test_missing_nodes_are_extended_along_the_end_segments():
    """A normal's table with its outer nodes missing (quantiles beyond the grid) draws as
    the whole table does: a straight line in z is a normal's quantile function. A column
    with one finite node (or none) is drawn as the Gaussian of its mean and sd."""
    full = stats.norm.ppf(P, 1.0, 2.0)[:, None] * np.ones((1, 3))
    holed = full.copy()
    holed[:3, 0] = np.nan
    holed[-2:, 0] = np.nan
    holed[7, 0] = np.nan  # one inside
    holed[:, 1] = np.nan
    holed[1:, 2] = np.nan
    loc, scale = np.ones(3), np.full(3, 2.0)
    s = standardised_table(Z, holed, loc, scale)
    np.testing.assert_allclose(s, np.repeat(Z[:, None], 3, axis=1), atol=1e-12)
    for col in range(3):  # one subject at a time: the same normal draws
        a = quantile_draws(loc[:1], scale[:1], 1000, 5, Z, holed[:, col:col + 1])
        b = quantile_draws(loc[:1], scale[:1], 1000, 5, Z, full[:, :1])
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_skewed_tables_missing_ends_follow_its_end_segments():
    """Beyond the finite nodes, a column continues along its outermost finite segment (not
    the table's last): a skew-normal whose two outer nodes each side are missing."""
    d = stats.skewnorm(5)
    values = d.ppf(P)[:, None]
    holed = values.copy()
    holed[:2, 0] = holed[-2:, 0] = np.nan
    s = standardised_table(Z, holed, np.array([d.mean()]), np.array([d.std()]))[:, 0]
    full = (values[:, 0] - d.mean()) / d.std()
    np.testing.assert_allclose(s[2:-2], full[2:-2], rtol=1e-12)
    low = (full[3] - full[2]) / (Z[3] - Z[2])
    high = (full[-3] - full[-4]) / (Z[-3] - Z[-4])
    np.testing.assert_allclose(s[:2], full[2] + low * (Z[:2] - Z[2]), rtol=1e-12)
    np.testing.assert_allclose(s[-2:], full[-3] + high * (Z[-2:] - Z[-3]), rtol=1e-12)


def test_a_table_out_of_order_is_made_non_decreasing():
    values = np.sort(np.random.default_rng(0).normal(size=len(Z)))[:, None]
    values[5, 0], values[6, 0] = values[6, 0], values[5, 0]  # a small ripple
    s = standardised_table(Z, values, np.zeros(1), np.ones(1))
    assert np.all(np.diff(s[:, 0]) >= 0)
    x = quantile_draws(np.zeros(1), np.ones(1), 10_000, 0, Z, values)
    assert np.all(np.isfinite(x))


@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_infinite_quantiles_are_treated_as_missing(bad):
    values = stats.norm.ppf(P)[:, None]
    values[0, 0] = bad
    x = quantile_draws(np.zeros(1), np.ones(1), 20_000, 0, Z, values)
    assert np.all(np.isfinite(x))
    assert abs(x.std() - 1) < 0.03
