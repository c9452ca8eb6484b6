"""The runner on a real multi-node local Ray cluster (every process on 127.0.0.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from cluster.runner import run_trials
from cluster.settings import RunnerSettings, StabilitySettings
from cluster.stability import plan
from cluster.trials import stability_batch
from tests.cluster.conftest import ingest_simulated, is_loopback, simulate_2pl

REPO = Path(__file__).resolve().parents[2]
SETTINGS = StabilitySettings(sizes=(10, 30), trials_per_size=4)
RAY = RunnerSettings(backend="ray", batch_size=2, progress=False)
INPROCESS = RAY.replace(backend="inprocess")


@pytest.fixture(scope="module")
def reference(stability_ctx, tmp_path_factory):
    trials = plan(SETTINGS, 120)
    out = tmp_path_factory.mktemp("ref") / "s.parquet"
    return trials, run_trials(stability_batch, stability_ctx, trials, out, INPROCESS)


def test_every_ray_process_listens_on_loopback_only(ray_cluster):
    started = ray_cluster.started_listeners
    assert len(started) >= 3  # gcs, raylets, object managers at least
    assert all(is_loopback(host) for host, _ in started), started


def test_ray_run_equals_inprocess_run(ray_cluster, stability_ctx, reference, tmp_path):
    trials, ref = reference
    got = run_trials(stability_batch, stability_ctx, trials, tmp_path / "s.parquet", RAY)
    pd.testing.assert_frame_equal(got, ref)


def _kill_a_running_batch(killed: list, timeout_s: float = 120.0) -> None:
    """Wait for a worker process that is running a batch, and SIGKILL it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] and p.info["cmdline"][0].startswith("ray::run_batch"):
                os.kill(p.pid, signal.SIGKILL)
                killed.append(p.pid)
                return
        time.sleep(0.02)


def test_node_removed_and_worker_killed_mid_run_yield_every_trial_once(
        ray_cluster, stability_ctx, tmp_path):
    settings = StabilitySettings(sizes=(10, 30), trials_per_size=8)
    trials = plan(settings, 120)
    ref = run_trials(stability_batch, stability_ctx, trials, tmp_path / "ref.parquet", INPROCESS)
    killed, killer = [], []

    def chaos(n_done):
        if n_done == 1:
            ray_cluster.remove_node(ray_cluster.worker_node, allow_graceful=False)
            killer.append(threading.Thread(target=_kill_a_running_batch, args=(killed,)))
            killer[0].start()

    try:
        got = run_trials(stability_batch, stability_ctx, trials, tmp_path / "s.parquet",
                         RAY.replace(max_in_flight=2), on_batch=chaos)
    finally:
        ray_cluster.worker_node = ray_cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        for t in killer:
            t.join()
    assert killed, "no running batch process found to kill"
    counts = got.groupby(["trial_group", "trial_index"]).size()
    assert sorted(counts.index) == sorted(t.key for t in trials) and (counts == 2).all()
    pd.testing.assert_frame_equal(got, ref)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    return ingest_simulated(tmp_path_factory.mktemp("store"), 24, 120, seed=3, name="store")


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "engine.cli", *map(str, args)]


def _stability_args(store, out):
    return ["stability", store, "--out", out, "--sizes", "10", "--trials-per-size", "2",
            "--batch-size", "2", "--passes", "12", "--quiet"]


