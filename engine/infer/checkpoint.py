"""Checkpoints of a running fit: the fit state and loop bookkeeping, as npz + JSON.

A checkpoint is two files in a directory (the run directory): ``checkpoint-<pass>-<random>.npz``
(the arrays: fit state leaves, the Polyak window of guides, the block-order key) and
``checkpoint.json`` (the pass reached, the ELBO trace, timings, the fit's fingerprint and
the name of its npz and the npz's size and SHA-256). The npz is written first under a
temporary name and renamed; the JSON is then replaced atomically, so a process killed at any
moment leaves the previous checkpoint or the new one, never half of one. A write that fails
(a full disk) removes its temporary file and leaves the previous checkpoint as it was; the
temporary files of a killed writer are removed by the next :meth:`Checkpointer.save` or
:func:`remove_leftovers`. Loading checks the npz's checksum and that its name is a plain
``checkpoint-<pass>.npz`` inside the directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import numpy as np

from engine.errors import SettingsError
from engine.infer.guide import FitState, GuideState

__all__ = ["FitProgress", "Checkpointer", "CHECKPOINT_FILE", "has_checkpoint", "remove_leftovers"]

CHECKPOINT_FILE = "checkpoint.json"
FORMAT_VERSION = 3  # 2: the Newton state carries running cross curvatures; 3: steps average
# settings.mc_draws Monte Carlo draws (a format-2 fit took one, which its fingerprint lacks)


class FitProgress(NamedTuple):
    """Where a fit loop stands after a pass: everything needed to continue it exactly."""

    state: FitState
    order_key: jax.Array
    trace: list
    recent: list  # the last ``patience`` guides (Polyak window)
    elapsed_s: float
    compile_s: float


def has_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a fit checkpoint."""
    return (Path(directory) / CHECKPOINT_FILE).is_file()


# the remedy for a checkpoint that cannot be resumed, in the command's and the library's words
START_OVER = "pass --overwrite (resume=False in the library) to start the fit over"
_ARRAYS = re.compile(r"checkpoint-\d{6}(-[0-9a-f]{8})?\.npz")  # unique per save since format 3
_LEFTOVER = re.compile(r"\.(checkpoint-\d{6}(-[0-9a-f]{8})?\.npz|checkpoint\.json)\.tmp-[0-9a-f]{8}")


