"""Small leaderboards: the default fit and ``nuts_first_subjects`` against NUTS with doubled
draws (issue 16).

For each board (``bench_marginal._load`` names: ``nlu:copa``, ``openml:kc2`` ...), seed 0,
2PL: the default ``fit`` (NUTS first below 30 subjects since 6d251b7); ``fit`` with
``FitSettings(nuts_first_subjects=30)``; and
``fit_nuts`` with 4 x (1,000 + 2,000) draws as the reference. Per block, |mean - reference
mean| / reference sd and sd / reference sd on the unconstrained scale; wall times, and the
sampled fits' R-hat, least bulk ESS and divergences. One JSON line a board and part.

    python benchmarks/bench_nuts_first.py nlu:cb nlu:copa [--parts default,first,reference]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _fits(board: str, parts: list[str]) -> dict:
    from bench_marginal import _load
    from engine.api import fit, fit_nuts
    from engine.infer.nuts import NutsSettings
    from engine.infer.settings import FitSettings

    y = _load(board)
    runs = {"default": lambda: fit(y, "2pl", FitSettings(seed=0)),
            "first": lambda: fit(y, "2pl", FitSettings(seed=0, nuts_first_subjects=30)),
            "reference": lambda: fit_nuts(y, "2pl", NutsSettings(seed=0, num_samples=2000))}
    out = {}
    for part in parts:
        load = os.getloadavg()[0]
        t = time.perf_counter()
        res = runs[part]()
        diag = res.extra.get("diagnostics") or {}
        out[part] = (res, {"wall_s": round(time.perf_counter() - t, 1), "load": round(load, 2),
                           "method": (res.extra.get("ability_factor") or {}).get("method", "nuts"),
                           "route": sorted(k for k in ("nuts_first", "quadrature_not_converged")
                                           if k in (res.extra.get("ability_factor") or {})),
                           "rhat_max": diag.get("rhat_max"), "ess_bulk_min": diag.get("ess_bulk_min"),
                           "divergences": diag.get("divergences"), "extended": diag.get("extended"),
                           "converged": res.converged})
    return {"board": board, "shape": list(y.shape), "cells": int((y >= 0).sum()), "fits": out}


def _against(res, ref) -> dict:
    rows = {}
    for block in ("ability", "difficulty", "discrimination"):
        m, mr = np.asarray(res.guide.loc[block]), np.asarray(ref.guide.loc[block])
        s, sr = (np.exp(np.asarray(g.guide.log_scale[block], np.float64)) for g in (res, ref))
        z, ratio = np.abs(m - mr) / sr, s / sr
        rows[block] = {"z_max": round(float(z.max()), 3),
                       "sd_ratio_median": round(float(np.median(ratio)), 3),
                       "sd_ratio_min": round(float(ratio.min()), 3),
                       "under_0.8": int((ratio < 0.8).sum()), "of": int(ratio.size)}
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("boards", nargs="+")
    parser.add_argument("--parts", default="default,first,reference")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    for board in args.boards:
        got = _fits(board, parts)
        ref = got["fits"].get("reference", (None,))[0]
        for part, (res, row) in got["fits"].items():
            if ref is not None and part != "reference":
                row["against_reference"] = _against(res, ref)
            print(json.dumps({"board": board, "shape": got["shape"], "cells": got["cells"],
                              "part": part, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
