"""irt-engine and the plain-JAX probe, each run in a child of the engine's own virtualenv.

Parent side: ``run_engine(model, responses)`` and ``run_probe(responses)``.
Child side: ``python engine_side.py JOB DATA.npy OUT_DIR OPTIONS`` with JOB in
{"engine_1pl", "engine_2pl", "engine_model", "jax_probe"}; ``engine_model`` fits any registered
model with its options (``run_engine_model``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["ENGINE_PYTHON", "run_engine", "run_engine_model", "run_probe"]

_HERE = Path(__file__).resolve()
_REPO = _HERE.parent.parent
ENGINE_PYTHON = os.environ.get("IRT_ENGINE_PYTHON", str(_REPO / ".venv" / "bin" / "python"))


def fit_engine(responses: np.ndarray, model: str, seed: int = 0) -> tuple[dict, dict]:
    """engine.fit with default settings: ``fit_engine_model``'s timings, the three 2PL arrays."""
    meta, arrays = fit_engine_model(responses, model, seed=seed)
    return meta, {k: v for k, v in arrays.items()
                  if k in ("ability", "difficulty", "discrimination")}


def fit_engine_model(responses: np.ndarray, model: str, model_options: dict | None = None,
                     seed: int = 0) -> tuple[dict, dict]:
    """engine.fit of any registered model (with builder options), default settings.

    Besides ``fit_engine``'s fields it reports the per-pass seconds from the trace: the first
    pass (JAX compilation included) apart, and the median of the others.
    """
    sys.path.insert(0, str(_REPO))
    import engine

    start = time.perf_counter()
    res = engine.fit(responses, model=model, settings=engine.FitSettings(seed=seed),
                     model_options=model_options)
    means = res.means()
    call_s = time.perf_counter() - start
    seconds = [float(r["seconds"]) for r in res.trace]
    passes, wall = int(res.num_passes), float(res.wall_time_s)
    median_pass = float(np.median(seconds[1:])) if len(seconds) > 1 else None
    meta = dict(tool="irt-engine", model=model, model_options=res.extra.get("model_options"),
                wall_s=wall, call_s=call_s, passes=passes, converged=bool(res.converged),
                observed_cells=int(res.num_observed), first_pass_s=seconds[0] if seconds else None,
                median_pass_s=median_pass, pass_seconds=seconds,
                compile_time_s=float(res.compile_time_s),
                cells_per_s_per_pass=int(res.num_observed) * passes / wall,
                cells_per_s_median_pass=(int(res.num_observed) / median_pass
                                         if median_pass else None),
                elbo=float(res.elbo))
    return meta, {k: np.asarray(v) for k, v in means.items()}


def jax_probe(responses: np.ndarray, calls: int = 20) -> tuple[dict, dict]:
    """Jitted value_and_grad of the dense float32 2PL Bernoulli log-likelihood; median of calls."""
    import jax
    import jax.numpy as jnp

    def loglik(params, y):
        theta, b, log_a = params
        logits = jnp.exp(log_a)[None, :] * (theta[:, None] - b[None, :])
        return jnp.sum(y.astype(jnp.float32) * logits - jax.nn.softplus(logits))

    step = jax.jit(jax.value_and_grad(loglik))
    num_subjects, num_items = responses.shape
    y = jax.device_put(responses)
    params = (jnp.zeros(num_subjects, jnp.float32), jnp.zeros(num_items, jnp.float32),
              jnp.zeros(num_items, jnp.float32))
    jax.block_until_ready(step(params, y))  # compile + warm-up
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(step(params, y))
        times.append(time.perf_counter() - start)
    median = float(np.median(times))
    meta = dict(tool="jax-probe", jax_version=jax.__version__, device=str(jax.devices()[0]),
                wall_s=median, calls=calls, cells=responses.size,
                cells_per_s=responses.size / median)
    return meta, {}


_JOBS = {
    "engine_1pl": lambda y, **o: fit_engine(y, "1pl", **o),
    "engine_2pl": lambda y, **o: fit_engine(y, "2pl", **o),
    "engine_model": fit_engine_model,
    "jax_probe": jax_probe,
}


def _worker_main(argv: list[str]) -> None:
    """Child entry point: JOB DATA.npy OUT_DIR OPTIONS_JSON."""
    sys.path.insert(0, str(_HERE.parent))
    from subproc import write_worker_result

    job, data_file, out_dir, options = argv
    responses = np.load(data_file)
    meta, arrays = _JOBS[job](responses, **json.loads(options))
    write_worker_result(out_dir, dict(meta, python=sys.version.split()[0]), arrays)


def run_engine(model: str, responses: np.ndarray, *, timeout: float = 600.0,
               python: str = ENGINE_PYTHON, compilation_cache: str | Path | None = None) -> dict:
    """Fit irt-engine's ``model`` ("1pl" or "2pl") in a child process; never raises.

    ``compilation_cache``: a JAX persistent compilation cache folder for the child (what the
    CLI keeps in ``~/.cache/irt-engine/jax``); an empty one fills, a filled one is read.
    """
    from subproc import run_worker

    env = None
    if compilation_cache is not None:
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(compilation_cache),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    return run_worker(python, _HERE, f"engine_{model}", responses, timeout=timeout, env=env)


def run_engine_model(model: str, responses: np.ndarray, *, model_options: dict | None = None,
                     timeout: float = 600.0, python: str = ENGINE_PYTHON) -> dict:
    """Fit any irt-engine ``model`` with ``model_options`` in a child process; never raises."""
    from subproc import run_worker

    options = {"model": model, "model_options": model_options or {}}
    return run_worker(python, _HERE, "engine_model", responses, timeout=timeout, options=options)


def run_probe(responses: np.ndarray, *, cores: int | None = None, timeout: float = 300.0,
              python: str = ENGINE_PYTHON) -> dict:
    """Run the JAX probe, optionally pinned to the first ``cores`` CPUs with taskset."""
    import shutil

    from subproc import run_worker

    prefix = None
    if cores is not None:
        if shutil.which("taskset") is None:
            return dict(job="jax_probe", status="failed", reason="taskset not found")
        prefix = ["taskset", "-c", ",".join(str(c) for c in range(cores))]
    result = run_worker(python, _HERE, "jax_probe", responses, timeout=timeout, prefix=prefix)
    result["cores"] = cores
    return result


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