def remove_leftovers(directory: str | Path) -> list[Path]:
    """Remove the temporary files a checkpoint writer killed mid-write left in
    ``directory`` (only names this module makes; a symlink is removed, never followed).
    Call it only while holding the directory's write lock. Returns the removed paths."""
    directory = Path(directory)
    if not directory.is_dir() or directory.is_symlink():
        return []
    gone = [p for p in directory.iterdir() if _LEFTOVER.fullmatch(p.name)
            and (p.is_symlink() or p.is_file())]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def _write_synced(path: Path, write_fn) -> None:
    """Call ``write_fn(f)`` on the new file ``path`` (O_EXCL, no symlink followed) and fsync
    it; on any error (a full disk) the partial file is removed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _file_record(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of the file at ``path``, read in 1 MiB blocks."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def _saved_arrays(target: Path) -> str | None:
    """The npz name the current checkpoint.json names, when it is readable and a plain name."""
    try:
        name = json.loads(target.read_text()).get("arrays") if target.is_file() else None
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and _ARRAYS.fullmatch(name) else None


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _restore(template, arrays: list[np.ndarray], what: str, path: Path):
    leaves, treedef = jax.tree.flatten(template)
    if len(leaves) != len(arrays) or any(np.shape(a) != np.shape(b) for a, b in zip(leaves, arrays)):
        raise SettingsError(f"{path}: the checkpointed {what} does not match this fit (different "
                            f"model or data shape); {START_OVER}")
    return jax.tree.unflatten(treedef, [np.asarray(a, dtype=np.asarray(b).dtype)
                                        for a, b in zip(arrays, leaves)])


@dataclass(frozen=True)
class Checkpointer:
    """Saves and loads :class:`FitProgress` in ``directory`` every ``every`` passes.

    ``fingerprint`` is a JSON-able identity of the fit (model, settings that change the
    result, data checksum and shape); a checkpoint with another fingerprint is refused.
    ``on_saved`` is called with the directory after each checkpoint is whole (e.g. to upload
    it next to a run that goes to object storage).
    """

    directory: Path
    every: int
    fingerprint: dict
    on_saved: Callable[[Path], None] | None = field(default=None, compare=False)

    def due(self, passes_done: int) -> bool:
        return self.every > 0 and passes_done % self.every == 0

    def save(self, progress: FitProgress) -> Path:
        """Write a checkpoint atomically; returns the JSON path."""
        directory = Path(self.directory)
        directory.mkdir(parents=True, exist_ok=True)
        passes = len(progress.trace)
        arrays = {f"state/{k:04d}": a for k, a in enumerate(_leaves(progress.state))}
        arrays["order_key"] = np.asarray(progress.order_key)
        for g, guide in enumerate(progress.recent):
            arrays |= {f"recent/{g:02d}/{k:04d}": a for k, a in enumerate(_leaves(guide))}
        # a name of its own, so that a failed save never replaces the arrays the current
        # checkpoint.json names, even when it saves the same pass again
        name = f"checkpoint-{passes:06d}-{secrets.token_hex(4)}.npz"
        remove_leftovers(directory)  # a killed writer's; this fit holds the directory's lock
        target = directory / CHECKPOINT_FILE
        previous = _saved_arrays(target)
        tmp = directory / f".{name}.tmp-{secrets.token_hex(4)}"
        _write_synced(tmp, lambda f: np.savez(f, **arrays))
        try:
            size, sha256 = _file_record(tmp)
            os.replace(tmp, directory / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        info = {"format_version": FORMAT_VERSION, "passes": passes, "arrays": name,
                "arrays_bytes": size, "arrays_sha256": sha256,
                "num_recent": len(progress.recent), "elapsed_s": progress.elapsed_s,
                "compile_s": progress.compile_s, "fingerprint": self.fingerprint,
                "trace": progress.trace}
        tmp_json = directory / f".{CHECKPOINT_FILE}.tmp-{secrets.token_hex(4)}"
        try:
            _write_synced(tmp_json, lambda f: f.write(json.dumps(info, default=float).encode()))
            os.replace(tmp_json, target)
        except BaseException:  # the previous checkpoint stays whole: drop the new arrays
            tmp_json.unlink(missing_ok=True)
            if name != previous:
                (directory / name).unlink(missing_ok=True)
            raise
        if previous and previous != name:
            (directory / previous).unlink(missing_ok=True)
        if self.on_saved is not None:
            self.on_saved(directory)
        return target

    def load(self, template: FitState) -> FitProgress | None:
        """The saved progress, or None when there is no checkpoint.

        Raises
        ------
        SettingsError
            The checkpoint belongs to another fit (fingerprint or shapes differ).
        """
        path = Path(self.directory) / CHECKPOINT_FILE
        if not path.is_file():
            return None
        try:
            info = json.loads(path.read_bytes().decode("utf-8"))
            if not isinstance(info, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise SettingsError(f"{path} is damaged ({err}); {START_OVER}") from None
        if info.get("format_version") != FORMAT_VERSION:
            raise SettingsError(f"{path}: the checkpoint is in format {info.get('format_version')}"
                                f", this version of irt-engine resumes format {FORMAT_VERSION}; "
                                f"{START_OVER}")
        if info.get("fingerprint") != self.fingerprint:
            saved, now = info.get("fingerprint", {}), self.fingerprint
            diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
            raise SettingsError(f"{path}: the checkpoint is of a different fit (differs in "
                                f"{', '.join(diff)}); resume with the same data, model and "
                                f"settings, or {START_OVER}")
        with np.load(self._arrays(path, info), allow_pickle=False) as z:
            state = _restore(template, [z[k] for k in sorted(z.files) if k.startswith("state/")],
                             "fit state", path)
            recent = []
            for g in range(info["num_recent"]):
                keys = sorted(k for k in z.files if k.startswith(f"recent/{g:02d}/"))
                recent.append(GuideState(*_restore(template.guide, [z[k] for k in keys],
                                                   "guide", path)))
            order_key = np.asarray(z["order_key"])
        return FitProgress(FitState(*state), order_key, info["trace"], recent,
                           float(info["elapsed_s"]), float(info["compile_s"]))

    def _arrays(self, path: Path, info: dict) -> Path:
        """The npz ``info`` names: a plain name in the directory, its size and
        SHA-256 as recorded (checkpoints written before those were recorded: unchecked)."""
        name = info.get("arrays")
        fix = START_OVER
        if not isinstance(name, str) or not _ARRAYS.fullmatch(name):
            raise SettingsError(f"{path} names arrays {name!r}, not a checkpoint-<pass>.npz in "
                                f"{self.directory}; {fix}")
        arrays = Path(self.directory) / name
        if arrays.is_symlink() or not arrays.is_file():
            raise SettingsError(f"{arrays} (the arrays of {path}) is missing; {fix}")
        if "arrays_sha256" in info and _file_record(arrays) != (info.get("arrays_bytes"),
                                                                 info["arrays_sha256"]):
            raise SettingsError(f"{arrays} is damaged (its size or checksum differs from "
                                f"{path}'s record); {fix}")
        return arrays

    def clear(self) -> None:
        """Remove the checkpoint files (after the finished run is saved)."""
        directory = Path(self.directory)
        for f in [directory / CHECKPOINT_FILE, *directory.glob("checkpoint-*.npz")]:
            f.unlink(missing_ok=True)
