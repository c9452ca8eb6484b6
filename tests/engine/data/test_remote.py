"""Stores and run directories at URLs, against a real S3-compatible server on 127.0.0.1
(moto in server mode, its own process) and ``file://``.

Commands run as real processes (``python -m engine.cli``) with a user's environment:
credentials and ``AWS_ENDPOINT_URL`` pointing at the local server, nothing else reachable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("moto")
pytest.importorskip("s3fs")

from engine.data.remote import MARKER, URL, as_location, is_url  # noqa: E402
from engine.errors import (DataFormatError, RunNotFoundError,  # noqa: E402
                           SettingsError, StoreExistsError, StoreNotFoundError)
from tests.cluster.conftest import simulate_2pl  # noqa: E402
from tests.cluster.s3server import S3Server  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3():
    with S3Server().serving("bkt") as server:  # the in-process calls read the same environment
        yield server


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    y = simulate_2pl(12, 20, seed=5)  # the shape of the stores below: one set of programs
    df = pd.DataFrame(y, columns=[f"q{i}" for i in range(y.shape[1])])
    df.insert(0, "system", [f"s{i}" for i in range(y.shape[0])])
    path = tmp_path_factory.mktemp("csv") / "responses.csv"
    df.to_csv(path, index=False)
    return path


def _cli(*args, env, cwd, timeout=300) -> subprocess.CompletedProcess:
    env = dict(env, PYTHONPATH=str(REPO), TMPDIR=str(cwd / "tmp"))
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _one_line_error(res: subprocess.CompletedProcess, match: str) -> None:
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert match in lines[0], lines[0]


def test_url_parsing():
    assert is_url("s3://b/x") and is_url("file:///tmp/x") and not is_url("dir/s3:x")
    assert as_location("file:///tmp/a/b") == Path("/tmp/a/b")
    url = as_location("s3://bkt/dir/store.zarr")
    assert isinstance(url, URL) and url.key == "bkt/dir/store.zarr" and url.name == "store.zarr"
    assert url / "zarr.json" == "s3://bkt/dir/store.zarr/zarr.json"
    with pytest.raises(SettingsError, match="unknown URL scheme 'ftp'"):
        as_location("ftp://host/x")
    with pytest.raises(SettingsError, match="absolute path"):
        as_location("file://relative/x")


def test_ingest_fit_leaderboard_through_s3_equal_the_local_fit(s3, csv, tmp_path):
    env = s3.env()
    _ok(_cli("ingest", csv, "--out", "s3://bkt/cli/store.zarr", env=env, cwd=tmp_path))
    assert "bkt/cli/store.zarr/zarr.json" in s3.objects("bkt/cli/store.zarr")
    _ok(_cli("fit", "s3://bkt/cli/store.zarr", "--out", "s3://bkt/cli/run", "--quiet",
             env=env, cwd=tmp_path))
    run_objects = s3.objects("bkt/cli/run")
    assert f"bkt/cli/run/{MARKER}" in run_objects and "bkt/cli/run/fit.json" in run_objects
    board = _ok(_cli("leaderboard", "s3://bkt/cli/run", "--top-k", "12", env=env, cwd=tmp_path))
    assert all(f" s{i} " in board for i in range(12))
    _one_line_error(_cli("fit", "s3://bkt/cli/store.zarr", "--out", "s3://bkt/cli/run",
                         "--quiet", env=env, cwd=tmp_path), "holds a finished run; pass --overwrite")
    assert not list((tmp_path / "tmp").iterdir())  # every private copy removed
    # the same input fitted from local disk (the same command, in this process) is the same run
    from engine.cli import main
    from engine.run import load_run

    assert main(["ingest", str(csv), "--out", str(tmp_path / "store.zarr")]) == 0
    assert main(["fit", str(tmp_path / "store.zarr"), "--out", str(tmp_path / "run"),
                 "--quiet"]) == 0
    remote, local = load_run("s3://bkt/cli/run"), load_run(tmp_path / "run")
    assert remote.info["data"]["store"] == "s3://bkt/cli/store.zarr"
    assert remote.info["data"]["checksum"] == local.info["data"]["checksum"]
    np.testing.assert_allclose(remote.subjects["ability_mean"], local.subjects["ability_mean"],
                               rtol=1e-5, atol=1e-5)
    # items reads the store the run recorded (a URL) and uploads its table
    assert main(["items", "s3://bkt/cli/run", "--out", "s3://bkt/cli/tables/items.csv"]) == 0
    assert s3.objects("bkt/cli/tables") == ["bkt/cli/tables/items.csv"]
    with s3.filesystem().open("bkt/cli/tables/items.csv") as f:
        assert len(pd.read_csv(f)) == 20
    # report: the page and its PNGs beside it, uploaded beside each other
    assert main(["report", "s3://bkt/cli/run", "--out", "s3://bkt/cli/page/report.html"]) == 0
    page = s3.objects("bkt/cli/page")
    assert "bkt/cli/page/report.html" in page and any(p.endswith(".png") for p in page)


def test_stability_on_an_s3_store_equals_the_local_run(s3, tmp_path):
    from engine.cli import main

    y, remote = _store(s3, "stab.zarr")
    from engine.data.store import write_store

    write_store(y, remote.subjects, remote.items, tmp_path / "store.zarr")
    # a budget under the matrix: the trials read the items they sample from the store (the URL)
    args = ["--sizes", "6", "--trials-per-size", "2", "--passes", "6", "--backend", "inprocess",
            "--quiet", "--memory-budget", "100"]
    assert main(["stability", "s3://bkt/stab.zarr", "--out", "s3://bkt/stab", *args]) == 0
    assert main(["stability", str(tmp_path / "store.zarr"), "--out", str(tmp_path / "out"),
                 *args]) == 0
    assert f"bkt/stab/{MARKER}" in s3.objects("bkt/stab")
    with s3.filesystem().open("bkt/stab/stability.parquet") as f:
        got = pd.read_parquet(f)
    want = pd.read_parquet(tmp_path / "out" / "stability.parquet")
    assert len(got) == 4  # two trials, two methods
    pd.testing.assert_frame_equal(got, want)
    with s3.filesystem().open("bkt/stab/stability.json") as f:
        assert json.load(f)["data"]["trial_data"] == "read from the store per trial"
    # a rerun into the same URL resumes from the uploaded trials: nothing is refitted
    assert main(["stability", "s3://bkt/stab.zarr", "--out", "s3://bkt/stab", *args]) == 0


def test_bad_urls_are_one_line_and_write_nothing(s3, csv, tmp_path):
    env = s3.env()
    before = s3.objects("bkt")
    _one_line_error(_cli("fit", "ftp://bkt/store.zarr", "--out", "s3://bkt/r", env=env,
                         cwd=tmp_path),
                    "unknown URL scheme 'ftp'")
    _one_line_error(_cli("ingest", csv, "--out", "s3://no-such-bucket/store.zarr", env=env,
                         cwd=tmp_path), "bucket 'no-such-bucket' does not exist")
    no_keys = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID",
                                                         "AWS_SECRET_ACCESS_KEY")}
    _one_line_error(_cli("ingest", csv, "--out", "s3://bkt/nokeys.zarr", env=no_keys,
                         cwd=tmp_path), "no credentials found; set AWS_ACCESS_KEY_ID")
    _one_line_error(_cli("leaderboard", "s3://bkt/nothing", env=env, cwd=tmp_path),
                    "s3://bkt/nothing: nothing there")
    _one_line_error(_cli("fit", "s3://bkt/nothing.zarr", "--out", "s3://bkt/r", env=env,
                         cwd=tmp_path), "s3://bkt/nothing.zarr: no such response store")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        _one_line_error(_cli("fit", "gs://bkt/s.zarr", "--out", "gs://bkt/r", env=env,
                             cwd=tmp_path),
                        "pip install 'irt-engine[gcs]'")
    assert s3.objects("bkt") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]
    assert not list((tmp_path / "tmp").iterdir())


def _store(s3, name: str, **kw):
    from engine.data.store import write_store

    y = simulate_2pl(12, 20, seed=1)
    return y, write_store(y, [f"s{i}" for i in range(12)], [f"i{j}" for j in range(20)],
                          f"s3://bkt/{name}", chunks=(4, 8), **kw)


def test_store_at_a_url_reads_back_and_checks_every_chunk(s3):
    from engine.data.store import open_store

    y, store = _store(s3, "crc.zarr")
    assert isinstance(store.path, URL)
    np.testing.assert_array_equal(open_store("s3://bkt/crc.zarr", verify=True).load(), y)
    with pytest.raises(StoreExistsError, match="already exists; pass --overwrite"):
        _store(s3, "crc.zarr")
    fs = s3.filesystem()
    chunk = "bkt/crc.zarr/responses/c/1/0"
    good = fs.cat_file(chunk)
    fs.pipe_file(chunk, good[:-1] + bytes([good[-1] ^ 0xFF]))  # damage the CRC-32C
    with pytest.raises(DataFormatError, match=f"s3://{chunk}: cannot decode it"):
        open_store("s3://bkt/crc.zarr").load()
    fs.rm_file(chunk)
    with pytest.raises(DataFormatError, match=f"s3://{chunk}: chunk file missing"):
        open_store("s3://bkt/crc.zarr")


def test_a_failed_write_leaves_nothing_at_the_url(s3):
    from engine.data.writer import DenseWriter

    with pytest.raises(RuntimeError, match="input broke"):
        with DenseWriter("s3://bkt/broken.zarr", ["a", "b"], ["x", "y"]) as writer:
            writer.write_rows(np.zeros((1, 2), np.int8))
            raise RuntimeError("input broke")
    assert s3.objects("bkt/broken.zarr") == []
    with pytest.raises(StoreNotFoundError, match="no such response store"):
        from engine.data.store import open_store

        open_store("s3://bkt/broken.zarr")


def test_streaming_fit_from_a_url_equals_the_fit_from_disk(s3, tmp_path):
    from engine.api import fit, make_source
    from engine.data.streaming import StreamingSource
    from engine.data.store import open_store, write_store
    from engine.infer.settings import FitSettings

    y, remote = _store(s3, "stream.zarr")
    local = write_store(y, remote.subjects, remote.items, tmp_path / "s.zarr", chunks=(4, 8))
    settings = FitSettings(memory_budget=64, max_block_cells=64, max_passes=10, progress=False)
    assert isinstance(make_source(open_store("s3://bkt/stream.zarr"), settings), StreamingSource)
    a = fit("s3://bkt/stream.zarr", "2pl", settings)
    b = fit(local.path, "2pl", settings)
    np.testing.assert_allclose(a.guide.loc["ability"], b.guide.loc["ability"], rtol=1e-6)
    assert a.extra["data"]["store"] == "s3://bkt/stream.zarr"


def test_a_run_without_its_completion_marker_is_not_read(s3, tmp_path):
    from engine.cli import main
    from engine.run import load_run

    _store(s3, "marker.zarr")
    assert main(["fit", "s3://bkt/marker.zarr", "--out", "s3://bkt/marker-run", "--quiet",
                 "--max-passes", "10"]) == 0
    assert load_run("s3://bkt/marker-run").subjects.shape[0] == 12
    s3.filesystem().rm_file(f"bkt/marker-run/{MARKER}")  # as if the upload had stopped there
    with pytest.raises(RunNotFoundError, match="an unfinished upload"):
        load_run("s3://bkt/marker-run")
    # --overwrite replaces it; a prefix holding other things is never removed
    assert main(["fit", "s3://bkt/marker.zarr", "--out", "s3://bkt/marker-run", "--quiet",
                 "--max-passes", "10", "--overwrite"]) == 0
    s3.filesystem().pipe_file("bkt/other/notes.txt", b"keep")
    assert main(["fit", "s3://bkt/marker.zarr", "--out", "s3://bkt/other", "--quiet",
                 "--overwrite"]) == 2
    assert s3.objects("bkt/other") == ["bkt/other/notes.txt"]


def test_file_urls_are_local_paths(tmp_path, capsys):
    from engine.cli import main
    from engine.data.store import open_store, write_store

    # the shape of the s3:// stores above (12 x 20), so the fit runs the programs they compiled
    y = simulate_2pl(12, 20, seed=2)
    write_store(y, [f"s{i}" for i in range(12)], [f"i{j}" for j in range(20)],
                f"file://{tmp_path}/f.zarr")
    np.testing.assert_array_equal(open_store(f"file://{tmp_path}/f.zarr").load(), y)
    assert main(["fit", f"file://{tmp_path}/f.zarr", "--out", f"file://{tmp_path}/run",
                 "--quiet", "--max-passes", "10"]) == 0
    assert (tmp_path / "run" / "fit.json").is_file()
    assert main(["leaderboard", f"file://{tmp_path}/run"]) == 0
    assert "s0" in capsys.readouterr().out


def test_kill_9_mid_fit_to_a_url_then_resume_equals_an_uninterrupted_fit(s3, tmp_path):
    """A fit to s3:// uploads each checkpoint; after a kill -9 (no local state survives: the
    process's private copy is lost with it), `--resume` continues from the uploaded one."""
    from engine.cli import main
    from engine.run import load_run

    y = simulate_2pl(2000, 300, seed=5)  # 30 passes, each uploading its checkpoint: a window
    df = pd.DataFrame(y, columns=[f"q{i}" for i in range(y.shape[1])])
    df.insert(0, "system", [f"s{i}" for i in range(y.shape[0])])
    df.to_csv(tmp_path / "r.csv", index=False)
    assert main(["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s.zarr")]) == 0
    args = ["fit", tmp_path / "s.zarr", "--model", "2pl", "--quiet", "--seed", "4",
            "--max-passes", "150", "--tol", "1e-12", "--checkpoint-every", "1", "--draws", "100",
            "--ability-factor", "gaussian"]  # the mean-field fit checkpoints
    _ok(_cli(*args, "--out", tmp_path / "whole", env=s3.env(), cwd=tmp_path))
    url, key = "s3://bkt/killed", "bkt/killed/checkpoint.json"
    env = dict(s3.env(), PYTHONPATH=str(REPO), TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *map(str, args), "--out", url],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    fs = s3.filesystem()  # one client for the polls: a new one per poll took 0.1-0.25 s

    def uploaded() -> bool:
        fs.invalidate_cache()
        return key in fs.find("bkt/killed")

    while not uploaded() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    if proc.poll() is not None:  # a crash fails; only a clean finish is too quick to catch
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
        pytest.skip("the fit finished before it could be killed on this machine")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = s3.objects("bkt/killed")
    assert key in left and f"bkt/killed/{MARKER}" not in left
    named = json.loads(s3.filesystem().cat_file(key))["arrays"]
    assert f"bkt/killed/{named}" in left  # the arrays checkpoint.json names were uploaded first
    # a kill between the new checkpoint.json and the removal of the arrays it replaced leaves
    # those too; the next upload (or the finished run) removes them
    assert sum(k.endswith(".npz") for k in left) <= 2
    _one_line_error(_cli(*args, "--out", url, env=s3.env(), cwd=tmp_path),
                    "holds the checkpoint of an unfinished fit; pass --resume")
    resumed = _cli(*args, "--out", url, "--resume", env=s3.env(), cwd=tmp_path)
    _ok(resumed)
    assert "found no checkpoint" not in resumed.stderr  # it continued the uploaded checkpoint
    a, b = load_run(tmp_path / "whole"), load_run(url)
    np.testing.assert_array_equal(a.subjects["ability_mean"], b.subjects["ability_mean"])
    np.testing.assert_array_equal(a.items["difficulty_mean"], b.items["difficulty_mean"])
    assert not any("checkpoint" in k for k in s3.objects("bkt/killed"))  # the run replaced it
