"""Stores and run directories at URLs: ``s3://``, ``gs://`` (through fsspec) and ``file://``.

A ``file://`` URL is a local path. An object-store URL is read in place for stores (zarr v3's
``FsspecStore``: a streaming fit reads its tiles from the bucket) and through a private
temporary copy for run directories. Everything written to an object store is written locally
first and uploaded with a completion marker last (object stores have no rename), so nothing
half-uploaded reads as finished:

- a store's marker is its root ``zarr.json`` (the group attributes irt-engine reads);
- a directory's marker (a run, a trial analysis) is :data:`MARKER`, listing every file.

A fit to a URL with ``--checkpoint-every`` uploads each checkpoint as it is written (arrays
first, then ``checkpoint.json``, which names them), so ``fit --out URL --resume`` continues a
fit whose process or machine was lost.

Credentials and endpoints come from the usual environment: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (or ``AWS_PROFILE``), ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` for an S3-compatible endpoint; ``GOOGLE_APPLICATION_CREDENTIALS`` for gs
(``STORAGE_EMULATOR_HOST`` for a GCS emulator, read without credentials).
Every failure (unknown scheme, missing extra, missing credentials, missing bucket) is one
:class:`~engine.errors.RemoteError` line naming the URL and the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from engine.errors import IRTError, RemoteError, RunNotFoundError, SettingsError, StoreNotFoundError

__all__ = ["URL", "MARKER", "SCHEMES", "is_url", "as_location", "filesystem", "zarr_store",
           "storage_options", "remote_errors", "is_file", "list_files", "publish_dir",
           "publish_store", "download_dir", "fetch_run", "staged_store", "url_outputs",
           "upload_checkpoint"]

SCHEMES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
MARKER = ".irt-complete"


class URL(str):
    """An object-store URL that joins like a ``Path`` (``url / "zarr.json"``), so error
    messages and keys built for local stores name the remote object."""

    def __truediv__(self, other) -> "URL":
        return URL(self.rstrip("/") + "/" + str(other).lstrip("/"))

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> "URL":
        return URL(self.rstrip("/").rsplit("/", 1)[0])

    @property
    def scheme(self) -> str:
        return self.split("://", 1)[0].lower()

    @property
    def key(self) -> str:
        """The path without the scheme (``bucket/prefix``), as fsspec names it."""
        return self.split("://", 1)[1].rstrip("/")

    def resolve(self) -> "URL":
        return self

    def exists(self) -> bool:
        """Whether an object or a prefix holding objects is there."""
        with remote_errors(self):
            return filesystem(self).exists(self.key)


def is_url(value) -> bool:
    """Whether ``value`` is a URL string (``scheme://...``), local or not."""
    return isinstance(value, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", value) is not None


def as_location(value) -> Path | URL:
    """A local ``Path`` (``file://`` URLs too) or an object-store :class:`URL`.

    Raises
    ------
    SettingsError
        An unknown scheme (the message lists the known ones).
    """
    if isinstance(value, URL) or not is_url(value):
        return value if isinstance(value, URL) else Path(value)
    scheme = value.split("://", 1)[0].lower()
    if scheme == "file":
        rest = value.split("://", 1)[1]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost"):]
        if not rest.startswith("/"):
            raise SettingsError(f"{value}: a file:// URL needs an absolute path "
                                f"(file:///abs/path); or give the path without file://")
        return Path(rest)
    if scheme not in SCHEMES:
        raise SettingsError(f"{value}: unknown URL scheme {scheme!r}; use s3://BUCKET/PATH, "
                            f"gs://BUCKET/PATH, file:///PATH or a local path")
    url = URL(value)
    if not url.key or url.key.startswith("/"):
        raise SettingsError(f"{value}: no bucket in the URL; use {scheme}://BUCKET/PATH")
    return url


def storage_options(scheme: str) -> dict:
    """fsspec options for ``scheme`` from the environment (the S3 endpoint URL; for gs, a
    GCS emulator named in ``STORAGE_EMULATOR_HOST``, which takes no credentials)."""
    if scheme in ("gs", "gcs"):
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
            return {"endpoint_url": emulator, "token": "anon"}
        return {}
    if scheme != "s3":
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {"endpoint_url": endpoint} if endpoint else {}


def _require(url: URL):
    module, extra = SCHEMES[url.scheme]
    try:
        __import__(module)
    except ImportError:
        raise RemoteError(f"{url}: {url.scheme}:// URLs need the {module} package; install it "
                          f"with `pip install 'irt-engine[{extra}]'`") from None


def filesystem(url: URL, *, asynchronous: bool = False):
    """The fsspec filesystem of ``url`` (its package checked, options from the environment)."""
    import fsspec

    _require(url)
    return fsspec.filesystem(url.scheme, asynchronous=asynchronous,
                             **storage_options(url.scheme))


def zarr_store(url: URL, *, read_only: bool = True):
    """zarr v3's ``FsspecStore`` of ``url``."""
    from zarr.storage import FsspecStore

    _require(url)
    return FsspecStore.from_url(str(url), storage_options=storage_options(url.scheme),
                                read_only=read_only)


def _credentials_hint(url: URL) -> str:
    if url.scheme == "s3":
        return ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and "
                "AWS_ENDPOINT_URL for an S3-compatible server")
    return "set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`"


def _describe(url: URL, err: BaseException) -> str | None:
    """One line for a failure talking to an object store, or None if it is not one."""
    bucket = url.key.split("/", 1)[0]
    chain, seen = [], err
    while seen is not None and len(chain) < 8:
        chain.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    text = " | ".join(chain)
    if "NoCredentials" in text or "Unable to locate credentials" in text or \
            "DefaultCredentialsError" in text:
        return f"{url}: no credentials found; {_credentials_hint(url)}"
    gcs_missing = url.scheme != "s3" and isinstance(err, FileNotFoundError) and \
        f"b/{bucket}/o" in str(err)  # gcsfs: the bucket's object listing is not there
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower() or gcs_missing:
        return (f"{url}: bucket {bucket!r} does not exist at "
                f"{storage_options(url.scheme).get('endpoint_url', 'the default endpoint')}; "
                f"create it first or check the URL")
    denied = [k for k in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                          "Forbidden", "PermissionError") if k in text]
    if denied:
        detail = " ".join(str(err).split()).split(". ")[0].rstrip(".")[:160]
        return (f"{url}: access denied ({denied[0]}: {detail}); check the key: "
                f"{_credentials_hint(url)}")
    if any(k in text for k in ("EndpointConnectionError", "Could not connect", "ConnectTimeout",
                               "ClientConnectorError", "Cannot connect")):
        where = storage_options(url.scheme).get("endpoint_url", "the default endpoint")
        fix = "AWS_ENDPOINT_URL" if url.scheme == "s3" else "STORAGE_EMULATOR_HOST"
        return f"{url}: cannot reach {where}; check {fix} and the network"
    return None


