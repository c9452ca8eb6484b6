"""1,000 stability trials on a one-node and on a two-node `ray start` cluster (token auth,
127.0.0.1, one CPU per node; tests/cluster/raycluster.py).

    nice -n 10 python benchmarks/bench_cluster_trials.py [--trials 1000 --batch-size 50]

On a simulated 2PL store, runs `irt-engine stability --address` with the same trials first
against the head node alone, then after a second node joined. Reports wall seconds, trials/s
and seconds per trial for each, and the in-process run of the same trials (no Ray) as the
floor, so what the cluster adds per trial shows. Stops only the processes it started.
Writes benchmarks/results/cluster_trials.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pandas as pd  # noqa: E402

from tests.cluster.conftest import simulate_2pl  # noqa: E402
from subproc import timed_cli  # noqa: E402
from tests.cluster.raycluster import RayStartCluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subjects", type=int, default=24)
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--size", type=int, default=20)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=50)
    args = ap.parse_args()
    from engine.compile_cache import compilation_cache_dir
    from engine.data.store import write_store

    root = Path(tempfile.mkdtemp(prefix="bench-cluster-trials-"))
    y = simulate_2pl(args.subjects, args.items, seed=3)
    store = write_store(y, [f"s{i}" for i in range(args.subjects)],
                        [f"q{j}" for j in range(args.items)], root / "store.zarr").path
    stab = ["--sizes", args.size, "--trials-per-size", args.trials, "--batch-size",
            args.batch_size, "--passes", args.passes, "--bootstrap", "100", "--quiet"]
    results = {"shape": [args.subjects, args.items], "trials": args.trials,
               "sample_size": args.size, "passes": args.passes, "batch_size": args.batch_size,
               "cpus": os.cpu_count(), "machine": platform.platform(), "runs": {}}
    cluster = RayStartCluster(root / "cluster",
                              env={"JAX_COMPILATION_CACHE_DIR": compilation_cache_dir()})
    client = {k: v for k, v in cluster.env.items()
              if not k.startswith("RAY_AUTH") and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    client["RAY_AUTH_TOKEN"] = cluster.token
    rows = {}

    def record(name, cmd, env):
        load_before = os.getloadavg()[0]
        sec, proc = timed_cli(cmd, env, timeout=3600)
        out = Path(cmd[cmd.index("--out") + 1])
        done = pd.read_parquet(out / "stability.parquet") if proc.returncode == 0 else None
        irt = done[done["method"] == "irt"] if done is not None else None
        results["runs"][name] = {
            "exit": proc.returncode, "seconds": sec, "trials_per_s": args.trials / sec,
            "seconds_per_trial": sec / args.trials,
            "trials_landed": None if irt is None else int(len(irt)),
            "trials_unique": None if irt is None else int(irt["trial"].nunique()),
            "load_1min_before_after": [load_before, os.getloadavg()[0]],
            "stderr_tail": proc.stderr.strip()[-300:]}
        if irt is not None:
            rows[name] = irt.sort_values("trial").reset_index(drop=True)
        print(name, json.dumps(results["runs"][name]), flush=True)

    try:
        record("inprocess", ["stability", store, "--out", root / "inproc", "--backend",
                             "inprocess", *stab], client)
        cluster.start_head()
        cluster.wait_for_nodes(1)
        record("one_node", ["stability", store, "--out", root / "one", "--address",
                            cluster.address, *stab], client)
        cluster.add_node("worker")
        cluster.wait_for_nodes(2)
        record("two_nodes", ["stability", store, "--out", root / "two", "--address",
                             cluster.address, *stab], client)
    finally:
        cluster.stop()
    if {"one_node", "two_nodes"} <= rows.keys():
        cols = [c for c in rows["one_node"].columns if c not in ("seconds", "elapsed", "node")]
        results["two_nodes_rows_equal_one_node"] = bool(
            rows["one_node"][cols].equals(rows["two_nodes"][cols]))
    base = results["runs"].get("inprocess", {}).get("seconds_per_trial")
    for name in ("one_node", "two_nodes"):
        run = results["runs"].get(name, {})
        if base and run.get("exit") == 0:
            run["overhead_per_trial_vs_inprocess_s"] = run["seconds_per_trial"] - base
    out = HERE / "results" / "cluster_trials.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
