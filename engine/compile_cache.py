"""The persistent JAX compilation cache that commands, the library API and Ray workers share,
and a count of the compilation work a fit does.

Every fit (``engine.fit``, ``irt-engine fit``, trials) calls :func:`use_compilation_cache`, so a
second process fitting a data set of similar shape loads its XLA programs from the cache folder
instead of compiling them (the fit pads its shapes to buckets: ``engine.infer.fit``).
``IRT_ENGINE_COMPILATION_CACHE=0`` turns the cache off; ``JAX_COMPILATION_CACHE_DIR`` moves it.
The folder is kept under ``IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE`` (default 1G; ``-1``: no
cap): after a fit that added entries, the least recently used are removed
(:func:`prune_compilation_cache`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["compilation_cache_dir", "compilation_cache_enabled", "use_compilation_cache",
           "CompileStats", "count_compiles", "compilation_cache_max_bytes", "prune_compilation_cache"]

_OFF = "IRT_ENGINE_COMPILATION_CACHE"
_MAX_SIZE = "IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE"
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
# the entries a prune may remove (a JAX entry with its ``-atime`` stamp): JAX's, irt-engine's traces
_ENTRIES = ("*-cache", "traces/*.exported")


def compilation_cache_dir() -> str:
    """``JAX_COMPILATION_CACHE_DIR``, by default ``~/.cache/irt-engine/jax``."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(
        Path.home() / ".cache" / "irt-engine" / "jax")


def compilation_cache_enabled() -> bool:
    """False when ``IRT_ENGINE_COMPILATION_CACHE=0`` (or ``false``/``off``/``no``)."""
    return os.environ.get(_OFF, "1").strip().lower() not in ("0", "false", "off", "no")


def compilation_cache_max_bytes() -> int | None:
    """``IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE`` in bytes (``512M``, ``2G``, ``1000000``;
    default ``1G``); None for ``-1`` (no cap). Anything else is a SettingsError naming it."""
    text = os.environ.get(_MAX_SIZE, "1G").strip().upper().removesuffix("IB").removesuffix("B")
    if text == "-1":
        return None
    number, unit = (text[:-1], text[-1]) if text[-1:].isalpha() else (text, "")
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        value = -1.0
    if not 0 <= value < float("inf"):
        from engine.errors import SettingsError

        raise SettingsError(f"{_MAX_SIZE}={os.environ.get(_MAX_SIZE)!r}: need a size such as "
                            f"512M or 2G, or -1 for no cap")
    return int(value)


def prune_compilation_cache(max_bytes: int | None = None, *, keep_share: float = 0.8) -> int:
    """Remove the compilation cache's least recently used entries while the folder holds
    more than ``max_bytes`` (default :func:`compilation_cache_max_bytes`), down to
    ``keep_share`` of it; returns the bytes removed.

    Only the cache's own entries are removed (JAX's ``*-cache`` files with their ``-atime``
    stamps, and ``traces/*.exported``); an entry's last use is the latest of its access
    time, modification time and JAX's stamp. JAX stamps its entries only with its own size
    cap on, and file systems keep access times loosely (``relatime``: at most once a day;
    ``noatime``: never), so "least recently used" is to about a day for JAX's entries and
    falls back to their creation; a trace marks its own use when read. An entry another
    process removes first is skipped; a reader whose entry is removed under it warns and
    compiles again (JAX) or exports again (traces), never runs a partial program.
    """
    if not compilation_cache_enabled():
        return 0
    cap = compilation_cache_max_bytes() if max_bytes is None else max_bytes
    folder = Path(compilation_cache_dir())
    if cap is None or not folder.is_dir():
        return 0
    entries, total = [], 0
    for pattern in _ENTRIES:
        for path in folder.glob(pattern):
            try:
                st = path.lstat()
            except OSError:
                continue
            if not path.is_file() or path.is_symlink():
                continue
            used = max(st.st_atime, st.st_mtime)
            stamp = path.with_name(path.name.removesuffix("-cache") + "-atime") \
                if path.name.endswith("-cache") else None
            size = st.st_size
            if stamp is not None:
                try:
                    used = max(used, int.from_bytes(stamp.read_bytes()[:8], "little") / 1e9)
                    size += stamp.lstat().st_size
                except OSError:
                    stamp = None
            entries.append((used, size, path, stamp))
            total += size
    if total <= cap:
        return 0
    removed, target = 0, cap * keep_share
    for used, size, path, stamp in sorted(entries, key=lambda e: e[0]):
        if total - removed <= target:
            break
        for f in (path, stamp):
            if f is not None:
                try:
                    f.unlink()
                except OSError:
                    pass
        removed += size
    return removed


