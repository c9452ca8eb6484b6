"""The default fit's Monte Carlo error beside a NUTS reference: one simulated data set fitted
with several fit seeds (``FitSettings.seed``: the importance draws or the item sampler's
chains), each item block's means, sds and 90% interval ends compared with the NUTS draws'
recorded by ``bench_coverage.py --nuts`` (its ``.runs.jsonl``: ``nuts.agreement[block]
.per_item``), so that a disagreement can be read as the fit's bias or as Monte Carlo noise
on either side (the 4PL's discriminations at 2,000 x 12, whose long tails make their sds
noisy for both samplers).

    python benchmarks/bench_fit_seeds.py RUNS_JSONL [--fit-seeds 0,1,2] [--sampler-draws N]
        [--out PATH]

Prints one line per fit seed and block (largest ``|fit mean - NUTS mean| / NUTS sd``, the sd
ratios' range and median, the interval ends' largest distance in NUTS sds), then each item's
sd under every fit seed beside NUTS's, and writes the numbers to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def compare(table, per_item: dict, block: str) -> dict:
    """The fit's ``table`` columns of ``block`` against NUTS's recorded ``per_item`` values
    (``bench_coverage.agreement``), with the fit's sds."""
    from bench_coverage import agreement

    exact = {f"{block}_{c}": per_item[f"nuts_{c}"] for c in ("mean", "sd", "q05", "q95")}
    return agreement(table, exact, block) | {
        "fit_sd": np.asarray(table[f"{block}_sd"], np.float64).tolist()}


def main(argv: list[str] | None = None) -> int:
    from bench_coverage import simulate

    import engine
    from engine.infer.marginal import MarginalSettings, fit_marginal_result
    from engine.infer.settings import FitSettings
    from engine.models import get_model
    from engine.readout.posterior import result_columns

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", help="a bench_coverage --nuts .runs.jsonl (its first line is used)")
    ap.add_argument("--fit-seeds", default="0,1,2")
    ap.add_argument("--sampler-draws", type=int, default=None,
                    help="MarginalSettings.sampler_draws (default: the fit's own)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    ref = json.loads(Path(args.runs).read_text().splitlines()[0])
    model, shape, seed = ref["model"], tuple(ref["shape"]), ref["seed"]
    per_block = {b: a["per_item"] for b, a in ref["nuts"]["agreement"].items() if "per_item" in a}
    sim = simulate(model, shape, seed, **ref.get("truths", {}))
    settings = MarginalSettings() if args.sampler_draws is None else MarginalSettings(
        sampler_draws=args.sampler_draws)
    out = {"reference": str(args.runs), "model": model, "shape": list(shape), "data_seed": seed,
           "nuts_sd": {b: p["nuts_sd"] for b, p in per_block.items()}, "fits": {},
           "machine": {"platform": platform.platform(), "processor": platform.processor()}}
    for fit_seed in (int(s) for s in args.fit_seeds.split(",")):
        start = time.perf_counter()
        if args.sampler_draws is None:  # the default fit, as bench_coverage runs it
            res = engine.fit(sim["responses"], model=model, prior=ref.get("prior"),
                             settings=FitSettings(seed=fit_seed))
        else:  # its quadrature fit with longer chains
            res = fit_marginal_result(get_model(model, prior=ref.get("prior") or "population"),
                                      sim["responses"], FitSettings(seed=fit_seed),
                                      replace(settings, max_iter=FitSettings().max_passes))
        wall = time.perf_counter() - start
        moments = res.extra["quadrature"]["item_moments"]
        sampler = moments.get("sampler") or {}
        table = result_columns(res, "item")
        row = {"wall_s": wall, "method": moments["method"],
               **{k: sampler.get(k) for k in ("draws", "extended", "not_extended", "ess_min",
                                              "ess_tail_min", "rhat_max", "seconds")},
               "blocks": {b: compare(table, p, b) for b, p in per_block.items()}}
        out["fits"][str(fit_seed)] = row
        print(f"fit seed {fit_seed}: {row['method']}, draws {row['draws']}, ESS min "
              f"{row['ess_min']} (tail {row['ess_tail_min']}), R-hat {row['rhat_max']}, "
              f"{wall:.1f} s", flush=True)
        for b, c in row["blocks"].items():
            print(f"  {b:15s} z_max {c['z_max']:.3f}  sd ratio {c['sd_ratio_min']:.2f}-"
                  f"{c['sd_ratio_max']:.2f} (median {c['sd_ratio_median']:.2f})  interval ends "
                  f"{c['interval_ends_z_max']:.2f}", flush=True)
    for b, nuts_sd in out["nuts_sd"].items():
        print(f"{b} sd per item: NUTS {np.round(nuts_sd, 3).tolist()}")
        for s, row in out["fits"].items():
            print(f"  fit seed {s}: {np.round(row['blocks'][b]['fit_sd'], 3).tolist()}")
    if args.out:
        path = Path(args.out)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
