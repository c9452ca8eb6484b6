"""Checkpoints of a running fit: the fit state and loop bookkeeping, as npz + JSON.

A checkpoint is two files in a directory (the run directory): ``checkpoint-<pass>.npz``
(the arrays: fit state leaves, the Polyak window of guides, the block-order key) and
``checkpoint.json`` (the pass reached, the ELBO trace, timings, the fit's fingerprint and
the name of its npz). The npz is written first under a temporary name and renamed; the
JSON is then replaced atomically, so a process killed at any moment leaves the previous
checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from engine.errors import SettingsError
from engine.infer.guide import FitState, GuideState

__all__ = ["FitProgress", "Checkpointer", "CHECKPOINT_FILE", "has_checkpoint"]

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


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _restore(template, arrays: list[np.ndarray], what: str, path: Path):
    leaves, treedef = jax.tree.flatten(template)
    if len(leaves) != len(arrays) or any(np.shape(a) != np.shape(b) for a, b in zip(leaves, arrays)):
        raise SettingsError(f"{path}: the checkpointed {what} does not match this fit (different "
                            f"model or data shape); pass --overwrite to start the fit over")
    return jax.tree.unflatten(treedef, [np.asarray(a, dtype=np.asarray(b).dtype)
                                        for a, b in zip(arrays, leaves)])


@dataclass(frozen=True)
class Checkpointer:
    """Saves and loads :class:`FitProgress` in ``directory`` every ``every`` passes.

    ``fingerprint`` is a JSON-able identity of the fit (model, settings that change the
    result, data checksum and shape); a checkpoint with another fingerprint is refused.
    """

    directory: Path
    every: int
    fingerprint: dict

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
        name = f"checkpoint-{passes:06d}.npz"
        tmp = directory / f".{name}.tmp-{secrets.token_hex(4)}"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / name)
        info = {"format_version": FORMAT_VERSION, "passes": passes, "arrays": name,
                "num_recent": len(progress.recent), "elapsed_s": progress.elapsed_s,
                "compile_s": progress.compile_s, "fingerprint": self.fingerprint,
                "trace": progress.trace}
        target = directory / CHECKPOINT_FILE
        previous = json.loads(target.read_text()).get("arrays") if target.is_file() else None
        tmp_json = directory / f".{CHECKPOINT_FILE}.tmp-{secrets.token_hex(4)}"
        with open(tmp_json, "w") as f:
            f.write(json.dumps(info, default=float))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_json, target)
        if previous and previous != name:
            (directory / previous).unlink(missing_ok=True)
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
        info = json.loads(path.read_text())
        if info.get("format_version") != FORMAT_VERSION:
            raise SettingsError(f"{path}: the checkpoint is in format {info.get('format_version')}"
                                f", this version of irt-engine resumes format {FORMAT_VERSION}; "
                                f"pass --overwrite to start the fit over")
        if info.get("fingerprint") != self.fingerprint:
            saved, now = info.get("fingerprint", {}), self.fingerprint
            diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
            raise SettingsError(f"{path}: the checkpoint is of a different fit (differs in "
                                f"{', '.join(diff)}); resume with the same data, model and "
                                f"settings, or pass --overwrite to start over")
        with np.load(Path(self.directory) / info["arrays"], allow_pickle=False) as z:
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

    def clear(self) -> None:
        """Remove the checkpoint files (after the finished run is saved)."""
        directory = Path(self.directory)
        for f in [directory / CHECKPOINT_FILE, *directory.glob("checkpoint-*.npz")]:
            f.unlink(missing_ok=True)
