"""Adaptive-selection trials through Ray on the real NLU matrix, and score vs refit timing.

    python benchmarks/bench_adaptive.py --trials 120

Fits the 90 x 82,756 NLU matrix (2PL), then runs ``--trials`` adaptive trials with
``irt-engine adaptive``'s library path on a local Ray (2 CPUs), and times ``score`` for 100
simulated new subjects against a full refit of all 190. Writes
benchmarks/results/adaptive.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_items import nlu  # noqa: E402
from cluster.adaptive import run_adaptive  # noqa: E402
from cluster.settings import RunnerSettings  # noqa: E402
from engine.api import fit  # noqa: E402
from engine.data.store import write_store  # noqa: E402
from engine.infer.settings import FitSettings  # noqa: E402
from engine.readout.adaptive import AdaptiveTrialSpec  # noqa: E402
from engine.readout.items import item_bank  # noqa: E402
from engine.run import save_run  # noqa: E402
from engine.score import score  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "adaptive.json"))
    args = ap.parse_args()
    y, subjects, items = nlu()
    tmp = Path(tempfile.mkdtemp(prefix="bench-adaptive-"))
    store = write_store(y, subjects, items, tmp / "nlu.zarr")
    settings = FitSettings(seed=0)
    t0 = time.perf_counter()
    run = save_run(fit(store.path, model="2pl", settings=settings), tmp / "run", num_draws=200)
    fit_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    theta = rng.choice(run.subjects["ability_mean"].to_numpy(), 100) + rng.normal(0, 0.1, 100)
    p = item_bank(run.spec, run.guide).prob(theta.astype(np.float32))
    y_new = (rng.random(p.shape) < p).astype(np.int8)
    t0 = time.perf_counter()
    _, res = score(run, y_new, num_draws=200)
    score_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = fit(np.concatenate([y, y_new]), model="2pl", settings=settings)
    refit_s = time.perf_counter() - t0

    spec = AdaptiveTrialSpec(run=str(run.path), checkpoints=(10, 25, 50, 100, 200))
    t0 = time.perf_counter()
    out = run_adaptive(run.path, tmp / "adaptive", spec, args.trials,
                       RunnerSettings(num_cpus=args.num_cpus, batch_size=4, progress=False))
    adaptive_s = time.perf_counter() - t0
    tau = out.summary.pivot(index="strategy", columns="num_items", values="tau_mean").round(3)
    result = {
        "machine": f"{platform.machine()}, 2 cores", "date": time.strftime("%Y-%m-%d %H:%M"),
        "data": "nlu 90 x 82,756 (real); 100 new subjects simulated from the fitted 2PL",
        "fit_2pl_s": fit_s, "score_100_s": score_s, "score_passes": res.num_passes,
        "refit_190_s": refit_s, "refit_passes": full.num_passes, "score_speedup": refit_s / score_s,
        "adaptive_trials": args.trials, "adaptive_wall_s": adaptive_s,
        "adaptive_trials_per_min_ray": 60 * args.trials / adaptive_s,
        "adaptive_tau_mean": {k: v for k, v in tau.to_dict(orient="index").items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
