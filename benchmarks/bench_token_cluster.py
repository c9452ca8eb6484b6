"""A user's token-auth Ray cluster on this machine: what submit and --address cost.

    python benchmarks/bench_token_cluster.py [--subjects 100 --items 400]

Starts `ray start --head` plus a second node (both 127.0.0.1, token authentication, one CPU
each; tests/cluster/raycluster.py), then times, on a simulated 2PL store: a local `fit` and
the same fit through `submit`; `stability` with its own embedded Ray and with `--address`;
and how long a client without a token takes to get its one-line error from `submit` and from
`--address`. Stops only the processes it started. Writes benchmarks/results/token_cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pandas as pd  # noqa: E402

from tests.cluster.conftest import simulate_2pl  # noqa: E402
from subproc import timed_cli  # noqa: E402
from tests.cluster.raycluster import RayStartCluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subjects", type=int, default=100)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--trials-per-size", type=int, default=4)
    args = ap.parse_args()
    from engine.compile_cache import compilation_cache_dir
    from engine.data import ingest

    root = Path(tempfile.mkdtemp(prefix="bench-token-cluster-"))
    y = simulate_2pl(args.subjects, args.items, seed=3)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(y.shape[1])])
    df.insert(0, "subject", [f"s{i}" for i in range(y.shape[0])])
    df.to_csv(root / "wide.csv", index=False)
    store = ingest(root / "wide.csv", root / "store.zarr").path
    results = {"shape": [args.subjects, args.items], "cpus": os.cpu_count(),
               "machine": platform.platform(), "seconds": {}}
    sec = results["seconds"]
    cluster = RayStartCluster(root / "cluster",
                              env={"JAX_COMPILATION_CACHE_DIR": compilation_cache_dir()})
    client = {k: v for k, v in cluster.env.items()
              if not k.startswith("RAY_AUTH") and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    client["HOME"] = str(root / "client-home")
    Path(client["HOME"]).mkdir()
    with_token = {**client, "RAY_AUTH_TOKEN": cluster.token}
    stab = ["--sizes", "25", "--trials-per-size", args.trials_per_size, "--batch-size", "1",
            "--passes", "10", "--quiet"]
    try:
        t = time.perf_counter()
        cluster.start_head()
        sec["ray_start_head"] = time.perf_counter() - t
        t = time.perf_counter()
        cluster.add_node("worker")
        sec["ray_start_second_node"] = time.perf_counter() - t
        for name, cmd, env in [
            ("fit_local", ["fit", store, "--out", root / "run-local", "--quiet"], with_token),
            ("fit_submit", ["submit", "--address", cluster.dashboard, "--python", sys.executable,
                            "--", "fit", store, "--out", root / "run-job", "--quiet"], with_token),
            ("stability_embedded_ray", ["stability", store, "--out", root / "st-local",
                                        "--num-cpus", "2", *stab], with_token),
            ("stability_address", ["stability", store, "--out", root / "st-address",
                                   "--address", cluster.address, *stab], with_token),
            ("submit_without_token_error", ["submit", "--address", cluster.dashboard, "--",
                                            "fit", store, "--out", root / "x"], client),
            ("address_without_token_error", ["stability", store, "--out", root / "y",
                                             "--address", cluster.address, *stab], client),
        ]:
            sec[name], proc = timed_cli(cmd, env, timeout=1800)
            results[f"{name}_exit"] = proc.returncode
            print(f"{name}: {sec[name]:.1f} s (exit {proc.returncode})", flush=True)
            if name.endswith("_error"):
                results[f"{name}_line"] = proc.stderr.strip()
        same = pd.read_parquet(root / "st-local" / "stability.parquet").equals(
            pd.read_parquet(root / "st-address" / "stability.parquet"))
        results["stability_address_rows_equal_embedded"] = bool(same)
    finally:
        cluster.stop()
    out = HERE / "results" / "token_cluster.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
