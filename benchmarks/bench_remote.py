"""A streaming fit reading its tiles from an S3 endpoint against the same fit from disk.

Generates a dense 2PL store on disk, uploads the same store to an S3-compatible server on
127.0.0.1 (moto in server mode, started here), then runs ``irt-engine fit`` on each in its own
child process with the same ``--memory-budget`` (small enough that both stream) and a fixed
number of passes. Reports cells/s (fit.json's, observed cells x passes / fit wall time), the
command's wall time and the child's peak RSS (``ru_maxrss`` of the reaped child).

    python benchmarks/bench_remote.py --subjects 2000 --items 5000 --passes 10

Loopback only: the server binds 127.0.0.1 and the child gets AWS_ENDPOINT_URL pointing at it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.generate_store import generate_store  # noqa: E402
from tests.cluster.s3server import S3Server  # noqa: E402


def _fit(store: str, out: Path, args, env: dict) -> dict:
    cmd = [sys.executable, "-m", "engine.cli", "fit", store, "--out", str(out), "--quiet",
           "--memory-budget", args.budget, "--max-passes", str(args.passes), "--seed", "0"]
    t0 = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"fit of {store} failed: {(out.parent / f'{out.name}.log').read_text()}")
    info = json.loads((out / "fit.json").read_text())
    return {"store": store, "wall_s": wall, "fit_wall_s": info["timings"]["wall_s"],
            "cells_per_s": info["timings"]["cells_per_s"], "passes": info["num_passes"],
            "peak_rss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subjects", type=int, default=2000)
    ap.add_argument("--items", type=int, default=5000)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--budget", default="4M", help="--memory-budget of both fits")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    store = root / "store.zarr"
    gen = generate_store(store, args.subjects, args.items, chunks=(1000, 1000))
    server = S3Server()
    try:
        env = server.env()
        env["PYTHONPATH"] = str(REPO)
        server.make_bucket("bench")
        t0 = time.perf_counter()
        server.filesystem().put(str(store), "bench/store.zarr", recursive=True)
        upload_s = time.perf_counter() - t0
        rows = []
        for r in range(args.repeats):
            for where in (str(store), "s3://bench/store.zarr"):
                res = _fit(where, root / f"run-{r}-{len(rows)}", args, env)
                rows.append(res)
                print(json.dumps(res), flush=True)
    finally:
        server.stop()
    print(json.dumps({"shape": [args.subjects, args.items], "budget": args.budget,
                      "generate": gen, "upload_s": upload_s}, default=str))


if __name__ == "__main__":
    main()
