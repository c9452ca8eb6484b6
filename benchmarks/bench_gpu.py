"""Accelerator benchmark (issue 19, item 5): irt-engine on one GPU beside the plain-JAX probe.

Run on the lent GPU machine (the ``device`` tool) as one script, sections in order of
importance, each guarded so one failure leaves the others' numbers; results go to one JSON
file, rewritten after every section (what a timed-out run measured still comes back).

- ``fit1b``: a 10,000 x 100,000 (1B-cell) 2PL store generated with known truth
  (``generate_store.py``), then whole fresh processes fitting it with default settings from
  the store: empty compilation cache, warm cache, and warm with larger tiles. Each reports
  the seconds from the call of ``engine.api.fit`` on the store path (loading included) to
  the result, passes, convergence, the median pass and the recovery of the truth. The warm
  process also times the plain-JAX probe on the same matrix.
- ``passes``: per-pass cells/s of the mean-field 2PL fit against the probe (jitted
  value-and-gradient of the dense 2PL log-likelihood) on the benchmark shapes, in process.
- ``beta``: the Beta-IRT pass against the 2PL pass on the same shapes (target >= 50%).
- ``processes``: ``bench_core.py --processes`` (whole ``irt-engine`` processes beside mirt's);
  run by the caller, see BENCHMARKS.md.

    python benchmarks/bench_gpu.py --out /tmp/gpu.json                  # everything
    python benchmarks/bench_gpu.py --quick --out /tmp/gpu-quick.json    # small shapes (CPU smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# name -> (subjects, items)
SHAPES = {"squad": (161, 11_873), "square": (3_000, 3_000), "wide": (300, 30_000),
          "nlu_shape": (90, 82_756), "big": (1_000, 10_000)}
QUICK_SHAPES = {"squad": (161, 2_000), "square": (300, 300)}
BETA_SHAPES = {"wide": (300, 30_000), "tall": (1_000, 30_000)}
ONE_B = (10_000, 100_000)
QUICK_ONE_B = (500, 4_000)


def _median_pass(trace: list[dict]) -> tuple[float, float]:
    seconds = [t["seconds"] for t in trace]
    return seconds[0], float(np.median(seconds[1:])) if len(seconds) > 1 else seconds[0]


def engine_pass(y: np.ndarray, model: str, passes: int, **options) -> dict:
    """Fixed passes of the mean-field fit; its median pass (the first, compiling, left out)."""
    from engine.api import fit
    from engine.infer.settings import FitSettings

    settings = FitSettings(seed=0, min_passes=passes, max_passes=passes, ability_factor="gaussian")
    start = time.perf_counter()
    res = fit(y, model, settings, model_options=options or None)
    call = time.perf_counter() - start
    first, median = _median_pass(res.trace)
    return {"model": model, "passes": res.num_passes, "first_pass_s": first, "median_pass_s": median,
            "cells": int(res.num_observed), "mc_draws": res.extra["mc_draws"],
            "cells_per_s": res.num_observed / median,
            "cell_draws_per_s": res.num_observed * res.extra["mc_draws"] / median,
            "call_s": call, "source": res.extra["source"], "num_devices": res.num_devices,
            "compile": res.extra.get("compile")}


def probe(y: np.ndarray) -> dict:
    from engine_side import jax_probe

    meta, _ = jax_probe(y)
    return meta


def section_passes(args, out: dict) -> None:
    from simulate import simulate_2pl

    for name, shape in (QUICK_SHAPES if args.quick else SHAPES).items():
        y = simulate_2pl(*shape, seed=0)["responses"]
        row = {"shape": list(shape)}
        try:
            row["engine"] = engine_pass(y, "2pl", args.passes)
            row["probe"] = probe(y)
            row["engine_over_probe"] = row["engine"]["cells_per_s"] / row["probe"]["cells_per_s"]
            # a pass of a small matrix evaluates every cell once per Monte Carlo draw
            row["engine_draws_over_probe"] = (row["engine"]["cell_draws_per_s"]
                                              / row["probe"]["cells_per_s"])
        except Exception:
            row["error"] = traceback.format_exc()[-2000:]
        out[name] = row
        print(f"[passes] {name}: {json.dumps(_brief(row))}", flush=True)


def simulate_unit(num_subjects: int, num_items: int, *, seed: int) -> np.ndarray:
    """Beta-IRT unit scores as ``bench_models.simulate_beta`` draws them (theta, beta ~ N(0, 1),
    log alpha ~ N(0, 0.3^2), log precision ~ N(1.5, 0.5^2)), clipped to [1e-4, 1 - 1e-4]
    rather than redrawn: only the pass's cost is timed here."""
    rng = np.random.default_rng(seed)
    theta, beta = rng.standard_normal(num_subjects), rng.standard_normal(num_items)
    alpha = np.exp(0.3 * rng.standard_normal(num_items))
    log_precision = 1.5 + 0.5 * rng.standard_normal(num_items)
    eta = alpha * theta[:, None] - beta
    y = rng.beta(np.exp(0.5 * (eta + log_precision)), np.exp(0.5 * (log_precision - eta)))
    return np.clip(y, 1e-4, 1 - 1e-4).astype(np.float32)


