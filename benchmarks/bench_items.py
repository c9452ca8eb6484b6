"""Item-analysis benchmarks: scoring new subjects against frozen NLU items vs. a full refit,
and in-process adaptive-selection trials per minute.

Usage: ``python benchmarks/bench_items.py [--out benchmarks/results/items.json]``. Reads the
real NLU matrix (90 x 82,756) from ../shared/data. The 100 new subjects are drawn from the
fitted 2PL at abilities spread like the run's (their responses are simulated, the items real).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.api import fit
from engine.data import write_store
from engine.infer.settings import FitSettings
from engine.readout.adaptive import AdaptiveTrialSpec, adaptive_trial, load_trial_data
from engine.readout.items import item_bank
from engine.run import save_run
from engine.score import score

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[1].parent / "shared" / "data"


def nlu() -> tuple[np.ndarray, list[str], list[str]]:
    wide = pd.read_parquet(DATA / "nlu" / "responses_items_x_subjects.parquet")
    subjects = [c for c in wide.columns if c not in ("item_id", "item", "dataset")]
    return wide[subjects].to_numpy().T.astype(np.int8), subjects, wide["item"].astype(str).tolist()


def nlu_run(tmp: Path):
    """The NLU matrix, its store under ``tmp`` and a saved 2PL run: ``(y, run, fit seconds)``."""
    y, subjects, items = nlu()
    store = write_store(y, subjects, items, tmp / "nlu.zarr")
    t0 = time.perf_counter()
    run = save_run(fit(store.path, model="2pl", settings=FitSettings(seed=0)), tmp / "run",
                   num_draws=200)
    return y, run, time.perf_counter() - t0


def score_vs_refit(y: np.ndarray, run) -> dict:
    """Score 100 subjects simulated from the run against its frozen items, and time a full
    refit of all subjects; abilities of the new subjects compared between the two."""
    rng = np.random.default_rng(0)
    theta = rng.choice(run.subjects["ability_mean"].to_numpy(), 100) + rng.normal(0, 0.1, 100)
    p = item_bank(run.spec, run.guide).prob(theta.astype(np.float32))
    y_new = (rng.random(p.shape) < p).astype(np.int8)
    timed = {}
    for method in ("grid", "fit"):  # the first call in the process pays its compilation
        t0 = time.perf_counter()
        board, res = score(run, y_new, num_draws=200, method=method)
        timed[method] = (time.perf_counter() - t0, res.num_passes,
                         board[board["new"]]["ability_mean"].to_numpy())
    t0 = time.perf_counter()
    full = fit(np.concatenate([y, y_new]), model="2pl", settings=FitSettings(seed=0))
    refit_s = time.perf_counter() - t0
    refit = full.means()["ability"][y.shape[0]:]
    out = {"refit_190_s": refit_s, "refit_passes": full.num_passes}
    for method, (seconds, passes, new) in timed.items():
        tag = "" if method == "grid" else "_frozen_fit"
        out |= {f"score_100_s{tag}": seconds, f"score_passes{tag}": passes,
                f"speedup{tag}": refit_s / seconds,
                f"score_vs_refit_r{tag}": float(np.corrcoef(new, refit)[0, 1]),
                f"score_vs_truth_r{tag}": float(np.corrcoef(new, theta)[0, 1])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/items.json")
    ap.add_argument("--trials", type=int, default=40, help="in-process adaptive trials (0: none)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-items-"))
    y, run, fit_s = nlu_run(tmp)
    timing = score_vs_refit(y, run)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores",
        "load_average": __import__('os').getloadavg(),
        "data": "nlu 90 x 82,756 (real); 100 new subjects simulated from the fitted 2PL",
        "fit_2pl_s": fit_s, **timing,
    }
    if args.trials:
        result |= adaptive_in_process(run, args.trials)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))


def adaptive_in_process(run, trials: int) -> dict:
    """In-process adaptive-selection trials: trials per minute and Kendall tau bands."""
    t0 = time.perf_counter()
    data = load_trial_data(run)
    load_s = time.perf_counter() - t0
    spec = AdaptiveTrialSpec(run=str(run.path), checkpoints=(10, 25, 50, 100, 200))
    t0 = time.perf_counter()
    rows = [row for s in range(trials) for row in adaptive_trial(AdaptiveTrialSpec(**{**spec.to_dict(), "seed": s}), data)]
    trial_s = time.perf_counter() - t0
    tau = pd.DataFrame(rows).groupby(["strategy", "num_items"])["kendall_tau"].mean().unstack().round(3)

    return {"adaptive_load_s": load_s, "adaptive_trials": trials, "adaptive_trial_s": trial_s,
            "adaptive_trials_per_min_in_process": 60 * trials / trial_s,
            "adaptive_tau": {k: v for k, v in tau.to_dict(orient="index").items()}}


if __name__ == "__main__":
    main()
