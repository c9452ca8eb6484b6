"""Evaluation-log ingest at leaderboard scale: Every Eval Ever JSONL, streamed.

Generates (once, cached under --work) a folder of ``F`` model files x ``N`` samples in Every
Eval Ever instance-level JSONL (schema 0.2.2 lines with every required field, nested
``<evaluation>/<developer>/<model>/<uuid>_samples.jsonl``; the ``N`` samples are spread over 5
evaluations of one file per model each), then in a fresh subprocess for each:

- ``irt-engine ingest`` (``engine.data.ingest``) of the folder: wall time, rows/s, peak RSS;
- pyarrow's own JSON reader (``pyarrow.json.read_json`` per file, all columns, nothing kept):
  wall time, rows/s, peak RSS; it only parses, it does not build a store.

Peak memory must not grow with the number of files: run it at 200 and 2,000 files, and at
equal rows (``--sizes 2000x5000,200x50000``). ``--gzip`` writes ``.jsonl.gz`` files (a sixth of
the disk; both readers decompress). Peak RSS is the child's ``ru_maxrss``.

    python benchmarks/bench_logs_ingest.py --files 200,2000 --samples 1000 [--work DIR]
    python benchmarks/bench_logs_ingest.py --sizes 200x5000,2000x5000,200x50000 [--kinds engine]
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EVALUATIONS = ("mmlu", "gsm8k", "hellaswag", "arc", "truthfulqa")


def generate(folder: Path, files: int, samples: int, seed: int = 0, gz: bool = False) -> int:
    """Write ``files`` model files of ``samples`` lines (gzip-compressed with ``gz``); returns
    the number of lines."""
    if (folder / ".done").exists():
        return files * samples
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(seed)
    ability = rng.normal(size=files)
    difficulty = rng.normal(size=samples)
    per_eval = -(-samples // len(EVALUATIONS))
    template = ('{{"schema_version": "instance_level_eval_0.2.2", "evaluation_id": "{ev}/{m}", '
                '"model_id": "dev{d}/model-{m}", "evaluation_name": "{ev}", "sample_id": "{s}", '
                '"sample_hash": "{h:016x}", "interaction_type": "single_turn", "input": {{"raw": '
                '"Question {s}: which of the following is true about item {s}?", "reference": '
                '["B"], "choices": ["A", "B", "C", "D"]}}, "output": {{"raw": ["{a}"]}}, '
                '"answer_attribution": [{{"turn_idx": 0, "source": "output.raw", '
                '"extracted_value": "{a}", "extraction_method": "exact_match", "is_terminal": '
                'true}}], "evaluation": {{"score": {v}.0, "is_correct": {c}}}, "metadata": '
                '{{"subject": "{ev}_{g}"}}}}\n')
    for m in range(files):
        correct = rng.random(samples) < 1 / (1 + np.exp(difficulty - ability[m]))
        d = m % 40
        path = folder / "all" / f"dev{d}" / f"model-{m}" / f"{m:08x}-0000-4000-8000-000000000000_samples.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        opened = (gzip.open(path.with_suffix(".jsonl.gz"), "wt", compresslevel=1) if gz
                  else open(path, "w"))
        with opened as f:
            f.writelines(template.format(
                ev=EVALUATIONS[k // per_eval], m=m, d=d, s=k, h=k * 2654435761 % (1 << 64),
                a="B" if c else "A", v=int(c), c="true" if c else "false", g=k % 57)
                for k, c in enumerate(correct.tolist()))
    (folder / ".done").write_text("")
    return files * samples


def _child(kind: str, folder: str, out: str) -> None:
    if kind == "engine":  # imports before the clock starts, as for pyarrow
        import zarr  # noqa: F401

        import engine.data.formats.every_eval_ever  # noqa: F401
        import engine.data.formats.logs  # noqa: F401
        from engine.data.ingest import ingest
    else:
        import pyarrow.json as pj
    start = time.perf_counter()
    rows = 0
    if kind == "engine":
        store = ingest(folder, out, overwrite=True, memory_budget=256 << 20)
        rows = store.num_observed
    else:
        for path in sorted(p for p in Path(folder).rglob("*.jsonl*")
                           if p.name.endswith((".jsonl", ".jsonl.gz"))):
            rows += pj.read_json(path).num_rows
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rows": rows, "wall_s": wall, "peak_rss_bytes": rss}))


def measure(kind: str, folder: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(folder), str(out)],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["rows_per_s"] = result["rows"] / result["wall_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="200,2000")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--sizes", default=None,
                        help="FILESxSAMPLES,... (instead of --files and --samples)")
    parser.add_argument("--gzip", action="store_true", help="write .jsonl.gz files")
    parser.add_argument("--kinds", default="engine,pyarrow")
    parser.add_argument("--work", default="/tmp/bench_logs")
    parser.add_argument("--out", default=str(HERE / "results" / "logs_ingest.json"))
    parser.add_argument("--child", nargs=3, default=None)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT))
        _child(*args.child)
        return
    work = Path(args.work)
    rows = []
    sizes = ([tuple(map(int, x.split("x"))) for x in args.sizes.split(",")] if args.sizes
             else [(files, args.samples) for files in map(int, args.files.split(","))])
    for files, samples in sizes:
        folder = work / f"eee_{files}x{samples}{'_gz' if args.gzip else ''}"
        t0 = time.perf_counter()
        lines = generate(folder, files, samples, gz=args.gzip)
        gen = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in folder.rglob("*.jsonl*"))
        row = {"files": files, "samples": samples, "lines": lines, "bytes": size,
               "gzip": args.gzip, "generate_s": gen}
        for kind in args.kinds.split(","):
            row[kind] = measure(kind, folder, work / "store.zarr")
            print(files, kind, row[kind], flush=True)
        shutil.rmtree(work / "store.zarr", ignore_errors=True)
        rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    for r in rows:
        if "engine" not in r or "pyarrow" not in r:
            continue
        e, p = r["engine"], r["pyarrow"]
        print(f"{r['files']:>5} files x {r['samples']} samples ({r['bytes'] / 2**30:.2f} GiB): "
              f"irt-engine {e['wall_s']:.1f} s, {e['rows_per_s']:,.0f} rows/s, peak RSS "
              f"{e['peak_rss_bytes'] / 2**20:,.0f} MiB | pyarrow.json {p['wall_s']:.1f} s, "
              f"{p['rows_per_s']:,.0f} rows/s, peak RSS {p['peak_rss_bytes'] / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
