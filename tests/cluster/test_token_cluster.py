"""A user's cluster: `ray start --head` plus a second node, token authentication on, every
process on 127.0.0.1. irt-engine submits to it, joins it with --address, survives losing the
second node mid-run, and says in one line what is missing when it has no token."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tests.cluster.conftest import ingest_simulated, is_loopback
from tests.cluster.raycluster import listeners_of, two_node_cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from two_node_cluster(tmp_path_factory.mktemp("raycluster"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_simulated(tmp_path_factory.mktemp("store"), 24, 60, seed=3, name="store.zarr")


def _env(cluster, *, token: bool) -> dict:
    """A user's shell: the cluster's token in RAY_AUTH_TOKEN, or no token anywhere."""
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(cluster.root / "client-home")  # no ~/.ray/auth_token there
    Path(env["HOME"]).mkdir(exist_ok=True)
    if token:
        env["RAY_AUTH_TOKEN"] = cluster.token
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # irt-engine keeps loopback itself
    return env


def _cli(*args, env, cwd=None, timeout=400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _stability(store, out, *extra):
    return ["stability", store, "--out", out, "--sizes", "10", "--trials-per-size", "4",
            "--batch-size", "1", "--passes", "6", "--quiet", *extra]


def test_every_process_of_both_nodes_listens_on_loopback_only(cluster):
    head, worker = cluster.processes("head"), cluster.processes("worker")
    assert head and worker
    found = listeners_of({p.pid for p in head + worker})
    ports = {port for _, port in found}
    assert cluster.port in ports and cluster.dashboard_port in ports
    assert len(found) >= 6 and all(is_loopback(h) for h, _ in found), found


def test_submit_a_fit_with_the_token_and_read_the_run_back(cluster, store, tmp_path):
    env = _env(cluster, token=True)
    run = tmp_path / "run"
    proc = _cli("submit", "--address", cluster.dashboard, "--python", sys.executable, "--",
                "fit", store, "--out", run, "--quiet", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shipped = [line for line in proc.stderr.splitlines() if line.startswith("submit: shipping")]
    assert shipped and "shipping 0 files" in shipped[0] and f"in place on the cluster: {store}" \
        in shipped[0], proc.stderr[-2000:]
    assert "2pl NUTS " in proc.stdout, proc.stdout[-2000:]  # fewer than 30 subjects: NUTS first
    from engine.run import load_run

    loaded = load_run(run)
    assert len(loaded.subjects) == 24 and len(loaded.items) == 60
    assert "WARNING" not in proc.stderr and "INFO dashboard_sdk" not in proc.stderr


def test_submit_ships_a_relative_store_and_refuses_a_relative_out(cluster, store, tmp_path):
    import shutil

    env = _env(cluster, token=True)
    shutil.copytree(store, tmp_path / "data.zarr")
    (tmp_path / "data.zarr" / ".env").write_text("SECRET=1\n")
    (tmp_path / "data.zarr" / "id_rsa").write_text("key\n")
    os.symlink("/etc/hostname", tmp_path / "data.zarr" / "leak")
    proc = _cli("submit", "--address", cluster.dashboard, "--", "fit", "data.zarr", "--out",
                "run", env=env, cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "--out run is a relative path" in proc.stderr and str(tmp_path / "run") in proc.stderr
    assert not (tmp_path / "run").exists()
    proc = _cli("submit", "--address", cluster.dashboard, "--python", sys.executable, "--",
                "fit", "data.zarr", "--out", tmp_path / "run", "--quiet", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shipped = [line for line in proc.stderr.splitlines() if line.startswith("submit: shipping")]
    assert len(shipped) == 1 and "(data.zarr)" in shipped[0], proc.stderr[-2000:]
    for skipped in ("credentials 1 (data.zarr/id_rsa)", "dot-files 1 (data.zarr/.env)",
                    "symlinks leading outside 1 (data.zarr/leak)"):
        assert skipped in shipped[0], shipped[0]
    assert len(pd.read_parquet(tmp_path / "run" / "subjects.parquet")) == 24


def test_stability_with_address_joins_the_token_cluster(cluster, store, tmp_path):
    proc = _cli(*_stability(store, tmp_path / "st", "--address", cluster.address),
                env=_env(cluster, token=True))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-2000:]  # no Ray chatter, no fork warnings
    assert len(pd.read_parquet(tmp_path / "st" / "stability.parquet")) == 4 * 2


def test_no_token_is_one_clear_line_and_nothing_written(cluster, store, tmp_path):
    env = _env(cluster, token=False)
    proc = _cli("submit", "--address", cluster.dashboard, "--", "fit", store, "--out",
                tmp_path / "run", env=env, timeout=120)
    home = Path(env["HOME"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"irt-engine submit: error: the Ray cluster at {cluster.dashboard} requires an "
        "authentication token and none was found (looked in RAY_AUTH_TOKEN: unset; "
        f"RAY_AUTH_TOKEN_PATH: unset; {home}/.ray/auth_token: no such file); run `ray "
        "get-auth-token` on the cluster's head node and set RAY_AUTH_TOKEN to what it prints "
        "(or save it to ~/.ray/auth_token, or name its file in RAY_AUTH_TOKEN_PATH)"]
    proc = _cli(*_stability(store, tmp_path / "st", "--address", cluster.address), env=env,
                timeout=180)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"irt-engine stability: error: the Ray cluster at {cluster.address} requires an "
        "authentication token and none was found"), proc.stderr[-2000:]
    # A wrong token is named as such.
    proc = _cli("submit", "--address", cluster.dashboard, "--", "fit", store, "--out",
                tmp_path / "run", env={**env, "RAY_AUTH_TOKEN": "0" * 64}, timeout=120)
    assert proc.returncode == 2 and "rejected the authentication token from RAY_AUTH_TOKEN" \
        in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "st").exists()
    assert not (home / ".ray").exists()


@pytest.mark.slow  # about two minutes on two cores
def test_losing_the_second_node_mid_run_lands_every_trial_once(cluster, store, tmp_path):
    """Last in this module: the second node stays down afterwards."""
    from cluster.settings import RunnerSettings, StabilitySettings
    from cluster.stability import run_stability

    out = tmp_path / "st"
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", *map(str, _stability(
            store, out, "--address", cluster.address, "--max-in-flight", "2"))],
        env=_env(cluster, token=True), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parts = out / ".stability.parquet.parts"
    killed, deadline = 0, time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        done = len(list(parts.glob("part-*.parquet"))) if parts.is_dir() else 0
        running = [p for p in cluster.processes("worker")
                   if _cmdline(p).startswith("ray::run_batch")]
        if done >= 1 and running:
            killed = cluster.kill_node("worker")
            break
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=400)
    assert killed, "the second node never ran a batch while the run was under way"
    assert proc.returncode == 0, stderr[-3000:]
    got = pd.read_parquet(out / "stability.parquet")
    counts = got.groupby(["trial_group", "trial_index"]).size()
    assert len(counts) == 4 and (counts == 2).all()
    ref = run_stability(store, tmp_path / "ref", StabilitySettings(
        sizes=(10,), trials_per_size=4, passes=6), RunnerSettings(
        backend="inprocess", batch_size=1, progress=False))
    pd.testing.assert_frame_equal(got, ref.trials)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""
