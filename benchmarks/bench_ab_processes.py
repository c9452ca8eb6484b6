"""Two versions of irt-engine side by side: whole ``irt-engine fit`` processes, alternating.

For a change whose effect on a process is smaller than the machine's drift (a fixed cost of
a tenth of a second), run the code before it and after it in turns on the same store, each
with its own warm compilation cache, and compare the medians: both see the same load.

    python benchmarks/bench_ab_processes.py --base /tmp/base [--head .] [--data lsat7,nlu]
        [--rounds 5] [--work /tmp/ab]

``--data`` names lsat7, ability (psych, its 16 unanswered subjects dropped), nlu or a simulated shape of ``bench_core.py`` (squad, big, square, wide).

``--base`` is a checkout of the earlier commit (``git worktree add /tmp/base REV``); both
versions run with the repository's ``.venv`` and ``PYTHONPATH`` set to their tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
PY = str(HERE.parent / ".venv" / "bin" / "python")
PSYCH = HERE.parent.parent / "shared" / "data" / "psych_human_r"
LSAT7 = PSYCH / "lsat7.parquet"


def _stores(work: Path, names: list[str]) -> None:
    """Ingest each data set once (with the head version)."""
    for name in names:
        if (work / f"{name}.zarr").exists():
            continue
        if name == "lsat7":
            source = LSAT7
        elif name == "ability":  # ingest refuses subjects with no response: dropped
            df = pd.read_parquet(PSYCH / "ability.parquet")
            source = work / "ability.parquet"
            df[~df.drop(columns=["subject_id"]).isna().all(axis=1)].to_parquet(source, index=False)
        else:  # nlu, or one of bench_core's simulated shapes (squad: 161 x 11,873 ...)
            from bench_core import NLU_PARQUET, load_dataset

            y = load_dataset(name, quick=False, nlu_path=NLU_PARQUET)["responses"]
            s, i = np.nonzero(y >= 0)
            source = work / f"{name}.parquet"
            pd.DataFrame({"subject": s.astype(np.int32), "item": i.astype(np.int32),
                          "response": y[s, i].astype(np.int8)}).to_parquet(source)
        subprocess.run([PY, "-m", "engine.cli", "ingest", str(source), "--out",
                        str(work / f"{name}.zarr")], check=True, cwd=work)


def _fit(tree: str, tag: str, work: Path, name: str, k: str) -> tuple[float, float]:
    """Wall and CPU seconds of one fit process of version ``tag``."""
    env = {**os.environ, "PYTHONPATH": tree, "JAX_COMPILATION_CACHE_DIR": str(work / f"cache-{tag}")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([PY, "-m", "engine.cli", "fit", str(work / f"{name}.zarr"), "--model", "2pl",
                    "--out", str(work / f"run-{tag}-{name}-{k}"), "--quiet", "--overwrite"],
                   check=True, cwd=work, env=env, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="checkout of the earlier version")
    ap.add_argument("--head", default=str(HERE.parent))
    ap.add_argument("--data", default="lsat7,nlu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ab"))
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    names = args.data.split(",")
    _stores(args.work, names)
    trees = {"base": str(Path(args.base).resolve()), "head": str(Path(args.head).resolve())}
    times: dict[str, dict[str, list]] = {}
    for name in names:
        for tag, tree in trees.items():  # fills each version's compilation cache
            _fit(tree, tag, args.work, name, "warm-up")
        for k in range(args.rounds):
            order = ("base", "head") if k % 2 == 0 else ("head", "base")
            for tag in order:
                times.setdefault(name, {}).setdefault(tag, []).append(
                    _fit(trees[tag], tag, args.work, name, str(k)))
    summary = {name: {tag: {"wall_median_s": statistics.median(w for w, _ in v),
                            "cpu_median_s": statistics.median(c for _, c in v),
                            "walls_s": [round(w, 3) for w, _ in v]}
                      for tag, v in by.items()} for name, by in times.items()}
    summary["load_avg_1m_at_end"] = os.getloadavg()[0]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
