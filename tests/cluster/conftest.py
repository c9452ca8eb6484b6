"""A real multi-node Ray cluster on this machine, every process bound to 127.0.0.1."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from cluster.trials import FitContext, StabilityContext, ability_of, subject_accuracy


def listeners() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket on the machine, from ``ss -ltn``."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        local = line.split()[3]
        host, port = local.rsplit(":", 1)
        found.add((host.strip("[]"), int(port)))
    return found


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "::ffff:127.0.0.1") or host.startswith("127.")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """Head plus one worker node (one CPU each) started with ``ray.cluster_utils.Cluster``."""
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax-cache")))
    from cluster.runner import loopback_only, worker_runtime_env

    # Also when an earlier test imported Ray: Ray reads the switch when it is imported, and
    # otherwise rewrites 127.0.0.1 in ray.init's address to the machine's network address.
    loopback_only()
    import ray
    from ray.cluster_utils import Cluster

    before = listeners()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, runtime_env=worker_runtime_env(), log_to_driver=False)
    cluster.wait_for_nodes()
    cluster.started_listeners = listeners() - before
    cluster.worker_node = worker
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def simulate_2pl(num_subjects: int, num_items: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=num_subjects)
    b = rng.normal(size=num_items)
    a = np.exp(rng.normal(0.0, 0.3, size=num_items))
    p = 1.0 / (1.0 + np.exp(-a * (theta[:, None] - b)))
    return (rng.random(p.shape) < p).astype(np.int8)


@pytest.fixture(scope="session")
def stability_ctx():
    """A small 2PL matrix with its full fit, the warm start of stability trials."""
    from engine.api import fit
    from engine.infer.settings import FitSettings

    y = simulate_2pl(24, 120, seed=3)
    settings = FitSettings(seed=0)
    full = fit(y, "2pl", settings)
    options = tuple(sorted(full.extra["model_options"].items()))
    return StabilityContext(FitContext(y, "2pl", options, full.guide, settings, passes=12),
                            ability_of(full.spec, full.guide.loc), subject_accuracy(y))


def ingest_simulated(directory, num_subjects: int, num_items: int, seed: int, name: str):
    """A simulated 2PL matrix written as a wide CSV in ``directory`` and ingested to ``name``."""
    import pandas as pd

    from engine.data import ingest

    y = simulate_2pl(num_subjects, num_items, seed=seed)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(y.shape[1])])
    df.insert(0, "subject", [f"s{i}" for i in range(y.shape[0])])
    df.to_csv(directory / "wide.csv", index=False)
    return ingest(directory / "wide.csv", directory / name).path