def section_beta(args, out: dict) -> None:
    from simulate import simulate_2pl

    for name, shape in (QUICK_SHAPES if args.quick else BETA_SHAPES).items():
        row = {"shape": list(shape)}
        try:
            row["2pl"] = engine_pass(simulate_2pl(*shape, seed=0)["responses"], "2pl", args.passes)
            row["beta"] = engine_pass(simulate_unit(*shape, seed=0), "beta", args.passes)
            row["beta_over_2pl"] = row["beta"]["cells_per_s"] / row["2pl"]["cells_per_s"]
        except Exception:
            row["error"] = traceback.format_exc()[-2000:]
        out[name] = row
        print(f"[beta] {name}: {json.dumps(_brief(row))}", flush=True)


def _brief(row: dict) -> dict:
    """A row without the compile breakdowns, for the log."""
    return {k: ({kk: vv for kk, vv in v.items() if kk != "compile"} if isinstance(v, dict) else v)
            for k, v in row.items()}


def worker_1b(store: str, block_cells: int, with_probe: bool) -> dict:
    """In a fresh process: fit the store from its path with default settings, timed whole."""
    t_process = time.perf_counter()
    from engine.api import fit
    from engine.infer.settings import FitSettings
    import jax

    imported = time.perf_counter() - t_process
    settings = FitSettings(seed=0, max_block_cells=block_cells)
    records = []

    def progress(i, record):
        records.append({**record, "at_s": time.perf_counter() - start})

    start = time.perf_counter()
    res = fit(store, "2pl", settings, progress_fn=progress)
    total = time.perf_counter() - start
    truth = np.load(store + ".truth.npz")
    means = res.means()
    first, median = _median_pass(res.trace)
    out = {"device": str(jax.devices()[0]), "import_s": imported,
           "fit_call_s": total, "loop_wall_s": res.wall_time_s,
           "before_loop_s": records[0]["at_s"] - records[0]["seconds"] if records else None,
           "after_loop_s": total - (records[-1]["at_s"] if records else 0.0),
           "passes": res.num_passes, "converged": res.converged,
           "first_pass_s": first, "median_pass_s": median,
           "cells": int(res.num_observed), "cells_per_s": res.num_observed / median,
           "source": res.extra["source"], "block_cells": res.settings.max_block_cells,
           "compile": res.extra.get("compile"),
           "recovery_r": {k: float(np.corrcoef(means[k], truth[k])[0, 1]) for k in truth.files}}
    if with_probe:
        from engine.data.store import open_store

        out["probe"] = probe(open_store(store).load())
        out["pass_over_probe"] = out["cells_per_s"] / out["probe"]["cells_per_s"]
    return out


def section_fit1b(args, out: dict) -> None:
    from generate_store import generate_store

    shape = QUICK_ONE_B if args.quick else ONE_B
    store = args.work / f"synthetic-{shape[0]}x{shape[1]}.zarr"
    if not store.exists():
        out["generate"] = generate_store(store, *shape, chunks=(2000, 2000))
        print(f"[fit1b] generated {json.dumps(out['generate'])}", flush=True)
    cache = args.work / f"cache-{time.time_ns()}"
    # block cells 0 = the default for the backend (engine.infer.settings.default_block_cells)
    runs = (("cold", 0, False), ("warm", 0, True), ("warm_tiles_4m", 1 << 22, False),
            ("warm_tiles_256m", 1 << 28, False))[: 2 if args.defaults_only else None]
    for label, cells, with_probe in runs:
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--worker-1b", str(store), str(cells),
                               str(int(with_probe))], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=args.timeout)
        row = {"process_s": time.perf_counter() - start}
        if proc.returncode != 0:
            row["error"] = proc.stderr[-3000:]
        else:
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        out[label] = row
        print(f"[fit1b] {label}: {json.dumps(_brief(row))}", flush=True)


