"""What the default fit's two ways of fitting abilities cost, by shape (the `auto` bound).

Simulates one 2PL matrix per shape (theta, b ~ N(0, 1), every cell observed) and fits it with
``engine.fit`` at each ``--ability-factor`` in one process; prints wall seconds (compilation
included) and fit.json's ``ability_factor`` record.

    python benchmarks/bench_ability_factor_cost.py --shapes 2000x250,4000x250 \\
        --factors gaussian,quadrature
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="2000x250,4000x250")
    ap.add_argument("--factors", default="gaussian,quadrature")
    args = ap.parse_args()
    from engine.api import fit
    from engine.infer.settings import FitSettings

    for shape in args.shapes.split(","):
        s, n = map(int, shape.split("x"))
        rng = np.random.default_rng(0)
        theta, b = rng.normal(size=s), rng.normal(size=n)
        y = (rng.random((s, n)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(np.int8)
        for factor in args.factors.split(","):
            t = time.perf_counter()
            res = fit(y, "2pl", FitSettings(seed=0, ability_factor=factor))
            print(f"{shape} {factor}: {time.perf_counter() - t:.1f} s "
                  f"{res.extra['ability_factor']}", flush=True)


if __name__ == "__main__":
    main()
