"""NUTS at 50 x 1,000 for an asymptote model (seed 0, simulated as bench_coverage.py does), with
its agreement with the default fit's per-item means and sds in the 2026-11-30 results file.

    python benchmarks/nuts_asymptotes_50x1000.py 3pl|feas
"""
import json, sys, time
from pathlib import Path

import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_coverage import draws_coverage, simulate
import engine
from engine.readout.posterior import draw_summary_columns
model = sys.argv[1]
sim = simulate(model, (50, 1000), 0)
t = time.perf_counter()
res = engine.fit_nuts(sim["responses"], model=model)
wall = time.perf_counter() - t
d = res.extra["diagnostics"]
out = {"model": model, "shape": [50, 1000], "seed": 0, "wall_s": round(wall, 1), "rhat_max": d["rhat_max"],
       "ess_bulk_min": d["ess_bulk_min"], "divergences": d["divergences"],
       "by_block": {k: {"rhat_max": round(v["rhat_max"], 4), "ess_bulk_min": round(v["ess_bulk_min"])} for k, v in d["blocks"].items()},
       "steps": d["mean_steps_per_draw"], "converged": res.converged}
out["coverage"] = draws_coverage(sim, res.draws)
old = json.load(open(Path(__file__).resolve().parent / f"results/coverage_{model}_50x1000_nuts_seed0-2026-11-30.json"))
exact = draw_summary_columns(res.spec, res.draws, "item")
def find(o):
    if isinstance(o, dict):
        if "agreement" in o: return o["agreement"]
        for v in o.values():
            r = find(v)
            if r: return r
    if isinstance(o, list):
        for v in o:
            r = find(v)
            if r: return r
ag = find(old)
out["agreement_with_the_2026_11_30_fit"] = {}
for block, a in (ag or {}).items():
    if "per_item" not in a or f"{block}_mean" not in exact: continue
    nm, ns = np.asarray(exact[f"{block}_mean"], float), np.asarray(exact[f"{block}_sd"], float)
    fm, fs = np.asarray(a["per_item"]["fit_mean"]), np.asarray(a["per_item"]["fit_sd"])
    om = np.asarray(a["per_item"]["nuts_mean"])
    z = np.abs(fm - nm) / ns; r = fs / ns
    out["agreement_with_the_2026_11_30_fit"][block] = {"z_median": round(float(np.median(z)), 3), "z_max": round(float(z.max()), 3),
        "share_within_0.25": round(float(np.mean(z <= 0.25)), 3), "sd_ratio": [round(float(x), 3) for x in (r.min(), np.median(r), r.max())],
        "old_nuts_vs_new_z_max": round(float((np.abs(om - nm) / ns).max()), 3)}
print(json.dumps(out), flush=True)
