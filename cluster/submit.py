"""``irt-engine submit -- COMMAND...``: any irt-engine command as a Ray job on a cluster.

The working directory travels in the job's runtime environment; the job runs
``python -m engine.cli COMMAND...`` there, its logs stream to this terminal, and the job's
outcome becomes the exit status (0 when it succeeded, the entrypoint's exit code when it
failed, 1 when it was stopped).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
import time
from pathlib import Path

from engine.errors import SettingsError

__all__ = ["submit", "entrypoint"]

EXCLUDES = [".venv", ".git", "**/__pycache__", "*.zarr", "benchmarks/results"]


def entrypoint(command: list[str], python: str = "python") -> str:
    """The shell command a job runs for ``irt-engine COMMAND...``."""
    if command and command[0] == "irt-engine":
        command = command[1:]
    if not command:
        raise SettingsError("nothing to submit: give a command, e.g. "
                            "irt-engine submit --address URL -- fit store --out run")
    if command[0] == "submit":
        raise SettingsError("a submitted job cannot itself be `submit`")
    return shlex.join([python, "-m", "engine.cli", *command])


def _submit_when_ready(client, command: str, runtime_env: dict, wait_s: float = 60.0) -> str:
    """Submit, retrying while a freshly started cluster has no job agent up yet."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return client.submit_job(entrypoint=command, runtime_env=runtime_env)
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


async def _stream(client, job_id: str, out) -> None:
    async for lines in client.tail_job_logs(job_id):
        out.write(lines)
        out.flush()


def submit(command: list[str], *, address: str, working_dir: str | Path = ".",
           python: str = "python", out=sys.stdout, poll_s: float = 0.5) -> int:
    """Submit ``irt-engine COMMAND...`` to the Ray job server at ``address``; stream its logs.

    ``python`` is the interpreter the job runs on the cluster (one with irt-engine's
    dependencies); the shipped working directory supplies the irt-engine code itself.
    Returns 0 if the job succeeded, else its entrypoint's exit code (1 if none is known).
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    working_dir = Path(working_dir).resolve()
    if not working_dir.is_dir():
        raise SettingsError(f"--working-dir {working_dir} is not a directory")
    try:
        client = JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise SettingsError(f"no Ray job server at {address}: {err}; give the dashboard address "
                            "of a running cluster, e.g. http://127.0.0.1:8265") from err
    job_id = _submit_when_ready(client, entrypoint(command, python),
                                {"working_dir": str(working_dir), "excludes": EXCLUDES})
    print(f"submitted {job_id} to {address}", file=sys.stderr)
    asyncio.run(_stream(client, job_id, out))
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    status = client.get_job_status(job_id)
    while status not in terminal:
        time.sleep(poll_s)
        status = client.get_job_status(job_id)
    print(f"{job_id}: {status.value}", file=sys.stderr)
    if status == JobStatus.SUCCEEDED:
        return 0
    found = re.search(r"exit code (\d+)", client.get_job_info(job_id).message or "")
    return int(found.group(1)) if found and int(found.group(1)) else 1
