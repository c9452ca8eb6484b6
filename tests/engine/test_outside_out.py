"""Nothing outside --out is written or deleted through planted names or symlinks."""

import numpy as np
import pandas as pd
import pytest

from cluster.runner import run_trials
from cluster.settings import RunnerSettings
from cluster.trials import TrialSpec
from engine.atomic import atomic_write, private_dir
from engine.cli import main
from engine.errors import IRTError


def _victim(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    return outside


def test_atomic_write_ignores_planted_temporary_names(tmp_path):
    outside = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    # the names earlier versions used for their temporary files
    for name in (".t.csv.tmp", ".t.csv.0.tmp"):
        (out / name).symlink_to(outside / "precious.txt")
    atomic_write(out / "t.csv", lambda p: p.write_text("a,b\n1,2\n"))
    assert (out / "t.csv").read_text() == "a,b\n1,2\n"
    assert (outside / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == [".t.csv.0.tmp", ".t.csv.tmp", "t.csv"]


def test_atomic_write_replaces_a_symlinked_target_not_its_target(tmp_path):
    outside = _victim(tmp_path)
    (tmp_path / "t.csv").symlink_to(outside / "precious.txt")
    atomic_write(tmp_path / "t.csv", lambda p: p.write_text("new"))
    assert not (tmp_path / "t.csv").is_symlink() and (tmp_path / "t.csv").read_text() == "new"
    assert (outside / "precious.txt").read_text() == "keep me"


def test_failed_write_leaves_nothing(tmp_path):
    (tmp_path / "t.csv").write_text("old")

    def boom(p):
        p.write_text("half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "t.csv", boom)
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"] and (tmp_path / "t.csv").read_text() == "old"


def test_a_refused_command_leaves_no_folder_it_made_for_out(tmp_path, capsys):
    """ingest and fit make --out's missing parent folders; where they then fail, those
    folders go too (only the ones they made, and only while empty)."""
    (tmp_path / "dup.csv").write_text("model,q1\na,1\na,0\n")
    out = tmp_path / "new" / "deeper" / "out.zarr"
    assert main(["ingest", str(tmp_path / "dup.csv"), "--out", str(out)]) == 2
    assert "duplicate subject 'a'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there stays
    (tmp_path / "kept" / "mine.txt").write_text("keep me")
    assert main(["ingest", str(tmp_path / "dup.csv"), "--out",
                 str(tmp_path / "kept" / "sub" / "out.zarr")]) == 2
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["mine.txt"]
    (tmp_path / "was_there").mkdir()  # reached through a folder made for it: only that goes
    assert main(["ingest", str(tmp_path / "dup.csv"), "--out",
                 str(tmp_path / "made" / ".." / "was_there" / "out.zarr")]) == 2
    assert (tmp_path / "was_there").is_dir() and not (tmp_path / "made").exists()
    (tmp_path / "ok.csv").write_text("model,q1,q2\na,1,0\nb,0,1\n")
    assert main(["ingest", str(tmp_path / "ok.csv"), "--out", str(out)]) == 0  # made and kept
    assert (out / "zarr.json").is_file()


def test_private_dir_refuses_symlinks_and_outside_paths(tmp_path):
    outside = _victim(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".x.parts").symlink_to(outside)
    with pytest.raises(IRTError, match="symlink"):
        private_dir(home / ".x.parts", inside=home, what="parts")
    (home / ".y.parts").write_text("")
    with pytest.raises(IRTError, match="not a directory"):
        private_dir(home / ".y.parts", inside=home, what="parts")
    assert private_dir(home / ".z.parts", inside=home, what="parts") == home / ".z.parts"


def _rows(context, batch):
    return [{"value": float(t.seed % 7)} for t in batch]


def test_planted_parts_symlink_stops_the_runner_and_deletes_nothing(tmp_path):
    outside = _victim(tmp_path)
    out = tmp_path / "run" / "stability.parquet"
    out.parent.mkdir()
    (out.parent / ".stability.parquet.parts").symlink_to(outside)
    settings = RunnerSettings(backend="inprocess", batch_size=2, progress=False)
    trials = [TrialSpec(0, i, 100 + i) for i in range(4)]
    with pytest.raises(IRTError, match="symlink"):
        run_trials(_rows, None, trials, out, settings)
    assert [p.name for p in outside.iterdir()] == ["precious.txt"]
    assert (outside / "precious.txt").read_text() == "keep me"
    (out.parent / ".stability.parquet.parts").unlink()
    df = run_trials(_rows, None, trials, out, settings)
    assert len(df) == 4 and not (out.parent / ".stability.parquet.parts").exists()


def test_items_table_through_planted_tmp_symlink(tmp_path, monkeypatch):
    outside = _victim(tmp_path)
    rng = np.random.default_rng(0)
    y = (rng.random((20, 6)) < 0.6).astype(int)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(6)])
    df.insert(0, "subject_id", [f"s{i}" for i in range(20)])
    df.to_csv(tmp_path / "r.csv", index=False)
    assert main(["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s")]) == 0
    assert main(["fit", str(tmp_path / "s"), "--out", str(tmp_path / "r"), "--quiet", "--model", "1pl",
                 "--max-passes", "15", "--draws", "50"]) == 0
    (tmp_path / ".flags.csv.tmp").symlink_to(outside / "precious.txt")
    assert main(["items", str(tmp_path / "r"), "--out", str(tmp_path / "flags.csv")]) == 0
    assert (outside / "precious.txt").read_text() == "keep me"
    assert len(pd.read_csv(tmp_path / "flags.csv")) == 6
    (tmp_path / ".page.html.tmp").symlink_to(outside / "precious.txt")
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "page.html")]) == 0
    assert (outside / "precious.txt").read_text() == "keep me"
    assert (tmp_path / "page.html").read_text().lstrip().lower().startswith("<!doctype html")


