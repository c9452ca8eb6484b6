"""Out-of-core scale benchmarks: streaming vs in-memory 2PL fits, 1B cells, long ingest, pmap.

Every measurement runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own.
Stores come from ``generate_store.py`` (made once under ``--work``, reused). Results are
merged into ``benchmarks/results/scale.json`` (one key per case) and a Markdown table is
written to ``benchmarks/results/scale.md``.

    python benchmarks/bench_scale.py --cases fit10m fit100m pmap ingest100m
    python benchmarks/bench_scale.py --cases fit1b --max-passes 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results"

# name -> (subjects, items, chunks)
STORES = {
    "10m": (1000, 10_000, (1000, 2500)),
    "100m": (2000, 50_000, (2000, 2000)),
    "1b": (10_000, 100_000, (2000, 2000)),
}

# case -> (store, memory budget, devices, extra env)
CASES = {
    "fit10m_memory": ("10m", "8G", 1, {}),
    "fit10m_stream": ("10m", "16M", 1, {}),
    "fit100m_stream": ("100m", "256M", 1, {}),
    "fit1b_stream": ("1b", "1G", 1, {}),
    "pmap10m_1dev": ("10m", "8G", 1, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
    "pmap10m_2dev": ("10m", "8G", 2, {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
    # streamed tiles (1000 x 2500): 4 tiles split evenly over 2 devices
    "pmap10m_stream_1dev": ("10m", "16M", 1,
                            {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
    "pmap10m_stream_2dev": ("10m", "16M", 2,
                            {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}),
}
GROUPS = {"fit10m": ["fit10m_memory", "fit10m_stream"], "fit100m": ["read100m", "fit100m_stream"],
          "fit1b": ["fit1b_stream"], "pmap": ["pmap10m_1dev", "pmap10m_2dev", "pmap10m_stream_1dev",
                                         "pmap10m_stream_2dev"],
          "ingest100m": ["ingest100m_long"]}


def _store_path(work: Path, name: str) -> Path:
    return work / f"synthetic-{name}.zarr"


def ensure_store(work: Path, name: str) -> Path:
    from generate_store import generate_store

    path = _store_path(work, name)
    if not path.exists():
        S, N, chunks = STORES[name]
        print(f"generating {name} store {S} x {N} ...", flush=True)
        print(generate_store(path, S, N, chunks=chunks), flush=True)
    return path


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_fit(store_path: str, budget: str, devices: int, max_passes: int, fixed: int,
               checkpoint_dir: str = "") -> dict:
    from engine.api import fit
    from engine.infer.settings import FitSettings, parse_bytes

    t0 = time.perf_counter()
    settings = FitSettings(seed=0, max_passes=max_passes, memory_budget=parse_bytes(budget),
                           num_devices=devices, checkpoint_every=1 if checkpoint_dir else 0)
    if fixed:
        settings = settings.replace(min_passes=fixed, max_passes=fixed)

    def log(i, record):
        print(json.dumps(record), file=sys.stderr, flush=True)

    # Long fits checkpoint every pass and resume, so an interrupted benchmark loses little.
    res = fit(store_path, "2pl", settings, progress_fn=log, checkpoint_dir=checkpoint_dir or None,
              resume=bool(checkpoint_dir))
    wall = time.perf_counter() - t0
    truth = np.load(store_path + ".truth.npz")
    means = res.means()
    r = {k: float(np.corrcoef(means[k], truth[k])[0, 1]) for k in truth.files}
    seconds = [t["seconds"] for t in res.trace]
    steady = float(np.median(seconds[1:])) if len(seconds) > 1 else seconds[0]
    return {
        "source": res.extra["source"], "num_devices": res.num_devices,
        "shape": [res.num_subjects, res.num_items], "cells": res.num_observed,
        "passes": res.num_passes, "converged": res.converged,
        "fit_wall_s": res.wall_time_s, "process_wall_s": wall,
        "first_pass_s": seconds[0], "median_pass_s": steady,
        "cells_per_s_per_pass": res.num_observed / steady,
        "peak_rss_mb": _peak_rss_mb(), "recovery_r": r,
    }


def worker_read(store_path: str) -> dict:
    """One pass of tile reads alone (no compute): the I/O that prefetching must hide."""
    from engine.data.store import open_store
    from engine.data.streaming import StreamingSource

    source = StreamingSource.from_store(open_store(store_path))
    t0 = time.perf_counter()
    for key in source.keys():
        source.block(key)
    seconds = time.perf_counter() - t0
    return {"tile": list(source.tile), "tiles": len(source.keys()), "read_pass_s": seconds,
            "cells_per_s": source.num_observed / seconds, "peak_rss_mb": _peak_rss_mb()}


def worker_ingest(folder: str, out: str) -> dict:
    from engine.data import ingest

    t0 = time.perf_counter()
    store = ingest(folder, out, fmt="long", overwrite=True)
    return {"cells": store.num_observed, "shape": list(store.shape), "layout": store.layout,
            "wall_s": time.perf_counter() - t0, "peak_rss_mb": _peak_rss_mb(),
            "cells_per_s": store.num_observed / (time.perf_counter() - t0)}


def _run_worker(args: list[str], env_extra: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **env_extra)
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, cwd=ROOT,
                          stdout=subprocess.PIPE, text=True, timeout=timeout)  # stderr: progress
    if proc.returncode != 0:
        return {"error": f"worker exited with {proc.returncode}", "returncode": proc.returncode}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_case(case: str, work: Path, max_passes: int, timeout: float) -> dict:
    if case == "ingest100m_long":
        from generate_store import generate_long

        folder = work / "long-100m"
        gen = None
        if not folder.exists():
            gen = generate_long(folder, 2000, 50_000)
        out = _run_worker(["ingest", str(folder), str(work / "ingested-100m.zarr")], {}, timeout)
        out["input_bytes"] = sum(p.stat().st_size for p in folder.iterdir())
        if gen:
            out["generate_s"] = gen["seconds"]
        return out
    if case.startswith("read"):
        return _run_worker(["read", str(ensure_store(work, case[4:]))], {}, timeout)
    store, budget, devices, env = CASES[case]
    path = ensure_store(work, store)
    fixed = 10 if case.startswith("pmap") else 0
    checkpoint = str(work / f"checkpoint-{case}") if store == "1b" else ""
    return _run_worker(["fit", str(path), budget, str(devices), str(max_passes), str(fixed),
                        checkpoint], env, timeout)


def machine() -> dict:
    load = os.getloadavg()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpus": os.cpu_count(), "memory_gb": round(mem / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in load],
            "note": "shared machine: other jobs ran at the same time; timings are upper bounds"}


def write_markdown(results: dict) -> str:
    lines = ["| case | source | cells | passes | median s/pass | cells/s per pass | peak RSS MB "
             "| r ability / difficulty / discrimination |", "|---|---|---|---|---|---|---|---|"]
    for case, res in results.items():
        if case.startswith("_"):
            continue
        if "error" in res:
            lines.append(f"| {case} | error | | | | | | |")
            continue
        if case.startswith("read"):
            lines.append(f"| {case} | tile reads only, {res['tiles']} tiles {res['tile']} | | | "
                         f"{res['read_pass_s']:.2f} | {res['cells_per_s']:.3g} | "
                         f"{res['peak_rss_mb']:.0f} | |")
            continue
        if "ingest" in case:
            lines.append(f"| {case} | long Parquet -> {res['layout']} store | {res['cells']:,} | "
                         f"| {res['wall_s']:.1f} s total | {res['cells_per_s']:.3g} | "
                         f"{res['peak_rss_mb']:.0f} | |")
            continue
        r = res["recovery_r"]
        lines.append(
            f"| {case} | {res['source']} x{res['num_devices']} | {res['cells']:,} | {res['passes']}"
            f"{'' if res['converged'] else ' (cap)'} | {res['median_pass_s']:.2f} | "
            f"{res['cells_per_s_per_pass']:.3g} | {res['peak_rss_mb']:.0f} | "
            f"{r['ability']:.3f} / {r['difficulty']:.3f} / {r['discrimination']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", nargs="+", default=["fit10m", "fit100m", "pmap", "ingest100m"],
                   help=f"groups {sorted(GROUPS)} or case names {sorted(CASES)}")
    p.add_argument("--work", type=Path, default=Path("/tmp/irt-scale"),
                   help="folder for generated stores (large)")
    p.add_argument("--max-passes", type=int, default=500)
    p.add_argument("--timeout", type=float, default=6 * 3600)
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        kind, *rest = args.worker
        if kind == "fit":
            out = worker_fit(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]),
                             rest[5] if len(rest) > 5 else "")
        elif kind == "read":
            out = worker_read(*rest)
        else:
            out = worker_ingest(*rest)
        print(json.dumps(out))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    target = RESULTS / "scale.json"
    cases = [c for name in args.cases for c in GROUPS.get(name, [name])]
    for case in cases:
        print(f"== {case}", flush=True)
        res = run_case(case, args.work, args.max_passes, args.timeout)
        res["machine"] = machine()
        res["measured"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        res["max_passes"] = args.max_passes
        print(json.dumps(res, indent=1), flush=True)
        # re-read before merging: another bench_scale run may have written meanwhile
        results = json.loads(target.read_text()) if target.exists() else {}
        results[case] = res
        target.write_text(json.dumps(results, indent=1))
        (RESULTS / "scale.md").write_text(write_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
