"""Run a script in a fresh process with forced host CPU devices (the pmap path on CPU)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# XLA aborts a process whose CPU all-reduce waited 40 s for a device program that never
# arrived ("Expected 2 threads to join the rendezvous, but not all of them arrived on
# time"). Clean CI runs met it now and then on this 2-core machine (forced devices share
# XLA's thread pool), in programs unrelated to the change under test. That abort, and only
# that abort, is run once more; any other failure, a second abort or a wrong result fails.
_XLA_STUCK = "threads to join the rendezvous"


def run_with_devices(script: str, devices: int, *args: str,
                     scratch: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` with ``devices`` forced CPU devices; with ``scratch``, each try gets a new
    empty folder under it as its first argument, so a rerun never meets a stalled try's files."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    # three tries: at 2026-12-02's clean-clone run both of two stalled (2 devices on 2 cores,
    # the other test worker busy); the same test then passed alone in 24 s
    for attempt in (1, 2, 3):
        folder = []
        if scratch is not None:
            folder = [str(scratch / f"try{attempt}")]
            Path(folder[0]).mkdir(parents=True)
        proc = subprocess.run([sys.executable, "-c", script, *folder, *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 or _XLA_STUCK not in proc.stderr or attempt == 3:
            return proc
        print(f"XLA's CPU all-reduce stalled (attempt {attempt}); running the script again")
    return proc
