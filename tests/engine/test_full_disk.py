"""A full disk during a fit: a one-line error, no temporary file left, and the last good
checkpoint resumes to the uninterrupted result. The real test fills a small tmpfs mounted in a
user and mount namespace (skipped where the kernel refuses one); the others make the
checkpoint's write fail part-way in process."""

import errno
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _tables import write_rasch_csv

from engine.api import fit
from engine.cli import main
from engine.errors import SettingsError
from engine.infer.checkpoint import CHECKPOINT_FILE, Checkpointer, remove_leftovers
from engine.infer.settings import FitSettings
from engine.run import load_run

CLI = [sys.executable, "-m", "engine.cli"]
FIT = ["--model", "2pl", "--quiet", "--seed", "4", "--max-passes", "30", "--tol", "1e-12",
       "--checkpoint-every", "2", "--draws", "100", "--ability-factor", "gaussian"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disk")
    write_rasch_csv(tmp / "r.csv", 300, 40, seed=8)
    assert main(["ingest", str(tmp / "r.csv"), "--out", str(tmp / "s")]) == 0
    return tmp / "s"


def _settings(max_passes):
    return FitSettings(max_passes=max_passes, min_passes=min(10, max_passes), tol=1e-12, seed=4,
                       checkpoint_every=2,
                       ability_factor="gaussian", progress=False)


def _namespaces_work(tmp) -> bool:
    (tmp / "probe").mkdir()
    cmd = f"mount -t tmpfs -o size=64k tmpfs {tmp / 'probe'} && touch {tmp / 'probe' / 'x'}"
    try:
        res = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", cmd],
                             capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def test_full_disk_mid_fit_keeps_the_last_checkpoint_and_resume_equals_a_whole_fit(store, tmp_path):
    if shutil.which("unshare") is None or not _namespaces_work(tmp_path):
        pytest.skip("no user+mount namespace here to mount a small tmpfs in")
    # the size of a checkpoint once the Polyak window is full (same model, data and settings)
    fit(store, "2pl", _settings(12), checkpoint_dir=tmp_path / "probe_fit")
    size = json.loads((tmp_path / "probe_fit" / CHECKPOINT_FILE).read_text())["arrays_bytes"]
    # room for one checkpoint and half of the next: the first save succeeds, a later one
    # (old arrays kept until the new ones are complete) runs out of space part-way
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    kilobytes = (size + size // 2) // 1024 + 16
    script = (f"mount -t tmpfs -o size={kilobytes}k tmpfs {disk} || exit 99\n"
              f"{' '.join(CLI)} fit {store} --out {disk / 'run'} {' '.join(FIT)} 2> {tmp_path / 'err'}\n"
              f"echo $? > {tmp_path / 'rc'}\n"
              f"ls -A {disk / 'run'} > {tmp_path / 'listing'}\n"
              f"cp -a {disk / 'run'} {kept}\n")
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                   check=True, timeout=300)
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "No space left on device" in err and "free some disk space" in err
    listing = sorted((tmp_path / "listing").read_text().split())
    assert len(listing) == 2 and listing[0].startswith("checkpoint-") and listing[1] == CHECKPOINT_FILE
    assert json.loads((kept / CHECKPOINT_FILE).read_text())["passes"] >= 2
    # the checkpoint left behind resumes (on a disk with room) to the uninterrupted fit
    res = subprocess.run(CLI + ["fit", str(store), "--out", str(kept), *FIT, "--resume"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    whole = subprocess.run(CLI + ["fit", str(store), "--out", str(tmp_path / "whole"), *FIT],
                           capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    a, b = load_run(tmp_path / "whole"), load_run(kept)
    np.testing.assert_array_equal(a.subjects["ability_mean"], b.subjects["ability_mean"])
    np.testing.assert_array_equal(a.items["difficulty_mean"], b.items["difficulty_mean"])


@pytest.fixture(scope="module")
def progress(store, tmp_path_factory):
    """Two checkpoints' worth of real fit progress (passes 2 and 4)."""
    out = tmp_path_factory.mktemp("progress")
    saved = []

    class Keep(Checkpointer):
        def save(self, p):  # a snapshot: the fit goes on appending to its trace list
            saved.append(p._replace(trace=list(p.trace), recent=list(p.recent)))
            return super().save(p)

    import engine.api as api

    real = api.Checkpointer
    api.Checkpointer = Keep
    try:
        fit(store, "2pl", _settings(4), checkpoint_dir=out)
    finally:
        api.Checkpointer = real
    fingerprint = json.loads((out / CHECKPOINT_FILE).read_text())["fingerprint"]
    return saved, fingerprint


@pytest.mark.parametrize("failing_write, same_pass", [(1, False), (2, False), (2, True)])
def test_a_checkpoint_write_that_fails_part_way_leaves_the_previous_one(
        progress, tmp_path, monkeypatch, failing_write, same_pass):
    # failing write 1: the arrays, 2: checkpoint.json; same_pass: the pass saved last, again
    (first, second), fingerprint = progress
    if same_pass:
        second = second._replace(trace=first.trace)
    ckpt = Checkpointer(tmp_path, 2, fingerprint)
    ckpt.save(first)
    before = sorted(os.listdir(tmp_path))
    real, calls = os.fsync, []

    def full(fd):  # the data went out part-way, then the disk filled
        calls.append(fd)
        if len(calls) == failing_write:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(second)
    monkeypatch.setattr(os, "fsync", real)
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file, no orphan arrays
    loaded = ckpt.load(first.state)
    assert len(loaded.trace) == len(first.trace)
    np.testing.assert_array_equal(loaded.state.guide.loc["ability"], first.state.guide.loc["ability"])
    ckpt.save(second)  # once there is room again, the next save works
    again = ckpt.load(first.state)
    assert len(again.trace) == len(second.trace)
    np.testing.assert_array_equal(again.state.guide.loc["ability"], second.state.guide.loc["ability"])


def test_leftovers_of_a_killed_checkpoint_writer_are_removed(progress, tmp_path):
    (first, _), fingerprint = progress
    ckpt = Checkpointer(tmp_path, 2, fingerprint)
    ckpt.save(first)
    stale = [tmp_path / ".checkpoint-000004-00ff00ff.npz.tmp-0123abcd",
             tmp_path / ".checkpoint.json.tmp-deadbeef"]
    for f in stale:
        f.write_bytes(b"half")
    mine = tmp_path / ".checkpoint.json.tmp-notours"  # not a name the writer makes: kept
    mine.write_text("x")
    assert sorted(remove_leftovers(tmp_path)) == sorted(stale)
    assert mine.exists() and all(not f.exists() for f in stale)


def test_a_damaged_or_escaping_checkpoint_is_refused(progress, tmp_path):
    (first, _), fingerprint = progress
    ckpt = Checkpointer(tmp_path / "run", 2, fingerprint)
    ckpt.save(first)
    info = json.loads((tmp_path / "run" / CHECKPOINT_FILE).read_text())
    arrays = tmp_path / "run" / info["arrays"]
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 0x04
    arrays.write_bytes(bytes(data))
    with pytest.raises(SettingsError, match=f"{info['arrays']} is damaged"):
        ckpt.load(first.state)
    shutil.copy(arrays, tmp_path / "x.npz")
    (tmp_path / "run" / CHECKPOINT_FILE).write_text(json.dumps(info | {"arrays": "../x.npz"}))
    with pytest.raises(SettingsError, match="not a checkpoint-<pass>.npz"):
        ckpt.load(first.state)
    assert (tmp_path / "x.npz").exists()
