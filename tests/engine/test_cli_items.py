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
    # per-group boards of a one-ability run: the reason is the run, not the flag
    assert main(["leaderboard", str(lsat_run / "r"), "--by", "group"]) == 2
    err = capsys.readouterr().err
    assert "has one ability for all items (model 2pl)" in err and "--q-matrix-from group" in err
    assert main(["leaderboard", str(lsat_run / "r"), "--by", "skill"]) == 2
    assert "the one per-group board is --by group" in capsys.readouterr().err


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


@needs_data
def test_table_commands_refuse_a_bad_out_and_bad_options_before_any_work(lsat_run, capsys):
    """--out x.txt, --out a folder, --subjects zz and --ability -1,inf were found only after
    the whole computation had run and printed (or, for --ability inf, printed NaN
    information and the first items as "chosen")."""
    run = str(lsat_run / "r")
    (lsat_run / "folder.csv").mkdir(exist_ok=True)
    capsys.readouterr()
    for argv, said in (
            (["items", run, "--out", str(lsat_run / "x.txt")], "use a .csv or .parquet file name"),
            (["items", run, "--subjects", "1,zz"], "zz"),
            (["subset", run, "--size", "2", "--out", str(lsat_run / "folder.csv")], "a folder"),
            (["subset", run, "--size", "2", "--ability", "-1,inf"], "two finite abilities"),
            (["subset", run, "--size", "2", "--ability", "nan,1"], "two finite abilities"),
            (["score", run, str(lsat_run / "new.csv"), "--out", str(lsat_run / "x.json")],
             "use a .csv or .parquet file name")):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert said in captured.err and captured.out == "", (argv, captured)


@needs_data
def test_score_reads_the_runs_top_k(lsat_run, capsys):
    """A run fitted with --top-k 10: score's combined board has P(top10), as the run's
    leaderboard does (it was P(top3) whatever the run)."""
    assert main(["fit", str(lsat_run / "s"), "--model", "1pl", "--out", str(lsat_run / "r10"),
                 "--quiet", "--draws", "200", "--top-k", "10"]) == 0
    out = lsat_run / "board10.csv"
    assert main(["score", str(lsat_run / "r10"), str(lsat_run / "new.csv"), "--out", str(out)]) == 0
    columns = pd.read_csv(out).columns
    assert "p_top10" in columns and "p_top3" not in columns
    assert "P(top10)" in capsys.readouterr().out


@needs_data
def test_compare_refuses_an_out_that_is_a_file_before_fitting(lsat_run, capsys):
    (lsat_run / "afile.txt").write_text("hi")
    assert main(["compare", str(lsat_run / "s"), "--models", "1pl", "--out",
                 str(lsat_run / "afile.txt"), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert "a file; compare writes a folder" in captured.err and "models fitted" not in captured.out


@needs_data
def test_errors_name_what_the_user_can_pass(lsat_run, capsys):
    """A model option the builder lacks lists the ones it takes; a value outside the run's
    kind in score's input names the run's kind (ingest's fix, "--kind", is not score's)."""
    assert main(["compare", str(lsat_run / "s"), "--models", "2pl:foo=1", "--quiet"]) == 2
    assert "its options are prior, signed_discrimination" in capsys.readouterr().err
    bad = lsat_run / "half.csv"
    bad.write_text("subject_id,item1,item2,item3,item4,item5\nzz,1,0.5,1,1,0\n")
    assert main(["score", str(lsat_run / "r"), str(bad)]) == 2
    err = capsys.readouterr().err
    assert 'half.csv line 2, column "item2": got 0.5' in err and "--kind" not in err
    assert "was fitted to binary responses, so new ones are read as binary" in err
