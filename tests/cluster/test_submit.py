"""`irt-engine submit`: a command as a Ray job on a real local cluster with a job server."""

from __future__ import annotations

import io
import os
import socket
import sys
from pathlib import Path

import pandas as pd
import pytest

from cluster.submit import entrypoint, submit
from engine.errors import SettingsError
from tests.cluster.conftest import is_loopback, listeners

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def job_cluster():
    """A one-node cluster whose dashboard (the Ray job server) listens on 127.0.0.1 only."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    before = listeners()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": True,
        "dashboard_host": "127.0.0.1", "dashboard_port": _free_port(),
        # The job agent's default port (52365) may be held by another Ray on this machine.
        "dashboard_agent_listen_port": _free_port()})
    cluster.started_listeners = listeners() - before
    yield cluster
    cluster.shutdown()


def test_entrypoint_runs_the_shipped_cli():
    assert entrypoint(["irt-engine", "fit", "s", "--out", "r x"], "/usr/bin/python3") == \
        "/usr/bin/python3 -m engine.cli fit s --out 'r x'"
    with pytest.raises(SettingsError, match="nothing to submit"):
        entrypoint([])
    with pytest.raises(SettingsError, match="cannot itself be"):
        entrypoint(["submit", "--", "fit"])


def test_submit_runs_a_command_as_a_job_and_returns_its_status(job_cluster, tmp_path):
    assert all(is_loopback(h) for h, _ in job_cluster.started_listeners)
    address = f"http://{job_cluster.webui_url}"
    table = tmp_path / "long.csv"
    pd.DataFrame({"subject": ["a", "a", "b", "b"], "item": ["x", "y", "x", "y"],
                  "response": [1, 0, 1, 1]}).to_csv(table, index=False)
    logs = io.StringIO()
    code = submit(["irt-engine", "ingest", str(table), "--out", str(tmp_path / "store")],
                  address=address, working_dir=REPO, python=sys.executable, out=logs)
    assert code == 0, logs.getvalue()
    assert "2 subjects x 2 items" in logs.getvalue()
    assert (tmp_path / "store").is_dir()
    # A failing command fails the job, and its exit status comes back.
    logs = io.StringIO()
    code = submit(["ingest", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "s2")],
                  address=address, working_dir=REPO, python=sys.executable, out=logs)
    assert code == 2, logs.getvalue()
    assert "missing.csv" in logs.getvalue()


def test_submit_to_no_job_server_is_a_clear_error(capsys):
    from engine.cli import main

    assert main(["submit", "--address", "http://127.0.0.1:9", "--", "fit", "s", "--out", "r"]) == 2
    assert "no Ray job server at http://127.0.0.1:9" in capsys.readouterr().err
