"""Simulation-based calibration (Talts et al. 2018) of the default fit method.

For each replicate: draw every parameter from the vague priors (theta ~ N(0, 1),
b ~ N(0, 10^3), log a ~ N(0, 1); fitted with ``prior="vague"``: SBC needs a prior that can
be drawn from, and the population priors' N(0, 10^6) item location cannot), simulate a
response matrix, fit it at default settings, and record the rank of the true value among ``L`` posterior draws, for
one subject's ability and one item's difficulty (and log-discrimination). Under a
calibrated posterior the ranks are uniform on 0..L; a chi-square statistic over ``B``
equal bins (df = B - 1) tests it, and the histograms are plotted.

Item draws use what ``items.parquet`` reports (the within-item marginal sd), abilities the
guide's factor, both as Gaussians on the unconstrained scale. Items whose simulated
responses are all alike are fitted as unobserved (prior only), as every fit does.

    python benchmarks/bench_sbc.py --reps 100 --out benchmarks/results/sbc.json

``--method nuts`` ranks the truth among NUTS draws instead (``engine.infer.nuts``, vague
priors as above, constant items set aside as ``fit_nuts`` does): one compiled sampler per
model and shape (the data is its argument), 2 chains; each block's draws are thinned by
its bulk ESS (stride ``ceil(draws / ESS)``) so the ranked draws are close to independent,
and the rank among the ``m`` thinned draws is mapped to ``0..L`` as
``floor((r + u) (L + 1) / (m + 1))``, ``u ~ U(0, 1)``, which is uniform when ``r`` is.
``--time-limit`` (seconds per model and shape) stops a row early; the rows say how many
replicates ran.

    nice -n 10 python benchmarks/bench_sbc.py --method nuts --reps 200 \
        --out benchmarks/results/sbc_nuts.json --plot benchmarks/results/sbc_nuts.png
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.special import expit

from engine.api import fit
from engine.compile_cache import use_compilation_cache
from engine.infer.settings import FitSettings
from engine.readout.posterior import summarize

Z90 = 1.6448536269514722


def _prior_draw(model: str, s: int, n: int, rng) -> dict:
    truth = {"ability": rng.normal(0, 1, s), "difficulty": rng.normal(0, np.sqrt(1e3), n)}
    truth["log_discrimination"] = rng.normal(0, 1, n) if model == "2pl" else np.zeros(n)
    return truth


def _ranks(model: str, s: int, n: int, rep: int, num_draws: int, factor: str) -> dict:
    rng = np.random.default_rng(10_000 + rep)
    t = _prior_draw(model, s, n, rng)
    p = expit(np.exp(t["log_discrimination"])[None, :] * (t["ability"][:, None] - t["difficulty"][None, :]))
    y = (rng.random((s, n)) < p).astype(np.int8)
    res = fit(y, model=model, prior="vague",
              settings=FitSettings(seed=rep, progress=False, ability_factor=factor))
    items = summarize(res.spec, res.guide, "item", cross=res.cross)
    constant = np.ptp(y, axis=0) == 0
    out = {"converged": bool(res.converged), "constant_share": float(constant.mean())}
    loc, sd = res.guide.loc["ability"][0], np.exp(res.guide.log_scale["ability"][0])
    out["ability"] = int((rng.normal(loc, sd, num_draws) < t["ability"][0]).sum())
    # the first informative item and the first set-aside one (selecting on y keeps each
    # selected item's truth a draw from its posterior, so its rank stays uniform)
    for label, found in (("informative", np.flatnonzero(~constant)), ("set aside", np.flatnonzero(constant))):
        if not found.size:
            continue
        j = found[0]
        post = {"difficulty": (items["difficulty_mean"][j],
                               (items["difficulty_q95"][j] - items["difficulty_q05"][j]) / (2 * Z90))}
        if model == "2pl":
            lo, hi = np.log(items["discrimination_q05"][j]), np.log(items["discrimination_q95"][j])
            post["log_discrimination"] = ((lo + hi) / 2, (hi - lo) / (2 * Z90))
        for name, (m, v) in post.items():
            out[f"{name} ({label})"] = int((rng.normal(m, v, num_draws) < t[name][j]).sum())
    return out


def _nuts_ranks(model: str, s: int, n: int, rep: int, num_draws: int, sampler, settings) -> dict:
    """One replicate's ranks among thinned NUTS draws (see the module docstring)."""
    import warnings

    from engine.infer.nuts import sample_nuts
    from engine.models.registry import get_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz as az
    rng = np.random.default_rng(10_000 + rep)
    t = _prior_draw(model, s, n, rng)
    p = expit(np.exp(t["log_discrimination"])[None, :] * (t["ability"][:, None] - t["difficulty"][None, :]))
    y = (rng.random((s, n)) < p).astype(np.int8)
    constant = np.ptp(y, axis=0) == 0
    y_fit = y.copy()
    y_fit[:, constant] = -1  # prior only, as fit_nuts does
    draws, _ = sample_nuts(get_model(model, prior="vague"), y_fit, settings.replace(seed=rep), sampler=sampler)
    pos = {k: np.asarray(v) for k, v in draws.position.items()}
    out = {"converged": bool(draws.diverging.sum() == 0), "constant_share": float(constant.mean()),
           "mean_steps": float(np.mean(draws.num_steps))}

    def rank(chains: np.ndarray, truth: float) -> int:
        ess = float(az.ess(chains[None] if chains.ndim == 1 else chains, method="bulk"))
        flat = chains.reshape(-1)
        thinned = flat[::max(1, int(np.ceil(flat.size / max(ess, 1.0))))]
        r = int((thinned < truth).sum())
        return int(np.floor((r + rng.random()) * (num_draws + 1) / (thinned.size + 1)))

    out["ability"] = rank(pos["ability"][..., 0], t["ability"][0])
    for label, found in (("informative", np.flatnonzero(~constant)), ("set aside", np.flatnonzero(constant))):
        if not found.size:
            continue
        j = found[0]
        out[f"difficulty ({label})"] = rank(pos["difficulty"][..., j], t["difficulty"][j])
        if model == "2pl":  # the unconstrained block is log a
            out[f"log_discrimination ({label})"] = rank(pos["discrimination"][..., j],
                                                        t["log_discrimination"][j])
    return out