@contextlib.contextmanager
def remote_errors(url: URL) -> Iterator[None]:
    """Turn an object-store failure inside the block into one ``RemoteError`` line."""
    try:
        yield
    except IRTError:
        raise
    except Exception as err:
        line = _describe(url, err)
        if line is None:
            raise
        raise RemoteError(line) from None


def is_file(path: Path | URL) -> bool:
    """Whether the file or object ``path`` exists."""
    if not isinstance(path, URL):
        return Path(path).is_file()
    with remote_errors(path):
        return filesystem(path).isfile(path.key)


def list_files(url: URL) -> list[str]:
    """Every object under ``url`` (a prefix), as paths relative to it, sorted."""
    fs = filesystem(url)
    with remote_errors(url):
        fs.invalidate_cache()
        found = fs.find(url.key)  # raises for missing credentials and a missing bucket
    prefix = url.key + "/"
    return sorted(f[len(prefix):] for f in found if f.startswith(prefix))


def _upload(local: Path, url: URL, names: list[str], last: list[str]) -> None:
    fs = filesystem(url)
    for name in [n for n in names if n not in last] + [n for n in last if n in names]:
        fs.put_file(str(local / name), (url / name).key)


def _remove(url: URL, names: list[str], first: list[str]) -> None:
    """Remove the objects ``names`` under ``url``, the markers ``first`` before the rest."""
    fs = filesystem(url)
    ordered = [n for n in first if n in names] + [n for n in names if n not in first]
    for name in ordered:
        fs.rm_file((url / name).key)


