"""Run one benchmark job in a child Python process and measure it.

The parent writes the responses to a temporary ``.npy``; the child (a worker module run with
some virtualenv's python) loads them, fits, and writes ``result.json`` (scalars, incl. its own
fit-only ``wall_s``) plus ``estimates.npz`` (arrays).  The parent polls the child's ``VmHWM``
and reaps it with ``os.wait4`` so each job's peak RSS is its own, even on a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["peak_rss_gb", "run_worker", "write_worker_result", "timed_cli"]

# the child is polled at most this far apart, and at 1% of its elapsed time below that: a fixed
# 0.2 s poll rounded a 0.6 s process up to the next 0.2 s (mirt's LSAT7 read 0.60 / 0.80 s)
_POLL_S = 0.2
_POLL_MIN_S = 0.002


def timed_cli(args, env: dict, cwd=None, timeout: float = 3600) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds and result of one whole ``irt-engine`` command (``python -m engine.cli``)."""
    import sys

    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - t, proc


def peak_rss_gb(pid: int | str = "self") -> float | None:
    """Peak resident set size (VmHWM) of a process in GB (1e9 bytes), or None if gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def write_worker_result(out_dir: str | Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Child side: write scalars to result.json and arrays to estimates.npz."""
    out_dir = Path(out_dir)
    clean = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items() if v is not None}
    np.savez(out_dir / "estimates.npz", **clean)
    meta = dict(meta, child_peak_rss_gb=peak_rss_gb())
    (out_dir / "result.json").write_text(json.dumps(meta, default=float))


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int | None, float, float | None]:
    """Poll until exit or timeout; return (status or None, elapsed, max VmHWM seen)."""
    start, seen = time.perf_counter(), None
    while True:
        hwm = peak_rss_gb(proc.pid)
        if hwm is not None:
            seen = max(seen or 0.0, hwm)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            rss = usage.ru_maxrss * 1024 / 1e9
            return proc.returncode, time.perf_counter() - start, max(seen or 0.0, rss)
        if time.perf_counter() - start > timeout:
            return None, time.perf_counter() - start, seen
        time.sleep(min(_POLL_S, max(_POLL_MIN_S, 0.01 * (time.perf_counter() - start))))


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child's own process group (it was started in a new session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.wait4(proc.pid, 0)
    except ChildProcessError:
        pass


def _read_result(out_dir: Path) -> dict:
    """Load result.json and estimates.npz written by the child."""
    result = json.loads((out_dir / "result.json").read_text())
    npz = out_dir / "estimates.npz"
    if npz.exists():
        with np.load(npz) as data:
            result["estimates"] = {k: data[k] for k in data.files}
    return result


def run_worker(
    python: str,
    module_path: str | Path,
    job: str,
    responses: np.ndarray,
    *,
    timeout: float = 600.0,
    options: dict | None = None,
    env: dict | None = None,
    prefix: list[str] | None = None,
) -> dict:
    """Run ``python module_path JOB DATA.npy OUT_DIR OPTIONS_JSON`` and collect its result.

    Returns a dict with ``status`` ("ok", "timeout" or "failed"), ``process_s`` (whole child),
    ``peak_rss_gb`` (child's VmHWM), the child's own fields (``wall_s`` fit-only, ...) and
    ``estimates`` (dict of arrays) on success, or ``reason`` on failure.
    """
    with tempfile.TemporaryDirectory(prefix="irtbench-") as tmp:
        tmp_path = Path(tmp)
        data_file = tmp_path / "responses.npy"
        np.save(data_file, responses)
        cmd = [*(prefix or []), python, str(module_path), job, str(data_file), tmp,
               json.dumps(options or {})]
        with open(tmp_path / "log.txt", "w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
            code, elapsed, rss = _wait(proc, timeout)
            if code is None:
                _kill(proc)
            log.seek(0)
            tail = log.read()[-1500:].strip()
        base = dict(job=job, process_s=round(elapsed, 3), peak_rss_gb=rss)
        if code is None:  # the log's tail shows how far it got (if the child flushes it)
            return dict(base, status="timeout", reason=f"killed after {timeout:.0f} s",
                        log_tail=tail)
        if code != 0 or not (tmp_path / "result.json").exists():
            return dict(base, status="failed", reason=f"exit code {code}: {tail}")
        result = _read_result(tmp_path)
        return dict(base, status="ok", **result)
