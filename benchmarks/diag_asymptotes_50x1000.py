"""The quadrature fit of an asymptote model at 50 x 1,000, pass by pass (issue 16, part 2).

Simulates ``simulate_asymptotes(model, 50, 1000, seed)`` (as ``bench_coverage.py`` does),
fits it with ``ability_factor="quadrature"`` (no mean-field fallback), and prints the wall
time, passes, whether the mode search converged or stalled (``diverged``: its best pass and
last progress), how the items' moments were obtained, and every third pass's objective,
largest Newton step and seconds.

    python benchmarks/diag_asymptotes_50x1000.py 3pl 1
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine  # noqa: E402
from simulate import simulate_asymptotes  # noqa: E402


def main(model: str, seed: int) -> None:
    y = simulate_asymptotes(model, 50, 1000, seed=seed)["responses"]
    start = time.time()
    res = engine.fit(y, model=model, settings=engine.FitSettings(
        seed=seed, progress=False, ability_factor="quadrature"))
    q = res.extra["quadrature"]
    print("wall", round(time.time() - start, 1), "passes", res.num_passes, "converged",
          res.converged, "mode_converged", q.get("mode_converged"), "diverged", q.get("diverged"))
    moments = {k: v for k, v in q["item_moments"].items() if k != "not_mixed"}
    print("moments", json.dumps(moments, default=str)[:1500])
    for row in res.trace[::3] + res.trace[-3:]:
        print(row["pass"], round(row["elbo"], 3), round(row["max_step"], 4), round(row["seconds"], 1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
