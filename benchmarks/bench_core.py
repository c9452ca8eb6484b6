"""Side-by-side benchmark: irt-engine vs the incumbent IRT tools, measured in the same run.

Every fit runs in its own child process (incumbents in the benchmark virtualenv, irt-engine and
the plain-JAX probe in the repo's .venv) so that wall time and peak RSS are comparable.
Writes benchmarks/results/core.json and core.md (``-quick`` suffix with --quick).

    python benchmarks/bench_core.py                       # all data sets, all tools
    python benchmarks/bench_core.py --datasets squad --skip-pyirt
    python benchmarks/bench_core.py --processes            # everyday jobs as whole processes

``--processes`` times what a user runs (issue 19): whole ``irt-engine`` command processes
(``ingest`` + ``fit`` + ``leaderboard`` on LSAT7 and psych ``ability``; ``fit`` from a store on
the simulated 161 x 11,873 2PL and NLU) beside whole mirt processes, each repeated (median), with
an empty compilation cache (cold) and with the cache the cold run filled (warm), and the load
average when each ran. Writes benchmarks/results/core-processes.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import engine_side
import incumbents
import report
from simulate import simulate_2pl

HERE = Path(__file__).resolve().parent
NLU_PARQUET = HERE.parent.parent / "shared" / "data" / "nlu" / "responses_items_x_subjects.parquet"
PSYCH = HERE.parent.parent / "shared" / "data" / "psych_human_r"
IRT_ENGINE = str(Path(engine_side.ENGINE_PYTHON).parent / "irt-engine")
# process benchmark: data set -> the irt-engine commands timed (ingest runs untimed otherwise)
PROCESS_JOBS = {"lsat7": ("ingest", "fit", "leaderboard"),
                "ability": ("ingest", "fit", "leaderboard"),
                "squad": ("fit",), "nlu": ("fit",)}

# dataset -> list of (model, tool, job); tool "irt-engine" runs engine_side, others incumbents
JOBS = {
    "squad": [("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl"),
              ("2pl", "py-irt", "pyirt_2pl"),
              ("1pl", "irt-engine", "engine_1pl"), ("1pl", "girth", "girth_1pl")],
    "big": [("1pl", "irt-engine", "engine_1pl"), ("1pl", "girth", "girth_1pl"),
            ("1pl", "mirt", "mirt_1pl"),
            ("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl")],
    "nlu": [("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl")],
    # issue 19's two shapes of 9M cells: as many subjects as items, and 100 items a subject
    "square": [("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl")],
    "wide": [("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl")],
}
QUICK_SHAPES = {"squad": (161, 1_000), "big": (200, 2_000), "nlu": (90, 5_000),
                "square": (300, 300), "wide": (30, 3_000)}
SIMULATED = {"squad": ((161, 11_873), 0), "big": ((1_000, 10_000), 1),
             "square": ((3_000, 3_000), 2), "wide": ((300, 30_000), 3)}


def load_nlu(path: Path) -> np.ndarray:
    """The real NLU matrix (stored items x subjects) as int8 subjects x items."""
    import pandas as pd

    df = pd.read_parquet(path)
    subject_cols = [c for c in df.columns if c not in ("item_id", "item", "dataset")]
    return np.ascontiguousarray(df[subject_cols].to_numpy().T.astype(np.int8))


def load_dataset(name: str, *, quick: bool, nlu_path: Path) -> dict:
    """Return dict(responses, truth or None, description) for one benchmark data set."""
    if name in SIMULATED:
        shape, seed = SIMULATED[name]
    else:
        y = load_nlu(nlu_path)
        if quick:
            y = y[:, : QUICK_SHAPES["nlu"][1]]
        return dict(responses=y, truth=None, description=f"real NLU matrix {nlu_path.name}")
    if quick:
        shape = QUICK_SHAPES[name]
    sim = simulate_2pl(*shape, seed=seed)
    truth = {k: sim[k] for k in ("ability", "difficulty", "discrimination")}
    desc = f"simulated 2PL {shape[0]} x {shape[1]}, seed {seed}, log_disc_sd 0.3"
    return dict(responses=sim["responses"], truth=truth, description=desc)


def run_job(tool: str, job: str, responses: np.ndarray, args: argparse.Namespace,
            cache: Path | None = None) -> dict:
    """Run one fit in its child process; the result never raises."""
    if tool.startswith("irt-engine"):
        return engine_side.run_engine(job.split("_")[1], responses, timeout=args.timeout,
                                      compilation_cache=cache)
    options = {"epochs": args.pyirt_epochs} if job == "pyirt_2pl" else {}
    return incumbents.run_incumbent(job, responses, timeout=args.timeout, options=options)


def selected_jobs(name: str, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The dataset's jobs after --skip-pyirt / --skip-engine (py-irt only runs on squad)."""
    jobs = JOBS[name]
    if args.skip_pyirt:
        jobs = [j for j in jobs if j[1] != "py-irt"]
    if args.skip_engine:
        jobs = [j for j in jobs if j[1] != "irt-engine"]
    return jobs


