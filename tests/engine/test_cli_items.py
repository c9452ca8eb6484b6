"""The item-analysis commands end to end on real data (LSAT section 7, NLU slice)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.run import load_run

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"shared data not found at {DATA}")


@pytest.fixture(scope="module")
def lsat_run(tmp_path_factory):
    """LSAT7 (1000 x 5) minus its last 50 rows, fitted 2PL; the 50 rows are new subjects."""
    tmp = tmp_path_factory.mktemp("lsat")
    df = pd.read_csv(DATA / "demo" / "lsat7.csv")
    df.iloc[:-50].to_csv(tmp / "old.csv", index=False)
    new = df.iloc[-50:].copy()
    new["subject_id"] = [f"new{i}" for i in range(50)]
    new.to_csv(tmp / "new.csv", index=False)
    assert main(["ingest", str(tmp / "old.csv"), "--out", str(tmp / "s")]) == 0
    assert main(["fit", str(tmp / "s"), "--model", "2pl", "--out", str(tmp / "r"), "--quiet",
                 "--draws", "300"]) == 0
    return tmp


@needs_data
def test_items_command_prints_review_and_quartiles(lsat_run, capsys):
    out_csv = lsat_run / "flags.csv"
    assert main(["items", str(lsat_run / "r"), "--top", "3", "--out", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "items ranked for review (5 informative of 5)" in out and "difficulty:low" in out
    flags = pd.read_csv(out_csv)
    assert len(flags) == 5 and (np.diff(flags["review_score"]) <= 0).all()
    assert flags["flagged"].sum() == 0 and not flags["set_aside"].any()  # LSAT7's items all work
    run = load_run(lsat_run / "r")
    # the flags' observed means are the data's (LSAT7 item means, Bock & Lieberman 1970)
    expect = dict(zip(run.items["item"], run.items["mean_response"]))
    np.testing.assert_allclose(flags["mean_response"], [expect[i] for i in flags["item"]])
    assert main(["items", str(lsat_run / "r"), "--subjects", "nobody"]) == 2
    assert "nobody" in capsys.readouterr().err


@needs_data
def test_score_command_places_new_subjects(lsat_run, capsys):
    out = lsat_run / "board.csv"
    assert main(["score", str(lsat_run / "r"), str(lsat_run / "new.csv"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "scored 50 new subject(s)" in text and "new0" in text
    board = pd.read_csv(out)
    assert len(board) == 1000 and board["new"].sum() == 50
    # same response pattern -> same ability, whether fitted with the run or scored after it
    old = pd.read_csv(lsat_run / "old.csv")
    new = pd.read_csv(lsat_run / "new.csv")
    run = load_run(lsat_run / "r")
    cols = [c for c in old.columns if c != "subject_id"]
    pattern_old = dict(zip(map(tuple, old[cols].to_numpy()), run.subjects["ability_mean"]))
    scored = board.set_index("subject").loc[new["subject_id"]]
    ref = np.array([pattern_old[tuple(r)] for r in new[cols].to_numpy()])
    gap = np.abs(scored["ability_mean"].to_numpy() - ref) / scored["ability_sd"].to_numpy()
    print("scored vs fitted, same pattern: max gap", gap.max(), "sd")  # measured .17 sd
    assert gap.max() < 0.3


@needs_data
def test_score_command_names_unknown_item_columns(lsat_run, capsys):
    bad = lsat_run / "bad.csv"
    pd.DataFrame({"subject_id": ["x"], "item1": [1], "item9": [0]}).to_csv(bad, index=False)
    assert main(["score", str(lsat_run / "r"), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "item9" in err and "bad.csv" in err


@needs_data
def test_subset_command_reports_tau_against_random(lsat_run, capsys):
    out = lsat_run / "subset.csv"
    assert main(["subset", str(lsat_run / "r"), "--size", "2", "--random", "6", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "informative" in text and "random (mean of 6)" in text
    assert len(pd.read_csv(out)) == 2
    assert main(["subset", str(lsat_run / "r"), "--size", "9"]) == 2
    assert "subset size 9" in capsys.readouterr().err
    assert main(["subset", str(lsat_run / "r"), "--size", "2", "--ability", "2"]) == 2
    assert "LO,HI" in capsys.readouterr().err
    # a range starting below zero, as the README and the error's example write it (argparse
    # alone reads "-1,2" as an option): both spellings, the same subset
    chosen = {}
    for form in (["--ability", "-1,2"], ["--ability=-1,2"]):
        out = lsat_run / f"subset{len(chosen)}.csv"
        assert main(["subset", str(lsat_run / "r"), "--size", "2", "--random", "6", *form,
                     "--out", str(out)]) == 0, capsys.readouterr().err
        chosen[form[-1]] = pd.read_csv(out)["item"].tolist()
    assert chosen["-1,2"] == chosen["--ability=-1,2"] and len(chosen["-1,2"]) == 2
