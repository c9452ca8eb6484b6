"""Traced programs kept between processes (``engine.exported``): a new process loads them
instead of tracing, gives the same numbers to the bit, refuses a damaged entry, and never
keeps a program whose key cannot cover everything it depends on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from engine.exported import Unkeyable, fingerprint
from engine.models import get_model

REPO = Path(__file__).resolve().parents[2]


def _simulate(S: int, N: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=S), rng.normal(size=N)
    a = np.exp(0.3 * rng.normal(size=N))
    return (rng.random((S, N)) < 1 / (1 + np.exp(-a * (theta[:, None] - b)))).astype(np.int8)


def test_fingerprint_separates_models_and_options():
    two = get_model("2pl")
    assert fingerprint(two) == fingerprint(get_model("2pl"))
    assert fingerprint(two) != fingerprint(get_model("2pl", prior="vague"))
    assert fingerprint(two) != fingerprint(get_model("1pl"))
    assert fingerprint(get_model("3pl")) != fingerprint(get_model("4pl"))
    assert fingerprint((1, 2.0)) != fingerprint((1.0, 2.0)) != fingerprint([1, 2.0])
    assert fingerprint(np.arange(3)) != fingerprint(np.arange(3.0))


def test_fingerprint_is_the_same_in_another_process():
    code = "from engine.exported import fingerprint; from engine.models import get_model; " \
           "print(fingerprint(get_model('2pl')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "7"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == fingerprint(get_model("2pl"))


def test_code_from_outside_the_package_cannot_be_keyed():
    spec = get_model("2pl")
    custom = replace(spec, loglik=lambda params, y, mask: y * 0.0, linear=None)
    with pytest.raises(Unkeyable, match="not part of the engine package"):
        fingerprint(custom)
    with pytest.raises(Unkeyable):
        fingerprint(object())


def _node_inputs(n: int = 6, U: int = 16, Q: int = 5):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(n, 2)), jnp.float32)
    theta = jnp.asarray(rng.normal(size=(U, Q)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 2, (U, n)), jnp.float32)
    return x, theta, y, jnp.ones((U, n), jnp.float32)


def test_a_program_is_kept_once_and_matches_plain_jit(tmp_path, monkeypatch):
    from engine.infer.marginal import _node_loglik

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "1")
    spec = get_model("2pl", prior="vague")
    args = _node_inputs()
    kept = np.asarray(_node_loglik(spec, *args))
    entries = sorted((tmp_path / "traces").iterdir())
    assert len(entries) == 1 and entries[0].name.startswith("node_loglik-")
    np.asarray(_node_loglik(spec, *args))  # the same key: nothing new
    assert sorted((tmp_path / "traces").iterdir()) == entries
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "0")
    plain = np.asarray(_node_loglik(spec, *args))
    np.testing.assert_array_equal(kept, plain)
    # a model with code from outside the package runs as plain jit and keeps nothing
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "1")
    custom = replace(spec, loglik=lambda params, y, mask: spec.loglik(params, y, mask) * 2.0,
                     linear=None, name="custom")
    np.testing.assert_allclose(np.asarray(_node_loglik(custom, *args)), 2 * plain, rtol=1e-6)
    assert sorted((tmp_path / "traces").iterdir()) == entries


_CHILD = """
import json, sys
import numpy as np
import engine
y = np.load(sys.argv[1])
res = engine.fit(y, model="2pl")
print(json.dumps({"compile": res.extra["compile"], "source": res.extra["source"],
                  "loc": {k: np.asarray(v).tolist() for k, v in res.guide.loc.items()},
                  "log_scale": {k: np.asarray(v).tolist() for k, v in res.guide.log_scale.items()}}))
