"""Run files carry checksums: every damaged, truncated or missing run file is a one-line error
naming it, through the library and the command line."""

import hashlib
import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from _tables import write_rasch_csv

from engine.cli import main
from engine.errors import RunDamagedError, RunNotFoundError, SettingsError
from engine.run import load_run
from engine.runfiles import read_table, write_table

CLI = [sys.executable, "-m", "engine.cli"]
FILES = ["fit.json", "subjects.parquet", "items.parquet", "guide.npz", "ability_draws.npz",
         "sheets.npz"]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checksums")
    write_rasch_csv(tmp / "r.csv", 40, 12, seed=3)
    assert main(["ingest", str(tmp / "r.csv"), "--out", str(tmp / "s")]) == 0
    assert main(["fit", str(tmp / "s"), "--out", str(tmp / "run"), "--model", "2pl", "--quiet",
                 "--max-passes", "20", "--draws", "200"]) == 0
    return tmp / "run"


@pytest.fixture
def run_copy(clean_run, tmp_path):
    shutil.copytree(clean_run, tmp_path / "run")
    return tmp_path / "run"


def _read_everything(path):
    run = load_run(path)
    run.pairwise()
    run.ability_draws()
    run.sheet_digests()
    return run


def _damage(path, how, rng):
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        at = int(rng.integers(len(data)))
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    elif how == "empty":
        path.write_bytes(b"")


