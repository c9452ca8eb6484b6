"""Cluster benchmark: ranking-stability trials per minute and parallel-analysis shuffles.

Measured in one run on this machine:
  * irt-engine stability, batched trials (``jax.vmap``) as Ray tasks on a local Ray;
  * the same trials with one trial per Ray task (``--batch-size 1``), on a subset;
  * a naive loop refitting an incumbent per trial (mirt, the fastest 2PL incumbent, and
    py-irt), one trial per sample size: a trial is two fits, so its cost is twice a fit's;
  * parallel analysis: 1,000 column-permuted shuffles of the real NLU matrix as Ray trials.
Writes benchmarks/results/cluster.json and prints a Markdown table.

    python benchmarks/bench_cluster.py                      # everything
    python benchmarks/bench_cluster.py --skip-pyirt --trials 200
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import incumbents  # noqa: E402
from simulate import simulate_2pl  # noqa: E402

NLU = HERE.parent.parent / "shared" / "data" / "nlu" / "responses_items_x_subjects.parquet"


def _engine_stability(y, trials_per_size: int, batch_size: int, num_cpus: int,
                      sizes=None) -> dict:
    from cluster.settings import RunnerSettings, StabilitySettings
    from cluster.stability import run_stability

    settings = StabilitySettings(sizes=sizes, trials_per_size=trials_per_size, bootstrap=1000)
    runner = RunnerSettings(num_cpus=num_cpus, batch_size=batch_size, progress=False)
    with tempfile.TemporaryDirectory(prefix="bench-stab-") as out:
        t0 = time.perf_counter()
        res = run_stability(y, out, settings, runner)
        wall = time.perf_counter() - t0
        meta = json.loads((Path(out) / "stability.json").read_text())
    n = res.trials[["trial_group", "trial_index"]].drop_duplicates().shape[0]
    summary = res.summary[res.summary.method == "irt"][["size", "tau_between_mean", "diff_mean",
                                                         "diff_p_value", "converged_share"]]
    acc = res.summary[res.summary.method == "accuracy"][["size", "tau_between_mean"]]
    return {"trials": n, "wall_s": wall, "trials_per_min": 60 * n / wall,
            "full_fit_s": meta["seconds"]["full_fit"], "trials_s": meta["seconds"]["trials"],
            "batch_size": batch_size,
            "per_size": summary.merge(acc, on="size", suffixes=("_irt", "_acc")).to_dict("records")}


def _incumbent_loop(y, sizes, job: str, seed: int = 0, measured_sizes=None) -> dict:
    """One trial per size: two fits on disjoint item samples, each in the incumbent's process.

    With ``measured_sizes`` only those sizes are run and a trial's cost at the other sizes is
    read off a least-squares line in the number of items (reported as extrapolated).
    """
    rng = np.random.default_rng(seed)
    per_size = []
    for k in measured_sizes or sizes:
        perm = rng.permutation(y.shape[1])
        fit_s = []
        for half in (perm[:k], perm[k : 2 * k]):
            r = incumbents.run_incumbent(job, np.ascontiguousarray(y[:, half]), timeout=1800)
            if r["status"] != "ok":
                return {"status": r["status"], "reason": r.get("reason", "")[:300]}
            fit_s.append(r["process_s"])
        per_size.append({"size": int(k), "trial_s": float(sum(fit_s))})
    if measured_sizes:
        slope, intercept = np.polyfit([p["size"] for p in per_size],
                                      [p["trial_s"] for p in per_size], 1)
        costs = [intercept + slope * k for k in sizes]
    else:
        costs = [p["trial_s"] for p in per_size]
    mean_trial = float(np.mean(costs))
    return {"status": "ok", "per_size": per_size, "mean_trial_s": mean_trial,
            "trials_per_min": 60.0 / mean_trial, "extrapolated": bool(measured_sizes)}


def _dimensions(shuffles: int, num_cpus: int) -> dict:
    from bench_core import load_nlu
    from cluster.dimensions import run_dimensions
    from cluster.settings import DimensionsSettings, RunnerSettings

    y = load_nlu(NLU)
    with tempfile.TemporaryDirectory(prefix="bench-dims-") as out:
        t0 = time.perf_counter()
        res = run_dimensions(y, out, DimensionsSettings(shuffles=shuffles),
                             RunnerSettings(num_cpus=num_cpus, batch_size=50, progress=False))
        wall = time.perf_counter() - t0
        meta = json.loads((Path(out) / "summary.json").read_text())
    return {"shuffles": shuffles, "wall_s": wall, "seconds": meta.get("seconds", {}),
            "n_factors": res.summary["n_factors"], "reading": res.summary["reading"],
            "shape": list(res.summary.get("shape", []))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--single-trials-per-size", type=int, default=2)
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count())
    ap.add_argument("--skip-pyirt", action="store_true")
    ap.add_argument("--skip-mirt", action="store_true")
    ap.add_argument("--skip-stability", action="store_true")
    ap.add_argument("--skip-dimensions", action="store_true")
    ap.add_argument("--shuffles", type=int, default=1000)
    ap.add_argument("--out", default=str(HERE / "results" / "cluster.json"))
    args = ap.parse_args(argv)

    from cluster.settings import default_sizes

    results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version()},
               "date": time.strftime("%Y-%m-%d %H:%M")}
    if not args.skip_stability:
        y = simulate_2pl(161, 11873, seed=0)["responses"]
        sizes = default_sizes(y.shape[1])
        per_size = math.ceil(args.trials / len(sizes))
        results["stability_batched"] = _engine_stability(y, per_size, 8, args.num_cpus)
        print("batched", json.dumps(results["stability_batched"], default=str)[:400], flush=True)
        results["stability_one_per_task"] = _engine_stability(
            y, args.single_trials_per_size, 1, args.num_cpus)
        print("one per task", results["stability_one_per_task"]["trials_per_min"], flush=True)
        if not args.skip_mirt:
            results["mirt_loop"] = _incumbent_loop(y, sizes, "mirt_2pl")
            print("mirt loop", results["mirt_loop"].get("trials_per_min"), flush=True)
        if not args.skip_pyirt:
            results["pyirt_loop"] = _incumbent_loop(y, sizes, "pyirt_2pl",
                                                    measured_sizes=[25, 800, 3200])
            print("py-irt loop", results["pyirt_loop"].get("trials_per_min"), flush=True)
    if not args.skip_dimensions:
        results["dimensions_nlu"] = _dimensions(args.shuffles, args.num_cpus)
        print("dimensions", results["dimensions_nlu"], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
