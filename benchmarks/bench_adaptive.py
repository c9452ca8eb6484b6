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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_items import nlu_run, score_vs_refit  # noqa: E402
from cluster.adaptive import run_adaptive  # noqa: E402
from cluster.settings import RunnerSettings  # noqa: E402
from engine.readout.adaptive import AdaptiveTrialSpec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=120)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "adaptive.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-adaptive-"))
    y, run, fit_s = nlu_run(tmp)
    timing = score_vs_refit(y, run)

    spec = AdaptiveTrialSpec(run=str(run.path), checkpoints=(10, 25, 50, 100, 200))
    t0 = time.perf_counter()
    out = run_adaptive(run.path, tmp / "adaptive", spec, args.trials,
                       RunnerSettings(num_cpus=args.num_cpus, batch_size=4, progress=False))
    adaptive_s = time.perf_counter() - t0
    tau = out.summary.pivot(index="strategy", columns="num_items", values="tau_mean").round(3)
    result = {
        "machine": f"{platform.machine()}, 2 cores", "date": time.strftime("%Y-%m-%d %H:%M"),
        "data": "nlu 90 x 82,756 (real); 100 new subjects simulated from the fitted 2PL",
        "fit_2pl_s": fit_s, **timing,
        "adaptive_trials": args.trials, "adaptive_wall_s": adaptive_s,
        "adaptive_trials_per_min_ray": 60 * args.trials / adaptive_s,
        "adaptive_tau_mean": {k: v for k, v in tau.to_dict(orient="index").items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
