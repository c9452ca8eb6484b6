"""A real Ray cluster from ``ray start``: a head plus worker nodes, all on 127.0.0.1.

Every process a node starts inherits a marker in its environment, so the cluster stops
exactly the processes it started (``ray stop`` would stop every Ray on the machine, other
users' and other tests' included). The nodes run with token authentication and their own
``HOME``, so nothing is read from or written to the real ``~/.ray``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
# `ray start` (Ray's own CLI entry point) with two changes that keep a worker node on
# loopback: see RayStartCluster.add_node.
RAY_START = [sys.executable, "-c", (
    "import sys\n"
    "from ray._private import ray_constants, services\n"
    "ray_constants.ENABLE_RAY_CLUSTER = True\n"
    "services.get_node_ip_address = lambda address=None: '127.0.0.1'\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv = ['ray', *sys.argv[1:]]\n"
    "main()\n"), "start"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listeners_of(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of the given processes (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            host, port = fields[3].rsplit(":", 1)
            found.add((host.strip("[]"), int(port)))
    return found


class RayStartCluster:
    """``ray start --head`` and ``ray start --address`` nodes with one CPU each."""

    def __init__(self, root: Path, *, env: dict[str, str] | None = None):
        self.root = Path(root)
        self.home = self.root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(32)
        self.marker = uuid.uuid4().hex
        # Unix socket paths must stay short: the session lives in a short folder under /tmp.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="irtray", dir="/tmp"))
        self.port, self.dashboard_port = free_port(), free_port()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("RAY_") or k == "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        self.env.update({"HOME": str(self.home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                         "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                         "RAY_USAGE_STATS_ENABLED": "0", **(env or {})})
        self.nodes: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, name: str, args: list[str], **env_changes: str) -> None:
        env = {**self.env, **env_changes, "IRT_TEST_RAY_NODE": f"{self.marker}:{name}"}
        log = self.root / f"ray-start-{name}.log"
        with open(log, "w") as f:  # not a pipe: Ray's daemons would hold it open
            proc = subprocess.run([*RAY_START, "--node-ip-address=127.0.0.1", "--num-cpus=1",
                                   f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
                                   f"--dashboard-agent-listen-port={free_port()}", *args],
                                  env=env, stdout=f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed: {log.read_text()[-2000:]}")
        self.nodes.append(name)

    def start_head(self) -> None:
        self._start("head", ["--head", f"--port={self.port}", "--dashboard-host=127.0.0.1",
                             f"--dashboard-port={self.dashboard_port}",
                             f"--ray-client-server-port={free_port()}"])

    def add_node(self, name: str) -> None:
        """``ray start --address=127.0.0.1:PORT``, kept on loopback.

        With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` that command refuses to start a second
        node; with ``=1`` it rewrites the loopback address to the machine's network address
        and dials the head there. So the same command runs with the switch at 0 (every
        process it starts keeps 127.0.0.1) and only its refusal lifted, and its node address
        pinned to 127.0.0.1.
        """
        self._start(name, [f"--address={self.address}"])

    def processes(self, name: str | None = None) -> list[psutil.Process]:
        """The live processes of node ``name`` (every node's when ``None``): those carrying
        the marker, and their descendants (Ray's agents and workers overwrite their
        environment with their process titles, but stay children of their raylet)."""
        want = f"{self.marker}:{name}" if name else None
        found = {}
        for p in psutil.process_iter():
            try:
                mark = p.environ().get("IRT_TEST_RAY_NODE", "")
            except psutil.Error:
                continue
            if mark.startswith(self.marker) and (want is None or mark == want):
                found[p.pid] = p
                try:
                    found.update((c.pid, c) for c in p.children(recursive=True))
                except psutil.Error:
                    pass
        return list(found.values())

    def kill_node(self, name: str) -> int:
        """SIGKILL every process of node ``name`` (a node lost without warning)."""
        procs = self.processes(name)
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        return len(procs)

    def wait_for_nodes(self, count: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run([RAY, "list", "nodes", "--address", self.address, "--format",
                                  "json"], env=self.env, capture_output=True, text=True).stdout
            if out.count('"ALIVE"') >= count:
                return
            time.sleep(1.0)
        raise RuntimeError(f"fewer than {count} Ray nodes came up in {timeout_s:.0f} s")

    def stop(self) -> None:
        """Terminate, then kill, exactly the processes this cluster started."""
        procs = self.processes()
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        # Ray's GCS server and autoscaler monitor ignore SIGTERM here (measured: still alive
        # after 15 s while every other process exits within a second), so a short grace
        # period, then SIGKILL, stops exactly the same processes without idling.
        _, alive = psutil.wait_procs(procs, timeout=3)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def two_node_cluster(root: Path, **env: str):
    """A started head plus one worker node under ``root`` with ``env`` (and the engine's
    compilation cache) in the nodes' environment; a generator for module fixtures: it yields
    the cluster and stops what it started."""
    from engine.compile_cache import compilation_cache_dir

    c = RayStartCluster(root, env={"JAX_COMPILATION_CACHE_DIR": compilation_cache_dir(), **env})
    try:
        c.start_head()
        c.add_node("worker")
        yield c
    finally:
        c.stop()
