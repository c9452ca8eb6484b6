"""Rank read-outs of real boards with many identical answer sheets.

Each data set (binary psych questionnaires in ``/work/shared/data/psych_human_r``) is fitted
with the default 2PL and written with ``save_run``; the script reports what a maintainer
reads off ``subjects.parquet``: P(top-1) and P(top-3) summed over the board (one and three
when twins rank among each other), the largest group of identical best sheets with its
P(top-1), P(top-3) and 90% rank interval, and the best other sheet's; ``save_run``'s wall
time (median of three, the fit outside it).

    python benchmarks/bench_rank_twins.py [--data lsat7,ability,blot,mathexam] [--out PATH]

Run it with ``PYTHONPATH`` set to another checkout to read an earlier version's numbers
(``git worktree add /tmp/base REV``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

PSYCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "psych_human_r"


def responses(name: str) -> np.ndarray:
    """The binary matrix of ``name`` (-1 missing), subjects without a response dropped."""
    file = {"lsat7": "lsat7", "ability": "ability", "blot": "blot",
            "mathexam": "mathexam14w"}[name]
    df = pd.read_parquet(PSYCH / f"{file}.parquet").drop(columns=["subject_id"])
    if name == "mathexam":
        df = df[[c for c in df.columns if c.startswith("solved_")]]
    y = df.astype("float").fillna(-1).to_numpy().astype(np.int8)
    return y[(y >= 0).any(axis=1)]


def measure(name: str, work: Path) -> dict:
    import engine
    from engine.run import save_run

    y = responses(name)
    res = engine.fit(y, model="2pl")
    times = []
    for _ in range(3):
        shutil.rmtree(work / name, ignore_errors=True)
        start = time.perf_counter()
        run = save_run(res, work / name)
        times.append(time.perf_counter() - start)
    s = run.subjects
    best = s["ability_mean"].max()
    top = s[s["ability_mean"] == best]
    other = s[s["ability_mean"] < best].sort_values("ability_mean").iloc[-1]

    def row(r) -> dict:
        return {"ability_mean": float(r["ability_mean"]), "p_top1": float(r["p_top1"]),
                "p_top3": float(r["p_top3"]), "rank_mean": float(r["rank_mean"]),
                "rank_q05": float(r["rank_q05"]), "rank_q95": float(r["rank_q95"])}

    return {"data": name, "shape": list(y.shape), "p_top1_sum": float(s["p_top1"].sum()),
            "p_top3_sum": float(s["p_top3"].sum()), "best_group_size": int(len(top)),
            "best_sheet": row(top.iloc[0]), "next_sheet": row(other),
            "save_run_s": statistics.median(times), "rank_draws": run.info["readout"]["rank_draws"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="lsat7,ability,blot,mathexam")
    ap.add_argument("--out", default=None, help="a JSON file for the results")
    args = ap.parse_args(argv)
    import engine

    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.data.split(","):
            rows.append(measure(name, Path(work)))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "engine": str(Path(engine.__file__).parent), "machine": platform.processor() or
            platform.machine(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
