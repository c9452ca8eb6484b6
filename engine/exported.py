"""Jitted functions whose tracing is kept between processes: ``jax.export`` on disk.

The persistent compilation cache (:mod:`engine.compile_cache`) keeps XLA's compiled code, but
a new process still traces every program to a jaxpr and lowers it to StableHLO before it can
look the code up: on LSAT7 (1,000 x 5) that was 1.5 of a warm fit's 1.7 s of compile work,
most of it the quadrature fit's nested derivatives. A function decorated with
:func:`exported_jit` is exported once per model, shapes and static arguments
(``jax.export``: its lowered StableHLO, serialized), and a later process deserializes it
instead of tracing it; the compiled code then comes from the compilation cache as before.

It is the compilation cache's folder (``traces/`` inside it) and switch:
``IRT_ENGINE_COMPILATION_CACHE=0`` turns both off, and then a decorated function is plain
``jax.jit``. An entry's key covers everything its program depends on: the function, every
source file of the ``engine`` package, the JAX and jaxlib versions, the backend, the
``x64`` and partitionable-threefry flags, the arguments' shapes, dtypes and structure, and
the static arguments' values (:func:`load_or_export` callers add the version of any other
package whose code the program holds: NUTS's blackjax).
A static argument whose value cannot be written down completely (a model with a function
from outside ``engine``, whose code the key cannot cover) is not cached: that call is plain
``jax.jit``. Each entry carries a SHA-256 of its bytes; one that does not match, or does not
deserialize, is exported again, never run.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import threading
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from engine.atomic import atomic_write
from engine.compile_cache import compilation_cache_dir, compilation_cache_enabled

__all__ = ["exported_jit", "fingerprint", "Unkeyable", "source_digest", "register_structures",
           "compiler_options", "QUICK_COMPILE", "load_or_export"]

_MAGIC = b"irt-engine exported program 1\n"
_PACKAGE = Path(__file__).resolve().parent


class Unkeyable(Exception):
    """A value whose every effect on a program cannot be written into a cache key."""


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 over the ``engine`` package's Python sources and the JAX versions."""
    import jaxlib

    h = hashlib.sha256(f"jax {jax.__version__} jaxlib {jaxlib.__version__}\n".encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def fingerprint(value) -> str:
    """A text that determines ``value`` as a static argument: its type and contents, and for a
    function of the ``engine`` package its name and closure (its code is in
    :func:`source_digest`). Raises :class:`Unkeyable` for anything else."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, enum.Enum):
        return f"enum:{type(value).__qualname__}.{value.name}"
    if isinstance(value, (tuple, list, frozenset, set)):
        items = [fingerprint(v) for v in value]
        if isinstance(value, (frozenset, set)):
            items.sort()
        return f"{_qualified(type(value))}({','.join(items)})"
    if isinstance(value, dict):
        items = sorted(f"{fingerprint(k)}={fingerprint(v)}" for k, v in value.items())
        return f"dict({','.join(items)})"
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(value)
        return f"ndarray({a.dtype.str},{a.shape},{hashlib.sha256(a.tobytes()).hexdigest()})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f"{f.name}={fingerprint(getattr(value, f.name))}"
                  for f in dataclasses.fields(value)]
        return f"{_qualified(type(value))}({','.join(fields)})"
    if isinstance(value, functools.partial):
        return (f"partial({fingerprint(value.func)},{fingerprint(value.args)},"
                f"{fingerprint(value.keywords)})")
    if inspect.ismethod(value):
        return f"method({fingerprint(value.__self__)}.{value.__func__.__qualname__})"
    if inspect.isfunction(value) or inspect.isbuiltin(value) or isinstance(value, np.ufunc):
        name = _qualified(value)
        if inspect.isfunction(value):
            if not name.startswith("engine."):
                raise Unkeyable(f"function {name} is not part of the engine package")
            cells = [fingerprint(c.cell_contents) for c in (value.__closure__ or ())]
            defaults = fingerprint(value.__defaults__)
            kwdefaults = fingerprint(value.__kwdefaults__)
            return f"function({name},{','.join(cells)},{defaults},{kwdefaults})"
        return f"builtin({name})"
    raise Unkeyable(f"a {type(value).__name__}")


def register_structures(*types: type) -> None:
    """Let the named tuples ``types`` be arguments and results of exported programs (their
    pytree structure is written into the entry under the type's qualified name)."""
    for t in types:
        try:
            jax.export.register_namedtuple_serialization(t, serialized_name=_qualified(t))
        except ValueError:  # registered already (the module was imported again)
            pass


def _qualified(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', repr(obj))}"


def _folder() -> Path:
    return Path(compilation_cache_dir()) / "traces"


def _read(path: Path):
    """The deserialized program at ``path``, or None where it is absent or damaged."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC)
    if not data.startswith(_MAGIC) or len(data) < head + 32:
        return None
    digest, payload = data[head:head + 32], data[head + 32:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        exp = jax.export.deserialize(bytearray(payload))
    except Exception:
        return None
    try:  # its last use (access time; the written time stays): the cache's size cap
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass
    return exp


# LAPACK on a CPU: calling any exported program makes JAX initialise its LAPACK kernels, which
# come from SciPy (``scipy.linalg``: 0.12-0.23 s of a fit process), whether or not the program
# calls LAPACK. A program that calls none is run with that step skipped; one that does (its
# serialized module names a ``lapack_`` target) runs as JAX runs it. If JAX's private hook
# moves, nothing is skipped.
_LAPACK = b"lapack"
_skipping = threading.local()


def uses_lapack(exp) -> bool:
    """Whether the exported program ``exp`` may call a LAPACK kernel: its serialized module
    mentions ``lapack`` anywhere. Every LAPACK target of jaxlib is named ``lapack_...`` and
    MLIR bytecode keeps strings as they are, so none is missed; a mention elsewhere (a
    function's name in a location) only keeps the initialisation. Skipping it for a program
    that calls LAPACK would crash the process, so the test errs on that side."""
    return _LAPACK in bytes(exp.mlir_module_serialized)


@functools.lru_cache(maxsize=1)
def _hook_lapack_initialisation() -> bool:
    """Route JAX's ``_ensure_backends_initialized`` (run when a call to an exported program
    is lowered) through a check of this thread's flag; False where the hook is not there."""
    try:
        from jax._src.export import _export
    except ImportError:
        return False
    original = getattr(_export, "_ensure_backends_initialized", None)
    if not callable(original):
        return False

    def ensure(platforms):
        if not getattr(_skipping, "lapack", False):
            original(platforms)

    _export._ensure_backends_initialized = ensure
    return True


def _without_lapack(jitted: Callable) -> Callable:
    """``jitted`` (a call of an exported program without LAPACK) lowered without
    initialising LAPACK."""
    if not _hook_lapack_initialisation():
        return jitted

    def call(*args):
        _skipping.lapack = True
        try:
            return jitted(*args)
        finally:
            _skipping.lapack = False

    return call


def _write(path: Path, payload: bytes) -> None:
    """Write a serialized program atomically (:func:`engine.atomic.atomic_write`); a cache
    that cannot be written is skipped, not an error of the fit."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: tmp.write_bytes(
            _MAGIC + hashlib.sha256(payload).digest() + payload))
    except OSError:
        pass


# XLA's options for a program compiled fast: little optimisation (a small program's compile
# falls by about half; it runs slower, which matters only on large arrays)
QUICK_COMPILE = {"xla_backend_optimization_level": 0}

# XLA options for the programs compiled inside ``compiler_options(...)`` (None: XLA's own)
_OPTIONS: contextvars.ContextVar = contextvars.ContextVar("irt_engine_xla_options", default=None)


@contextlib.contextmanager
def compiler_options(options: dict | None):
    """XLA compiler options (``jax.jit``'s ``compiler_options``) for every program of an
    :func:`exported_jit` function compiled inside the block. They are part of each
    program's key (its own exported entry and compiled code), so a call with other
    options, or none, never runs a program compiled with these."""
    token = _OPTIONS.set(tuple(sorted(options.items())) if options else None)
    try:
        yield
    finally:
        _OPTIONS.reset(token)


# programs kept in a process per decorated function (least recently used dropped): a fit
# uses a few shapes of each; a long-lived worker fitting data sets of many shapes (simulation-
# based calibration, Ray trials) must not keep them all
MAX_PROGRAMS = 8


class _ExportedJit:
    """``jax.jit(fn, static_argnames=...)`` whose traced programs are kept on disk."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...]):
        self.fn = fn
        self.static_argnames = static_argnames
        self.jitted = jax.jit(fn, static_argnames=static_argnames)
        parameters = inspect.signature(fn).parameters.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            raise TypeError(f"exported_jit({fn.__qualname__}): *args and **kwargs are not "
                            "supported; name the arguments")
        self.names = [p.name for p in parameters]
        self.dynamic_names = [n for n in self.names if n not in static_argnames]
        self.defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        # in-process: (static values, argument types) -> callable, the most recently used
        # MAX_PROGRAMS kept (a compiled program holds hundreds of memory mappings: kept
        # without bound, 150 of the sampler's in one process exhausted the kernel's 65,530)
        self.programs: collections.OrderedDict = collections.OrderedDict()
        self.plain: dict = {None: self.jitted}  # compiler options -> plain jax.jit
        functools.update_wrapper(self, fn)

    def _plain(self, options: tuple | None) -> Callable:
        if options not in self.plain:
            self.plain[options] = jax.jit(self.fn, static_argnames=self.static_argnames,
                                          compiler_options=dict(options))
        return self.plain[options]

    def __call__(self, *args, **kwargs):
        options = _OPTIONS.get()
        if not compilation_cache_enabled():
            return self._plain(options)(*args, **kwargs)
        values = {**self.defaults, **dict(zip(self.names, args)), **kwargs}
        static = tuple(values[k] for k in self.static_argnames)
        dynamic = [values[k] for k in self.dynamic_names]
        leaves, tree = jax.tree.flatten(dynamic)
        if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self.jitted(*args, **kwargs)  # inside another trace: nothing to keep
        types = tuple(jax.typeof(leaf) for leaf in leaves)
        memo = (static, tree, types, options)
        program = self.programs.get(memo)
        if program is None:
            program = self.programs[memo] = self._program(static, dynamic, tree, types, options)
            while len(self.programs) > MAX_PROGRAMS:
                self.programs.popitem(last=False)  # the least recently used: freed
        else:
            self.programs.move_to_end(memo)
        return program(*dynamic)

    def _program(self, static: tuple, dynamic: list, tree, types,
                 options: tuple | None = None) -> Callable:
        """The callable for these static values and argument types: the exported program,
        read from disk or exported there now; plain ``jax.jit`` where no key can be made."""
        named = dict(zip(self.static_argnames, static))

        def bound(*dyn):
            return self.fn(**named, **dict(zip(self.dynamic_names, dyn)))

        xla = dict(options) if options else None
        try:
            parts = [fingerprint(self.fn), fingerprint(sorted(named.items()))] + (
                [f"xla={fingerprint(options)}"] if options else [])
        except Unkeyable:
            return jax.jit(bound, compiler_options=xla)
        try:
            args = jax.tree.unflatten(tree, list(types))
        except Exception:  # a structure that does not take abstract values: not kept
            return jax.jit(bound, compiler_options=xla)
        exp = load_or_export(self.fn.__name__.lstrip("_"), parts, jax.jit(bound), args)
        if exp is None:  # not exportable (a structure without serialization, or an error
            return jax.jit(bound, compiler_options=xla)  # the plain call reports)
        jitted = jax.jit(exp.call, compiler_options=xla)
        return jitted if uses_lapack(exp) else _without_lapack(jitted)


def load_or_export(name: str, key_parts: list[str], jitted: Callable, args):
    """The ``jax.export`` program of ``jitted`` for arguments of ``args``' structure, shapes
    and dtypes (``args``: a list of pytrees of arrays or abstract values), read from the
    traces folder, or traced, exported and written there now; None where the cache is off
    (``IRT_ENGINE_COMPILATION_CACHE=0``) or the program cannot be exported.

    ``key_parts``: texts that determine everything else the program depends on (the
    function, its static values: :func:`fingerprint`, and the version of any other package
    whose code it holds); the entry's key adds every source file of ``engine`` and the JAX
    versions (:func:`source_digest`), the backend, the ``x64`` and partitionable-threefry
    flags (random numbers drawn inside a program follow the latter) and the arguments'
    structure and types. ``name`` starts the file's name.
    Call the result through ``jax.jit(exp.call)``: its compiled code then comes from the
    compilation cache, and a later process neither traces nor lowers ``jitted`` again."""
    if not compilation_cache_enabled():
        return None
    leaves, tree = jax.tree.flatten(args)
    types = tuple(leaf if isinstance(leaf, jax.core.ShapedArray) else jax.typeof(leaf)
                  for leaf in leaves)
    key = hashlib.sha256("\n".join([
        *key_parts, source_digest(), jax.default_backend(), f"x64={jax.config.jax_enable_x64}",
        f"threefry_partitionable={jax.config.jax_threefry_partitionable}", str(tree),
        repr(types)]).encode()).hexdigest()
    path = _folder() / f"{name}-{key[:40]}.exported"
    exp = _read(path)
    if exp is None:
        specs = [jax.ShapeDtypeStruct(t.shape, t.dtype, weak_type=t.weak_type) for t in types]
        try:  # a structure without serialization is not exportable either
            exp = jax.export.export(jitted)(*jax.tree.unflatten(tree, specs))
            payload = bytes(exp.serialize())
        except Exception:
            return None
        _write(path, payload)
    return exp


def exported_jit(fn: Callable | None = None, *, static_argnames: tuple[str, ...] = ()):
    """Decorator: ``jax.jit`` with ``static_argnames`` whose traced and lowered programs are
    kept between processes (module docstring). Static arguments are passed by name or
    position as with ``jax.jit``; the others are arrays (or pytrees of them)."""
    if fn is None:
        return functools.partial(exported_jit, static_argnames=tuple(static_argnames))
    return _ExportedJit(fn, tuple(static_argnames))
