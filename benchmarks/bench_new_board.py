"""A new board of a similar shape after an earlier one: does its fit find the earlier fit's
programs in the persistent compilation cache?

For each pair of simulated 2PL boards ``(S, N, seed)``, a process fits the first with an
empty cache directory, then a second process fits the second with the same directory; the
second process's fit is timed, with its compile counts (``extra["compile"]``) and the item
sampler's grid. With ``--base`` the code before a change runs beside the head, in turns.

    python benchmarks/bench_new_board.py [--base /tmp/base] [--rounds 2]

``--base`` is a checkout of the earlier commit (``git worktree add /tmp/base REV``); both run
with the repository's ``.venv`` and ``PYTHONPATH`` set to their tree. Writes
benchmarks/results/new-board.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = str(HERE.parent / ".venv" / "bin" / "python")
PAIRS = [((24, 120, 0), (24, 120, 2)),  # the same shape, other answers
         ((24, 120, 0), (23, 117, 1)),  # one subject and three items fewer
         ((40, 30, 0), (40, 30, 5)),
         ((40, 30, 0), (38, 29, 6))]

_CHILD = """
import json, sys, time
import numpy as np
from engine.api import fit
S, N, seed = map(int, sys.argv[1:4])
r = np.random.default_rng(seed)
theta, b, a = r.normal(size=S), r.normal(size=N), np.exp(0.3 * r.normal(size=N))
p = 1 / (1 + np.exp(-a * (theta[:, None] - b)))
y = (r.uniform(size=(S, N)) < p).astype(np.int8)
t = time.perf_counter()
res = fit(y, "2pl")
wall = time.perf_counter() - t
moments = res.extra["quadrature"]["item_moments"]
sampler = moments.get("sampler") or {}
print(json.dumps({"fit_s": round(wall, 2), "programs": res.extra["compile"]["programs"],
                  "xla_s": res.extra["compile"]["xla_compile_s"],
                  "sampler_s": sampler.get("seconds"), "grid": sampler.get("grid_points"),
                  "item_moments": moments.get("method")}))
"""


def _fit(tree: Path, board, cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "JAX_COMPILATION_CACHE_DIR": cache,
           "IRT_ENGINE_COMPILATION_CACHE": "1"}
    out = subprocess.run([PY, "-c", _CHILD, *map(str, board)], env=env, check=True,
                         capture_output=True, text=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="a checkout of the code before a change")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    trees = ([("base", args.base.resolve())] if args.base else []) + [("head", HERE.parent)]
    rows = []
    for round_ in range(args.rounds):
        for name, tree in trees:
            for first, second in PAIRS:
                with tempfile.TemporaryDirectory() as cache:
                    _fit(tree, first, cache)
                    row = {"round": round_, "code": name, "first": first, "second": second,
                           **_fit(tree, second, cache), "load": os.getloadavg()[0]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = HERE / "results" / "new-board.json"
    out.write_text(json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(),
                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
