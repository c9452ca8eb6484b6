"""``irt-engine submit -- COMMAND...``: any irt-engine command as a Ray job on a cluster.

irt-engine's code and the relative inputs the command names (``cluster.shipping``) travel in
the job's runtime environment; the job runs ``python -m engine.cli COMMAND...``, its logs
stream to this terminal, and the job's outcome becomes the exit status (0 when it succeeded,
the entrypoint's exit code when it failed, 1 when it was stopped). The cluster's token is sent
when one is found (``cluster.auth``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

from cluster.auth import ClusterAuthError, find_token, is_auth_failure, missing_token_message
from cluster.shipping import MAX_SHIP_BYTES, plan_paths, stage, stage_code
from engine.errors import SettingsError

__all__ = ["submit", "entrypoint"]


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


def _client(address: str, token):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address, headers=token.header())
    except (ConnectionError, RuntimeError, ValueError) as err:
        if is_auth_failure(err):
            raise
        raise SettingsError(f"no Ray job server at {address}: {err}; give the dashboard address "
                            "of a running cluster, e.g. http://127.0.0.1:8265") from err


def submit(command: list[str], *, address: str, working_dir: str | Path | None = None,
           python: str = "python", out=sys.stdout, err=sys.stderr, poll_s: float = 0.5,
           cwd: str | Path | None = None, max_bytes: int = MAX_SHIP_BYTES,
           verbose: bool = False) -> int:
    """Submit ``irt-engine COMMAND...`` to the Ray job server at ``address``; stream its logs.

    Only the relative inputs the command names are shipped (or all of ``working_dir`` when
    given), without dot-files, credentials or symlinks leading out; what is shipped is printed
    to ``err``. Relative outputs are refused, since the job's working directory is temporary.
    The cluster's token, when one is found (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``), is sent with every request. Ray's own log lines (package uploads)
    show only with ``verbose``. ``python`` is the interpreter the job
    runs on the cluster (one with irt-engine's dependencies); irt-engine's own code is shipped.

    Returns 0 if the job succeeded, else its entrypoint's exit code (1 if none is known).

    Raises
    ------
    SettingsError for a bad command, path or address; ClusterAuthError when the cluster wants a
    token that was not found, or refused the one sent. Nothing is submitted then.
    """
    from ray.job_submission import JobStatus

    cwd = Path(cwd) if cwd is not None else Path.cwd()
    if working_dir is not None and not Path(working_dir).is_dir():
        raise SettingsError(f"--working-dir {working_dir} is not a directory")
    shell = entrypoint(command, python)
    if command and command[0] == "irt-engine":
        command = command[1:]
    plan = plan_paths(command, cwd=cwd, working_dir=working_dir)
    token = find_token()
    import ray  # noqa: F401  (configures Ray's loggers, quietened below)

    for handler in logging.getLogger("ray").handlers:  # Ray's modules log at INFO themselves
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        client = _client(address, token)  # asks the server its version: checks the token
        with tempfile.TemporaryDirectory(prefix="irt-engine-submit-") as tmp:
            modules, code = stage_code(Path(tmp) / "code")
            runtime_env = {"py_modules": modules}
            if plan.whole_dir or plan.relative:
                runtime_env["working_dir"] = str(stage(plan, Path(tmp) / "ship", max_bytes))
            print(f"submit: {plan.describe(code)}", file=err)
            job_id = _submit_when_ready(client, shell, runtime_env)
    except Exception as error:
        if is_auth_failure(error):
            raise ClusterAuthError(missing_token_message(address, token)) from None
        raise
    print(f"submitted {job_id} to {address}", file=err)
    asyncio.run(_stream(client, job_id, out))
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    status = client.get_job_status(job_id)
    while status not in terminal:
        time.sleep(poll_s)
        status = client.get_job_status(job_id)
    print(f"{job_id}: {status.value}", file=err)
    if status == JobStatus.SUCCEEDED:
        return 0
    found = re.search(r"exit code (\d+)", client.get_job_info(job_id).message or "")
    return int(found.group(1)) if found and int(found.group(1)) else 1