def test_fit_json_records_every_run_file(clean_run):
    info = json.loads((clean_run / "fit.json").read_text())
    on_disk = {p.name for p in clean_run.iterdir()} - {"fit.json"}
    assert set(info["files"]) == on_disk == set(FILES) - {"fit.json"}
    for name, record in info["files"].items():
        data = (clean_run / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert info["format_version"] == 2 and len(info["fit_json_sha256"]) == 64


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("how", ["delete", "truncate", "flip", "empty"])
def test_each_damaged_run_file_is_named(run_copy, name, how):
    _damage(run_copy / name, how, np.random.default_rng(len(name)))
    error = RunNotFoundError if (name, how) == ("fit.json", "delete") else RunDamagedError
    with pytest.raises(error, match=f"{name}" + ("" if error is RunNotFoundError else ".*refit")):
        _read_everything(run_copy)


@pytest.mark.parametrize("name", FILES)
def test_any_single_byte_flip_is_caught(run_copy, name):
    # before checksums most flips in subjects.parquet / items.parquet read back as other numbers
    path = run_copy / name
    clean = path.read_bytes()
    rng = np.random.default_rng(7)
    for at in rng.choice(len(clean), size=min(40, len(clean)), replace=False):
        path.write_bytes(clean[:at] + bytes([clean[at] ^ (1 << int(rng.integers(8)))]) + clean[at + 1:])
        with pytest.raises(RunDamagedError, match=name):
            _read_everything(run_copy)
    path.write_bytes(clean)
    _read_everything(run_copy)


def test_parquet_pages_carry_their_own_checksums(tmp_path):
    values = np.random.default_rng(0).normal(size=64)  # incompressible: stored as written
    write_table(pd.DataFrame({"ability_mean": values}), tmp_path / "t.parquet")
    data = bytearray((tmp_path / "t.parquet").read_bytes())
    at = bytes(data).find(struct.pack("<d", values[10]))
    assert at > 0
    data[at + 3] ^= 0x10
    (tmp_path / "t.parquet").write_bytes(bytes(data))
    silently = pd.read_parquet(tmp_path / "t.parquet")["ability_mean"].to_numpy()
    assert silently[10] != values[10]  # without verification the flip reads back as a number
    with pytest.raises(OSError, match="(?i)crc|checksum"):
        pd.read_parquet(tmp_path / "t.parquet", page_checksum_verification=True)
    # the loader of a run from before fit.json checksums still catches it through the page CRC
    with pytest.raises(RunDamagedError, match="t.parquet"):
        read_table(tmp_path, {"format_version": 1}, "t.parquet")


def test_a_run_from_before_checksums_is_read_unverified(run_copy, clean_run):
    info = json.loads((run_copy / "fit.json").read_text())
    for key in ("files", "fit_json_sha256"):
        del info[key]
    (run_copy / "fit.json").write_text(json.dumps(info | {"format_version": 1}, indent=2))
    old, new = load_run(run_copy), load_run(clean_run)
    pd.testing.assert_frame_equal(old.subjects, new.subjects)
    np.testing.assert_array_equal(old.pairwise(), new.pairwise())
    (run_copy / "guide.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(RunDamagedError, match="guide.npz.*cannot decode"):
        load_run(run_copy)


def test_a_checksummed_run_stripped_of_its_record_is_damage(run_copy):
    info = json.loads((run_copy / "fit.json").read_text())
    del info["files"]  # would pass for a run from before checksums, but format 2 is sealed
    (run_copy / "fit.json").write_text(json.dumps(info, indent=2))
    with pytest.raises(RunDamagedError, match="fit.json"):
        load_run(run_copy)


@pytest.mark.parametrize("command, name, how", [
    ("leaderboard", "subjects.parquet", "flip"),
    ("leaderboard", "guide.npz", "delete"),
    ("items", "items.parquet", "truncate"),
    ("items", "fit.json", "flip"),
])
def test_cli_read_outs_name_the_damaged_file(run_copy, command, name, how):
    _damage(run_copy / name, how, np.random.default_rng(1))
    res = subprocess.run(CLI + [command, str(run_copy)], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith(f"irt-engine {command}: error: run file {run_copy / name}")
    assert "refit it" in lines[0] and not res.stdout


@pytest.mark.parametrize("ability_factor", ["gaussian", "quadrature"])
def test_save_run_returns_what_load_run_reads(tmp_path, ability_factor):
    """save_run hands back the run it wrote without reading it again: the same fit.json,
    guide and tables as load_run of the directory, value for value and dtype for dtype."""
    from engine.api import fit
    from engine.infer.settings import FitSettings
    from engine.run import save_run

    rng = np.random.default_rng(4)
    y = (rng.random((40, 12)) < 0.6).astype(np.int8)  # clean_run's shape: compiled programs
    y[3, 2] = -1
    res = fit(y, model="2pl", settings=FitSettings(ability_factor=ability_factor, max_passes=30))
    written = save_run(res, tmp_path / "run", num_draws=100)
    read = load_run(tmp_path / "run")
    assert written.info == read.info and written.path == read.path
    assert written.spec == read.spec
    for got, want in ((written.guide.loc, read.guide.loc),
                      (written.guide.log_scale, read.guide.log_scale)):
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype
            np.testing.assert_array_equal(got[k], want[k])
    pd.testing.assert_frame_equal(written.subjects, read.subjects)
    pd.testing.assert_frame_equal(written.items, read.items)


def test_a_changed_byte_that_parses_alike_is_damage(run_copy):
    """fit.json's checksum covers its parsed content, so the text must be as written too:
    a float's 17th digit changed to one that parses to the same number, a space added
    inside, or a format version a bit away (2 -> 0, read unverified before) is refused;
    line ends and a final newline are not."""
    import re

    path = run_copy / "fit.json"
    clean = path.read_text()
    same = None
    for m in re.finditer(r"-?\d+\.\d{12,}", clean):  # a long float whose last digit is slack
        token = m.group()
        for d in "0123456789":
            other = token[:-1] + d
            if other != token and float(other) == float(token):
                same = clean[:m.start()] + other + clean[m.end():]
                break
        if same:
            break
    assert same is not None and json.loads(same) == json.loads(clean)
    for text in (same, clean.replace("{", "{ ", 1),
                 clean.replace('"format_version": 2', '"format_version": 0', 1)):  # one bit
        path.write_bytes(text.encode())
        with pytest.raises(RunDamagedError, match="fit.json"):
            load_run(run_copy)
    # what a copy may change and JSON ignores is read: Windows line ends, a final newline
    for text in (clean.replace("\n", "\r\n"), clean + "\n", clean + "\r\n  \n"):
        path.write_bytes(text.encode())
        load_run(run_copy)
    path.write_bytes(clean.encode())
    load_run(run_copy)


def test_pairwise_is_counted_from_the_rank_draws_and_an_older_runs_file_is_read(run_copy):
    """A run counts P(beats) when asked, from the draws its rank statistics read (the same
    values for any subset); a run written with ``pairwise.npz`` is read from that file,
    checked against its checksum."""
    from engine import runfiles
    from engine.readout.ranking import pairwise_beats, rank_stats

    run = load_run(run_copy)
    assert not (run_copy / "pairwise.npz").exists()
    draws, groups = run.rank_draws()
    assert draws.shape == (200, 40)  # fit --draws 200
    # the draws are the table's: its rank statistics again, to the bit
    np.testing.assert_array_equal(rank_stats(draws, 3, groups=groups)["rank_mean"],
                                  run.subjects["rank_mean"])
    whole = run.pairwise()
    np.testing.assert_array_equal(whole, pairwise_beats(draws, groups=groups))
    ids = run.subjects["subject"].tolist()
    some = [ids[7], ids[0], ids[31]]
    np.testing.assert_array_equal(run.pairwise(some), whole[np.ix_([7, 0, 31], [7, 0, 31])])
    assert run.pairwise([]).shape == (0, 0)
    off = ~np.eye(40, dtype=bool)
    np.testing.assert_allclose(whole[off] + whole.T[off], 1.0, atol=1e-6)  # no ties
    with pytest.raises(SettingsError, match="nobody.*not subjects of run"):
        run.pairwise(["nobody", ids[0]])
    import engine.run

    engine.run.PAIRWISE_MAX_SUBJECTS, limit = 10, engine.run.PAIRWISE_MAX_SUBJECTS
    try:
        with pytest.raises(SettingsError, match="40 subjects.*pass the subjects"):
            run.pairwise()
        assert run.pairwise(some).shape == (3, 3)
    finally:
        engine.run.PAIRWISE_MAX_SUBJECTS = limit
    # a run written with the whole table in pairwise.npz reads it from there
    marked = np.arange(1600, dtype=np.float32).reshape(40, 40)
    runfiles.write_npz(run_copy / "pairwise.npz", p_beats=marked)
    runfiles.seal(run_copy, json.loads((run_copy / "fit.json").read_text()))
    older = load_run(run_copy)
    np.testing.assert_array_equal(older.pairwise(), marked)
    np.testing.assert_array_equal(older.pairwise(some), marked[np.ix_([7, 0, 31], [7, 0, 31])])
    _damage(run_copy / "pairwise.npz", "flip", np.random.default_rng(1))
    with pytest.raises(RunDamagedError, match="pairwise.npz"):
        load_run(run_copy).pairwise()
