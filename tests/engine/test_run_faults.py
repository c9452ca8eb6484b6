"""Killed and concurrent writers of a run directory: real processes, kill -9."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from _kill import kill_when
from _tables import write_rasch_csv

from engine.cli import main
from engine.run import _swap_into_place, load_run

CLI = [sys.executable, "-m", "engine.cli"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    write_rasch_csv(tmp / "r.csv", 400, 60, seed=5)
    assert main(["ingest", str(tmp / "r.csv"), "--out", str(tmp / "s")]) == 0
    return tmp / "s"


def _fit_args(store, out, *extra):
    return ["fit", str(store), "--out", str(out), "--model", "2pl", "--quiet", "--seed", "4",
            "--max-passes", "150", "--tol", "1e-12", "--checkpoint-every", "2", "--draws", "100",
            "--ability-factor", "gaussian", *extra]  # the mean-field fit checkpoints


def test_second_writer_of_one_out_fails_at_once(store, tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom engine.atomic import exclusive_lock\n"
         f"with exclusive_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        assert main(_fit_args(store, out)) == 2
        assert time.perf_counter() - t0 < 10  # at once, not after a fit
        assert "another irt-engine process is writing --out" in capsys.readouterr().err
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    # the lock dies with its holder: the next writer proceeds
    assert main(_fit_args(store, out, "--max-passes", "10")) == 0


def test_kill_9_mid_fit_then_resume_equals_an_uninterrupted_fit(store, tmp_path):
    whole = tmp_path / "whole"
    assert subprocess.run(CLI + _fit_args(store, whole), capture_output=True).returncode == 0
    out = tmp_path / "killed"
    proc = subprocess.Popen(CLI + _fit_args(store, out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    kill_when(proc, lambda: (out / "checkpoint.json").exists(), "its first checkpoint", 120)
    assert (out / "checkpoint.json").exists() and not (out / "fit.json").exists()
    res = subprocess.run(CLI + _fit_args(store, out, "--resume"), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    a, b = load_run(whole), load_run(out)
    np.testing.assert_array_equal(a.subjects["ability_mean"], b.subjects["ability_mean"])
    np.testing.assert_array_equal(a.items["difficulty_mean"], b.items["difficulty_mean"])
    assert not list(tmp_path.glob(".killed.tmp-*")) and not list(tmp_path.glob(".killed.old-*"))


def test_swap_keeps_the_old_run_when_the_new_one_cannot_move_in(tmp_path, monkeypatch):
    out, new = tmp_path / "run", tmp_path / ".run.tmp-x"
    out.mkdir()
    (out / "fit.json").write_text("old")
    new.mkdir()
    (new / "fit.json").write_text("new")
    real = os.replace
    calls = []

    def flaky(a, b):
        calls.append((a, b))
        if len(calls) == 2:  # the new run's rename fails (disk full, a kill, ...)
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError):
        _swap_into_place(new, out)
    monkeypatch.setattr(os, "replace", real)
    assert (out / "fit.json").read_text() == "old"
    _swap_into_place(new, out)
    assert (out / "fit.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_resume_without_a_checkpoint_says_so(store, tmp_path, capsys):
    assert main(_fit_args(store, tmp_path / "r", "--resume", "--max-passes", "10")) == 0
    assert "found no checkpoint" in capsys.readouterr().err
