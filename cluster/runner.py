"""The trial runner: batches of trials as Ray tasks (or in this process), results to Parquet.

``run_trials(fn, context, trials, out, settings)`` groups trials into batches of one group
(same shapes), keeps at most ``max_in_flight`` tasks running, resubmits a task whose worker or
node died, writes every finished batch at once as a Parquet part (temporary file, then rename),
and skips trials already on disk, so an interrupted run resumes where it stopped. At the end the
parts are merged into ``out`` (one row set per trial, sorted by trial).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pandas as pd

from cluster.io import write_parquet_atomic
from cluster.settings import RunnerSettings
from cluster.trials import TrialSpec
from engine.atomic import private_dir
from engine.errors import IRTError, SettingsError

__all__ = ["run_trials", "ray_session", "session_for", "batches", "interleave", "done_keys", "worker_runtime_env", "loopback_only", "LOOPBACK"]

LOOPBACK = "127.0.0.1"
KEY = ("trial_group", "trial_index")


def batches(trials: Sequence[TrialSpec], size: int) -> list[list[TrialSpec]]:
    """Trials sorted by key and cut into batches of at most ``size`` trials of one group."""
    out, current = [], []
    for t in sorted(trials):
        if current and (len(current) == size or current[0].group != t.group):
            out.append(current)
            current = []
        current.append(t)
    if current:
        out.append(current)
    return out


def interleave(work: list[list[TrialSpec]]) -> list[list[TrialSpec]]:
    """Batches reordered round-robin over groups: the first batch of every group, then the
    second, ... so that tasks running at once have different shapes and each shape's program
    is compiled by one worker (the others then load it from the shared compilation cache)."""
    by_group: dict[int, list] = {}
    for b in work:
        by_group.setdefault(b[0].group, []).append(b)
    queues = list(by_group.values())
    out = []
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def _parts_dir(out: Path) -> Path:
    return private_dir(out.parent / f".{out.name}.parts", inside=out.parent,
                       what="the trial runner's part files")


def _read_all(out: Path) -> pd.DataFrame | None:
    """Rows on disk; a trial found in more than one file keeps the rows of the first only."""
    files = ([out] if out.exists() else []) + (
        sorted(_parts_dir(out).glob("part-*.parquet")) if _parts_dir(out).exists() else [])
    frames = [pd.read_parquet(f).assign(_source=n) for n, f in enumerate(files)]
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    if set(KEY) <= set(df.columns):
        first = df.groupby(list(KEY))["_source"].transform("min")
        df = df[df["_source"] == first]
    return df.drop(columns="_source").reset_index(drop=True)


def done_keys(out: Path) -> set[tuple[int, int]]:
    """Keys ``(group, index)`` of trials whose rows are already on disk."""
    df = _read_all(Path(out))
    if df is None or df.empty:
        return set()
    if not set(KEY) <= set(df.columns):
        raise IRTError(f"{out} was not written by the trial runner (no {KEY} columns); "
                       "choose another --out or remove it")
    return set(zip(df[KEY[0]].astype(int), df[KEY[1]].astype(int)))


def _write_part(out: Path, batch: list[TrialSpec], rows: list[dict]) -> None:
    df = pd.DataFrame(rows)
    if len(df) % len(batch):
        raise IRTError(f"trial function returned {len(df)} rows for {len(batch)} trials")
    per = len(df) // len(batch)
    df.insert(0, KEY[1], [t.index for t in batch for _ in range(per)])
    df.insert(0, KEY[0], [t.group for t in batch for _ in range(per)])
    parts = _parts_dir(out)
    parts.mkdir(parents=True, exist_ok=True)
    first = batch[0]
    write_parquet_atomic(df, parts / f"part-{first.group}-{first.index}-{uuid.uuid4().hex[:8]}.parquet")


def _merge(out: Path) -> pd.DataFrame:
    df = _read_all(out)
    if df is None:
        df = pd.DataFrame(columns=list(KEY))
    df = df.sort_values(list(KEY), kind="stable").reset_index(drop=True)
    write_parquet_atomic(df, out)
    parts = _parts_dir(out)
    if parts.exists():
        for p in parts.glob("part-*.parquet"):
            if p.is_file() and not p.is_symlink():
                p.unlink()
        try:
            parts.rmdir()
        except OSError:  # something not written by the runner is left there: keep it
            pass
    return df


def _progress(settings: RunnerSettings, total: int, initial: int, desc: str):
    if not settings.progress:
        return contextlib.nullcontext(None)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="trial", file=sys.stderr)


@contextlib.contextmanager
def ray_session(settings: RunnerSettings) -> Iterator[None]:
    """Join ``settings.address``, or start a local Ray bound to 127.0.0.1 with no dashboard.

    Joining sends the cluster's token when one is found (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``); a local Ray gets a fresh random token
    held only in its processes' environment. Ray's log lines are shown only with
    ``settings.verbose``. An already initialised Ray (e.g. a test's cluster) is used as it is
    and left running.
    """
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        yield
        return
    if not settings.address or _is_loopback(settings.address):
        loopback_only()
    from cluster.auth import ClusterAuthError, ephemeral_token_env, find_token, is_auth_failure
    from cluster.auth import missing_token_message, token_env

    token = find_token() if settings.address else None
    quiet = {"runtime_env": worker_runtime_env(), "log_to_driver": settings.verbose,
             "logging_level": logging.INFO if settings.verbose else logging.WARNING}
    with (token_env(token) if settings.address else ephemeral_token_env()):
        import ray

        try:
            if settings.address:
                with _stderr_hidden(not settings.verbose):
                    ray.init(address=settings.address, **quiet)
            else:
                # "local" starts a new instance even when another Ray runs on this machine.
                ray.init(address="local", num_cpus=settings.num_cpus, include_dashboard=False,
                         _node_ip_address=LOOPBACK, **quiet)
        except Exception as err:
            if settings.address and is_auth_failure(err):
                raise ClusterAuthError(missing_token_message(settings.address, token)) from None
            if not isinstance(err, (ConnectionError, ValueError, RuntimeError)):
                raise
            where = settings.address or "a local Ray instance"
            raise SettingsError(f"could not start or join Ray at {where}: {err}; check --address "
                                "(e.g. 127.0.0.1:6379 from `ray start --head`)") from err
        try:
            yield
        finally:
            ray.shutdown()


@contextlib.contextmanager
def _stderr_hidden(hide: bool) -> Iterator[None]:
    """Hide what is written to file descriptor 2 (Ray's C++ core logs each failed attempt to
    reach a cluster there, once a second, whatever the log level). Only for joining: a local
    Ray's processes would inherit the hidden descriptor."""
    if not hide:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def session_for(settings: RunnerSettings):
    """``ray_session(settings)`` for the Ray backend, else nothing.

    Analyses enter it before their first JAX computation: Ray starts its processes with
    ``fork``, which JAX (multithreaded once it has run anything) warns may deadlock.
    """
    return ray_session(settings) if settings.backend == "ray" else contextlib.nullcontext()


def _is_loopback(address: str) -> bool:
    """Whether a Ray address (``HOST:PORT``, ``ray://HOST:PORT``) names this machine's loopback.

    Joining one needs :func:`loopback_only` too: otherwise Ray rewrites 127.0.0.1 to the
    machine's network address and dials the cluster there.
    """
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def loopback_only() -> None:
    """Make a local Ray bind every process to 127.0.0.1.

    Ray otherwise advertises the machine's network address, even for a local instance. The
    switch is read from the environment when Ray is imported (by this process, and by every
    Ray process it starts), so set it in both places.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray" in sys.modules:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def worker_runtime_env() -> dict:
    """Runtime environment for Ray workers: a shared JAX compilation cache, so each compiled
    batch program is built once per machine rather than once per worker process."""
    from engine.compile_cache import compilation_cache_dir

    env = {"JAX_COMPILATION_CACHE_DIR": compilation_cache_dir(),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    if "XLA_FLAGS" in os.environ:
        env["XLA_FLAGS"] = os.environ["XLA_FLAGS"]
    return {"env_vars": env}


def _system_errors():
    import ray.exceptions as rex

    names = ("WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError",
             "ObjectReconstructionFailedError", "LocalRayletDiedError", "TaskCancelledError")
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


def run_trials(fn: Callable, context, trials: Sequence[TrialSpec], out: str | Path,
               settings: RunnerSettings = RunnerSettings(), *, desc: str = "trials",
               on_batch: Callable[[int], None] | None = None) -> pd.DataFrame:
    """Run ``fn(context, batch) -> rows`` over all ``trials`` not yet in ``out``; return all rows.

    Parameters
    ----------
    fn : a pure, importable function of a context and a list of same-group trials.
    context : the data every batch needs; put in the Ray object store once.
    out : the Parquet file of results; finished batches stream to a parts folder beside it.
    on_batch : called with the number of batches finished so far, after each is written.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = [t.key for t in trials]
    if len(set(keys)) != len(keys):
        raise SettingsError("trial keys (group, index) must be unique")
    done = done_keys(out)
    todo = [t for t in trials if t.key not in done]
    work = interleave(batches(todo, settings.batch_size))
    with _progress(settings, len(trials), len(trials) - len(todo), desc) as bar:
        def finished(n_done: int, batch: list[TrialSpec], rows: list[dict]) -> None:
            _write_part(out, batch, rows)
            if bar is not None:
                bar.update(len(batch))
            if on_batch is not None:
                on_batch(n_done)

        if settings.backend == "inprocess":
            for n, batch in enumerate(work, 1):
                finished(n, batch, fn(context, batch))
        elif work:
            with ray_session(settings):
                _run_ray(fn, context, work, settings, finished)
    return _merge(out)


def _run_ray(fn, context, work, settings: RunnerSettings, finished) -> None:
    import ray

    @ray.remote(num_cpus=1, max_retries=settings.max_retries)
    def run_batch(fn, ctx, batch):
        return fn(ctx, batch)

    system_errors = _system_errors()
    ctx_ref = ray.put(context)
    in_flight = settings.max_in_flight or max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
    queue = list(enumerate(work))
    attempts = {i: 0 for i, _ in queue}
    pending: dict = {}
    n_done = 0
    while queue or pending:
        while queue and len(pending) < in_flight:
            i, batch = queue.pop(0)
            pending[run_batch.remote(fn, ctx_ref, batch)] = i
        ready, _ = ray.wait(list(pending), num_returns=1)
        ref = ready[0]
        i = pending.pop(ref)
        try:
            rows = ray.get(ref)
        except system_errors as err:
            attempts[i] += 1
            if attempts[i] > settings.max_retries:
                raise IRTError(f"batch {i} failed {attempts[i]} times ({type(err).__name__}); "
                               "check the cluster's nodes and raise --max-retries") from err
            queue.insert(0, (i, work[i]))
            continue
        n_done += 1
        finished(n_done, work[i], rows)
