"""Generate large synthetic 2PL response stores chunk by chunk, with known truth.

Nothing the size of the matrix is ever in memory: responses are drawn a few rows at a
time and written through ``DenseWriter`` (one chunk row band buffered). The truth
(ability, difficulty, discrimination) goes to ``<out>.truth.npz`` beside the store.
``--long DIR`` instead writes the same kind of data as a folder of long-format Parquet
files (subject, item, response), for ingest benchmarks.

    python benchmarks/generate_store.py --subjects 10000 --items 100000 --out big.zarr
    python benchmarks/generate_store.py --subjects 2000 --items 50000 --long long_dir
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.data.writer import DenseWriter  # noqa: E402

__all__ = ["truth_2pl", "draw_rows", "generate_store", "generate_long"]

_ROW_CELLS = 8_000_000  # cells drawn at once (float32 temporaries ~ 32 MB each)


def truth_2pl(num_subjects: int, num_items: int, *, seed: int,
              log_disc_sd: float = 0.3) -> dict[str, np.ndarray]:
    """theta, b ~ N(0, 1), log a ~ N(0, log_disc_sd^2)."""
    rng = np.random.default_rng(seed)
    return {"ability": rng.standard_normal(num_subjects).astype(np.float32),
            "difficulty": rng.standard_normal(num_items).astype(np.float32),
            "discrimination": np.exp(log_disc_sd * rng.standard_normal(num_items)).astype(np.float32)}


def draw_rows(truth: dict, start: int, stop: int, *, seed: int) -> np.ndarray:
    """Responses of subjects ``start:stop`` (int8), reproducible per row range."""
    rng = np.random.default_rng([seed, start])
    logits = truth["discrimination"] * (truth["ability"][start:stop, None] - truth["difficulty"])
    prob = 1.0 / (1.0 + np.exp(-logits))
    return (rng.random(prob.shape, dtype=np.float32) < prob).astype(np.int8)


def _row_steps(num_subjects: int, num_items: int):
    rows = max(1, _ROW_CELLS // num_items)
    return [(r, min(r + rows, num_subjects)) for r in range(0, num_subjects, rows)]


def generate_store(out: Path, num_subjects: int, num_items: int, *, seed: int = 0,
                   chunks: tuple[int, int] = (2000, 2000), overwrite: bool = False) -> dict:
    """Write a dense 2PL store and its truth; returns timing and size figures."""
    t0 = time.perf_counter()
    truth = truth_2pl(num_subjects, num_items, seed=seed)
    with DenseWriter(out, [f"s{k}" for k in range(num_subjects)],
                     [f"i{k}" for k in range(num_items)], chunks=chunks, overwrite=overwrite,
                     source=["benchmarks/generate_store.py"], input_format="synthetic-2pl") as w:
        for start, stop in _row_steps(num_subjects, num_items):
            w.write_rows(draw_rows(truth, start, stop, seed=seed))
        store = w.commit()
    np.savez(Path(str(out) + ".truth.npz"), **truth)
    size = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
    return {"cells": num_subjects * num_items, "seconds": time.perf_counter() - t0,
            "bytes_on_disk": size, "checksum": store.meta["checksum"]}


def generate_long(folder: Path, num_subjects: int, num_items: int, *, seed: int = 0,
                  rows_per_file: int = 10_000_000) -> dict:
    """Write the 2PL data as long-format Parquet files (dictionary-encoded ids)."""
    t0 = time.perf_counter()
    truth = truth_2pl(num_subjects, num_items, seed=seed)
    folder.mkdir(parents=True, exist_ok=False)
    subjects = pa.array([f"s{k}" for k in range(num_subjects)])
    items = pa.array([f"i{k}" for k in range(num_items)])
    per_file = max(1, rows_per_file // num_items)
    for f, start in enumerate(range(0, num_subjects, per_file)):
        stop = min(start + per_file, num_subjects)
        with pq.ParquetWriter(folder / f"part-{f:05d}.parquet", pa.schema([
                ("subject", pa.dictionary(pa.int32(), pa.string())),
                ("item", pa.dictionary(pa.int32(), pa.string())),
                ("response", pa.int8())])) as writer:
            for a, b in _row_steps(stop - start, num_items):
                y = draw_rows(truth, start + a, start + b, seed=seed)
                rows = np.arange(start + a, start + b, dtype=np.int32)
                writer.write_table(pa.table({
                    "subject": pa.DictionaryArray.from_arrays(np.repeat(rows, num_items), subjects),
                    "item": pa.DictionaryArray.from_arrays(
                        np.tile(np.arange(num_items, dtype=np.int32), b - a), items),
                    "response": y.ravel()}))
    np.savez(folder.with_name(folder.name + ".truth.npz"), **truth)
    size = sum(p.stat().st_size for p in folder.iterdir())
    return {"cells": num_subjects * num_items, "seconds": time.perf_counter() - t0,
            "bytes_on_disk": size}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--subjects", type=int, required=True)
    p.add_argument("--items", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunks", type=int, nargs=2, default=(2000, 2000), metavar=("ROWS", "ITEMS"))
    p.add_argument("--overwrite", action="store_true")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="store directory to write")
    group.add_argument("--long", type=Path, help="folder of long Parquet files to write")
    args = p.parse_args(argv)
    if args.out:
        info = generate_store(args.out, args.subjects, args.items, seed=args.seed,
                              chunks=tuple(args.chunks), overwrite=args.overwrite)
    else:
        info = generate_long(args.long, args.subjects, args.items, seed=args.seed)
    print(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