def use_compilation_cache() -> None:
    """Keep compiled programs between runs, so a repeated or similar fit skips most of its
    XLA compilation (:func:`compilation_cache_dir`); ``IRT_ENGINE_COMPILATION_CACHE=0`` turns
    it off.

    Before JAX is imported this only sets JAX's own environment variables (a command that
    never fits, such as ``leaderboard``, does not import JAX for it); once JAX is loaded it
    sets its configuration. A directory the user configured in JAX is kept. Idempotent.
    """
    if not compilation_cache_enabled():
        return
    compilation_cache_max_bytes()  # a bad cap is an error before the fit, not after it
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", compilation_cache_dir())
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        return
    import jax

    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # JAX keeps only programs that took a second to compile: most of a fit's take less
        # on a quiet machine (a directory set through JAX's environment keeps that default)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", compilation_cache_dir())
        try:  # JAX decides once whether a cache is used: let it decide again with the folder
            from jax._src import compilation_cache

            compilation_cache.reset_cache()
        except Exception:  # pragma: no cover - private API moved: the cache starts next process
            pass


class CompileStats:
    """Compilation work seen while :func:`count_compiles` was open (all threads).

    ``programs``: XLA programs obtained (compiled or loaded from the persistent cache);
    ``cache_hits`` / ``cache_misses``: persistent-cache lookups; ``trace_s``: tracing to
    jaxprs; ``lower_s``: lowering to MLIR; ``compile_s``: XLA compilation or cache loading.
    """

    def __init__(self):
        self.programs = self.cache_hits = self.cache_misses = 0
        self.trace_s = self.lower_s = self.compile_s = 0.0
        self.wall_s = 0.0

    def to_dict(self) -> dict:
        return {"programs": self.programs, "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses, "trace_s": round(self.trace_s, 4),
                "lower_s": round(self.lower_s, 4), "xla_compile_s": round(self.compile_s, 4),
                "total_s": round(self.trace_s + self.lower_s + self.compile_s, 4),
                "cache": compilation_cache_dir() if compilation_cache_enabled() else None}


# JAX's monitoring listeners are process-wide and cannot be scoped: one pair is registered
# on first use and feeds whichever CompileStats are open.
_open: list[CompileStats] = []
_lock = threading.Lock()
_registered = False

_DURATIONS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
              "/jax/core/compile/backend_compile_duration": "compile_s"}
_EVENTS = {"/jax/compilation_cache/cache_hits": "cache_hits",
           "/jax/compilation_cache/cache_misses": "cache_misses"}


def _on_duration(event: str, seconds: float, **_) -> None:
    field = _DURATIONS.get(event)
    if field is None:
        return
    with _lock:
        for stats in _open:
            setattr(stats, field, getattr(stats, field) + seconds)
            if field == "compile_s":
                stats.programs += 1


def _on_event(event: str, **_) -> None:
    field = _EVENTS.get(event)
    if field is None:
        return
    with _lock:
        for stats in _open:
            setattr(stats, field, getattr(stats, field) + 1)


@contextmanager
def count_compiles() -> Iterator[CompileStats]:
    """Count JAX's tracing, lowering and XLA compilation (or cache loads) inside the block."""
    global _registered
    from jax import monitoring

    with _lock:
        if not _registered:
            monitoring.register_event_duration_secs_listener(_on_duration)
            monitoring.register_event_listener(_on_event)
            _registered = True
        stats = CompileStats()
        _open.append(stats)
    start = time.perf_counter()
    try:
        yield stats
    finally:
        stats.wall_s = time.perf_counter() - start
        with _lock:
            _open.remove(stats)
            outermost = not _open
        if outermost and stats.cache_misses:  # the fit added entries: keep the folder capped
            try:
                prune_compilation_cache()
            except OSError:  # a cache that cannot be pruned is not an error of the fit
                pass
