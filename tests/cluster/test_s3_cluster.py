"""`submit -- fit` on a two-node token cluster (`ray start`, 127.0.0.1) with the store and the
run on an S3-compatible server (moto, 127.0.0.1): the job reads s3://bkt/store.zarr and writes
s3://bkt/run, and `leaderboard` reads that run here; the same through gs:// against a GCS
emulator on 127.0.0.1 where gcsfs and the emulator are installed. Slow: it starts its own
cluster."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("moto")
pytest.importorskip("s3fs")

from tests.cluster.raycluster import two_node_cluster  # noqa: E402
from tests.cluster.s3server import S3Server  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    try:
        server.make_bucket("bkt")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gcs():
    """A GCS emulator, or None where gcsfs or the emulator is not installed."""
    if importlib.util.find_spec("gcsfs") is None or \
            importlib.util.find_spec("gcp_storage_emulator") is None:
        yield None
        return
    from tests.cluster.gcsserver import GCSServer

    server = GCSServer()
    try:
        server.make_bucket("bkt")
        yield server
    finally:
        server.stop()


def _storage_env(s3, gcs, base: dict) -> dict:
    return s3.env(gcs.env(base) if gcs is not None else base)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3, gcs):
    # the nodes' environment carries the credentials and endpoints, as on a cloud cluster
    yield from two_node_cluster(tmp_path_factory.mktemp("raycluster"),
                                **_storage_env(s3, gcs, {}))


def _cli(*args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)],
                          env=dict(env, PYTHONPATH=str(REPO)), cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_submit_fit_reads_and_writes_the_object_store(scheme, cluster, s3, gcs, tmp_path,
                                                       monkeypatch):
    import numpy as np
    import pandas as pd

    from tests.cluster.conftest import simulate_2pl

    if scheme == "gs" and gcs is None:
        pytest.skip("needs gcsfs and gcp-storage-emulator")
    y = simulate_2pl(24, 60, seed=3)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(60)])
    df.insert(0, "model", [f"m{i}" for i in range(24)])
    df.to_csv(tmp_path / "r.csv", index=False)
    env = _storage_env(s3, gcs, {k: v for k, v in cluster.env.items()
                                 if not k.startswith("RAY_AUTH")})
    env["RAY_AUTH_TOKEN"] = cluster.token
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    store, out = f"{scheme}://bkt/store.zarr", f"{scheme}://bkt/run"
    proc = _cli("ingest", tmp_path / "r.csv", "--out", store, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _cli("submit", "--address", cluster.dashboard, "--python", sys.executable, "--",
                "fit", store, "--out", out, "--quiet", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"uploaded {out}" in proc.stdout, proc.stdout[-2000:]
    assert not list(tmp_path.glob(f"{scheme}*"))  # nothing under a path named like the URL
    board = _cli("leaderboard", out, "--top-k", "24", env=env, cwd=tmp_path)
    assert board.returncode == 0, board.stderr[-2000:]
    assert all(f" m{i} " in board.stdout for i in range(24))
    from engine.run import load_run

    for key, value in _storage_env(s3, gcs, {}).items():
        monkeypatch.setenv(key, value)
    run = load_run(out)
    assert run.info["data"]["store"] == store
    assert np.isfinite(run.subjects["ability_mean"]).all()


def test_stability_with_address_reads_trial_items_from_s3(cluster, s3, tmp_path, monkeypatch):
    """Under a budget smaller than the matrix, the trial tasks on both nodes read the items
    they sample from the S3 store; every trial lands once and the result is uploaded."""
    import pandas as pd

    from tests.cluster.conftest import simulate_2pl
    from engine.data.store import write_store

    for key, value in s3.env({}).items():
        monkeypatch.setenv(key, value)
    y = simulate_2pl(24, 60, seed=4)
    write_store(y, [f"m{i}" for i in range(24)], [f"q{j}" for j in range(60)],
                "s3://bkt/stab.zarr")
    env = s3.env({k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")})
    env["RAY_AUTH_TOKEN"] = cluster.token
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    proc = _cli("stability", "s3://bkt/stab.zarr", "--out", "s3://bkt/stab", "--address",
                cluster.address, "--sizes", "10", "--trials-per-size", "4", "--batch-size", "1",
                "--passes", "6", "--quiet", "--memory-budget", "1K", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fs = s3.filesystem()
    with fs.open("bkt/stab/stability.parquet") as f:
        rows = pd.read_parquet(f)
    assert sorted(rows[rows["method"] == "irt"]["trial"]) == [0, 1, 2, 3]
    with fs.open("bkt/stab/stability.json") as f:
        info = json.load(f)
    assert info["data"]["trial_data"] == "read from the store per trial"
