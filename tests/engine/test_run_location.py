"""A run finds its store from any working directory, and after run and store move together."""

import shutil

import numpy as np
import pytest
from _tables import write_rasch_csv

from engine.cli import main
from engine.errors import StoreNotFoundError
from engine.readout.items import load_run_responses
from engine.run import load_run


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A 30 x 12 2PL run fitted with relative paths from its own directory."""
    base = tmp_path_factory.mktemp("loc")
    work = base / "work"
    work.mkdir()
    y = write_rasch_csv(work / "r.csv", 30, 12, seed=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert main(["ingest", "r.csv", "--out", "data/store"]) == 0
        assert main(["fit", "data/store", "--model", "1pl", "--out", "runs/run", "--quiet",
                     "--max-passes", "30", "--draws", "100"]) == 0
    return base, y


def test_run_records_its_store_absolute_and_relative_to_itself(fitted):
    base, _ = fitted
    data = load_run(base / "work" / "runs" / "run").info["data"]
    assert data["store"] == str((base / "work" / "data" / "store").resolve())
    assert data["store_from_run"] == "../../data/store"


def test_items_reads_the_store_from_another_directory(fitted, tmp_path, monkeypatch, capsys):
    base, y = fitted
    monkeypatch.chdir(tmp_path)
    run = load_run(base / "work" / "runs" / "run")
    np.testing.assert_array_equal(load_run_responses(run), y)
    assert main(["items", str(base / "work" / "runs" / "run"), "--top", "3"]) == 0
    assert "items ranked for review" in capsys.readouterr().out


def test_run_and_store_moved_together_still_agree(fitted, tmp_path, monkeypatch):
    base, y = fitted
    moved = tmp_path / "moved"
    shutil.copytree(base / "work", moved)
    # the recorded absolute path must not be what makes it work: hide the original store
    original = base / "work" / "data"
    hidden = base / "hidden"
    original.rename(hidden)
    try:
        monkeypatch.chdir(tmp_path)
        run = load_run(moved / "runs" / "run")
        np.testing.assert_array_equal(load_run_responses(run), y)
    finally:
        hidden.rename(original)


def test_missing_store_error_names_every_path_tried(fitted, tmp_path, monkeypatch):
    base, _ = fitted
    lone = tmp_path / "lone" / "run"
    shutil.copytree(base / "work" / "runs" / "run", lone)
    run = load_run(lone)
    original = base / "work" / "data"
    hidden = base / "hidden2"
    original.rename(hidden)
    try:
        monkeypatch.chdir(tmp_path)
        with pytest.raises(StoreNotFoundError) as err:
            load_run_responses(run)
        msg = str(err.value)
        assert str(lone / "../../data/store") in msg and str(original / "store") in msg
        assert "--store" in msg
    finally:
        hidden.rename(original)
