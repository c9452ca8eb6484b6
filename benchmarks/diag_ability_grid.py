"""The default fit's abilities at 50 x 1,000 against NUTS in several coordinates, per value:
the probe behind BENCHMARKS.md "The item sampler's ability grid cut off the sampled
posteriors" (2026-12-05, stop 66).

    python benchmarks/diag_ability_grid.py run MODEL SEED fit [CHAINS_FACTOR]
    python benchmarks/diag_ability_grid.py run MODEL SEED nuts TAG '{"noncentred_below": 0}'
    python benchmarks/diag_ability_grid.py compare REFERENCE.npz OTHER.npz ...

``run`` simulates ``bench_coverage.simulate(MODEL, (50, 1000), SEED)``, fits it (the default
fit; ``CHAINS_FACTOR`` k runs the item sampler's warm-up and kept draws k times longer) or
samples it with NUTS at ``NutsSettings(**JSON)``, and writes each block's per-value mean and
sd (``subjects.parquet`` / ``items.parquet`` columns) to ``--dir`` (default /tmp). ``compare``
prints ``|other - reference| / reference sd`` and the sd ratios per block.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
BLOCKS = ("ability", "difficulty", "discrimination", "guessing", "feasibility")


def run(model: str, seed: int, what: str, rest: list[str], out_dir: Path) -> None:
    import engine
    import engine.infer.marginal as marginal
    from bench_coverage import simulate
    from engine.infer.nuts import NutsSettings
    from engine.infer.settings import FitSettings
    from engine.readout.posterior import draw_summary_columns, summary_columns

    warnings.simplefilter("ignore")
    y = simulate(model, (50, 1000), seed)["responses"]
    start = time.perf_counter()
    if what == "nuts":
        tag, kw = rest[0], json.loads(rest[1] if len(rest) > 1 else "{}")
        if "standardise" in kw:
            kw["standardise"] = tuple(kw["standardise"])
        res = engine.fit_nuts(y, model=model, prior="population", settings=NutsSettings(**kw))
        cols = {**draw_summary_columns(res.spec, res.draws, "subject"),
                **draw_summary_columns(res.spec, res.draws, "item")}
        d = res.extra["diagnostics"]
        info = {"rhat_max": d["rhat_max"], "ess_bulk_min": d["ess_bulk_min"],
                "coordinates": d["coordinates"]}
    else:
        factor = int(rest[0]) if rest else 1
        tag = "fit" if factor == 1 else f"fit{factor}x"
        if factor > 1:
            @dataclasses.dataclass(frozen=True)
            class Longer(marginal.MarginalSettings):
                sampler_draws: int = 2000 * factor
                sampler_warmup: int = 1000 * factor
                sampler_cells_max: int = 400_000_000_000

            marginal.MarginalSettings = Longer
        res = engine.fit(y, model=model, prior="population", settings=FitSettings(seed=seed))
        cols = {**summary_columns(res.spec, res.guide, "subject"),
                **summary_columns(res.spec, res.guide, "item", cross=res.cross,
                                  intervals=res.intervals, moments=res.moments)}
        sampler = res.extra.get("quadrature", {}).get("item_moments", {}).get("sampler", {})
        info = {k: sampler.get(k) for k in ("rhat_max", "ess_min", "seconds", "grid_points",
                                            "grid_edge_mass", "grid_widened")}
    path = out_dir / f"{model}{seed}_{tag}.npz"
    np.savez(path, **{k: np.asarray(v, float) for k, v in cols.items()
                      if k.endswith(("_mean", "_sd"))})
    print(json.dumps({"wrote": str(path), "wall_s": round(time.perf_counter() - start, 1),
                      **info}, default=str))


def compare(reference: str, others: list[str]) -> None:
    ref = np.load(reference)
    for other in others:
        d = np.load(other)
        print(other)
        for b in BLOCKS:
            if f"{b}_mean" not in ref.files or f"{b}_mean" not in d.files:
                continue
            z = (d[f"{b}_mean"] - ref[f"{b}_mean"]) / ref[f"{b}_sd"]
            r = d[f"{b}_sd"] / ref[f"{b}_sd"]
            print(f"  {b}: |z| median {np.median(abs(z)):.3f} max {abs(z).max():.3f} signed mean "
                  f"{z.mean():+.3f}; sd ratio {r.min():.2f} / {np.median(r):.2f} / {r.max():.2f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    out = Path("/tmp")
    if "--dir" in args:
        i = args.index("--dir")
        out = Path(args[i + 1])
        del args[i:i + 2]
    if args[0] == "run":
        run(args[1], int(args[2]), args[3], args[4:], out)
    else:
        compare(args[1], args[2:])
