"""Simulation-based calibration (Talts et al. 2018) of the default fit method.

For each replicate: draw every parameter from the model's own priors (``--prior``;
``ModelSpec.draw_prior``: under ``population`` the pooled locations and precisions first,
then the items from them; theta ~ N(0, 1) in both families), simulate a response matrix,
fit it at default settings under the same priors, and record the rank of the true value
among ``L`` posterior draws, for one subject's ability and one item's difficulty (and
log-discrimination). Under a calibrated posterior the ranks are uniform on 0..L; a
chi-square statistic over ``B`` equal bins (df = B - 1) tests it, and the histograms are
plotted. (Seed 003's hierarchical family cannot be drawn from usefully: its locations are
N(0, 10^6).)

Item draws use what ``items.parquet`` reports (the within-item marginal sd), abilities the
guide's factor, both as Gaussians on the unconstrained scale (a skewed posterior's exact
mean and sd still give non-uniform ranks). Items whose simulated responses are all alike
("constant") are set aside by the fit's mode search and put back by its read-out (on a
grid under the pool's posterior with them in it, integrated out of importance draws, or
sampled with their answers); their rows are also split by that route (``by_route``).

    python benchmarks/bench_sbc.py --reps 200 --prior population --out benchmarks/results/sbc_population.json

Where the fit's items were sampled (``quadrature.item_moments.method`` "sampled"), the
item rows are also ranked among the item sampler's own kept draws (rows "... among
sampler draws"; thinned by bulk ESS as NUTS's are, below): a skewed posterior, such as a
constant item's one-sided one, then counts as it is. The draws are the ones
``engine.infer.sampler.sample_items`` passes to ``split_rhat`` at its end (its last call;
``effective_draws`` also sees the tail ESS's indicator arrays), used only where their
means equal what the fit reports for that item.

Where the items were sampled, subject 0's ability is also ranked under its exact posterior
(row "ability (exact, over sampler draws)"): given the items, ``N(0, 1)`` times its answers'
likelihood on a fine grid, averaged over the sampler's kept item draws, its CDF at the
truth mapped to ``0..L``. It asks whether the posterior the fit summarises is calibrated,
where the plain "ability" row asks whether the Gaussian with its mean and sd is; row
"ability (reported quantile function)" ranks it among normal draws mapped through its
reported quantile function (the rank statistics' draws, ``engine.readout.quantile_draws``);
the row records how far that posterior's mean is from the reported one (``mean_gap_sd``).
Every subject's 90% interval is also checked as ``subjects.parquet`` reports it (a
quadrature fit's: each pattern's exact posterior quantiles) and as mean -+ 1.645 sd: the
shares of true abilities below and above it, averaged over the replicates
(``ability_intervals``; 0.05 each for exact posterior quantiles, since the truths are
drawn from the prior the fit uses), over every subject and over those whose answer sheets
are all right or all wrong, the most skewed posteriors (exact quantiles are calibrated
given the data too).

``--method nuts`` ranks the truth among NUTS draws instead (``engine.infer.nuts``, the same
priors, constant items as ``fit_nuts`` treats them: with their data under pooled priors): one compiled sampler per
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
import contextlib
import json
import platform
import time
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.special import expit

from engine.api import fit
from engine.compile_cache import use_compilation_cache
from engine.infer.marginal import _item_blocks
from engine.infer.settings import FitSettings
from engine.readout.posterior import interval_90, result_columns, within_owner_scales
from engine.readout.quantile_draws import quantile_draws

def _simulate(model: str, prior: str, s: int, n: int, rep: int):
    """A replicate's truth (unconstrained blocks, ``discrimination`` as log a; zero for the
    1PL), its responses and the rng that continues to draw the ranks."""
    from engine.models.registry import get_model

    rng = np.random.default_rng(10_000 + rep)
    t = get_model(model, prior=prior).draw_prior(s, n, rng)
    t.setdefault("discrimination", np.zeros(n))
    p = expit(np.exp(t["discrimination"])[None, :] * (t["ability"][:, None] - t["difficulty"][None, :]))
    y = (rng.random((s, n)) < p).astype(np.int8)
    return t, y, rng


@contextlib.contextmanager
def _sampler_draws():
    """The item sampler's kept draws inside the block, ``(chains, draws, item values then
    globals)`` each: ``sample_items``'s last call of ``split_rhat`` is on them (an earlier
    one on its warm-up's draws; ``effective_draws`` is also called on the tail ESS's
    indicators, so it cannot be the one watched)."""
    import engine.infer.sampler as sampler

    seen, real = [], sampler.split_rhat

    def spy(draws):
        seen.append(np.asarray(draws))
        return real(draws)

    sampler.split_rhat = spy
    try:
        yield seen
    finally:
        sampler.split_rhat = real


def _rank_among(chains: np.ndarray, truth: float, num_draws: int, rng) -> int:
    """The truth's rank among ``chains`` ``(chains, draws)`` thinned by their bulk ESS, mapped
    to ``0..num_draws`` (module docstring)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz as az
    ess = float(az.ess(chains[None] if chains.ndim == 1 else chains, method="bulk"))
    flat = chains.reshape(-1)
    thinned = flat[::max(1, int(np.ceil(flat.size / max(ess, 1.0))))]
    r = int((thinned < truth).sum())
    return int(np.floor((r + rng.random()) * (num_draws + 1) / (thinned.size + 1)))


