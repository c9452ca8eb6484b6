"""engine.rows.identical_rows against a plain Python grouping of the rows."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from engine.rows import all_distinct, identical_rows


@settings(max_examples=60, deadline=None)
@given(arrays(np.int8, st.tuples(st.integers(1, 40), st.integers(0, 6)),
              elements=st.integers(-1, 1)))
def test_groups_rows_as_python_does(a):
    first, inverse, counts = identical_rows(a)
    seen = {}
    for row in map(tuple, a):
        seen[row] = seen.get(row, 0) + 1
    assert len(first) == len(seen) == len(counts)
    for u, f in enumerate(first):  # each distinct row: its first occurrence and its count
        rows = np.flatnonzero(inverse == u)
        assert rows[0] == f and counts[u] == seen[tuple(a[f])] == rows.size
        assert (a[rows] == a[f]).all()


def test_nan_matches_nan_and_float_rows():
    a = np.array([[np.nan, 1.0], [0.5, 1.0], [np.nan, 1.0]])
    first, inverse, counts = identical_rows(a)
    assert inverse[0] == inverse[2] != inverse[1] and sorted(counts) == [1, 2]


def test_columns_of_a_strided_view_and_bad_shape():
    draws = np.array([[1.0, 2.0, 1.0], [3.0, 4.0, 3.0]])
    first, inverse, _ = identical_rows(draws.T)  # a non-contiguous view: subjects as rows
    assert inverse[0] == inverse[2] != inverse[1] and sorted(first) == [0, 1]
    with pytest.raises(ValueError, match="2-D"):
        identical_rows(np.zeros(3))


@settings(max_examples=80, deadline=None)
@given(arrays(st.sampled_from([np.int8, np.float32]),
              st.tuples(st.integers(0, 30), st.integers(0, 13)),
              elements=st.sampled_from([-1, 0, 1])))
def test_all_distinct_agrees_with_the_grouping(a):
    """Any row width (whole 8-byte words or not), int8 and float32; a True answer is exact."""
    expected = len(identical_rows(a)[0]) == a.shape[0] if a.shape[1] else a.shape[0] < 2
    assert all_distinct(a) == expected


def test_rows_differing_in_sign_bits_do_not_collide():
    """Rows whose bytes differ only in the top bit of two words (float32 -1 against 1 at the
    end of a word): a linear hash of the words gave them one hash (hypothesis found it)."""
    a = np.full((4, 7), -1.0, np.float32)
    a[0, 0], a[1, 1], a[3, 3] = 0.0, 1.0, 1.0
    assert all_distinct(a)
    rng = np.random.default_rng(5)
    signs = np.where(rng.random((400, 16)) < 0.5, -1.0, 1.0).astype(np.float32)
    assert all_distinct(signs) == (len(identical_rows(signs)[0]) == 400)


def test_all_distinct_on_threaded_bands(monkeypatch):
    """A matrix over the serial size goes through the thread pool, band by band."""
    import engine.data.tally as tally

    monkeypatch.setattr(tally, "_BAND_CELLS", 1_000)
    monkeypatch.setattr(tally, "_SERIAL_CELLS", 0)
    rng = np.random.default_rng(0)
    a = rng.integers(-1, 2, size=(300, 77), dtype=np.int8)
    assert all_distinct(a)
    a[250] = a[3]  # rows in different bands
    assert not all_distinct(a)
    a[250, 76] = 1 - a[3, 76] if a[3, 76] >= 0 else 0  # the last (padded) word differs
    assert all_distinct(a)
    assert not all_distinct(np.full((3, 5), np.nan, np.float32))
    with pytest.raises(ValueError, match="2-D"):
        all_distinct(np.zeros(3))
