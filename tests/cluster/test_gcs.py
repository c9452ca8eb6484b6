"""Stores and runs at gs:// URLs against a GCS emulator on 127.0.0.1 (gcp-storage-emulator in
its own process; gcsfs pointed at it through ``STORAGE_EMULATOR_HOST``).

Commands run as real processes (``python -m engine.cli``): ingest to gs://bkt/store.zarr, fit
reading it and writing gs://bkt/run, leaderboard reading that run back; the run equals the
same fit from local disk. A missing bucket is one line and writes nothing.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

if importlib.util.find_spec("gcsfs") is None or \
        importlib.util.find_spec("gcp_storage_emulator") is None:
    pytest.skip("needs gcsfs and gcp-storage-emulator", allow_module_level=True)

from engine.data.remote import MARKER  # noqa: E402
from tests.cluster.conftest import simulate_2pl  # noqa: E402
from tests.cluster.gcsserver import GCSServer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gcs():
    with GCSServer().serving("bkt") as server:  # before gcsfs is imported here
        yield server


def _cli(*args, env, cwd) -> subprocess.CompletedProcess:
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)],
                          env=dict(env, PYTHONPATH=str(REPO), TMPDIR=str(cwd / "tmp")),
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_ingest_fit_leaderboard_through_gs_equal_the_local_fit(gcs, tmp_path):
    # the matrix of tests/engine/data/test_remote.py's s3:// round trip (12 x 20): whichever
    # runs second loads the fit's programs from the session's compilation cache
    y = simulate_2pl(12, 20, seed=5)
    df = pd.DataFrame(y, columns=[f"q{i}" for i in range(20)])
    df.insert(0, "system", [f"s{i}" for i in range(12)])
    df.to_csv(tmp_path / "r.csv", index=False)
    env = gcs.env()
    _ok(_cli("ingest", tmp_path / "r.csv", "--out", "gs://bkt/store.zarr", env=env,
             cwd=tmp_path))
    assert "bkt/store.zarr/zarr.json" in gcs.objects("bkt/store.zarr")
    _ok(_cli("fit", "gs://bkt/store.zarr", "--out", "gs://bkt/run", "--quiet",
             "--max-passes", "30", env=env, cwd=tmp_path))
    run_objects = gcs.objects("bkt/run")
    assert f"bkt/run/{MARKER}" in run_objects and "bkt/run/fit.json" in run_objects
    board = _ok(_cli("leaderboard", "gs://bkt/run", "--top-k", "12", env=env, cwd=tmp_path))
    assert all(f" s{i} " in board for i in range(12))
    assert not list((tmp_path / "tmp").iterdir())  # every private copy removed
    # the same fit from local disk in this process, and the gs:// run read back here
    from engine.cli import main
    from engine.run import load_run

    assert main(["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s.zarr")]) == 0
    assert main(["fit", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run"), "--quiet",
                 "--max-passes", "30"]) == 0
    remote, local = load_run("gs://bkt/run"), load_run(tmp_path / "run")
    assert remote.info["data"]["store"] == "gs://bkt/store.zarr"
    assert remote.info["data"]["checksum"] == local.info["data"]["checksum"]
    np.testing.assert_allclose(remote.subjects["ability_mean"], local.subjects["ability_mean"],
                               rtol=1e-5, atol=1e-5)


def test_a_missing_gs_bucket_is_one_line_and_writes_nothing(gcs, tmp_path):
    y = simulate_2pl(6, 5, seed=1)
    df = pd.DataFrame(y, columns=[f"q{i}" for i in range(5)])
    df.insert(0, "system", [f"s{i}" for i in range(6)])
    df.to_csv(tmp_path / "r.csv", index=False)
    res = _cli("ingest", tmp_path / "r.csv", "--out", "gs://no-such-bucket/store.zarr",
               env=gcs.env(), cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "bucket 'no-such-bucket' does not exist" in lines[0], res.stderr
    assert gcs.objects("no-such-bucket") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "tmp"]
    assert not list((tmp_path / "tmp").iterdir())
