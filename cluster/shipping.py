"""What ``irt-engine submit`` sends to a cluster: only the inputs a command names.

A submitted command's path arguments are read with the command's own parser. Inputs given as
URLs or absolute paths are used in place on the cluster (a filesystem its nodes share);
relative inputs are copied, under the same relative names, into a staging folder that becomes
the job's working directory. Outputs (``--out``) must be absolute or URLs: the job's working
directory is temporary, so a relative output would be lost with it. ``--working-dir DIR``
ships that folder instead of the named inputs.

Copies skip dot-files (``.env``, ``.ssh/``, ``.git/``, ...), credential files (keys,
certificates, cloud credentials) and anything else that is not a regular file or folder, and
never follow a symlink out of the folder being shipped.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import SettingsError

__all__ = ["Shipment", "plan_paths", "stage", "stage_code", "MAX_SHIP_BYTES", "excluded_reason",
           "human_bytes"]

MAX_SHIP_BYTES = 100 * 2**20
# Argument destinations (argparse ``dest``) holding input paths, and those holding outputs.
INPUT_DESTS = ("inputs", "store", "run", "q_matrix", "stability", "dimensions", "compare")
OUTPUT_DESTS = ("out",)
CREDENTIALS = ("id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12",
               "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.ovpn", "credentials",
               "credentials.json", "*credentials*.json", "service-account*.json",
               "client_secret*.json", "auth_token", "*.token", "secrets.*", "htpasswd")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def excluded_reason(name: str) -> str | None:
    """``"dot-file"`` or ``"credential"`` when a file or folder of this name is never shipped."""
    if name.startswith("."):
        return "dot-file"
    if any(fnmatch.fnmatch(name.lower(), p) for p in CREDENTIALS):
        return "credential"
    return None


@dataclass
class Shipment:
    """The relative inputs to copy, the paths used in place, and (after ``stage``) counts."""

    base: Path
    relative: list[str] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)
    whole_dir: bool = False
    files: int = 0
    bytes: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def describe(self, code: tuple[int, int]) -> str:
        what = (f"{self.base} (--working-dir)" if self.whole_dir
                else ", ".join(self.relative) if self.relative else "no input files")
        line = (f"shipping {self.files} files, {human_bytes(self.bytes)} ({what}) and irt-engine's "
                f"code ({code[0]} files, {human_bytes(code[1])})")
        if self.in_place:
            line += f"; used in place on the cluster: {', '.join(self.in_place)}"
        if self.skipped:
            line += "; not shipped: " + ", ".join(
                f"{k} {len(v)} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
                for k, v in sorted(self.skipped.items()))
        return line


def _parse(command: list[str]) -> argparse.Namespace:
    from engine.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(command)
    except SystemExit:
        said = err.getvalue().strip().splitlines()
        raise SettingsError(f"the submitted command `{' '.join(command)}` is not valid "
                            f"({said[-1] if said else 'it only asks for help'}); fix it and "
                            "submit again") from None


def _values(args: argparse.Namespace, dests: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for dest in dests:
        value = getattr(args, dest, None)
        for v in (value if isinstance(value, list) else [value]):
            if isinstance(v, (str, os.PathLike)) and str(v):
                out.append((dest, str(v)))
    return out


def _option(dest: str) -> str:
    return dest if dest in ("inputs", "store", "run") else "--" + dest.replace("_", "-")


def _outside(path: Path, base: Path) -> bool:
    return path != base and base not in path.parents


def plan_paths(command: list[str], *, cwd: Path, working_dir: Path | None = None) -> Shipment:
    """Check a command's paths for submission and list the relative inputs to ship.

    Raises
    ------
    SettingsError naming the argument and the fix for: a relative output, a relative input
    that is missing, lies outside the folder shipped, goes through a symlink leading out of
    it, or is a dot-file or credential.
    """
    base = Path(working_dir if working_dir is not None else cwd).resolve()
    args = _parse(command)
    plan = Shipment(base, whole_dir=working_dir is not None)
    for dest, value in _values(args, OUTPUT_DESTS):
        if not _URL.match(value) and not Path(value).is_absolute():
            raise SettingsError(
                f"{_option(dest)} {value} is a relative path: on the cluster it would be written "
                "inside the job's temporary working directory and deleted with it; give an "
                "absolute path on a filesystem the cluster's nodes share (e.g. "
                f"{_option(dest)} {Path(cwd).resolve() / value} if this folder is shared) or a URL")
    for dest, value in _values(args, INPUT_DESTS):
        if _URL.match(value) or Path(value).is_absolute():
            plan.in_place.append(value)
            continue
        where = f"{_option(dest)} {value}"
        local = Path(os.path.normpath(base / value))
        if _outside(local, base):
            raise SettingsError(f"{where} lies outside {base}, the folder submit ships from; give "
                                "an absolute path on a filesystem the cluster's nodes share, or "
                                "a URL")
        rel = local.relative_to(base)
        for part in rel.parts:
            if excluded_reason(part):
                raise SettingsError(f"{where}: {part} is a {excluded_reason(part)}, which submit "
                                    "never ships; rename it, or give an absolute path on a "
                                    "filesystem the cluster's nodes share")
        if not local.exists() and not local.is_symlink():
            raise SettingsError(f"{where} does not exist in {base}; submit ships relative inputs "
                                "from there: give an existing path, an absolute path on a "
                                "filesystem the cluster's nodes share, or a URL")
        if _outside(local.resolve(), base):
            raise SettingsError(f"{where} leads through a symlink to {local.resolve()}, outside "
                                f"{base}; submit does not follow links out of it: give "
                                f"{local.resolve()} (absolute) if the cluster's nodes share it")
        if str(rel) not in plan.relative:
            plan.relative.append(str(rel))
    return plan


def _skip(plan: Shipment, reason: str, path: Path) -> None:
    plan.skipped.setdefault(reason, []).append(str(path.relative_to(plan.base)))


def _copy(plan: Shipment, src: Path, dest: Path, max_bytes: int, seen: set) -> None:
    """Copy ``src`` (inside ``plan.base``) to ``dest``: regular files and folders only."""
    if src.is_symlink():
        target = src.resolve()
        if _outside(target, plan.base) or not target.exists():
            _skip(plan, "symlinks leading outside", src)
            return
    if src.is_dir():
        real = src.resolve()
        if real in seen:  # a link back into a folder already being copied
            _skip(plan, "symlink loops", src)
            return
        dest.mkdir(parents=True, exist_ok=True)
        for child in sorted(src.iterdir()):
            reason = excluded_reason(child.name)
            if reason:
                _skip(plan, reason + "s", child)
            else:
                _copy(plan, child, dest / child.name, max_bytes, seen | {real})
    elif src.is_file():
        size = src.stat().st_size
        if plan.bytes + size > max_bytes:
            raise SettingsError(
                f"the inputs to ship from {plan.base} exceed {human_bytes(max_bytes)} (at "
                f"{src.relative_to(plan.base)}); put large stores on a filesystem the cluster's "
                "nodes share and give their absolute paths (or URLs)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        plan.files += 1
        plan.bytes += size
    else:
        _skip(plan, "special files", src)


def stage(plan: Shipment, into: Path, max_bytes: int = MAX_SHIP_BYTES) -> Path:
    """Copy what ``plan`` ships into the empty folder ``into``; return it."""
    into = Path(into)
    if plan.whole_dir:
        _copy(plan, plan.base, into, max_bytes, set())
    else:
        for rel in plan.relative:
            _copy(plan, plan.base / rel, into / rel, max_bytes, set())
    return into


def stage_code(into: Path) -> tuple[list[str], tuple[int, int]]:
    """Copy irt-engine's packages (``engine``, ``cluster``: sources and package data, no
    caches or dot-files) into ``into``; return the copies, for the job's ``py_modules``, and
    their file count and bytes."""
    import cluster
    import engine

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    dirs, files, size = [], 0, 0
    for module in (engine, cluster):
        dest = Path(into) / module.__name__
        shutil.copytree(Path(module.__file__).parent, dest, ignore=ignore)
        dirs.append(str(dest))
        for f in dest.rglob("*"):
            if f.is_file():
                files += 1
                size += f.stat().st_size
    return dirs, (files, size)
