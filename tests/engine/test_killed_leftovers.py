"""What killed writers leave behind (spill folders, half-written directories, checkpoint
temporary files) is removed or reused by the next run: real processes, kill -9."""

import subprocess
import sys

import numpy as np
import pandas as pd
from _kill import kill_when
from _tables import write_rasch_csv

from engine.api import make_source
from engine.atomic import remove_leftovers
from engine.cli import main
from engine.data.store import open_store
from engine.data.streaming import StreamingSource
from engine.infer.settings import FitSettings, parse_bytes
from engine.run import load_run

CLI = [sys.executable, "-m", "engine.cli"]


def _leftovers(parent, name):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_kill_9_while_ingest_spills_then_rerun_removes_the_spill(tmp_path):
    rng = np.random.default_rng(2)
    num_subjects, num_items = 3000, 200
    s, i = np.divmod(np.flatnonzero(rng.random(num_subjects * num_items) < 0.5), num_items)
    pd.DataFrame({"subject": [f"s{k}" for k in s], "item": [f"q{k}" for k in i],
                  "response": (rng.random(len(s)) < 0.5).astype(int)}).to_csv(tmp_path / "l.csv",
                                                                            index=False)
    ingest = CLI + ["ingest", str(tmp_path / "l.csv"), "--memory-budget", "2M", "--out"]
    assert subprocess.run(ingest + [str(tmp_path / "whole")], capture_output=True).returncode == 0

    def spilling():
        spills = [p for p in tmp_path.glob(".s.spill-*") if p.is_dir()]
        return bool(spills) and any(any(p.iterdir()) for p in spills)

    proc = subprocess.Popen(ingest + [str(tmp_path / "s")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    kill_when(proc, spilling, "it spilled")
    assert any(n.startswith(".s.spill-") for n in _leftovers(tmp_path, "s"))  # the leftover
    assert not (tmp_path / "s").exists()
    res = subprocess.run(ingest + [str(tmp_path / "s")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert _leftovers(tmp_path, "s") == []  # spill of the killed run removed, lock released
    a, b = open_store(tmp_path / "whole"), open_store(tmp_path / "s")
    assert list(a.subjects) == list(b.subjects) and list(a.items) == list(b.items)
    np.testing.assert_array_equal(a.load(), b.load())


def test_kill_9_during_a_streamed_fit_then_resume_equals_a_whole_fit(tmp_path):
    write_rasch_csv(tmp_path / "r.csv", 400, 60, seed=6)
    assert main(["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s")]) == 0
    budget = "16K"  # the store's 24,000 cells do not fit: streamed tile by tile
    source = make_source(open_store(tmp_path / "s"), FitSettings(memory_budget=parse_bytes(budget)))
    assert isinstance(source, StreamingSource)
    args = ["fit", str(tmp_path / "s"), "--model", "2pl", "--quiet", "--seed", "3",
            "--max-passes", "40", "--tol", "1e-12", "--checkpoint-every", "2", "--draws", "100",
            "--ability-factor", "gaussian", "--memory-budget", budget, "--out"]
    whole = subprocess.run(CLI + args + [str(tmp_path / "whole")], capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "run"
    proc = subprocess.Popen(CLI + args + [str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    kill_when(proc, lambda: (out / "checkpoint.json").exists(), "its first checkpoint")
    assert not (out / "fit.json").exists()
    res = subprocess.run(CLI + args + [str(out), "--resume"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    a, b = load_run(tmp_path / "whole"), load_run(out)
    np.testing.assert_array_equal(a.subjects["ability_mean"], b.subjects["ability_mean"])
    np.testing.assert_array_equal(a.items["difficulty_mean"], b.items["difficulty_mean"])
    assert _leftovers(tmp_path, "run") == []
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_a_swap_killed_half_way_gets_the_previous_directory_back(tmp_path):
    # killed between renaming the old run aside and renaming the new one in
    (tmp_path / ".run.old-abc123").mkdir()
    (tmp_path / ".run.old-abc123" / "checkpoint.json").write_text("last good")
    (tmp_path / ".run.tmp-def456").mkdir()
    (tmp_path / ".run.tmp-def456" / "subjects.parquet").write_text("half")
    (tmp_path / ".run.spill-0a0a0a").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not ours")
    (tmp_path / ".run.tmp-777777").symlink_to(outside)  # a planted link: removed, not followed
    unrelated = [".run.parts", ".run.lock", ".runs.tmp-1", ".other.tmp-1", "run.tmp-1"]
    for name in unrelated:
        (tmp_path / name).write_text("x")
    touched = remove_leftovers(tmp_path / "run")
    assert (tmp_path / "run" / "checkpoint.json").read_text() == "last good"
    assert len(touched) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(unrelated + ["outside", "run"])
    assert (outside / "keep").read_text() == "not ours"
    # with the target in place, an old copy beside it is only removed
    (tmp_path / ".run.old-fff").mkdir()
    (tmp_path / ".run.old-fff" / "fit.json").write_text("older")
    remove_leftovers(tmp_path / "run")
    assert (tmp_path / "run" / "checkpoint.json").read_text() == "last good"
    assert not (tmp_path / ".run.old-fff").exists()


def test_checkpoint_temporaries_of_a_killed_first_save_do_not_block_the_next_fit(tmp_path, capsys):
    write_rasch_csv(tmp_path / "r.csv", 60, 10, seed=1)
    assert main(["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s")]) == 0
    out = tmp_path / "run"
    out.mkdir()  # killed while writing its first checkpoint: only temporary files
    (out / ".checkpoint-000002-0a0b0c0d.npz.tmp-01234567").write_bytes(b"PK half")
    (out / ".checkpoint.json.tmp-89abcdef").write_text("{")
    assert main(["fit", str(tmp_path / "s"), "--out", str(out), "--quiet", "--max-passes", "10",
                 "--draws", "50"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    load_run(out)
