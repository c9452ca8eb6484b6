"""kill -9 a real process at a chosen moment (tests of what a killed writer leaves)."""

import os
import signal
import time

import pytest


def kill_when(proc, ready, what: str, timeout: float = 180) -> None:
    """kill -9 ``proc`` (started with ``stderr=subprocess.PIPE, text=True``) as soon as
    ``ready()``. If it ended first, a clean exit skips (the machine was too quick to catch
    it) and any other exit fails with its stderr: a crash is never read as a skip."""
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        err = proc.stderr.read() if proc.stderr else ""
        if proc.returncode != 0:
            pytest.fail(f"the process exited {proc.returncode} before {what}:\n{err[-2000:]}")
        pytest.skip(f"the process finished before {what} on this machine")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stderr:
        proc.stderr.close()