def bench_dataset(name: str, args: argparse.Namespace) -> dict:
    """Run every selected job and the JAX probe on one data set; return its result entry."""
    data = load_dataset(name, quick=args.quick, nlu_path=args.nlu_path)
    y, truth = data["responses"], data["truth"]
    observed = int(np.count_nonzero(y >= 0))
    entry = dict(description=data["description"], shape=list(y.shape), observed_cells=observed,
                 mean_response=float(y[y >= 0].mean()), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                 fits=[])
    for model, tool, job in selected_jobs(name, args):
        # irt-engine runs cold (an empty compilation cache, which it fills), then once more
        # reading that cache, as a repeated command line run does
        runs = [(tool, None)]
        if tool == "irt-engine" and not args.no_warm:
            cache = Path(tempfile.mkdtemp(prefix="irtbench-jax-cache-"))
            runs = [(tool, cache), ("irt-engine (warm cache)", cache)]
        for label, cache in runs:
            print(f"[{name}] {model} {label} ...", flush=True)
            res = run_job(label, job, y, args, cache)
            res.update(model=model, tool=label)
            report.add_derived(res, observed, truth)
            entry["fits"].append(res)
            print(f"[{name}]   {report.one_line(res)}", flush=True)
        if len(runs) > 1:
            shutil.rmtree(runs[0][1], ignore_errors=True)
    if truth is None:
        entry["agreement"] = report.agreement(entry["fits"])
    if not args.skip_probe:
        entry["jax_probe"] = [_probe(y, cores) for cores in (None, 1)]
    for fit in entry["fits"]:
        fit.pop("estimates", None)
    return entry


def _probe(y: np.ndarray, cores: int | None) -> dict:
    """One JAX-probe run, without arrays; cores None = all CPUs."""
    res = engine_side.run_probe(y, cores=cores)
    res.pop("estimates", None)
    print(f"  jax probe ({cores or 'all'} cores): {res.get('cells_per_s', res.get('reason'))}")
    return res


def _process_input(name: str, work: Path, args: argparse.Namespace) -> tuple[Path, np.ndarray]:
    """The file ``irt-engine ingest`` reads for data set ``name`` and the int8 matrix (-1
    missing) the incumbents fit."""
    import pandas as pd

    if name in ("lsat7", "ability"):
        path = PSYCH / f"{name}.parquet"
        df = pd.read_parquet(path)
        items = df.drop(columns=["subject_id"])
        empty = items.isna().all(axis=1)
        if empty.any():  # ingest refuses subjects with no response (16 in ability): dropped
            path = work / f"{name}.parquet"
            df, items = df[~empty], items[~empty]
            df.to_parquet(path, index=False)
        y = items.astype("float32").fillna(-1).to_numpy().astype(np.int8)
        return path, y
    y = load_dataset(name, quick=args.quick, nlu_path=args.nlu_path)["responses"]
    s, i = np.nonzero(y >= 0)
    path = work / f"{name}.parquet"  # long form: subject,item,response
    pd.DataFrame({"subject": s.astype(np.int32), "item": i.astype(np.int32),
                  "response": y[s, i].astype(np.int8)}).to_parquet(path)
    return path, y