"""


def _child(data: Path, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(data)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_process_loads_the_programs_instead_of_tracing_them(tmp_path):
    """The default short-test fit (quadrature, population priors) in three fresh processes:
    the second traces next to nothing and gives the first's numbers to the bit; with every
    entry damaged the third traces again, rewrites them and still gives the same numbers."""
    data = tmp_path / "y.npy"
    np.save(data, _simulate(300, 6, seed=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "IRT_ENGINE_"))}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "cache")
    first = _child(data, env)
    traces = tmp_path / "cache" / "traces"
    entries = {p.name: p.read_bytes() for p in traces.iterdir()}
    assert first["source"] == "quadrature" and len(entries) >= 8
    second = _child(data, env)
    assert {p.name for p in traces.iterdir()} == set(entries)
    assert second["compile"]["trace_s"] < 0.2 * first["compile"]["trace_s"]
    assert second["loc"] == first["loc"] and second["log_scale"] == first["log_scale"]
    for name, data_bytes in entries.items():  # one flipped byte in every entry
        damaged = bytearray(data_bytes)
        damaged[len(damaged) // 2] ^= 0xFF
        (traces / name).write_bytes(bytes(damaged))
    third = _child(data, env)
    assert third["compile"]["trace_s"] > 0.2 * first["compile"]["trace_s"]  # traced again
    assert {p.name: p.read_bytes() for p in traces.iterdir()} == entries  # and rewritten
    assert third["loc"] == first["loc"] and third["log_scale"] == first["log_scale"]
    env_off = {**env, "IRT_ENGINE_COMPILATION_CACHE": "0"}
    off = _child(data, env_off)
    assert off["loc"] == first["loc"] and off["log_scale"] == first["log_scale"]


_LAPACK_CHILD = """
import json, sys
import jax.numpy as jnp
import numpy as np
from engine.exported import exported_jit

def _scaled(x):
    return 2.0 * x + 1.0

def _factor(x):
    return jnp.linalg.cholesky(x)

# keyed as functions of the package are (only the engine's own are; these two have no
# closure, and the test's cache folder is its own)
for f in (_scaled, _factor):
    f.__module__ = "engine.child_of_test_exported"
_scaled, _factor = exported_jit(_scaled), exported_jit(_factor)

a = np.array([[4.0, 2.0, 0.4], [2.0, 3.0, 0.5], [0.4, 0.5, 2.0]], np.float32)
out = {"scaled": np.asarray(_scaled(a)).tolist()}
out["scipy_after_plain"] = "scipy.linalg" in sys.modules
if sys.argv[1] == "lapack":  # a LAPACK program after one without: LAPACK initialised then
    out["factor"] = np.asarray(_factor(a)).tolist()
    out["scipy_after_lapack"] = "scipy.linalg" in sys.modules
