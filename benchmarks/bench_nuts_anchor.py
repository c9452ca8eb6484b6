"""NUTS in the anchored coordinates against the blocks as they are (issue 16, part 1).

For each board (``bench_marginal._load`` names: ``200x400``, ``lsat7``, ``openml:kc2`` ...)
and each ``NutsSettings.anchor`` value, a 2PL ``fit_nuts`` at the default 4 x (500 + 1,000)
draws (``--extend 1``: with ``auto``'s one added round where R-hat is over 1.01): wall
time, R-hat (worst three parameters), least bulk ESS per block, divergences, step sizes
and leapfrog steps per draw. One JSON line a run.

    python benchmarks/bench_nuts_anchor.py 200x400 lsat7 --anchors none,all [--seed 0] [--extend 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def run(board: str, anchor: str, seed: int, extend: int = 0) -> dict:
    import arviz as az
    from bench_marginal import _load
    from engine.api import fit_nuts
    from engine.infer.nuts import NutsSettings

    y = _load(board)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    res = fit_nuts(y, "2pl", NutsSettings(seed=seed, anchor=anchor, extend=extend))
    wall = time.perf_counter() - start
    d = res.extra["diagnostics"]
    rhat = az.rhat(res.extra["idata"])
    worst = sorted(((float(np.nanmax(np.asarray(rhat[v]))), v) for v in rhat.data_vars),
                   reverse=True)[:3]
    return {"board": board, "shape": list(y.shape), "anchor": anchor, "seed": seed,
            "extend": extend, "extended": d["extended"],
            "wall_s": round(wall, 1), "load": round(load, 2), "rhat_max": d["rhat_max"],
            "worst": worst, "ess_bulk_min": d["ess_bulk_min"],
            "ess_bulk_min_by_block": {k: round(v["ess_bulk_min"]) for k, v in d["blocks"].items()},
            "divergences": d["divergences"], "step_size": d["step_size"],
            "mean_steps_per_draw": d["mean_steps_per_draw"], "converged": res.converged}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("boards", nargs="+")
    parser.add_argument("--anchors", default="none,all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extend", type=int, default=0)
    args = parser.parse_args(argv)
    for board in args.boards:
        for anchor in args.anchors.split(","):
            print(json.dumps(run(board, anchor, args.seed, args.extend)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
