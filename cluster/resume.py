"""What a directory of trials was run with, so that resuming never mixes two analyses.

A trial command records, before its first trial, everything its trials' results depend on
(the analysis, its settings and seed, the fit settings and a checksum of the responses) in
``trials.json`` under ``--out``. A rerun into the same ``--out`` resumes only when that record
matches; otherwise it stops with one line naming what differs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from cluster.io import write_json_atomic
from engine.errors import SettingsError

__all__ = ["RECORD", "responses_checksum", "check_model_fits", "check_or_record", "differences", "trial_record"]

RECORD = "trials.json"


def responses_checksum(y: np.ndarray) -> str:
    """``sha256:...`` of the response matrix's shape, dtype and values."""
    y = np.ascontiguousarray(y)
    h = hashlib.sha256(f"{y.shape}|{y.dtype.str}|".encode())
    h.update(y.view(np.uint8).reshape(-1).data if y.size else b"")
    return "sha256:" + h.hexdigest()


# Settings that only shape the read-out computed from all trials, never a trial's result.
_SUMMARY_ONLY = {"bootstrap", "level"}


def trial_record(analysis: str, settings, fit_settings, y: np.ndarray | None, **extra) -> dict:
    """The record of a trial command: ``analysis``, its settings (less those that only shape
    the summary) and fit settings (less ``progress``), the responses' checksum and ``extra``."""
    record = {"analysis": analysis,
              "settings": {k: v for k, v in settings.to_dict().items() if k not in _SUMMARY_ONLY}}
    if fit_settings is not None:
        record["fit_settings"] = {k: v for k, v in fit_settings.to_dict().items()
                                  if k != "progress"}
    if y is not None:
        record["responses"] = responses_checksum(y)
    return {**record, **extra}


def _flat(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def differences(old: dict, new: dict) -> list[str]:
    """``"key: old -> new"`` for every setting that differs (nested keys joined with dots)."""
    a, b = _flat(old), _flat(new)
    return [f"{k}: {a.get(k, '(none)')} -> {b.get(k, '(none)')}"
            for k in sorted(set(a) | set(b)) if a.get(k, "(none)") != b.get(k, "(none)")]


def _normalise(record: dict) -> dict:
    """The record as it reads back from JSON (tuples become lists, numpy scalars numbers)."""
    return json.loads(json.dumps(record, default=str))


def check_model_fits(model: str, prior: str | None, y, kind: str | None = None) -> None:
    """Build ``model`` (with ``prior``) for the data before anything is written under
    ``--out``: a model that cannot fit it (another response kind, responses all on a
    boundary it does not model, a multi-skill model without its skills) fails here, and a
    corrected rerun into the same ``--out`` is not refused as other settings. ``y``: the
    matrix in memory, or anything with a ``shape`` (a store read per trial; ``kind`` given)."""
    from engine.api import resolve_model
    from engine.models.registry import resolve_prior

    held = isinstance(y, np.ndarray)  # a matrix held: its kind read from its values, as the
    # fit of it reads it (a unit store of 0/1 values fits the 2PL)
    resolve_model(model, {"prior": resolve_prior(model, prior)}, y if held else None,
                  None if held else kind, None if held else tuple(y.shape))


def check_or_record(out: Path, record: dict, results: tuple[str, ...], *,
                    write: bool = True) -> None:
    """Refuse to resume into ``out`` trials of other settings; else write ``trials.json``.

    Parameters
    ----------
    out : the analysis directory (``--out``).
    record : everything the trials' results depend on, JSON-serialisable.
    results : names of the trial tables under ``out`` (``stability.parquet``, ...), whose
        presence (or that of their parts folders) means trials were run before.
    write : write the record when there is none yet (``False``: only check, e.g. before
        joining a cluster, so that a failed start leaves nothing behind).

    Raises
    ------
    SettingsError naming ``out`` and what differs, when earlier trials there were run with
    other settings or without a record.
    """
    out = Path(out)
    record = _normalise(record)
    path = out / RECORD
    earlier = [r for r in results
               if (out / r).exists() or (out / f".{r}.parts").exists()]
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise SettingsError(f"{path} cannot be read ({err}); remove {out} or choose another "
                                "--out") from None
        diff = differences(old, record)
        if diff:
            raise SettingsError(
                f"--out {out} holds trials run with other settings ({'; '.join(diff)}); resuming "
                "would mix them: choose another --out, rerun with the earlier settings, or "
                f"remove {out}")
        return
    if earlier:
        raise SettingsError(
            f"--out {out} holds trials ({', '.join(earlier)}) without a record of their settings "
            f"({RECORD}), so they cannot be resumed safely; choose another --out or remove {out}")
    if write:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record)
