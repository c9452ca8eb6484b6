"""engine.data.tally against plain numpy reductions over the whole matrix."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import engine.data.tally as tally_module
from engine.api import constant_columns, response_stats
from engine.data.tally import count_observed, tally


def _plain(y):
    obs = ~np.isnan(y) if y.dtype.kind == "f" else y >= 0
    values = np.where(obs, y, 0).astype(np.float64)
    return obs.sum(1), values.sum(1), obs.sum(0), values.sum(0), int(obs.sum())


@settings(max_examples=60, deadline=None)
@given(arrays(np.int8, st.tuples(st.integers(0, 25), st.integers(0, 9)),
              elements=st.integers(-1, 1)),
       st.booleans())
def test_counts_and_sums_match_numpy(y, threaded):
    """int8 (-1 missing) and the same values as float32 (NaN missing), serial or banded."""
    saved = tally_module._BAND_CELLS, tally_module._SERIAL_CELLS
    if threaded:  # bands of a few rows, on the pool
        tally_module._BAND_CELLS, tally_module._SERIAL_CELLS = 7, 0
    try:
        for m in (y, np.where(y >= 0, y, np.nan).astype(np.float32)):
            row_n, row_sum, col_n, col_sum, total = _plain(m)
            t = tally(m)
            assert t.row_n.shape == (m.shape[0],) and t.col_n.shape == (m.shape[1],)
            np.testing.assert_array_equal(t.row_n, row_n)
            np.testing.assert_array_equal(t.col_n, col_n)
            np.testing.assert_allclose(t.row_sum, row_sum)
            np.testing.assert_allclose(t.col_sum, col_sum)
            assert count_observed(m) == total
    finally:
        tally_module._BAND_CELLS, tally_module._SERIAL_CELLS = saved


def test_stats_and_constant_items_use_it():
    y = np.array([[1, 0, -1, 1], [1, 1, -1, 0], [1, -1, -1, 1]], np.int8)
    stats = response_stats(y)
    np.testing.assert_array_equal(stats["subject_n"], [3, 3, 2])
    np.testing.assert_allclose(stats["subject_mean"], [2 / 3, 2 / 3, 1.0])
    np.testing.assert_array_equal(stats["item_n"], [3, 2, 0, 3])
    assert np.isnan(stats["item_mean"][2])
    # item 0 all ones, item 2 never observed (not constant), items 1 and 3 mixed
    np.testing.assert_array_equal(constant_columns(y), [True, False, False, False])
    stacked = np.stack([y, 1 - np.where(y >= 0, y, 2)])  # trials: leading axis kept
    assert constant_columns(stacked).shape == (2, 4)


def test_refuses_other_ranks():
    with pytest.raises(ValueError, match="2-D"):
        tally(np.zeros(4, np.int8))
    assert count_observed(np.array([1, -1, 0], np.int8)) == 2