def _ranks(model: str, prior: str, s: int, n: int, rep: int, num_draws: int, factor: str) -> dict:
    t, y, rng = _simulate(model, prior, s, n, rep)
    with _sampler_draws() as seen:
        res = fit(y, model=model, prior=prior,
                  settings=FitSettings(seed=rep, progress=False, ability_factor=factor))
    quad = res.extra.get("quadrature") or {}
    was_sampled = (quad.get("item_moments") or {}).get("method") == "sampled"
    sampled = seen[-1] if seen and was_sampled else None
    names = [p.name for p in _item_blocks(res.spec)]  # the sampler's order within an item
    among = np.random.default_rng([rep, 7])  # apart from ``rng``: the Gaussian rows unchanged
    # the items' posterior as items.parquet reports it (within-item marginal sds), read on
    # the unconstrained scale (a quantile of a tiny discrimination underflows to 0)
    scales = within_owner_scales(res.spec, res.guide, "item", res.cross) if res.cross else {}
    constant = np.ptp(y, axis=0) == 0
    out = {"converged": bool(res.converged), "constant_share": float(constant.mean()),
           "sampled": was_sampled}
    if constant.any():  # how the fit read its constant items (split out in the rows)
        out["route"] = ((quad.get("set_aside") or {}).get("method")
                        or res.extra.get("ability_factor", {}).get("method", "?"))
    loc, sd = res.guide.loc["ability"][0], np.exp(res.guide.log_scale["ability"][0])
    out["ability"] = int((rng.normal(loc, sd, num_draws) < t["ability"][0]).sum())
    if "ability" in res.quantile_functions:  # among the rank statistics' draws: normal draws
        # through subject 0's reported quantile function (its own stream: rows above unchanged)
        z, table = res.quantile_functions["ability"]
        own = quantile_draws(np.array([loc]), np.array([sd]), num_draws, 10_007 + rep, z, table[:, :1])
        out["ability (reported quantile function)"] = int((own[:, 0] < t["ability"][0]).sum())
    # every subject's 90% interval as subjects.parquet reports it, and as mean -+ 1.645 sd:
    # the shares of true abilities below and above it (0.05 each, over replicates drawn from
    # the prior, for an exact posterior's quantiles)
    cols = result_columns(res, "subject")
    gaussian = interval_90(np.asarray(res.guide.loc["ability"], np.float64),
                           np.exp(np.asarray(res.guide.log_scale["ability"], np.float64)))
    # the most skewed posteriors: sheets all right or all wrong (counts, not shares)
    edge = np.isin(y.sum(axis=1), (0, y.shape[1]))
    for how, (low, high) in (("reported", (cols["ability_q05"], cols["ability_q95"])),
                             ("gaussian", gaussian)):
        out[f"interval_{how}"] = [float(np.mean(t["ability"] < low)),
                                  float(np.mean(t["ability"] > high))]
        out[f"edge_{how}"] = [int(np.sum(edge & (t["ability"] < low))),
                              int(np.sum(edge & (t["ability"] > high))), int(edge.sum())]
    # the first informative item and the first set-aside one (selecting on y keeps each
    # selected item's truth a draw from its posterior, so its rank stays uniform)
    tried = matched = 0  # values looked up among the sampler's draws, and found there
    for label, found in (("informative", np.flatnonzero(~constant)), ("constant", np.flatnonzero(constant))):
        if not found.size:
            continue
        j = found[0]
        post = {name: (float(res.guide.loc[name][j]),
                       float(scales[name][j] if name in scales else np.exp(res.guide.log_scale[name][j])))
                for name in _LABEL if name in res.guide.loc}
        for name, (m, v) in post.items():
            out[f"{_LABEL[name]} ({label})"] = int((rng.normal(m, v, num_draws) < t[name][j]).sum())
            if sampled is not None:
                chains = sampled[:, :, j * len(names) + names.index(name)]
                if np.ptp(chains) == 0:  # held at one value (a vague prior's constant item)
                    continue
                tried += 1
                if abs(chains.mean() - m) < 1e-3 * max(v, 1e-6):  # the reported item's draws
                    matched += 1
                    out[f"{_LABEL[name]} ({label}) among sampler draws"] = _rank_among(
                        chains, t[name][j], num_draws, among)
    # a sampled fit whose kept draws were not found, for any value, would silently lose rows
    out["draws_found"] = sampled is not None and matched == tried
    if out["draws_found"]:  # subject 0's exact posterior over the sampler's item draws
        names_at = {name: names.index(name) for name in ("difficulty", "discrimination") if name in names}
        pit, gap = _exact_ability_pit(sampled, len(names), names_at, y[0], t["ability"][0], loc, sd)
        out["ability (exact, over sampler draws)"] = min(int(np.floor(pit * (num_draws + 1))), num_draws)
        out["ability_mean_gap_sd"] = gap
    return out