def test_embedded_default_starts_a_loopback_ray_without_dashboard(small_store, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(home),
               JAX_COMPILATION_CACHE_DIR=os.environ.get("JAX_COMPILATION_CACHE_DIR")
               or str(Path.home() / ".cache" / "irt-engine" / "jax"))
    proc = psutil.Popen(_cli(*_stability_args(small_store, tmp_path / "st"), "--num-cpus", "1"),
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, cmdlines = set(), set()
    while proc.poll() is None:
        try:
            for child in proc.children(recursive=True):
                cmdlines.add(" ".join(child.cmdline()))
                for c in child.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        seen.add((c.laddr.ip, c.laddr.port))
        except psutil.Error:
            pass
        time.sleep(0.2)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    # Quiet and safe: Ray starts before JAX's threads (no fork warning), with a token of its
    # own (no token warning, nothing written to ~/.ray), and its log lines stay off.
    assert err.strip() == "", err[-3000:]
    assert not (home / ".ray").exists()
    assert any("gcs_server" in c for c in cmdlines), "the command did not start its own Ray"
    assert seen and all(is_loopback(h) for h, _ in seen), seen
    # No dashboard UI: Ray's internal head process runs with its frontend disabled, and
    # nothing listens on the dashboard port.
    dashboards = [c for c in cmdlines if "dashboard/dashboard.py" in c]
    assert all("--disable-frontend" in c for c in dashboards), dashboards
    assert all(port != 8265 for _, port in seen)
    rows = pd.read_parquet(tmp_path / "st" / "stability.parquet")
    assert len(rows) == 2 * 2
    assert (tmp_path / "st" / "stability.png").stat().st_size > 1000


def test_address_joins_the_given_cluster_unchanged(ray_cluster, small_store, tmp_path):
    import ray

    before = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(_cli(*_stability_args(small_store, tmp_path / "st"),
                               "--address", ray_cluster.address),
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]) == before
    assert len(pd.read_parquet(tmp_path / "st" / "stability.parquet")) == 4


def test_dimensions_on_ray_finds_the_known_number_of_skills(ray_cluster, tmp_path):
    from cluster.dimensions import run_dimensions
    from cluster.settings import DimensionsSettings
    from tests.engine.readout.test_dimensions import simulate_mirt

    y = simulate_mirt(300, 150, 2, seed=12)
    res = run_dimensions(y, tmp_path, DimensionsSettings(shuffles=40, num_eigenvalues=8),
                         RAY.replace(batch_size=10))
    assert res.summary["n_factors"] == 2, res.summary["details"]
    table = pd.read_parquet(tmp_path / "eigenvalues.parquet")
    assert list(table.columns[:5]) == ["index", "observed", "residual", "envelope_mean", "envelope_q95"]
    assert len(pd.read_parquet(tmp_path / "shuffles.parquet")) == 40 * 8
    assert (tmp_path / "scree.png").stat().st_size > 1000
    # Shuffles on Ray equal shuffles in-process with the same seeds.
    local = run_dimensions(y, tmp_path / "local", DimensionsSettings(shuffles=40, num_eigenvalues=8),
                           INPROCESS.replace(batch_size=10))
    pd.testing.assert_frame_equal(local.table, res.table)


def test_adaptive_trials_on_ray_equal_inprocess(ray_cluster, tmp_path):
    from cluster.adaptive import run_adaptive
    from engine.api import fit
    from engine.infer.settings import FitSettings
    from engine.readout.adaptive import AdaptiveTrialSpec
    from engine.run import save_run

    from engine.data import ingest

    y = simulate_2pl(40, 80, seed=5)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(y.shape[1])])
    df.insert(0, "subject", [f"s{i}" for i in range(y.shape[0])])
    df.to_csv(tmp_path / "wide.csv", index=False)
    store = ingest(tmp_path / "wide.csv", tmp_path / "store")
    run = save_run(fit(store, "2pl", FitSettings(seed=0)), tmp_path / "run", num_draws=100)
    spec = AdaptiveTrialSpec(run=str(run.path), checkpoints=(1, 5, 20), seed=1)
    got = run_adaptive(run.path, tmp_path / "ray", spec, 6, RAY.replace(batch_size=2))
    ref = run_adaptive(run.path, tmp_path / "local", spec, 6, INPROCESS.replace(batch_size=2))
    pd.testing.assert_frame_equal(got.trials, ref.trials)
    assert len(got.trials) == 6 * 5 * 3
    tau = got.summary.set_index(["strategy", "num_items"])["tau_mean"]
    assert tau["fisher", 20] > tau["fisher", 1]  # more items rank the held-out subjects better
    assert (tmp_path / "ray" / "adaptive.png").stat().st_size > 1000
