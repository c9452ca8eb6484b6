"""Side-by-side benchmark: irt-engine vs the incumbent IRT tools, measured in the same run.

Every fit runs in its own child process (incumbents in the benchmark virtualenv, irt-engine and
the plain-JAX probe in the repo's .venv) so that wall time and peak RSS are comparable.
Writes benchmarks/results/core.json and core.md (``-quick`` suffix with --quick).

    python benchmarks/bench_core.py                       # all data sets, all tools
    python benchmarks/bench_core.py --datasets squad --skip-pyirt
"""

from __future__ import annotations

import argparse
import json
import shutil
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

# dataset -> list of (model, tool, job); tool "irt-engine" runs engine_side, others incumbents
JOBS = {
    "squad": [("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl"),
              ("2pl", "py-irt", "pyirt_2pl"),
              ("1pl", "irt-engine", "engine_1pl"), ("1pl", "girth", "girth_1pl")],
    "big": [("1pl", "irt-engine", "engine_1pl"), ("1pl", "girth", "girth_1pl"),
            ("1pl", "mirt", "mirt_1pl"),
            ("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl")],
    "nlu": [("2pl", "irt-engine", "engine_2pl"), ("2pl", "mirt", "mirt_2pl")],
}
QUICK_SHAPES = {"squad": (161, 1_000), "big": (200, 2_000), "nlu": (90, 5_000)}


def load_nlu(path: Path) -> np.ndarray:
    """The real NLU matrix (stored items x subjects) as int8 subjects x items."""
    import pandas as pd

    df = pd.read_parquet(path)
    subject_cols = [c for c in df.columns if c not in ("item_id", "item", "dataset")]
    return np.ascontiguousarray(df[subject_cols].to_numpy().T.astype(np.int8))


def load_dataset(name: str, *, quick: bool, nlu_path: Path) -> dict:
    """Return dict(responses, truth or None, description) for one benchmark data set."""
    if name == "squad":
        shape, seed = (161, 11_873), 0
    elif name == "big":
        shape, seed = (1_000, 10_000), 1
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="squad,big,nlu",
                   help="comma-separated subset of squad,big,nlu (default: all)")
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
    args = p.parse_args(argv)
    unknown = set(args.datasets.split(",")) - set(JOBS)
    if unknown:
        p.error(f"unknown data set(s) {sorted(unknown)}; choose from {sorted(JOBS)}")
    if args.quick:
        args.timeout, args.pyirt_epochs = min(args.timeout, 120.0), min(args.pyirt_epochs, 100)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write core.json / core.md (merging other data sets' entries)."""
    args = parse_args(argv)
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