def _local_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def publish_dir(local: Path, url: URL, *, marker: str = MARKER) -> None:
    """Upload the directory ``local`` to ``url``, replacing what is there.

    The old marker goes first, so a replaced directory stops reading as finished before any
    of its files change; the new marker (listing every file) is written last.
    """
    local = Path(local)
    names = [n for n in _local_files(local) if n != marker]
    with remote_errors(url):
        old = list_files(url)
        _remove(url, old, first=[marker, "fit.json", "zarr.json"])
        (local / marker).write_text(json.dumps({
            "files": names, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
        _upload(local, url, names + [marker], last=[marker])


def publish_store(local: Path, url: URL) -> None:
    """Upload a store written locally to ``url``: its root ``zarr.json`` (the attributes
    irt-engine reads) last, so a partial upload is not a store."""
    names = _local_files(Path(local))
    with remote_errors(url):
        old = list_files(url)
        _remove(url, old, first=["zarr.json"])
        _upload(Path(local), url, names, last=["zarr.json"])


def _private_tmp(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700, a fresh name


def download_dir(url: URL, dest: Path, *, marker: str | None = MARKER) -> list[str]:
    """Copy the finished directory at ``url`` into ``dest``; return the files copied.

    Raises ``RunNotFoundError`` when ``marker`` is given and absent (nothing there, or an
    upload that did not finish)."""
    names = list_files(url)
    if marker is not None and marker not in names:
        what = ("an unfinished upload (no completion marker " + marker + ")") if names else \
            "nothing there"
        raise RunNotFoundError(f"{url}: {what}; write it with `irt-engine fit ... --out {url}` "
                               f"(or the command that makes it) and let it finish")
    if marker is not None:
        listed = json.loads(_read_text(url / marker)).get("files", [])
        missing = sorted(set(listed) - set(names))
        if missing:
            raise RunNotFoundError(f"{url / missing[0]}: missing although {url / marker} lists "
                                   f"it; the directory was changed after upload: write it again")
        names = listed
    fs = filesystem(url)
    with remote_errors(url):
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file((url / name).key, str(target))
    return names


def _read_text(url: URL) -> str:
    with remote_errors(url):
        return filesystem(url).cat_file(url.key).decode()


def fetch_run(location) -> Path:
    """A local directory holding the run at ``location``: the path itself, or for an
    object-store URL a fresh private temporary copy (removed when the process exits)."""
    where = as_location(location)
    if not isinstance(where, URL):
        return where
    tmp = _private_tmp("irt-run-")
    import atexit

    atexit.register(shutil.rmtree, tmp, True)
    try:
        download_dir(where, tmp / "run")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp / "run"


# --- command outputs at URLs ------------------------------------------------------------------

_STORE_OUT = {"ingest"}
_RUN_OUT = {"fit"}
_DIR_OUT = {"stability", "bootstrap", "dimensions", "adaptive", "compare", "demo"}
_FILE_OUT = {"items", "score", "subset", "calibration", "report"}


def _check_store_target(url: URL, names: list[str], overwrite: bool) -> None:
    from engine.errors import StoreExistsError

    if not names:
        return
    if "zarr.json" not in names:
        raise StoreExistsError(f"{url}: objects exist there and it is not an irt-engine store; "
                               f"refusing to overwrite them, choose another --out")
    if not overwrite:
        raise StoreExistsError(f"{url}: already exists; pass --overwrite to replace it or "
                               f"choose another output URL")


def _in_progress(names: list[str]) -> bool:
    """Whether the objects ``names`` are an unfinished fit's uploaded checkpoint."""
    from engine.infer.checkpoint import CHECKPOINT_FILE

    return CHECKPOINT_FILE in names and MARKER not in names and "fit.json" not in names


def _check_run_target(url: URL, names: list[str], overwrite: bool, resume: bool) -> None:
    from engine.errors import RunExistsError

    if not names:
        return
    if MARKER not in names and "fit.json" not in names and not _in_progress(names):
        raise RunExistsError(f"--out {url}: objects exist there and it is not a run directory; "
                             f"--overwrite will not remove them, choose another --out")
    if overwrite:
        return
    if not _in_progress(names):
        raise RunExistsError(f"run directory {url} holds a finished run; pass --overwrite to "
                             f"replace it or choose another --out")
    if not resume:
        raise RunExistsError(f"run directory {url} holds the checkpoint of an unfinished fit; "
                             f"pass --resume to continue it, or --overwrite to start over")


def upload_checkpoint(local: Path, url: URL) -> None:
    """Upload the checkpoint in ``local`` to ``url``: its arrays first, then ``checkpoint.json``
    (one object, replaced whole), then the arrays it no longer names. A finished run still at
    ``url`` (``--overwrite``) is removed first, marker first, so the two never mix."""
    from engine.infer.checkpoint import CHECKPOINT_FILE

    local = Path(local)
    arrays = json.loads((local / CHECKPOINT_FILE).read_text())["arrays"]
    with remote_errors(url):
        fs = filesystem(url)
        old = list_files(url)
        if not _in_progress(old):
            _remove(url, old, first=[MARKER, "fit.json"])
            old = []
        fs.put_file(str(local / arrays), (url / arrays).key)
        fs.put_file(str(local / CHECKPOINT_FILE), (url / CHECKPOINT_FILE).key)
        _remove(url, [n for n in old if n.startswith("checkpoint-") and n != arrays], first=[])


@contextlib.contextmanager
def staged_store(url: URL, overwrite: bool) -> Iterator[Path]:
    """A private local path to write a store for ``url`` into; uploaded (root ``zarr.json``
    last) when the block ends without error, and removed either way."""
    _check_store_target(url, list_files(url), overwrite)
    tmp = _private_tmp("irt-store-")
    try:
        yield tmp / (url.name or "store")
        publish_store(tmp / (url.name or "store"), url)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def url_outputs(args) -> Iterator[None]:
    """Run a parsed command whose ``--out`` is a URL against a private local directory, then
    upload what it wrote (see the module doc). ``file://`` outputs become local paths; input
    URLs are left to the readers (:func:`engine.data.store.open_store`, ``load_run``)."""
    out = getattr(args, "out", None)
    command = getattr(args, "command", None)
    if not is_url(out) or command not in _STORE_OUT | _RUN_OUT | _DIR_OUT | _FILE_OUT:
        yield
        return
    where = as_location(out)
    if not isinstance(where, URL):
        args.out = str(where)
        yield
        return
    overwrite = bool(getattr(args, "overwrite", False))
    names = [] if command in _FILE_OUT else list_files(where)
    if command in _STORE_OUT:
        _check_store_target(where, names, overwrite)
    elif command in _RUN_OUT:
        _check_run_target(where, names, overwrite, bool(getattr(args, "resume", False)))
    tmp = _private_tmp("irt-out-")
    try:
        local = tmp / (where.name or "out")
        if command in _DIR_OUT and names:  # resume or --overwrite checks work on the copy
            download_dir(where, local, marker=MARKER if MARKER in names else None)
            (local / MARKER).unlink(missing_ok=True)
        if command in _RUN_OUT:
            if getattr(args, "resume", False) and _in_progress(names):
                download_dir(where, local, marker=None)  # the checkpoint to continue from
            args.on_checkpoint = lambda directory: upload_checkpoint(directory, where)
        if command in _FILE_OUT:
            local.parent.mkdir(parents=True, exist_ok=True)
        args.out = str(local)
        yield
        if command in _STORE_OUT:
            publish_store(local, where)
        elif command in _FILE_OUT:
            with remote_errors(where):
                fs = filesystem(where)
                for name in _local_files(tmp):
                    fs.put_file(str(tmp / name), (where.parent / name).key)
        else:
            publish_dir(local, where)
        print(f"uploaded {where}")
    finally:
        args.out = out
        if hasattr(args, "on_checkpoint"):
            del args.on_checkpoint
        shutil.rmtree(tmp, ignore_errors=True)


STORE_HINT = "run `irt-engine ingest INPUT --out STORE` to create one"


def no_store(path) -> StoreNotFoundError:
    """The error for a response store that is not there (``open_store``; a command checks a
    local path with it before it imports what a fit needs)."""
    return StoreNotFoundError(f"{path}: no such response store; {STORE_HINT}")
