"""What a default fit falls back to where its quadrature route does not converge, on real
small leaderboards: the route each board takes, and the held-out predictive density of the
NUTS fallback beside the mean-field one.

For each named data set (``nlu:<test set>``, the 18 final checkpoints, or
``openml:<data set>``, the 19 classifiers): a seeded 10% of the cells is held out, the 2PL
is fitted on the rest by default settings (``nuts_fallback_max_cells``, 12,000: NUTS where
the quadrature fit gives up) and with the NUTS fallback off (0: the mean-field fit), and
the held-out cells are scored by ``engine.readout.compare.predictive`` (NUTS over its own
draws; also over their normal approximation, the run's guide). Cells of items the
training responses answer alike are not scored, as ``compare`` does.

    python benchmarks/bench_fallback.py --data openml:kc2,openml:ilpd [--out PATH]
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

from bench_marginal import _load as load  # noqa: E402  nlu:<test set>, openml:<data set>


def measure(name: str, holdout: float, seed: int) -> dict:
    import jax

    from engine.api import constant_columns, fit
    from engine.infer.settings import FitSettings
    from engine.readout.compare import predictive, split_holdout

    y = load(name)
    train, s_idx, i_idx = split_holdout(y, holdout, seed)
    scored = ~constant_columns(train)[i_idx]
    s_idx, i_idx = s_idx[scored], i_idx[scored]
    y_out = y[s_idx, i_idx].astype(np.float64)
    row = {"data": name, "shape": list(y.shape), "heldout_scored": int(len(y_out))}
    kw = dict(num_subjects=y.shape[0], num_items=y.shape[1], num_draws=1000,
              rng_key=jax.random.PRNGKey(seed), binary=True)
    for label, cells in (("default", FitSettings().nuts_fallback_max_cells), ("mean_field", 0)):
        t = time.perf_counter()
        res = fit(train, "2pl", FitSettings(seed=seed, nuts_fallback_max_cells=cells))
        log_pred, _ = predictive(res.spec, res.guide, s_idx, i_idx, y_out, sampled=res.draws, **kw)
        factor = res.extra["ability_factor"]
        row[label] = {"method": factor["method"], "wall_s": time.perf_counter() - t,
                      "converged": bool(res.converged), "heldout_loglik": float(log_pred.sum()),
                      "why": factor.get("quadrature_not_converged"),
                      "rhat_max": res.extra.get("diagnostics", {}).get("rhat_max")}
        if res.draws:
            guided, _ = predictive(res.spec, res.guide, s_idx, i_idx, y_out, **kw)
            row[label]["heldout_loglik_normal_approximation"] = float(guided.sum())
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="openml:kc2,openml:ilpd")
    ap.add_argument("--holdout", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "fallback-holdout.jsonl"))
    args = ap.parse_args(argv)
    with open(args.out, "a") as out:
        for name in args.data.split(","):
            row = measure(name, args.holdout, args.seed)
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
