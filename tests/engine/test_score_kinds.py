"""``score`` checks new responses against the run's response kind: a 2 or a 0.5 given to a
binary run is an error naming the cell, never a 1 or a 0."""

import numpy as np
import pytest

from engine.api import fit
from engine.data import write_store
from engine.errors import DataFormatError
from engine.infer.settings import FitSettings
from engine.run import save_run
from engine.score import score


@pytest.fixture(scope="module")
def binary_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("score_kinds")
    rng = np.random.default_rng(3)
    y = (rng.random((30, 6)) < 0.6).astype(np.int8)
    y[0], y[1] = 1, 0
    store = write_store(y, [f"s{i}" for i in range(30)], [f"i{j}" for j in range(6)],
                        tmp / "r.zarr")
    res = fit(store.path, model="1pl", settings=FitSettings(seed=0, max_passes=20))
    return save_run(res, tmp / "run", num_draws=100)


@pytest.mark.parametrize("value", [2, 0.5])
def test_out_of_kind_array(binary_run, value):
    y = np.ones((2, 6), np.float32 if value == 0.5 else np.int8)
    y[1, 4] = value
    with pytest.raises(DataFormatError, match=rf"new responses row 1, column 4: got {value}"):
        score(binary_run, y)


def test_out_of_kind_file(binary_run, tmp_path):
    src = tmp_path / "new.csv"
    src.write_text("model,i0,i1,i2\nnew-a,1,0,1\nnew-b,1,0.5,1\n")
    with pytest.raises(DataFormatError, match=r'new\.csv line 3, column "i1": got 0\.5; expected '
                                              r"0 or 1 for kind 'binary'"):
        score(binary_run, src)
    src.write_text("model,i0,i1,i2\nnew-a,1,0,1\nnew-b,1,1,0\n")
    board, _ = score(binary_run, src)
    assert list(board[board["new"]]["subject"]) == ["new-a", "new-b"]


def test_new_subjects_named_as_the_runs_are_refused(binary_run, tmp_path):
    """A new subject under an id the run's board already has would be a second row of that
    name on the combined board: refused, naming the ids, before anything is scored."""
    src = tmp_path / "again.csv"
    src.write_text("model,i0,i1,i2\nnew-a,1,0,1\ns3,0,0,1\ns7,1,1,1\n")
    with pytest.raises(DataFormatError, match=r"again\.csv: subject id\(s\) \['s3', 's7'\] "
                                              r"\(2 of 3\) already on run .*'s leaderboard"):
        score(binary_run, src)
    store = write_store(np.ones((2, 6), np.int8), ["s0", "fresh"], [f"i{j}" for j in range(6)],
                        tmp_path / "own.zarr")  # a store of the run's own subjects, likewise
    with pytest.raises(DataFormatError, match=r"\['s0'\] \(1 of 2\)"):
        score(binary_run, store.path)
