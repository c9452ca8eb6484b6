"""Errors raised by irt-engine.

Every error is an ``IRTError`` and also the matching builtin, so callers can catch
either. Messages name the file, row, column or value and say what to do.
"""

__all__ = [
    "IRTError",
    "DataFormatError",
    "StoreNotFoundError",
    "StoreExistsError",
    "SettingsError",
    "ModelError",
    "RunNotFoundError",
    "RunExistsError",
    "RunDamagedError",
    "RemoteError",
]


class IRTError(Exception):
    """Base class of every irt-engine error."""


class DataFormatError(IRTError, ValueError):
    """Input data is malformed; the message names file, row/column and the fix."""


class StoreNotFoundError(IRTError, FileNotFoundError):
    """A response store path does not exist or is not an irt-engine store."""


class StoreExistsError(IRTError, FileExistsError):
    """The output store path already exists; pass overwrite or choose another path."""


class RunNotFoundError(IRTError, FileNotFoundError):
    """A run directory does not exist or lacks fit.json."""


class RunExistsError(IRTError, FileExistsError):
    """A run directory already exists and overwriting was not asked for."""


class RunDamagedError(IRTError, ValueError):
    """A run file is missing, truncated or changed since the fit wrote it; refit the run."""


class SettingsError(IRTError, ValueError):
    """A setting is out of range or inconsistent with others."""


class ModelError(IRTError, ValueError):
    """Unknown model name or a model that does not fit the data's response kind."""


class RemoteError(IRTError, OSError):
    """An object store (s3://, gs://) refused or failed: a missing package, missing
    credentials, a bucket that does not exist, an endpoint that cannot be reached."""
