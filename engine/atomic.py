"""Files written whole or not at all, and never through a name someone else planted."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "private_dir", "exclusive_lock", "remove_leftovers", "LEFTOVER_KINDS",
           "plain_mode"]

# What writers of ``--out NAME`` leave beside it while they work, as ``.NAME.<kind>-<random>``:
# tmp (the new run or store being written), old (the previous one, renamed aside during the
# swap), spill and logs (ingest's scratch bands).
LEFTOVER_KINDS = ("tmp", "old", "spill", "logs")


def atomic_write(path: str | Path, write_fn: Callable[[Path], object]) -> Path:
    """Call ``write_fn(tmp)`` on a fresh temporary file beside ``path``, then rename it over
    ``path``.

    The temporary name is random and created with ``O_EXCL`` (``tempfile.mkstemp``), so a
    file or symlink planted under a predictable name is never opened; the rename replaces
    ``path`` itself (a symlink there is replaced, its target untouched). On any error the
    temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:  # mkstemp made it 0600: the mode open() would give, through the descriptor
        os.fchmod(fd, 0o666 & ~_umask())
    except OSError:  # a file system without modes: as it comes
        pass
    os.close(fd)
    tmp = Path(name)
    try:
        write_fn(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    """The process's umask, read where Linux shows it (``/proc/self/status``) without
    setting it; elsewhere set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_mode(directory: str | Path) -> None:
    """Give a directory this process just made with ``tempfile.mkdtemp`` (0700) the
    permissions ``mkdir`` would have given it: 0o777 less the umask. A run renamed from
    one into place kept 0700: no one else could open it under umask 022. (Files:
    :func:`atomic_write` sets theirs through the descriptor.) A file system without modes
    leaves it as it is; a symlink is never followed."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fchmod(fd, 0o777 & ~_umask())
    except OSError:
        pass
    finally:
        os.close(fd)


def private_dir(path: str | Path, *, inside: str | Path, what: str) -> Path:
    """``path`` as a working directory this tool may fill and empty: a real directory (or
    absent), never a symlink, and resolving inside ``inside``.

    Raises
    ------
    IRTError naming ``path`` when it is a symlink, not a directory, or resolves elsewhere.
    """
    from engine.errors import IRTError

    path, inside = Path(path), Path(inside).resolve()
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise IRTError(f"{path} ({what}) is a symlink or not a directory, so irt-engine did not "
                       f"make it; remove it and run again")
    if path.exists() and inside not in path.resolve().parents:
        raise IRTError(f"{path} ({what}) resolves outside {inside}; remove it and run again")
    return path


@contextlib.contextmanager
def exclusive_lock(target: str | Path, *, what: str = "--out"):
    """Hold an exclusive lock on ``target`` (a file ``.NAME.lock`` beside it) for the block.

    A second process asking for the same target fails at once with a clear error instead of
    both writing it. The lock is the kernel's (``flock``): it ends with the process, so a
    killed writer never leaves a stale lock behind, only the empty lock file (a writer that
    finishes removes it). Once the lock is held, what a killed writer left beside ``target``
    is cleaned up (:func:`remove_leftovers`). Folders made for ``target`` are removed again
    where nothing was written (a refused command leaves none behind).
    """
    target = Path(target)
    made: list[Path] = []  # the folders this call made for target, outermost first
    try:
        _make_parents(target.parent, made)
        fd, lock = _lock_fd(target, what)
    except BaseException:
        _remove_made(made)
        raise
    try:
        remove_leftovers(target)  # a killed writer's: no live one exists while we hold the lock
        yield
    finally:
        lock.unlink(missing_ok=True)  # still held: a waiter that opened it retries on a new file
        os.close(fd)
        if not target.exists():  # nothing written: the folders made for it go too, while empty
            _remove_made(made)


def _make_parents(folder: Path, made: list[Path]) -> None:
    """Make ``folder`` and its missing parents one level at a time, appending to ``made``
    exactly those this call created (so a ``..`` in the path or a folder another process
    makes meanwhile is never counted as ours)."""
    parts = folder.parts
    for k in range(1, len(parts) + 1):
        step = Path(*parts[:k])
        try:
            os.mkdir(step)
        except FileExistsError:
            continue
        except OSError:
            if step.is_dir():  # e.g. a read-only parent that already holds it
                continue
            raise
        made.append(step)


def _remove_made(made: list[Path]) -> None:
    """Remove the folders :func:`_make_parents` made, innermost first, while each is empty."""
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            break


def _lock_fd(target: Path, what: str) -> tuple[int, Path]:
    """Open and ``flock`` ``target``'s lock file (``.NAME.lock`` beside it): its descriptor
    and path."""
    import fcntl

    from engine.errors import RunExistsError

    lock = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunExistsError(f"another irt-engine process is writing {what} {target} (it holds "
                                 f"{lock}); wait for it to finish or choose another {what}") from None
        try:  # the file locked is still the one named (a finishing holder unlinks it)
            if os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd, lock
        except FileNotFoundError:
            pass
        os.close(fd)


def remove_leftovers(target: str | Path) -> list[Path]:
    """Clean up after writers of ``target`` that were killed: call it only while holding
    ``target``'s :func:`exclusive_lock`, so none of them is alive.

    A writer killed inside the swap of a finished directory may have left ``target`` absent
    and the previous one renamed aside (``.NAME.old-*``): that one is renamed back, so the
    last good run, checkpoint or store is kept. Every other ``.NAME.<kind>-*`` beside
    ``target`` (:data:`LEFTOVER_KINDS`: half-written directories and ingest's spill) is
    removed; a symlink is removed, never followed. Returns the paths removed or restored.
    """
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(rf"\.{re.escape(target.name)}\.({'|'.join(LEFTOVER_KINDS)})-[A-Za-z0-9_]+")
    found = sorted((p for p in parent.iterdir() if pattern.fullmatch(p.name)),
                   key=lambda p: p.lstat().st_mtime, reverse=True)
    touched = []
    if not (target.exists() or target.is_symlink()):
        aside = [p for p in found if ".old-" in p.name and p.is_dir() and not p.is_symlink()
                 and any(p.iterdir())]
        if aside:  # the newest previous directory goes back where it was
            os.replace(aside[0], target)
            found.remove(aside[0])
            touched.append(target)
    for p in found:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        touched.append(p)
    return touched
