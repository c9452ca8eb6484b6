"""Parallel-analysis shuffles per second, and the full how-many-skills reading on real data.

Measures, in one run, on the real NLU matrix (90 x 82,756) and a simulated SQuAD-sized 2PL
matrix (161 x 11,873):

- per-shuffle time of ``shuffle_eigenvalues`` in one process with single-threaded BLAS
  (set-up, paid once per batch of seeds, reported apart);
- the naive loop it replaces (``rng.permuted(Z, axis=0)``, float64 ``Z @ Z.T``, ``eigvalsh``),
  same process, same BLAS threads, for the ratio;
- 1,000 shuffles of the NLU matrix in 2 worker processes (10 batches of 100 seeds), wall time
  from submission to the last result, worker start-up included (the issue's target: < 60 s).

With ``--analysis`` it also fits the one-skill 2PL to the NLU matrix with the engine and
writes the eigenvalue table, the scree plot and the ``n_factors`` reading.

    python benchmarks/bench_dimensions.py                 # timings only (~2 minutes)
    python benchmarks/bench_dimensions.py --analysis      # plus the NLU reading (~30 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from engine.readout import dimensions as dims  # noqa: E402
from simulate import simulate_2pl  # noqa: E402

NLU_PARQUET = Path("/work/shared/data/nlu/responses_items_x_subjects.parquet")


def load_nlu(path: Path) -> np.ndarray:
    """The real NLU matrix (stored items x subjects) as int8 subjects x items."""
    import pandas as pd

    df = pd.read_parquet(path)
    cols = [c for c in df.columns if c not in ("item_id", "item", "dataset")]
    return np.ascontiguousarray(df[cols].to_numpy().T.astype(np.int8))


def naive_per_shuffle(y: np.ndarray, num: int) -> float:
    """CPU seconds per shuffle of the plain loop: permute float64 Z per column, Z Z^T, eigvalsh."""
    from threadpoolctl import threadpool_limits

    x = y.astype(np.float64)
    z = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0) / np.sqrt(y.shape[0])
    rng = np.random.default_rng(0)
    with threadpool_limits(limits=1, user_api="blas"):
        c0 = time.process_time()
        for _ in range(num):
            zp = rng.permuted(z, axis=0)
            np.linalg.eigvalsh(zp @ zp.T)
        return (time.process_time() - c0) / num


def kernel_times(y: np.ndarray, num: int) -> dict:
    """Set-up and per-shuffle seconds (wall and CPU) of shuffle_eigenvalues (one process,
    1 BLAS thread): one call with 1 seed, one with ``num`` seeds."""
    def timed(seeds):
        t0, c0 = time.perf_counter(), time.process_time()
        dims.shuffle_eigenvalues(y, seeds)
        return time.perf_counter() - t0, time.process_time() - c0

    (one, one_cpu), (many, many_cpu) = timed([0]), timed(range(1, num + 1))
    per, per_cpu = (many - one) / (num - 1), (many_cpu - one_cpu) / (num - 1)
    return {"per_shuffle_s": per, "per_shuffle_cpu_s": per_cpu, "setup_s": max(one - per, 0.0),
            "shuffles": num}


def _batch(args) -> tuple[float, float, np.ndarray]:
    path, seeds = args
    y = np.load(path)
    t0, c0 = time.perf_counter(), time.process_time()
    out = dims.shuffle_eigenvalues(y, seeds)
    return time.perf_counter() - t0, time.process_time() - c0, out


def two_process_run(y: np.ndarray, shuffles: int, batch: int, workers: int, tmp: Path) -> dict:
    """Wall time of ``shuffles`` shuffles over ``workers`` processes in batches of ``batch``."""
    path = tmp / "responses.npy"
    np.save(path, y)
    jobs = [(path, list(range(s, min(s + batch, shuffles)))) for s in range(0, shuffles, batch)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_batch, jobs))
    wall = time.perf_counter() - t0
    path.unlink()
    eig = np.concatenate([r[2] for r in results])
    cpu = [r[1] for r in results]
    return {"shuffles": shuffles, "workers": workers, "batch": batch, "wall_s": wall,
            "task_wall_s": [r[0] for r in results], "task_cpu_s": cpu,
            "cpu_s_per_shuffle": sum(cpu) / shuffles,
            # what the same tasks take on `workers` cores nobody else uses
            "dedicated_cores_estimate_s": sum(cpu) / workers,
            "envelope": dims.envelope(eig), "eigenvalues": eig}


def analysis(y: np.ndarray, envelope_pair, out_dir: Path, null_reps: int, max_skills: int) -> dict:
    """The full reading on real data: engine 2PL fit, residual steps, table, scree plot."""
    from engine.api import fit
    from engine.infer.settings import FitSettings

    env_mean, env_q95 = envelope_pair
    k = env_mean.size
    observed = dims.correlation_eigenvalues(y, k=k)
    t0 = time.perf_counter()
    res = fit(y, model="2pl", settings=FitSettings(seed=0))
    fit_s = time.perf_counter() - t0
    p = dims.fitted_probabilities(res)
    residual = dims.residual_eigenvalues(y, p, k=k)
    t0 = time.perf_counter()
    null = dims.envelope(dims.residual_null_eigenvalues(p, range(null_reps), k=k))
    upper = max(dims.count_above(observed, env_q95), 1)
    print(f"  2PL fit {fit_s:.0f} s; parallel analysis upper bound {upper}", flush=True)
    steps = []  # dims.residual_steps, with progress
    for skills in range(1, min(upper, max_skills) if max_skills else upper):
        steps.append(dims.residual_step(y, p, skills, range(null_reps)))
        print(f"  {steps[-1]} at {time.perf_counter() - t0:.0f} s", flush=True)
        if not steps[-1].above:
            break
    steps_s = time.perf_counter() - t0
    n, reading = dims.suggest_n_factors(observed, residual, env_mean, env_q95,
                                        residual_envelope=null, steps=steps)
    table = dims.dimensions_table(observed, residual, env_mean, env_q95, residual_envelope=null)
    table.to_parquet(out_dir / "dimensions_nlu_eigenvalues.parquet")
    dims.scree_plot(table, out_dir / "dimensions_nlu_scree.png", n_factors=n)
    return {"n_factors": n, "reading": reading, "fit_s": fit_s, "fit_passes": res.num_passes,
            "converged": res.converged, "residual_tests_s": steps_s,
            "top_eigenvalues": table.head(12).to_dict(orient="list")}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nlu-path", type=Path, default=NLU_PARQUET)
    p.add_argument("--shuffles", type=int, default=1000)
    p.add_argument("--analysis", action="store_true", help="also run the full NLU reading")
    p.add_argument("--null-reps", type=int, default=50, help="residual null replicates per step")
    p.add_argument("--max-skills", type=int, default=0,
                   help="stop the residual steps here (default: the parallel-analysis bound)")
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    nlu = load_nlu(args.nlu_path)
    squad = simulate_2pl(161, 11_873, seed=0)["responses"]
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "load_avg_start": os.getloadavg()},
           "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name, y in (("nlu 90 x 82,756 (real)", nlu), ("squad-sized 161 x 11,873 (simulated 2PL)", squad)):
        k = kernel_times(y, 21)
        k["naive_per_shuffle_cpu_s"] = naive_per_shuffle(y, 5)
        k["speedup_vs_naive_cpu"] = k["naive_per_shuffle_cpu_s"] / k["per_shuffle_cpu_s"]
        out[name] = k
        print(f"{name}: {k['per_shuffle_s'] * 1e3:.1f} ms/shuffle wall, "
              f"{k['per_shuffle_cpu_s'] * 1e3:.1f} ms CPU (set-up {k['setup_s']:.2f} s); naive "
              f"{k['naive_per_shuffle_cpu_s'] * 1e3:.0f} ms CPU, {k['speedup_vs_naive_cpu']:.1f}x",
              flush=True)
    run = two_process_run(nlu, args.shuffles, 100, 2, args.out_dir)
    print(f"{args.shuffles} NLU shuffles on 2 processes: {run['wall_s']:.1f} s wall; "
          f"{run['cpu_s_per_shuffle'] * 1e3:.1f} ms CPU per shuffle, "
          f"{run['dedicated_cores_estimate_s']:.1f} s on 2 dedicated cores", flush=True)
    envelope_pair = run.pop("envelope")
    run.pop("eigenvalues")
    out["nlu_two_processes"] = run
    out["load_avg_end"] = os.getloadavg()
    if args.analysis:
        out["nlu_analysis"] = analysis(nlu, envelope_pair, args.out_dir, args.null_reps,
                                        args.max_skills)
        print(f"NLU n_factors = {out['nlu_analysis']['n_factors']}: "
              f"{out['nlu_analysis']['reading']['text']}", flush=True)
    (args.out_dir / "dimensions.json").write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out_dir / 'dimensions.json'}")


if __name__ == "__main__":
    main()