def _tiny(tmp_path):
    (tmp_path / "r.csv").write_text("subject,a,b,c\ns1,1,0,1\ns2,0,1,1\ns3,0,0,1\ns4,1,1,0\n")
    assert main(["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s")]) == 0
    return ["fit", str(tmp_path / "s"), "--quiet", "--model", "1pl", "--max-passes", "10",
            "--draws", "20", "--overwrite", "--out"]


def test_overwrite_removes_only_run_directories_never_through_symlinks(tmp_path, capsys):
    outside = _victim(tmp_path)
    fit = _tiny(tmp_path)
    # a directory that is not a run: refused, untouched
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    assert main(fit + [str(tmp_path / "notes")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert (tmp_path / "notes" / "a.txt").read_text() == "mine"
    # a symlink to a directory, even to a run: refused, target untouched
    (tmp_path / "link").symlink_to(outside)
    assert main(fit + [str(tmp_path / "link")]) == 2
    assert "symlink" in capsys.readouterr().err
    assert [p.name for p in outside.iterdir()] == ["precious.txt"]
    # a real run is replaced
    assert main(fit + [str(tmp_path / "run")]) == 0
    assert main(fit + [str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "fit.json").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_outputs_take_the_umask_as_any_file_would(tmp_path, umask):
    """Runs, reports and tables are renamed into place from private temporary names (0700
    and 0600); they end with the modes ``open`` and ``mkdir`` give under the user's umask,
    so a report is readable by whoever may read the folder (umask 022) and stays private
    under 077."""
    import os
    import stat

    rng = np.random.default_rng(0)
    y = (rng.random((40, 6)) < 0.6).astype(int)
    wide = pd.DataFrame(y, columns=[f"q{j}" for j in range(6)])
    wide.insert(0, "subject", [f"s{i}" for i in range(40)])
    wide.to_csv(tmp_path / "wide.csv", index=False)
    wide.iloc[:3].assign(subject=["n0", "n1", "n2"]).to_csv(tmp_path / "new.csv", index=False)
    old = os.umask(umask)
    try:
        assert main(["ingest", str(tmp_path / "wide.csv"), "--out", str(tmp_path / "st")]) == 0
        assert main(["fit", str(tmp_path / "st"), "--out", str(tmp_path / "run"), "--quiet"]) == 0
        assert main(["score", str(tmp_path / "run"), str(tmp_path / "new.csv"), "--out",
                     str(tmp_path / "scored.csv")]) == 0
        assert main(["report", str(tmp_path / "run"), "--out",
                     str(tmp_path / "rep" / "report.html")]) == 0
    finally:
        os.umask(old)
    made = [tmp_path / "run", tmp_path / "scored.csv", *(tmp_path / "run").iterdir(),
            *(tmp_path / "rep").iterdir()]
    assert any(p.suffix == ".png" for p in made) and (tmp_path / "rep" / "report.html") in made
    for path in made:
        want = (0o777 if path.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(path.stat().st_mode) == want, (path, oct(path.stat().st_mode))