def _timed(cmd: list[str], env: dict, cpu: dict | None = None) -> tuple[float, str]:
    """Wall seconds of one whole process (and its output); its CPU seconds (user + system,
    all threads: less sensitive to other load than wall time) are added to ``cpu["cpu_s"]``.
    A failure raises with its tail."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu["cpu_s"] = cpu.get("cpu_s", 0.0) + (after.ru_utime - before.ru_utime
                                                 + after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr[-800:]}")
    return seconds, out.stdout


def _engine_round(name: str, data: Path, work: Path, cache: Path, env: dict,
                  store: Path | None) -> dict:
    """One ``ingest`` (when timed) + ``fit`` + ``leaderboard`` round in fresh processes."""
    steps = PROCESS_JOBS[name]
    env = {**env, "JAX_COMPILATION_CACHE_DIR": str(cache)}
    row = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    tag = f"{time.time_ns()}"
    if "ingest" in steps or store is None:
        store = work / f"{name}-{tag}.zarr"
        seconds, _ = _timed([IRT_ENGINE, "ingest", str(data), "--out", str(store)], env,
                            row if "ingest" in steps else None)
        if "ingest" in steps:
            row["ingest_s"] = seconds
    run = work / f"{name}-{tag}-run"
    row["fit_s"], _ = _timed([IRT_ENGINE, "fit", str(store), "--model", "2pl", "--out", str(run),
                              "--quiet"], env, row)
    if "leaderboard" in steps:
        row["leaderboard_s"], _ = _timed([IRT_ENGINE, "leaderboard", str(run)], env, row)
    info = json.loads((run / "fit.json").read_text())
    row.update(total_s=sum(row.get(k, 0.0) for k in ("ingest_s", "fit_s", "leaderboard_s")),
               passes=info["num_passes"], converged=info["converged"],
               method=(info.get("ability_factor") or {}).get("method"),
               fit_wall_s=info["timings"]["wall_s"],
               first_pass_s=info["timings"]["first_pass_with_compile_s"],
               compile=info["timings"].get("compile"),
               cells_per_s=info["data"]["num_observed"] * info["num_passes"]
               / max(info["timings"]["wall_s"], 1e-9))
    shutil.rmtree(run, ignore_errors=True)
    return row


def _median_row(rows: list[dict]) -> dict:
    """Per-field medians of repeated rounds (numbers), the first round's other fields."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(np.median([r[key] for r in rows]))
    out["repeats"] = len(rows)
    out["totals"] = [round(r["total_s"], 3) for r in rows]
    return out


