"""What the store's self-checks cost and what they catch.

1. Per-chunk CRC-32C: open + load time and the time of a 2PL fit (in memory, and streamed
   under a small memory budget so every pass decodes every chunk) on a store of the real
   NLU matrix (90 x 82,756) with and without the CRC codec (both with the ``integrity``
   marker, so open does not recompute the whole checksum: the difference is the CRC alone).
2. Single-bit flips in every byte of one shard file of a small store: how many reads fail
   with a clear error, read back the same values, or read back other numbers, with and
   without the CRC codec.
3. Ingest time of the NLU matrix as a wide CSV (90 x 82,756) and as long Parquet
   (7,448,040 rows); run it once with this checkout and once with ``PYTHONPATH`` set to an
   older checkout to compare (``--only-ingest``).

Usage: ``python benchmarks/bench_store_integrity.py [--out benchmarks/results/store_integrity.json]
[--passes 5] [--repeat 3] [--no-fit] [--only-ingest | --skip-ingest]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import engine.data.store as store_mod
from engine.data import ingest, open_store, write_store
from engine.errors import DataFormatError

DATA = Path("/work/shared/data")


def nlu_matrix() -> tuple[np.ndarray, list[str], list[str]]:
    table = pq.read_table(DATA / "nlu" / "responses_items_x_subjects.parquet")
    subjects = table.column_names[3:]
    y = np.stack([table.column(s).to_numpy() for s in subjects]).astype(np.int8)
    return y, subjects, [str(i) for i in table.column("item_id").to_pylist()]


def without_crc():
    """``array_options`` with zstd alone (the CRC codec left out)."""
    from zarr.codecs import ZstdCodec

    return {"compressors": [ZstdCodec(level=0)], "config": {"write_empty_chunks": True}}


def write(y, subjects, items, path: Path, crc: bool):
    original = store_mod.array_options
    if not crc:
        store_mod.array_options = without_crc
    try:
        return write_store(y, subjects, items, path, overwrite=True)
    finally:
        store_mod.array_options = original


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def crc_overhead(tmp: Path, passes: int, repeat: int = 3, fits: bool = True) -> dict:
    """Best of ``repeat`` rounds, the two stores measured alternately in each round (the
    machine is shared: alternating keeps load changes from favouring one of them)."""
    from engine.api import fit
    from engine.infer.settings import FitSettings

    y, subjects, items = nlu_matrix()
    settings = FitSettings(seed=0, max_passes=passes, min_passes=passes, progress=False)
    paths = {}
    for crc in (False, True):
        paths[crc] = tmp / f"nlu-{'crc' if crc else 'plain'}.zarr"
        write(y, subjects, items, paths[crc], crc)
    budgets = {"fit_in_memory_s": None, "fit_streamed_s": 8 << 20}
    if fits:
        for budget in budgets.values():
            fit(paths[True], "2pl", settings.replace(memory_budget=budget))  # compile once
    best: dict = {False: {}, True: {}}
    stores = {crc: open_store(path) for crc, path in paths.items()}
    for _ in range(repeat):
        for crc in (False, True):
            path, row = paths[crc], best[crc]
            times = {"open_s": timed(lambda: open_store(path), 5),
                     "read_s": timed(lambda: stores[crc].arrays["responses"][...], 5),
                     "open_load_s": timed(lambda: open_store(path).load(), 5)}
            for name, budget in budgets.items() if fits else ():
                times[name] = timed(lambda: fit(path, "2pl", settings.replace(
                    memory_budget=budget)), 1)
            for key, value in times.items():
                row[key] = min(row.get(key, float("inf")), value)
    out = {"plain": best[False], "crc": best[True], "passes": passes}
    out["overhead"] = {k: best[True][k] / best[False][k] - 1 for k in best[True]}
    return out


def byte_flips(tmp: Path) -> dict:
    rng = np.random.default_rng(0)
    y = (rng.random((64, 200)) < 0.6).astype(np.int8)
    y[rng.random(y.shape) < 0.2] = -1
    y[:, 0], y[0, :] = 1, 0
    subjects, items = [f"s{k}" for k in range(64)], [f"i{k}" for k in range(200)]
    out = {}
    for crc in (False, True):
        path = tmp / f"flip-{crc}.zarr"
        write(y, subjects, items, path, crc)
        chunk = path / "responses" / "c" / "0" / "0"
        original = chunk.read_bytes()
        counts = {"bytes": len(original), "error": 0, "same": 0, "different": 0, "crash": 0}
        for offset in range(len(original)):
            data = bytearray(original)
            data[offset] ^= 1 << (offset % 8)
            chunk.write_bytes(bytes(data))
            try:
                got = open_store(path).load()
            except DataFormatError:
                counts["error"] += 1
            except Exception:  # noqa: BLE001 - a traceback instead of an error
                counts["crash"] += 1
            else:
                counts["same" if np.array_equal(got, y) else "different"] += 1
        chunk.write_bytes(original)
        out["crc" if crc else "plain"] = counts
    return out


def ingest_times(tmp: Path) -> dict:
    y, subjects, items = nlu_matrix()
    wide = tmp / "nlu.csv"
    body = np.full((y.shape[0], 2 * y.shape[1]), ord(","), np.uint8)
    body[:, 1::2] = y + ord("0")
    with open(wide, "wb") as f:
        f.write(("model," + ",".join(items) + "\n").encode())
        for name, row in zip(subjects, body):
            f.write(name.encode() + row.tobytes() + b"\n")
    s, i = np.nonzero(y >= 0)
    long = tmp / "nlu_long.parquet"
    pq.write_table(pa.table({"subject": pa.array(np.asarray(subjects)[s]).dictionary_encode(),
                             "item": pa.array(np.asarray(items)[i]).dictionary_encode(),
                             "response": y[s, i]}), long)
    out = {}
    for name, src in (("wide_csv_s", wide), ("long_parquet_s", long)):
        out[name] = timed(lambda: ingest(src, tmp / "out.zarr", overwrite=True), repeat=2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/store_integrity.json")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--only-ingest", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--no-fit", action="store_true", help="time open and reads only")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-integrity-"))
    try:
        result = {"machine": platform.platform(), "cpus": os.cpu_count(),
                  "load_average": os.getloadavg(),
                  "engine": str(Path(store_mod.__file__).parents[2])}
        if not args.skip_ingest:
            result["ingest"] = ingest_times(tmp)
            print(json.dumps(result, indent=1), flush=True)
        if not args.only_ingest:
            result["byte_flips"] = byte_flips(tmp)
            print(json.dumps(result["byte_flips"], indent=1), flush=True)
            result["crc"] = crc_overhead(tmp, args.passes, repeat=args.repeat,
                                         fits=not args.no_fit)
            print(json.dumps(result["crc"], indent=1), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