print(json.dumps(out))
"""


def _plain(x):
    return 2.0 * x + 1.0


# named without the library: JAX's locations carry the caller's frames, and a mention of
# the library's name anywhere in a module keeps its initialisation (uses_lapack)
def test_programs_without_linear_algebra_kernels_leave_scipy_unimported(tmp_path):
    """Calling an exported program made JAX initialise LAPACK (importing scipy.linalg, 0.12-0.23
    s) whatever the program. In fresh processes, first exporting and then loading from the
    cache: a program without LAPACK leaves scipy.linalg unimported, and a Cholesky factor
    called after it in the same process (so LAPACK was skipped once) still gives NumPy's
    factor, because its module names a LAPACK target and runs as JAX runs it."""
    import jax

    from engine.exported import uses_lapack

    a = np.array([[4.0, 2.0, 0.4], [2.0, 3.0, 0.5], [0.4, 0.5, 2.0]], np.float32)
    spec = jax.ShapeDtypeStruct(a.shape, a.dtype)
    assert uses_lapack(jax.export.export(jax.jit(jnp.linalg.cholesky))(spec))
    assert not uses_lapack(jax.export.export(jax.jit(_plain))(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "IRT_ENGINE_"))}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "cache")
    for round_ in ("exported now", "loaded"):
        for mode in ("plain", "lapack"):
            out = subprocess.run([sys.executable, "-c", _LAPACK_CHILD, mode], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stderr[-2000:]
            got = json.loads(out.stdout.strip().splitlines()[-1])
            np.testing.assert_allclose(got["scaled"], 2.0 * a + 1.0, rtol=1e-6)
            assert got["scipy_after_plain"] is False, round_
            if mode == "lapack":
                np.testing.assert_allclose(got["factor"], np.linalg.cholesky(a), rtol=1e-5)
                assert got["scipy_after_lapack"] is True, round_
    assert len(list((tmp_path / "cache" / "traces").iterdir())) == 2


def test_a_long_lived_process_keeps_the_most_recent_programs_only(tmp_path, monkeypatch):
    """A compiled program holds the process's memory mappings: the item sampler's about 430
    (measured with ``/proc/self/maps``). Kept for every shape, a process that fits data sets
    of many shapes (simulation-based calibration: about 150 of the sampler's) ran out of the
    kernel's 65,530 and died. The most recently used ``MAX_PROGRAMS`` of each function are
    kept; the others are dropped and freed."""
    import gc
    import weakref

    from engine.exported import MAX_PROGRAMS
    from engine.infer.marginal import _node_loglik

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "1")
    spec = get_model("2pl", prior="vague")
    np.asarray(_node_loglik(spec, *_node_inputs(U=8)))
    oldest = weakref.ref(_node_loglik.programs[next(reversed(_node_loglik.programs))])
    for U in range(9, 9 + 2 * MAX_PROGRAMS):  # a new shape each time
        np.asarray(_node_loglik(spec, *_node_inputs(U=U)))
        assert len(_node_loglik.programs) <= MAX_PROGRAMS
    gc.collect()
    assert oldest() is None  # dropped and freed
    # one used again stays: it becomes the most recent, and nothing is compiled for it
    keys = list(_node_loglik.programs)
    again = _node_loglik.programs[keys[0]]
    np.asarray(_node_loglik(spec, *_node_inputs(U=9 + MAX_PROGRAMS)))
    assert list(_node_loglik.programs) == keys[1:] + keys[:1]
    assert _node_loglik.programs[keys[0]] is again


_NUTS_CHILD = """
import json, sys
import numpy as np
from engine.api import fit_nuts
from engine.compile_cache import count_compiles
from engine.infer.nuts import NutsSettings

y = np.load(sys.argv[1])
with count_compiles() as stats:  # max_rhat 1.0: never met, so one round is always added
    res = fit_nuts(y, "2pl", NutsSettings(num_chains=2, num_warmup=60, num_samples=40,
                                          max_rhat=1.0, extend=1, seed=4))
print(json.dumps({"trace_s": stats.trace_s, "extended": res.extra["diagnostics"]["extended"],
                  "draws": {k: np.asarray(v).tolist() for k, v in res.draws.items()}}))
"""


def test_a_new_process_reads_the_nuts_programs_instead_of_tracing_them(tmp_path):
    """NUTS's sampler and continuation (blackjax's adaptation and tree building: seconds
    to trace) are kept as exported programs: a second process traces next to nothing and
    draws the first's draws to the bit; so does a process with the cache off, which traces
    plain ``jax.jit`` programs."""
    data = tmp_path / "y.npy"
    np.save(data, _simulate(20, 6, seed=3))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "IRT_ENGINE_"))}
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "cache")

    def child(environment):
        out = subprocess.run([sys.executable, "-c", _NUTS_CHILD, str(data)], cwd=REPO,
                             env=environment, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = child(env)
    traces = tmp_path / "cache" / "traces"
    kept = {p.name: p.stat().st_mtime_ns for p in traces.glob("nuts-*")}
    assert first["extended"] == 1
    assert sorted(n.rsplit("-", 1)[0] for n in kept) == ["nuts-continuation", "nuts-sampler"]
    second = child(env)
    assert {p.name: p.stat().st_mtime_ns for p in traces.glob("nuts-*")} == kept  # read
    assert second["trace_s"] < 0.2 * first["trace_s"]
    assert second["draws"] == first["draws"]
    off = child({**env, "IRT_ENGINE_COMPILATION_CACHE": "0"})
    assert off["trace_s"] > 0.2 * first["trace_s"]
    assert off["draws"] == first["draws"]


def test_an_entry_is_keyed_by_the_random_number_flag(tmp_path, monkeypatch):
    """A program that draws random numbers draws other numbers under the other
    partitionable-threefry flag, so each flag value keeps its own entry, and each entry
    gives that flag's own numbers."""
    import jax

    from engine.exported import load_or_export

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "1")
    draw = jax.jit(lambda key: jax.random.uniform(jax.random.split(key, 3)[1], (5,)))
    key = jax.random.PRNGKey(0)
    seen = {}
    for flag in (True, False):
        with jax.threefry_partitionable(flag):
            exp = load_or_export("rng", ["a test's draw"], draw, [key])
            seen[flag] = ({p.name for p in (tmp_path / "traces").iterdir()},
                          np.asarray(jax.jit(exp.call)(key)), np.asarray(draw(key)))
    assert len(seen[True][0]) == 1 and len(seen[False][0]) == 2
    for flag, (_, kept, plain) in seen.items():
        np.testing.assert_array_equal(kept, plain)
    assert not np.array_equal(seen[True][1], seen[False][1])
    monkeypatch.setenv("IRT_ENGINE_COMPILATION_CACHE", "0")
    assert load_or_export("rng", ["a test's draw"], draw, [key]) is None