def chi_square(ranks: np.ndarray, num_draws: int, bins: int) -> tuple[float, float, list[int]]:
    counts = np.histogram(ranks, bins=bins, range=(0, num_draws + 1))[0]
    stat, p = stats.chisquare(counts)
    return float(stat), float(p), counts.tolist()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--draws", type=int, default=99, help="L, posterior draws per replicate")
    ap.add_argument("--bins", type=int, default=10)
    ap.add_argument("--shapes", default="100x8,30x20")
    ap.add_argument("--models", default="1pl,2pl")
    ap.add_argument("--out", default="benchmarks/results/sbc.json")
    ap.add_argument("--plot", default="benchmarks/results/sbc.png")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw a results file")
    ap.add_argument("--ability-factor", default="gaussian", choices=["gaussian", "auto", "quadrature"],
                    help="the fit's ability factor (gaussian: the default mean-field fit)")
    ap.add_argument("--method", default="fit", choices=["fit", "nuts"],
                    help="fit: the default fit (--ability-factor); nuts: NUTS draws")
    ap.add_argument("--nuts-warmup", type=int, default=300)
    ap.add_argument("--nuts-samples", type=int, default=500, help="per chain (2 chains)")
    ap.add_argument("--time-limit", type=float, default=float("inf"),
                    help="seconds per model and shape; later replicates are skipped")
    args = ap.parse_args()
    if args.replot:
        _plot(json.loads(Path(args.replot).read_text())["rows"], args.plot)
        return
    use_compilation_cache()  # replicates of one shape share compiled programs
    rows, t0 = [], time.time()
    for model in args.models.split(","):
        for shape in args.shapes.split(","):
            s, n = map(int, shape.split("x"))
            row_start = time.time()
            if args.method == "nuts":
                from engine.infer.nuts import NutsSettings, make_sampler
                from engine.models.registry import get_model

                settings = NutsSettings(num_chains=2, num_warmup=args.nuts_warmup,
                                        num_samples=args.nuts_samples)
                sampler = make_sampler(get_model(model, prior="vague"), s, n, settings)
                reps = []
                for r in range(args.reps):
                    if time.time() - row_start > args.time_limit:
                        break
                    reps.append(_nuts_ranks(model, s, n, r, args.draws, sampler, settings))
            else:
                reps = [_ranks(model, s, n, r, args.draws, args.ability_factor) for r in range(args.reps)]
            blocks = sorted({k for r in reps for k in r} - {"converged", "constant_share", "mean_steps"})
            for block in blocks:
                ranks = np.array([r[block] for r in reps if block in r])
                stat, p, counts = chi_square(ranks, args.draws, args.bins)
                rows.append({"model": model, "shape": shape, "block": block, "reps": len(ranks),
                             "chi2": stat, "df": args.bins - 1, "p": p, "counts": counts,
                             "constant_share": float(np.mean([r["constant_share"] for r in reps])),
                             "converged": float(np.mean([r["converged"] for r in reps])),
                             "row_wall_s": time.time() - row_start,
                             **({"mean_steps": float(np.mean([r["mean_steps"] for r in reps]))}
                                if args.method == "nuts" else {})})
                print(f"{model} {shape} {block:34s} n={len(ranks):4d} chi2={stat:7.2f} "
                      f"p={p:.3f} {counts}", flush=True)
    meta = {"method": args.method, "ability_factor": args.ability_factor,
            **({"nuts": {"chains": 2, "warmup": args.nuts_warmup, "samples": args.nuts_samples,
                         "thinning": "stride ceil(draws / bulk ESS) per block"}}
               if args.method == "nuts" else {}), "machine": platform.processor() or platform.machine(), "cores": 2, "reps": args.reps,
            "draws": args.draws, "bins": args.bins, "wall_s": time.time() - t0, "rows": rows}
    Path(args.out).write_text(json.dumps(meta, indent=2))
    _plot(rows, args.plot)


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 5
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(2.4 * cols, 2.3 * nrows), squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.axis("off")
    for ax, r in zip(axes.flat, rows):
        ax.bar(range(len(r["counts"])), r["counts"], color="#4a78b5")
        ax.axhline(r["reps"] / len(r["counts"]), color="k", lw=0.8)
        ax.set_title(f"{r['model']} {r['shape']}\n{r['block']}\n"
                     f"chi2 {r['chi2']:.1f}, p {r['p']:.2f}", fontsize=7, parse_math=False)
        ax.set_xticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
