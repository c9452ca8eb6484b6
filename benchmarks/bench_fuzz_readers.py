"""Reader fuzzing at scale: outcome counts per reader.

Runs the property tests of ``tests/engine/data/test_fuzz_readers.py`` (wide CSV/Parquet, long
CSV/Parquet, py-irt jsonl) and ``tests/engine/data/test_fuzz_log_readers.py`` (Every Eval Ever,
lm-eval, HELM) with ``FUZZ_EXAMPLES`` examples per reader (derandomized, so a rerun draws the
same inputs), in a pytest subprocess per file, and records how many inputs gave a store and
how many a clean one-line error. Any traceback or mismatch with the reference parsers fails
the run (the counts are then missing for that file and its pytest tail is kept).

Usage: ``python benchmarks/bench_fuzz_readers.py [--examples 1000] [--only logs|tables]
[--out benchmarks/results/fuzz_readers.json]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = {"tables": "tests/engine/data/test_fuzz_readers.py",
         "logs": "tests/engine/data/test_fuzz_log_readers.py"}


def run(path: str, examples: int) -> dict:
    env = {**os.environ, "FUZZ_EXAMPLES": str(examples)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           path], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    line = next((ln for ln in proc.stdout.splitlines() if "fuzz outcomes " in ln), None)
    counts = ast.literal_eval(line.split("fuzz outcomes ", 1)[1]) if line else None
    out = {"file": path, "examples_per_reader": examples, "seconds": round(seconds, 1),
           "passed": proc.returncode == 0, "outcomes": counts}
    if proc.returncode:
        out["tail"] = (proc.stdout + proc.stderr)[-4000:]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--only", choices=sorted(FILES))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fuzz_readers.json")
    args = parser.parse_args()
    if args.examples < 1:
        parser.error(f"--examples {args.examples}: give a positive number of examples")
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load_before": os.getloadavg()[0]},
               "runs": [run(path, args.examples) for name, path in FILES.items()
                        if args.only in (None, name)]}
    text = json.dumps(results, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(args.out)
    for r in results["runs"]:
        print(f"{r['file']}: {'ok' if r['passed'] else 'FAILED'} in {r['seconds']} s")
        for reader, counts in (r["outcomes"] or {}).items():
            print(f"  {reader}: {counts.get('store', 0)} stores, {counts.get('error', 0)} "
                  f"clean errors")
    if not all(r["passed"] for r in results["runs"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