def _exact_ability_pit(sampled: np.ndarray, per_item: int, names_at: dict, y0: np.ndarray,
                       truth: float, loc: float, sd: float) -> tuple[float, float]:
    """Subject 0's posterior CDF at its true ability, and how far that posterior's mean is
    from the fit's reported one (in reported sds). Given the items, a subject's ability
    posterior is ``N(0, 1)`` times its own answers' likelihood (the abilities are
    independent given the items); averaged over the item sampler's draws (from the items'
    marginal posterior) it is the exact marginal posterior, here on a fine grid."""
    flat = sampled.reshape(-1, sampled.shape[-1])
    flat = flat[::max(1, len(flat) // 4000)]  # at most about 4,000 draws: Monte Carlo error only
    n = y0.size
    b = flat[:, [j * per_item + names_at["difficulty"] for j in range(n)]]
    a = (np.exp(flat[:, [j * per_item + names_at["discrimination"] for j in range(n)]])
         if "discrimination" in names_at else np.ones_like(b))
    grid = np.linspace(-8.0, 8.0, 1601)
    logpost = np.broadcast_to(-0.5 * grid ** 2, (len(flat), grid.size)).copy()  # (draws, grid)
    for j in range(n):  # item by item: (draws, grid) at a time, not (draws, grid, items)
        eta = a[:, j, None] * (grid[None, :] - b[:, j, None])
        logpost -= np.logaddexp(0.0, -eta if y0[j] == 1 else eta)
    w = np.exp(logpost - logpost.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)  # each draw's posterior on the grid
    dens = w.mean(axis=0)
    cdf = np.cumsum(dens) - 0.5 * dens  # midpoint rule
    mean = float((dens * grid).sum())
    return float(np.interp(truth, grid, cdf)), (mean - float(loc)) / float(sd)


_LABEL = {"difficulty": "difficulty", "discrimination": "log_discrimination"}


def _nuts_ranks(model: str, prior: str, s: int, n: int, rep: int, num_draws: int, sampler,
                settings) -> dict:
    """One replicate's ranks among thinned NUTS draws (see the module docstring)."""
    from engine.api import nuts_responses, response_stats
    from engine.infer.nuts import sample_nuts
    from engine.models.registry import get_model

    t, y, rng = _simulate(model, prior, s, n, rep)
    spec = get_model(model, prior=prior)
    constant = np.ptp(y, axis=0) == 0
    y_fit = nuts_responses(y, response_stats(y), "binary", spec)  # as fit_nuts samples them
    draws, _ = sample_nuts(spec, y_fit, settings.replace(seed=rep), sampler=sampler)
    pos = {k: np.asarray(v) for k, v in draws.position.items()}
    out = {"converged": bool(draws.diverging.sum() == 0), "constant_share": float(constant.mean()),
           "mean_steps": float(np.mean(draws.num_steps))}

    def rank(chains: np.ndarray, truth: float) -> int:
        return _rank_among(chains, truth, num_draws, rng)

    out["ability"] = rank(pos["ability"][..., 0], t["ability"][0])
    for label, found in (("informative", np.flatnonzero(~constant)), ("constant", np.flatnonzero(constant))):
        if not found.size:
            continue
        j = found[0]
        out[f"difficulty ({label})"] = rank(pos["difficulty"][..., j], t["difficulty"][j])
        if model == "2pl":  # the unconstrained block is log a
            out[f"log_discrimination ({label})"] = rank(pos["discrimination"][..., j],
                                                        t["discrimination"][j])
    return out


def _gap_summary(reps: list[dict]) -> dict:
    """How far the exact posterior's mean of subject 0 is from the fit's reported mean, in
    reported sds, over the replicates that have it (large gaps: the row is not about the
    fit's own posterior)."""
    gaps = np.abs([r["ability_mean_gap_sd"] for r in reps if "ability_mean_gap_sd" in r])
    return {"median": float(np.median(gaps)), "max": float(gaps.max())} if gaps.size else {}


MIN_PER_BIN = 5  # expected ranks a bin needs before the chi-square's p-value means anything


def chi_square(ranks: np.ndarray, num_draws: int, bins: int) -> tuple[float | None, float | None, list[int]]:
    """The ranks' histogram over ``bins`` equal bins and its chi-square statistic and p-value
    against uniform; both None where a bin expects fewer than ``MIN_PER_BIN`` ranks (a row
    of 1-3 replicates reads p 0.4-0.6 whatever its ranks)."""
    counts = np.histogram(ranks, bins=bins, range=(0, num_draws + 1))[0]
    if len(ranks) < MIN_PER_BIN * bins:
        return None, None, counts.tolist()
    stat, p = stats.chisquare(counts)
    return float(stat), float(p), counts.tolist()


def _test_text(stat: float | None, p: float | None) -> str:
    return "too few for chi2" if stat is None else f"chi2 {stat:.1f}, p {p:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--first-rep", type=int, default=0,
                    help="replicates first-rep .. +reps-1 (each replicate's truth and data are "
                         "seeded by its number: a later range gives fresh replicates)")
    ap.add_argument("--draws", type=int, default=99, help="L, posterior draws per replicate")
    ap.add_argument("--bins", type=int, default=10)
    ap.add_argument("--shapes", default="100x8,30x20")
    ap.add_argument("--models", default="1pl,2pl")
    ap.add_argument("--out", default="benchmarks/results/sbc.json")
    ap.add_argument("--plot", default="benchmarks/results/sbc.png")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw a results file")
    ap.add_argument("--prior", default="population", choices=["population", "vague"],
                    help="the prior family drawn from and fitted (population: the 1PL/2PL default)")
    ap.add_argument("--ability-factor", default="auto", choices=["gaussian", "auto", "quadrature"],
                    help="the fit's ability factor (auto: the default fit)")
    ap.add_argument("--method", default="fit", choices=["fit", "nuts"],
                    help="fit: the default fit (--ability-factor); nuts: NUTS draws")
    ap.add_argument("--nuts-warmup", type=int, default=300)
    ap.add_argument("--nuts-samples", type=int, default=500, help="per chain (2 chains)")
    ap.add_argument("--nuts-noncentred-below", type=int, default=None,
                    help="NutsSettings.noncentred_below (default: NutsSettings' own)")
    ap.add_argument("--time-limit", type=float, default=float("inf"),
                    help="seconds per model and shape; later replicates are skipped")
    args = ap.parse_args()
    if args.replot:
        _plot(json.loads(Path(args.replot).read_text())["rows"], args.plot)
        return
    use_compilation_cache()  # replicates of one shape share compiled programs
    rows, intervals, t0 = [], [], time.time()
    for model in args.models.split(","):
        for shape in args.shapes.split(","):
            s, n = map(int, shape.split("x"))
            row_start = time.time()
            if args.method == "nuts":
                from engine.infer.nuts import NutsSettings, make_sampler
                from engine.models.registry import get_model

                settings = NutsSettings(num_chains=2, num_warmup=args.nuts_warmup,
                                        num_samples=args.nuts_samples,
                                        **({} if args.nuts_noncentred_below is None else
                                           {"noncentred_below": args.nuts_noncentred_below}))
                sampler = make_sampler(get_model(model, prior=args.prior), s, n, settings)
                reps = []
                for r in range(args.first_rep, args.first_rep + args.reps):
                    if time.time() - row_start > args.time_limit:
                        break
                    reps.append(_nuts_ranks(model, args.prior, s, n, r, args.draws, sampler, settings))
            else:
                reps = [_ranks(model, args.prior, s, n, r, args.draws, args.ability_factor)
                        for r in range(args.first_rep, args.first_rep + args.reps)]
            blocks = sorted({k for r in reps for k in r} - {"converged", "constant_share",
                                                           "mean_steps", "route", "sampled",
                                                           "draws_found", "ability_mean_gap_sd",
                                                           "interval_reported", "interval_gaussian",
                                                           "edge_reported", "edge_gaussian"})
            sampled = [r for r in reps if r.get("sampled")]
            lost = sum(not r["draws_found"] for r in sampled)
            if lost:  # the spy on sample_items missed them: the rows among its draws are short
                print(f"{model} {shape}: {lost} of {len(sampled)} sampled replicates' kept "
                      "draws not found (no rank among sampler draws)", flush=True)
            for how in ("reported", "gaussian"):
                ends = np.array([r[f"interval_{how}"] for r in reps if f"interval_{how}" in r])
                if not len(ends):
                    continue
                miss = ends.sum(axis=1)  # per replicate: the share of abilities outside
                summary = {"model": model, "shape": shape, "interval": how, "reps": len(ends),
                           "coverage90": float(1 - miss.mean()),
                           "coverage90_se": (float(miss.std(ddof=1) / np.sqrt(len(ends)))
                                             if len(ends) > 1 else float("nan")),
                           "below_q05": float(ends[:, 0].mean()), "above_q95": float(ends[:, 1].mean())}
                edge = np.array([r[f"edge_{how}"] for r in reps]).sum(axis=0)
                summary["all_right_or_wrong"] = {"subjects": int(edge[2]),
                                                 "below_q05": float(edge[0] / max(edge[2], 1)),
                                                 "above_q95": float(edge[1] / max(edge[2], 1))}
                intervals.append(summary)
                print(f"{model} {shape} ability intervals ({how}): coverage "
                      f"{summary['coverage90']:.4f} +- {summary['coverage90_se']:.4f}, below "
                      f"{summary['below_q05']:.4f}, above {summary['above_q95']:.4f}; sheets all "
                      f"right or wrong ({edge[2]}): below {summary['all_right_or_wrong']['below_q05']:.4f}, "
                      f"above {summary['all_right_or_wrong']['above_q95']:.4f}", flush=True)
            for block in blocks:
                ranks = np.array([r[block] for r in reps if block in r])
                stat, p, counts = chi_square(ranks, args.draws, args.bins)
                by_route = {}  # the constant items' ranks split by how the fit read them
                for route in sorted({r["route"] for r in reps if block in r and "route" in r}
                                    if "(constant)" in block else ()):
                    sub = np.array([r[block] for r in reps if block in r and r.get("route") == route])
                    by_route[route] = dict(zip(("chi2", "p", "counts"),
                                               chi_square(sub, args.draws, args.bins)),
                                           reps=len(sub))
                rows.append({"model": model, "shape": shape, "block": block, "reps": len(ranks),
                             "chi2": stat, "df": args.bins - 1, "p": p, "counts": counts,
                             "constant_share": float(np.mean([r["constant_share"] for r in reps])),
                             "converged": float(np.mean([r["converged"] for r in reps])),
                             "row_wall_s": time.time() - row_start,
                             **({"sampled_reps": len(sampled), "draws_not_found": lost}
                                if args.method == "fit" else {}),
                             **({"by_route": by_route} if by_route else {}),
                             **({"mean_gap_sd": _gap_summary(reps)} if block.startswith("ability (exact") else {}),
                             **({"mean_steps": float(np.mean([r["mean_steps"] for r in reps]))}
                                if args.method == "nuts" else {})})
                print(f"{model} {shape} {block:34s} n={len(ranks):4d} {_test_text(stat, p)} "
                      f"{counts}", flush=True)
                for route, sub in by_route.items():  # under the row they split
                    print(f"    {route:40s} n={sub['reps']:4d} "
                          f"{_test_text(sub['chi2'], sub['p'])} {sub['counts']}", flush=True)
    meta = {"method": args.method, "prior": args.prior, "ability_factor": args.ability_factor,
            **({"nuts": {"chains": 2, "warmup": args.nuts_warmup, "samples": args.nuts_samples,
                         "noncentred_below": args.nuts_noncentred_below,
                         "thinning": "stride ceil(draws / bulk ESS) per block"}}
               if args.method == "nuts" else {}), "machine": platform.processor() or platform.machine(), "cores": 2, "reps": args.reps,
            "first_rep": args.first_rep,
            "draws": args.draws, "bins": args.bins, "wall_s": time.time() - t0, "rows": rows,
            "ability_intervals": intervals}
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
        # files written before the rule carry a statistic for every row
        test = (None, None) if r["reps"] < MIN_PER_BIN * len(r["counts"]) else (r["chi2"], r["p"])
        ax.bar(range(len(r["counts"])), r["counts"], color="#4a78b5")
        ax.axhline(r["reps"] / len(r["counts"]), color="k", lw=0.8)
        ax.set_title(f"{r['model']} {r['shape']}\n{r['block']}\n"
                     f"n {r['reps']}, {_test_text(*test)}", fontsize=7,
                     parse_math=False)
        ax.set_xticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