def bench_processes(name: str, args: argparse.Namespace, work: Path) -> dict:
    """irt-engine's commands cold and warm, and mirt's whole process, ``args.repeats`` times."""
    data, y = _process_input(name, work, args)
    observed = int(np.count_nonzero(y >= 0))
    entry = dict(shape=list(y.shape), observed_cells=observed, steps=list(PROCESS_JOBS[name]),
                 input=str(data), started=time.strftime("%Y-%m-%d %H:%M:%S"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    store = None
    if "ingest" not in PROCESS_JOBS[name]:  # fit from a store: ingested once, untimed
        store = work / f"{name}.zarr"
        _timed([IRT_ENGINE, "ingest", str(data), "--out", str(store)], env)
    cold, warm = [], []
    for r in range(args.repeats):
        cache = work / f"cache-{name}-{r}"  # empty: as a new user's first run
        cold.append(_engine_round(name, data, work, cache, env, store))
        warm.append(_engine_round(name, data, work, cache, env, store))
        print(f"[{name}] irt-engine round {r + 1}: cold {cold[-1]['total_s']:.2f} s, "
              f"warm {warm[-1]['total_s']:.2f} s (load {warm[-1]['load_avg_1m']})", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    entry["irt-engine cold"], entry["irt-engine warm"] = _median_row(cold), _median_row(warm)
    if not args.skip_incumbents:
        runs = []
        for r in range(args.repeats):
            import resource

            load = round(os.getloadavg()[0], 2)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            res = incumbents.run_incumbent("mirt_2pl", y, timeout=args.timeout)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            res.pop("estimates", None)
            if res.get("status") != "ok":
                entry["mirt"] = res
                break
            runs.append({"load_avg_1m": load, "total_s": res["process_s"],
                         "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
                         "fit_wall_s": res["wall_s"], "passes": res.get("iterations"),
                         "converged": res.get("converged"),
                         "cells_per_s": observed * (res.get("iterations") or 0) / res["wall_s"]})
            print(f"[{name}] mirt round {r + 1}: {runs[-1]['total_s']:.2f} s", flush=True)
        if runs:
            entry["mirt"] = _median_row(runs)
    return entry


def processes_markdown(results: dict) -> str:
    """The process benchmark as a Markdown table."""
    lines = ["| data | tool | commands | total s (median) | CPU s | ingest s | fit s | "
             "leaderboard s | fit wall s | passes | cells/s | compile: programs, hits, "
             "trace+lower+XLA s | load 1m |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)
    for name, entry in results["datasets"].items():
        shape = "x".join(str(n) for n in entry["shape"])
        for tool in ("irt-engine cold", "irt-engine warm", "mirt"):
            row = entry.get(tool)
            if not row or "total_s" not in row:
                continue
            c = row.get("compile") or {}
            comp = (f"{c.get('programs')}, {c.get('cache_hits')}, {c.get('total_s', 0):.2f}"
                    if c else "")
            steps = " + ".join(entry["steps"]) if tool != "mirt" else "python: fit + EAP"
            lines.append(f"| {name} {shape} | {tool} | {steps} | {fmt(row['total_s'])} | "
                         f"{fmt(row.get('cpu_s'))} | {fmt(row.get('ingest_s'))} | {fmt(row.get('fit_s'))} | "
                         f"{fmt(row.get('leaderboard_s'))} | {fmt(row.get('fit_wall_s'))} | "
                         f"{fmt(row.get('passes'))} | {row.get('cells_per_s', 0):.3g} | {comp} | "
                         f"{fmt(row.get('load_avg_1m'))} |")
    return "\n".join(lines) + "\n"


def main_processes(args: argparse.Namespace) -> None:
    """Run the process benchmark on ``args.datasets`` (default: all of PROCESS_JOBS)."""
    names = args.datasets.split(",")
    out_json = args.out_dir / ("core-processes-quick.json" if args.quick else "core-processes.json")
    results = json.loads(out_json.read_text()) if out_json.exists() else {"datasets": {}}
    results["machine"] = report.machine_info(incumbents.BENCH_PYTHON, engine_side.ENGINE_PYTHON)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="irtbench-proc-") as tmp:
        for name in names:
            results["datasets"][name] = bench_processes(name, args, Path(tmp))
            out_json.write_text(json.dumps(results, indent=1, default=report.json_default))
            out_json.with_suffix(".md").write_text(processes_markdown(results))
    print(f"wrote {out_json} and {out_json.with_suffix('.md').name}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=None,
                   help="comma-separated subset of squad,big,nlu,square,wide (default: all; with --processes "
                        "of lsat7,ability,squad,nlu)")
    p.add_argument("--skip-pyirt", action="store_true", help="do not run py-irt (minutes)")
    p.add_argument("--skip-engine", action="store_true",
                   help="incumbents only (no irt-engine fits; the JAX probe still runs)")
    p.add_argument("--skip-probe", action="store_true", help="do not run the JAX probe")
    p.add_argument("--no-warm", action="store_true",
                   help="do not rerun irt-engine with its compilation cache filled")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: small shapes, 100 py-irt epochs, 120 s timeout")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per fit (default 600)")
    p.add_argument("--pyirt-epochs", type=int, default=2000)
    p.add_argument("--nlu-path", type=Path, default=NLU_PARQUET)
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--processes", action="store_true",
                   help="whole command processes, cold and warm cache, beside mirt's process "
                        "(data sets lsat7, ability, squad, nlu)")
    p.add_argument("--repeats", type=int, default=3, help="--processes: rounds per tool (median)")
    p.add_argument("--skip-incumbents", action="store_true", help="--processes: no mirt")
    args = p.parse_args(argv)
    known = PROCESS_JOBS if args.processes else JOBS
    args.datasets = args.datasets or ",".join(known)
    unknown = set(args.datasets.split(",")) - set(known)
    if unknown:
        p.error(f"unknown data set(s) {sorted(unknown)}; choose from {sorted(known)}")
    if args.quick:
        args.timeout, args.pyirt_epochs = min(args.timeout, 120.0), min(args.pyirt_epochs, 100)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write core.json / core.md (merging other data sets' entries)."""
    args = parse_args(argv)
    if args.processes:
        main_processes(args)
        return
    stem = "core-quick" if args.quick else "core"
    out_json = args.out_dir / f"{stem}.json"
    results = json.loads(out_json.read_text()) if out_json.exists() else {"datasets": {}}
    results["machine"] = report.machine_info(incumbents.BENCH_PYTHON, engine_side.ENGINE_PYTHON)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.datasets.split(","):
        results["datasets"][name] = bench_dataset(name, args)
        out_json.write_text(json.dumps(results, indent=1, default=report.json_default))
        (args.out_dir / f"{stem}.md").write_text(report.markdown(results))
    print(f"wrote {out_json} and {stem}.md")


if __name__ == "__main__":
    main()
