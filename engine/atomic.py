"""Files written whole or not at all, and never through a name someone else planted."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "private_dir", "exclusive_lock"]


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
    os.close(fd)
    tmp = Path(name)
    try:
        write_fn(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


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
    killed writer never leaves a stale lock behind, only the empty lock file.
    """
    import fcntl

    from engine.errors import RunExistsError

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunExistsError(f"another irt-engine process is writing {what} {target} (it holds "
                                 f"{lock}); wait for it to finish or choose another {what}") from None
        yield
    finally:
        os.close(fd)