def section_anatomy(args, out: dict) -> None:
    """Where a pass's time goes: each of the fit loop's program calls timed to completion
    (``block_until_ready`` after each, so the pieces run one after another, as they do
    within a pass that ends on reading its ELBO); medians over the passes after the first."""
    import jax

    import engine.infer.fit as fit_module
    from simulate import simulate_2pl

    timers: dict[str, list] = {}

    def timed(name, fn):
        def call(*a, **k):
            start = time.perf_counter()
            result = fn(*a, **k)
            jax.block_until_ready(result)
            timers.setdefault(name, []).append(time.perf_counter() - start)
            return result
        return call

    saved = {k: getattr(fit_module, k) for k in ("_programs", "draw_many", "_stack_draws",
                                                  "_add_terms", "_compile_ahead")}
    programs = saved["_programs"]

    def timed_programs(*a):
        terms, update = programs(*a)
        return timed("terms", terms), timed("update", update)

    fit_module._programs = timed_programs
    fit_module.draw_many = timed("draw", saved["draw_many"])
    fit_module._stack_draws = timed("stack_draws", saved["_stack_draws"])
    fit_module._add_terms = timed("add_terms", saved["_add_terms"])
    fit_module._compile_ahead = lambda *a, **k: None  # no second thread in the timings
    try:
        for name in ("squad", "nlu_shape"):
            shape = (QUICK_SHAPES if args.quick else SHAPES).get(name, QUICK_SHAPES["squad"])
            timers.clear()
            row = engine_pass(simulate_2pl(*shape, seed=0)["responses"], "2pl", args.passes)
            per_pass = {k: float(np.median(v[len(v) // args.passes:])) * len(v) / args.passes
                        for k, v in timers.items()}
            out[name] = {"shape": list(shape), "median_pass_s": row["median_pass_s"],
                         "calls_per_pass": {k: len(v) / args.passes for k, v in timers.items()},
                         "seconds_per_pass": per_pass,
                         "rest_s": row["median_pass_s"] - sum(per_pass.values())}
            print(f"[anatomy] {name}: {json.dumps(out[name])}", flush=True)
    finally:
        for k, v in saved.items():
            setattr(fit_module, k, v)


def section_backend(args, out: dict) -> None:
    """Whole ``irt-engine fit`` processes of everyday shapes on the GPU and on this machine's
    CPU (``JAX_PLATFORMS=cpu``), each with an empty compilation cache and then warm; and
    how long starting each backend takes (``jax.devices()`` in a fresh process)."""
    from generate_store import generate_store

    for platform_name in ("cuda", "cpu"):
        env = {**os.environ, "JAX_PLATFORMS": platform_name}
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True)
        out[f"start_{platform_name}_s"] = time.perf_counter() - start if proc.returncode == 0 \
            else f"failed: {proc.stderr[-300:]!r}"
    for name, shape in (("lsat7_shape", (1_000, 5)), ("squad", SHAPES["squad"])):
        store = args.work / f"{name}.zarr"
        if not store.exists():
            generate_store(store, *shape)
        row = {"shape": list(shape)}
        for platform_name in ("cuda", "cpu"):
            cache = args.work / f"cache-{name}-{platform_name}-{time.time_ns()}"
            env = {**os.environ, "JAX_PLATFORMS": platform_name,
                   "JAX_COMPILATION_CACHE_DIR": str(cache)}
            for label in ("cold", "warm"):
                run = args.work / f"run-{name}-{platform_name}-{label}"
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "engine.cli", "fit", str(store),
                                       "--model", "2pl", "--out", str(run), "--quiet",
                                       "--overwrite"], env=env, cwd=ROOT, capture_output=True,
                                      text=True)
                seconds = time.perf_counter() - start
                if proc.returncode != 0:
                    row[f"{platform_name}_{label}"] = {"error": proc.stderr[-1500:]}
                    continue
                info = json.loads((run / "fit.json").read_text())
                row[f"{platform_name}_{label}"] = {
                    "process_s": seconds, "fit_wall_s": info["timings"]["wall_s"],
                    "passes": info["num_passes"],
                    "method": (info.get("ability_factor") or {}).get("method")}
        out[name] = row
        print(f"[backend] {name}: {json.dumps(row)}", flush=True)


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = None
    return info


SECTIONS = {"fit1b": section_fit1b, "passes": section_passes, "beta": section_beta,
            "anatomy": section_anatomy, "backend": section_backend}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--out", type=Path, required=False, default=ROOT / "benchmarks" / "results"
                   / "gpu.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/irt-gpu"))
    p.add_argument("--passes", type=int, default=8, help="fixed passes per timed fit")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per 1B process")
    p.add_argument("--quick", action="store_true", help="small shapes: a smoke test on a CPU")
    p.add_argument("--defaults-only", action="store_true",
                   help="fit1b: only the cold and warm runs at the default block size")
    p.add_argument("--worker-1b", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_1b:
        store, cells, with_probe = args.worker_1b
        print(json.dumps(worker_1b(store, int(cells), bool(int(with_probe)))))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "quick": args.quick}
    for name in args.sections:
        results[name] = {}
        t0 = time.perf_counter()
        try:
            SECTIONS[name](args, results[name])
        except Exception:
            results[name]["error"] = traceback.format_exc()[-3000:]
            print(results[name]["error"], flush=True)
        results[name]["section_s"] = time.perf_counter() - t0
        if name == "passes":
            import jax

            results["machine"].update(jax=jax.__version__, devices=[str(d) for d in jax.devices()])
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1, default=str))
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
