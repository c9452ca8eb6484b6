"""The asymptote models (3PL, 4PL, feas) under the vague and the population priors: is the
mean-field fit's shrinkage of the difficulties under pooled priors the posterior's, or the
fit's? NUTS of the same model and prior is the reference.

    python benchmarks/bench_asymptote_priors.py [--models 3pl,4pl,feas] [--shape 150x150]
        [--seed 2] [--chains 2] [--warmup 400] [--samples 400] [--out PATH]

Simulated truth: abilities and difficulties N(0, 1), discriminations exp(0.3 z), guessing
Beta(2, 8) (3PL, 4PL), feasibility 1 - Beta(2, 8) (4PL, feas). For each model and prior it
reports, for the NUTS posterior means, the default fit's (``auto``: quadrature on short
tests) and the mean-field fit's (``ability_factor="gaussian"``) means: r with the
truth per block, the sd of the fitted difficulties (the truth's is about 1), and the mean
asymptotes; and for NUTS the largest R-hat.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import engine  # noqa: E402
from engine.infer.nuts import NutsSettings  # noqa: E402
from simulate import simulate_asymptotes  # noqa: E402


def simulate(model: str, S: int, N: int, seed: int) -> dict:
    sim = simulate_asymptotes(model, S, N, seed=seed)
    return {"y": sim.pop("responses"), "truth": sim}


def summary(means: dict, truth: dict) -> dict:
    out = {f"r_{k}": round(float(np.corrcoef(means[k], v)[0, 1]), 3)
           for k, v in truth.items() if k in means}
    out["difficulty_sd"] = round(float(np.std(means["difficulty"])), 3)
    out["difficulty_sd_truth"] = round(float(np.std(truth["difficulty"])), 3)
    for k in ("guessing", "feasibility"):
        if k in means:
            out[f"mean_{k}"] = round(float(np.mean(means[k])), 3)
            out[f"mean_{k}_truth"] = round(float(np.mean(truth[k])), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="3pl,4pl,feas")
    ap.add_argument("--priors", default="vague,population")
    ap.add_argument("--shape", default="150x150")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=400)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "asymptote-priors.json")
    args = ap.parse_args(argv)
    S, N = (int(v) for v in args.shape.split("x"))
    results = {"shape": [S, N], "seed": args.seed, "nuts": {"chains": args.chains,
               "warmup": args.warmup, "samples": args.samples}, "rows": []}
    for model in args.models.split(","):
        sim = simulate(model, S, N, args.seed)
        for prior in args.priors.split(","):
            row = {"model": model, "prior": prior}
            for factor in ("auto", "gaussian"):  # the default (quadrature here), mean-field
                t0 = time.perf_counter()
                fit = engine.fit(sim["y"], model=model, prior=prior,
                                 settings=engine.FitSettings(seed=0, ability_factor=factor))
                row[f"fit_{factor}"] = summary(fit.means(), sim["truth"]) | {
                    "method": fit.extra.get("ability_factor", {}).get("method"),
                    "seconds": round(time.perf_counter() - t0, 1)}
            t0 = time.perf_counter()
            nuts = engine.fit_nuts(sim["y"], model=model, prior=prior, settings=NutsSettings(
                num_chains=args.chains, num_warmup=args.warmup, num_samples=args.samples,
                seed=0))
            rhat = nuts.extra["diagnostics"]["rhat_max"]
            row |= {"nuts": summary(nuts.means(), sim["truth"]), "nuts_rhat_max": rhat,
                    "nuts_s": round(time.perf_counter() - t0, 1)}
            print(json.dumps(row), flush=True)
            results["rows"].append(row)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
