"""The library API as a notebook user calls it: pandas DataFrames carry their ids, bad
in-memory input is a DataFormatError naming the cell or shape, settings are checked where
they are made, and ``save_run`` / ``posterior_tables`` read the fit as the CLI does."""

import numpy as np
import pandas as pd
import pytest

import engine
from engine.errors import DataFormatError, SettingsError

FAST = engine.FitSettings(seed=3, ability_factor="gaussian", max_passes=40)


def _frame(seed=0, S=40, N=8):
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=S), rng.normal(size=N)
    y = (rng.random((S, N)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype("int8")
    return pd.DataFrame(y, index=pd.Index([f"m{i}" for i in range(S)], name="model"),
                        columns=[f"q{j}" for j in range(N)])


def test_a_dataframe_names_the_subjects_and_items(tmp_path):
    """Its index and columns were dropped for positions ('0', '1', ...), and score then
    refused the run's own item names."""
    df = _frame()
    res = engine.fit(df, "1pl", FAST)
    assert list(res.extra["items"]) == list(df.columns)
    assert list(res.extra["subjects"][:2]) == ["m0", "m1"]
    run = engine.save_run(res, tmp_path / "run")
    assert run.items["item"].tolist() == list(df.columns)
    from engine.score import score

    new = _frame(seed=1, S=3).rename(index=lambda s: "new-" + s)
    board, _ = score(run, new)
    assert set(board.loc[board["new"], "subject"]) == {"new-m0", "new-m1", "new-m2"}


def test_nullable_missing_cells_are_missing_and_an_id_column_is_named():
    df = _frame().astype("Int8")
    df.iloc[0, 0] = pd.NA  # how the shipped Parquet files hold a missing cell
    res = engine.fit(df, "1pl", FAST)
    assert res.extra["stats"]["subject_n"][0] == df.shape[1] - 1
    with pytest.raises(DataFormatError, match=r"DataFrame column 'model' \(\w+\) holds no numbers; "
                                              r"convert it .* df\.set_index\('model'\)"):
        engine.fit(df.reset_index(), "1pl", FAST)
    with pytest.raises(DataFormatError, match=r"column 'subject_id' is named as subject ids; .*set_index"):
        engine.fit(df.reset_index(drop=True).assign(subject_id=np.arange(len(df)))
                   [["subject_id", *df.columns]], "1pl", FAST)
    twice = df.copy()
    twice.columns = ["q0"] * df.shape[1]
    with pytest.raises(DataFormatError, match=r"columns \(items\): 'q0' appears more than once"):
        engine.fit(twice, "1pl", FAST)


@pytest.mark.parametrize("bad, said", [
    (np.zeros((0, 5), np.int8), r"shape \(0, 5\): no subjects or no items"),
    (np.zeros((5, 0), np.int8), r"shape \(5, 0\): no subjects or no items"),
    (-np.ones((5, 5), np.int8), "every cell is missing"),
    (np.array([["1", "0"], ["x", "1"]]), r"row 0, column 0: got '1'; expected a number"),
    (np.array([[1, 0], ["x", 1]], dtype=object), r"row 1, column 0: got 'x'; expected a number"),
])
def test_bad_in_memory_matrices_are_named(bad, said):
    with pytest.raises(DataFormatError, match=said):
        engine.fit(bad, "1pl", FAST)


def test_settings_are_checked_where_they_are_made(tmp_path):
    for seed in ("0", 1.5, True):
        with pytest.raises(SettingsError, match=r"seed=.*need an integer"):
            engine.FitSettings(seed=seed)
    assert engine.FitSettings(seed=np.int64(2)).seed == 2
    assert engine.FitSettings(seed=-1).seed == -1  # taken as the mean-field fit takes it
    with pytest.raises(SettingsError, match=r"settings: pass engine\.FitSettings\(\.\.\.\), got dict"):
        engine.fit(_frame(), "1pl", {"seed": 0})
    with pytest.raises(SettingsError, match=r"inputs: file or folder paths; got DataFrame"):
        engine.ingest(_frame(), tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def test_save_run_draws_ranks_with_the_fits_seed_and_posterior_tables_match(tmp_path):
    """save_run drew its rank statistics with seed 0 whatever the fit's, where `fit --seed 3`
    draws with 3: one data set, two tables."""
    res = engine.fit(_frame(), "1pl", FAST)
    run = engine.save_run(res, tmp_path / "run")
    assert run.info["readout"]["seed"] == 3
    subjects, items = engine.posterior_tables(res)
    pd.testing.assert_frame_equal(subjects, run.subjects)
    pd.testing.assert_frame_equal(items, run.items)
    other = engine.save_run(res, tmp_path / "run0", seed=0)
    assert not np.allclose(other.subjects["rank_mean"], run.subjects["rank_mean"])


def test_whole_number_frames_and_object_arrays_read_minus_one_as_missing():
    """-1 is missing in an int matrix; a DataFrame or object array of ints read it as a
    negative error (a float copy first)."""
    from engine.api import load_responses

    y = np.array([[1, -1], [0, 1]], np.int8)
    for given in (pd.DataFrame(y), pd.DataFrame(y.astype(np.int64)), y.astype(object),
                  pd.DataFrame(y).astype("Int8")):
        got, subjects, items, info = load_responses(given)
        assert got.tolist() == y.tolist() and info["kind"] == "binary", type(given)
    with pytest.raises(DataFormatError, match=r"columns \(items\): '1' appears more than once"):
        load_responses(pd.DataFrame(y, columns=[1, "1"]))  # one id once written down


def test_score_takes_a_store_and_names_a_frames_problems_as_the_frame(tmp_path):
    from engine.data import write_store
    from engine.score import score

    df = _frame()
    run = engine.save_run(engine.fit(df, "1pl", FAST), tmp_path / "run")
    new = _frame(seed=2, S=2).rename(index=lambda s: "x" + s)
    store = write_store(new.to_numpy(), list(new.index), list(new.columns), tmp_path / "new.zarr")
    board, _ = score(run, store)
    assert set(board.loc[board["new"], "subject"]) == {"xm0", "xm1"}
    with pytest.raises(DataFormatError, match=r"^the DataFrame: subject id\(s\) \['m0'\]"):
        score(run, df.iloc[:1])
    bad = new.astype(float)
    bad.iloc[0, 0] = 0.5
    with pytest.raises(DataFormatError, match=r"^the DataFrame row index 0, column \"q0\": got 0\.5"):
        score(run, bad)


def test_ingest_takes_any_iterable_of_paths(tmp_path):
    for k in range(2):
        (tmp_path / f"part{k}.csv").write_text(f"subject,q0,q1\ns{k},1,0\n")
    store = engine.ingest((p for p in sorted(tmp_path.glob("part*.csv"))), tmp_path / "s.zarr")
    assert store.shape == (2, 2)
    with pytest.raises(SettingsError, match=r"inputs: file or folder paths; got ndarray"):
        engine.ingest(np.zeros((2, 2)), tmp_path / "t.zarr")
