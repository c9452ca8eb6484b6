"""NUTS with the pooled item blocks as they are against standardised (issue 16, part 1).

For each board (``bench_marginal._load`` names: ``50x1000``, ``nlu90:rte``, ``openml:kc2`` ...;
a simulated ``SxN`` board is drawn from ``--model``'s own generator, as ``bench_coverage.py``
draws it) a ``fit_nuts`` at the default 4 x (500 + 1,000) draws in two coordinate systems of
the same posterior: ``centred`` (``noncentred_below=0``: every block as it is, the default at
30 subjects or more) and ``std`` (``noncentred_below=N+1, anchor="all"``: every pooled item
block as ``(x - mu) sqrt(u)``, the scale read from the discriminations' pool location), or
``default`` (the default rule, with its restart in standardised coordinates where an
unconverged run's items are mostly their pools' prior: fit.json's shrinkages and first run
are in ``coords``). Wall
time, compile time, R-hat and least bulk ESS with the three worst blocks, divergences,
leapfrog steps per draw and the coordinates fit.json records. One JSON line a run.

    python benchmarks/bench_nuts_coordinates.py 50x1000 nlu90:rte --model 3pl [--modes centred,std,default]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def run(board: str, model: str, mode: str, seed: int) -> dict:
    from bench_coverage import simulate
    from bench_marginal import _load
    from engine.api import fit_nuts
    from engine.infer.nuts import NutsSettings

    shape = re.fullmatch(r"(\d+)x(\d+)", board)
    y = (simulate(model, (int(shape[1]), int(shape[2])), seed)["responses"] if shape
         else _load(board))
    settings = NutsSettings(seed=seed, **{
        "centred": {"noncentred_below": 0},
        "std": {"noncentred_below": y.shape[1] + 1, "anchor": "all"},
        "default": {}}[mode])
    start = time.perf_counter()
    res = fit_nuts(y, model, settings)
    wall = time.perf_counter() - start
    d = res.extra["diagnostics"]
    worst = sorted(((round(v["rhat_max"], 4), k, round(v["ess_bulk_min"]))
                    for k, v in d["blocks"].items()), reverse=True)[:3]
    return {"model": model, "board": board, "shape": list(y.shape), "seed": seed, "mode": mode,
            "wall_s": round(wall, 1), "compile_s": round(res.compile_time_s, 1),
            "rhat_max": round(d["rhat_max"], 4), "ess_bulk_min": round(d["ess_bulk_min"]),
            "worst": worst, "divergences": d["divergences"],
            "steps": round(d["mean_steps_per_draw"], 1), "converged": res.converged,
            "threads": d["chain_threads"], "coords": d["coordinates"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("boards", nargs="+")
    parser.add_argument("--model", default="2pl")
    parser.add_argument("--modes", default="centred,std")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for board in args.boards:
        for mode in args.modes.split(","):
            print(json.dumps(run(board, args.model, mode, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
