"""Coverage of the variational 90% intervals against simulated truth (1PL-4PL, feas).

Each data set is simulated with a seed (``simulate.py``: theta, b ~ N(0, 1), log a ~ N(0, 0.3^2);
for the 3PL / 4PL / feas guessing ~ Beta(2, 8), feasibility ~ 1 - Beta(2, 8), scored on the
logit scale),
fitted with ``engine.fit`` at default settings, and every block's interval ``loc +- 1.645 sd``
on the unconstrained scale (log-discrimination for the 2PL) is checked against the truth.
Reports per block: the share covered, and the ratio of the actual root-mean-square error to the
mean posterior sd (1 = calibrated, above 1 = intervals too narrow), both against the raw truth
and against the truth *linked* to the fit's scale (mean/sigma linking, as IRT simulation
studies do: the 2PL likelihood is unchanged by theta, b -> k theta + c, k b + c and a -> a / k,
so only the priors set k and c, and the vague priors do not put them where the simulation did).
The 1PL is linked by the shift only. Item blocks coupled within an item (the 2PL's difficulty
and discrimination) are also scored with the read-outs' within-item marginal sds
(``engine.readout.posterior.within_owner_scales``, what ``items.parquet`` reports). Writes ``benchmarks/results/coverage.json`` and prints a
Markdown table.

    python benchmarks/bench_coverage.py [--seeds 5] [--ability-factor auto|gaussian|quadrature]
        [--models 1pl,2pl] [--shapes 2000x12,1000x50,200x400,50x1000] [--out PATH]
        [--prior vague|hierarchical|population|default]
        [--mirt /work/bench-venv/bin/python [--mirt-only] [--mirt-timeout S]
         [--mirt-guessing-beta A,B]] [--nuts] [--guessing-truth C] [--feasibility-truth D]

``--guessing-truth C`` / ``--feasibility-truth D`` set every item's true guessing / feasibility
to ``C`` / ``D`` instead of drawing it from Beta(2, 8) / 1 - Beta(2, 8) (3PL, 4PL, feas); the
random stream is the same, so abilities, difficulties and discriminations (and the uniforms
behind the responses) match the default data set of the same seed. A truth of 0 (or 1) is
``-inf`` (``+inf``) on the logit scale and never covered. Each run also records
``summary``: the mean true and fitted (``items.parquet``'s ``_mean``) value per item block and
the mean error of the fitted location (unconstrained scale, raw truth).

``--mirt-guessing-beta A,B`` fits mirt with ``priors={"guessing": BetaPrior(A, B)}`` (MAP EM).

``--nuts`` also samples each data set with NUTS (``engine.fit_nuts`` at its defaults;
``--nuts-extend N``: up to N rounds of more draws while an R-hat exceeds 1.01) and
scores the raw truth with its draws' central 90% intervals: the exact posterior's coverage;
``nuts_agreement`` compares the fit's ``items.parquet`` / ``subjects.parquet`` columns with
NUTS's draws per block: ``|fit mean - NUTS mean| / NUTS sd`` (median, max) and the sd ratio
fit / NUTS (min, median, max), on the constrained scale those files report.

``--mirt`` adds mirt for Python's Wald-interval coverage (``mirt_wald``); ``--mirt-only`` runs
only mirt on the same simulated data sets (no engine fit) and reports its coverage per block.

``raw_within_item`` scores the raw truth with the sds ``items.parquet`` reports (the
quadrature fit's marginal sds; the mean-field fit's within-item marginal sds).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from simulate import ASYMPTOTES, simulate_1pl, simulate_2pl, simulate_asymptotes  # noqa: E402

from engine.readout.posterior import Z90  # noqa: E402

SHAPES = [(2000, 12), (1000, 50), (200, 400), (50, 1000)]
_BLOCKS = ("ability", "difficulty", "discrimination", "guessing", "feasibility")


def _truth_unconstrained(sim: dict, model: str, k: float = 1.0, c: float = 0.0) -> dict:
    """The truth on the unconstrained scale, moved along the likelihood's symmetries."""
    truth = {"ability": k * sim["ability"] + c, "difficulty": k * sim["difficulty"] + c}
    if model != "1pl":
        truth["discrimination"] = np.log(sim["discrimination"]) - np.log(k)
    for block in ("guessing", "feasibility"):  # logit scale; unmoved by the symmetries
        if block in sim:
            truth[block] = np.log(sim[block]) - np.log1p(-sim[block])
    return truth


def _linking(sim: dict, model: str, fitted_ability: np.ndarray) -> tuple[float, float]:
    """Mean/sigma linking constants (``k = 1`` for the 1PL) from the abilities."""
    k = float(np.std(fitted_ability) / np.std(sim["ability"])) if model != "1pl" else 1.0
    return k, float(np.mean(fitted_ability) - k * np.mean(sim["ability"]))


def simulate(model: str, shape: tuple[int, int], seed: int, guessing: float | None = None,
             feasibility: float | None = None) -> dict:
    """The data set ``measure`` fits: ``simulate.py``'s generator for ``model``; ``guessing`` /
    ``feasibility`` fix every item's true asymptote (asymptote models only)."""
    if model in ASYMPTOTES:
        return simulate_asymptotes(model, *shape, seed=seed, guessing=guessing,
                                   feasibility=feasibility)
    return (simulate_2pl if model == "2pl" else simulate_1pl)(*shape, seed=seed)


def mirt_wald(model: str, sim: dict, python: str, timeout: float | None = None,
              guessing_beta: str | None = None) -> dict:
    """Coverage of mirt for Python's 90% Wald intervals (EM, Oakes SEs; EAP +- 1.645 PSD for
    abilities) of the raw truth, run in the bench venv's ``python`` (``mirt_wald.py``).
    Discrimination is scored on mirt's raw scale ``a``, guessing and feasibility on the
    probability scale. An item whose SE mirt leaves unknown (NaN) counts as not covered;
    ``se_missing`` counts them per block, ``coverage_se_known`` is the coverage of the rest.
    ``guessing_beta`` ("A,B") fits with mirt's ``BetaPrior(A, B)`` on guessing (MAP EM).
    ``summary`` has the mean estimate and mean error per block. A failed or timed-out run
    gives ``failed``."""
    from mirt_wald import run_in

    start = time.perf_counter()
    est = run_in(python, sim["responses"], model, timeout, guessing_beta)
    if "failed" in est:
        return {"failed": est["failed"], "wall_s": time.perf_counter() - start}
    out = {"wall_s": est["wall_s"], "process_wall_s": time.perf_counter() - start,
           "tool_version": est["tool_version"], "converged": est.get("converged"),
           "n_iterations": est.get("n_iterations"), "priors": est.get("priors"),
           "se_missing": {}, "coverage_se_known": {}, "summary": {}}
    for block in _BLOCKS:
        if ((block == "discrimination" and model == "1pl") or block not in sim
                or est.get(f"{block}_se") is None):
            continue
        se = np.asarray(est[f"{block}_se"], dtype=float)  # null -> NaN
        err = np.asarray(est[block], dtype=float) - sim[block]
        covered, known = np.abs(err) <= Z90 * se, np.isfinite(se)  # NaN compares False
        out[block] = float(np.mean(covered))
        out["se_missing"][block] = int(np.sum(~known))
        out["coverage_se_known"][block] = float(np.mean(covered[known])) if known.any() else None
        out["summary"][block] = {"mean_estimate": float(np.nanmean(np.asarray(est[block], float))),
                                 "mean_truth": float(np.mean(sim[block])),
                                 "mean_error": float(np.nanmean(err))}
    return out


def mirt_only(models: list[str], shapes: list[tuple[int, int]], seeds: range, python: str,
              timeout: float | None = None, guessing_beta: str | None = None,
              truths: dict | None = None) -> tuple[list[dict], str]:
    """mirt's Wald coverage alone on ``measure``'s data sets, and a Markdown table per block
    (mean and range over seeds; SEs mirt left unknown, of all items or abilities)."""
    runs = []
    for m in models:
        for s in shapes:
            for seed in seeds:
                sim = simulate(m, s, seed, **(truths or {}))
                runs.append({"model": m, "shape": list(s), "seed": seed,
                             "mirt": mirt_wald(m, sim, python, timeout, guessing_beta)})
                print(m, s, seed, runs[-1]["mirt"], flush=True)
    lines = ["| model | subjects x items | block | mirt Wald 90% coverage, raw truth (mean; range) "
             "| SE unknown (all runs) | coverage where SE known (mean) | runs ok / not converged "
             "| mirt wall s (mean; range) | mean estimate (mean truth) | mean error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        for s in shapes:
            group = [r["mirt"] for r in runs if r["model"] == m and r["shape"] == list(s)]
            ok = [g for g in group if "failed" not in g]
            if not ok:
                lines.append(f"| {m} | {s[0]} x {s[1]} | - | all {len(group)} runs failed | "
                             f"| | 0/{len(group)} | | | |")
                continue
            walls = [g["wall_s"] for g in ok]
            for block in [b for b in ok[0] if b in _BLOCKS]:
                cov = [g[block] for g in ok]
                missing = sum(g["se_missing"][block] for g in ok)
                n = len(ok) * (s[0] if block == "ability" else s[1])
                known = [g["coverage_se_known"][block] for g in ok
                         if g["coverage_se_known"][block] is not None]
                known_cell = f"{np.mean(known):.3f}" if known else "-"
                summ = [g["summary"][block] for g in ok]
                est_cell = (f"{np.mean([x['mean_estimate'] for x in summ]):.3f} "
                            f"({np.mean([x['mean_truth'] for x in summ]):.3f})")
                err_cell = f"{np.mean([x['mean_error'] for x in summ]):+.3f}"
                lines.append(f"| {m} | {s[0]} x {s[1]} | {block} | {np.mean(cov):.3f} "
                             f"({min(cov):.3f}-{max(cov):.3f}) | {missing}/{n} | {known_cell} | "
                             f"{len(ok)}/{len(group)} / {sum(not g['converged'] for g in ok)} | "
                             f"{np.mean(walls):.1f} ({min(walls):.1f}-{max(walls):.1f}) | "
                             f"{est_cell} | {err_cell} |")
    return runs, "\n".join(lines)


def draws_coverage(sim: dict, draws: dict) -> dict:
    """Per block, the share of the simulated truth inside the draws' central 90% interval
    (their 5% and 95% quantiles); draws ``(chains, draws, *block)``."""
    out = {}
    for block, block_draws in draws.items():
        truth = sim.get(block)
        if truth is None or np.shape(truth) != np.shape(block_draws)[2:]:
            continue
        flat = np.asarray(block_draws).reshape((-1,) + np.shape(truth))
        lo, hi = np.quantile(flat, [0.05, 0.95], axis=0)
        out[block] = float(np.mean((truth >= lo) & (truth <= hi)))
    return out


def width_ratio(mine_q05, mine_q95, exact_q05, exact_q95) -> dict:
    """The 90% intervals' widths, mine / exact (min, median, max, share in [0.8, 1.25]): the
    spread compared where the sd is not a steady measure of it. A long-tailed value's sd
    rests on a few far draws (the 4PL's discriminations at 2,000 x 12: NUTS's own sd has a
    Monte Carlo error of 7-22% at 4 x 1,000 draws); its 5% and 95% quantiles do not."""
    ratio = (np.asarray(mine_q95) - np.asarray(mine_q05)) / (
        np.asarray(exact_q95) - np.asarray(exact_q05))
    return {"width_ratio_min": float(np.min(ratio)), "width_ratio_median": float(np.median(ratio)),
            "width_ratio_max": float(np.max(ratio)),
            "share_width_ratio_in_0.8_1.25": float(np.mean((ratio >= 0.8) & (ratio <= 1.25)))}


def agreement(mine, exact, block: str) -> dict:
    """One block of a fit (``mine``) against a reference (``exact``), both tables with the
    columns ``{block}_mean``, ``_sd``, ``_q05``, ``_q95`` (``result_columns``'): ``|mine mean -
    exact mean| / exact sd`` (median, max, share within 0.25, mean signed), the sd ratio
    mine / exact (min, median, max, share in [0.8, 1.25]), the same of the 90% intervals'
    widths (:func:`width_ratio`), and the 90% intervals' ends' largest
    distance in exact sds (steadier than the sd where a block's posterior is long-tailed: the
    4PL's discriminations at 2,000 x 12); where both tables carry the sds' Monte Carlo
    standard errors (``_mcse_sd``: sampled values), how many of them the sds are apart
    (largest; share within two)."""
    nm, ns = (np.asarray(exact[f"{block}_{c}"], float) for c in ("mean", "sd"))
    fm, fs = (np.asarray(mine[f"{block}_{c}"], float) for c in ("mean", "sd"))
    z, ratio = np.abs(fm - nm) / ns, fs / ns
    ends = np.maximum(*(np.abs(np.asarray(mine[f"{block}_{q}"], float)
                               - np.asarray(exact[f"{block}_{q}"], float)) / ns
                        for q in ("q05", "q95")))
    out = {"z_median": float(np.median(z)), "z_max": float(np.max(z)),
           "interval_ends_z_max": float(np.max(ends)),
           "share_z_within_0.25": float(np.mean(z <= 0.25)),
           "sd_ratio_min": float(np.min(ratio)), "sd_ratio_median": float(np.median(ratio)),
           "sd_ratio_max": float(np.max(ratio)),
           "share_sd_ratio_in_0.8_1.25": float(np.mean((ratio >= 0.8) & (ratio <= 1.25))),
           "mean_signed_z": float(np.mean((fm - nm) / ns))}
    out |= width_ratio(*(np.asarray(t[f"{block}_{q}"], float) for t in (mine, exact)
                         for q in ("q05", "q95")))
    if f"{block}_mcse_sd" in mine and f"{block}_mcse_sd" in exact:
        # both sds' Monte Carlo errors (sampled values): how far apart the sds are in them
        err = np.hypot(*(np.asarray(t[f"{block}_mcse_sd"], float) for t in (mine, exact)))
        apart = np.abs(fs - ns) / err
        out |= {"sd_apart_in_mcse_max": float(np.nanmax(apart)),
                "share_sd_within_2_mcse": float(np.mean(apart <= 2.0))}
    return out


def nuts_coverage(model: str, sim: dict, prior: str | None, fit=None, extend: int = 0) -> dict:
    """Coverage of NUTS's central 90% intervals (the draws' 5% and 95% quantiles, at
    ``fit --method nuts``'s defaults) of the raw truth, per block, with the run's largest
    R-hat, wall time and sampler coordinates (fit.json's, with any restart in standardised
    ones): the exact posterior's own calibration, beside the fit's. With the
    variational ``fit`` also ``agreement``: per block, ``|fit mean - NUTS mean| / NUTS sd``
    (median, max), the 90% intervals' ends ``|fit q - NUTS q| / NUTS sd`` (max over both ends)
    and the sd ratio fit / NUTS (min, median, max), comparing the columns
    ``items.parquet`` / ``subjects.parquet`` report (constrained scale), and for item blocks
    each item's four values (``per_item``)."""
    import engine
    from engine.readout.posterior import result_columns

    start = time.perf_counter()
    from engine.infer.nuts import NutsSettings

    res = engine.fit_nuts(sim["responses"], model=model, prior=prior,
                          settings=NutsSettings(extend=extend))
    out = {"wall_s": time.perf_counter() - start,
           "rhat_max": float(res.extra["diagnostics"]["rhat_max"]),
           "extended": int(res.extra["diagnostics"].get("extended", 0)),
           "coordinates": res.extra["diagnostics"]["coordinates"],  # and any restart
           # each block's largest Monte Carlo error of a posterior sd, relative to the sd
           "mcse_sd_rel_max": {b: v.get("mcse_sd_rel_max")
                               for b, v in res.extra["diagnostics"].get("blocks", {}).items()},
           **draws_coverage(sim, res.draws)}
    if fit is not None:
        out["agreement"] = {}
        for owner in ("item", "subject"):
            mine, exact = result_columns(fit, owner), result_columns(res, owner)
            for col in exact:
                if not col.endswith("_mean") or col not in mine:
                    continue
                block = col[:-5]
                out["agreement"][block] = agreement(mine, exact, block)
                if owner == "item":  # each item's values, to read a disagreement item by item
                    out["agreement"][block]["per_item"] = {
                        f"{who}_{c}": np.asarray(table[f"{block}_{c}"], float).tolist()
                        for c in ("mean", "sd", "q05", "q95", "mcse_sd")
                        for who, table in (("fit", mine), ("nuts", exact))
                        if f"{block}_{c}" in table}
    return out


def measure(model: str, shape: tuple[int, int], seed: int, ability_factor: str = "auto",
            mirt_python: str | None = None, prior: str | None = "population",
            nuts: bool = False, mirt_timeout: float | None = None, truths: dict | None = None,
            mirt_guessing_beta: str | None = None, nuts_extend: int = 0) -> dict:
    import engine
    from engine.readout.posterior import interval_90, result_columns, within_owner_scales

    truths = {k: v for k, v in (truths or {}).items() if v is not None}
    sim = simulate(model, shape, seed, **truths)
    start = time.perf_counter()
    res = engine.fit(sim["responses"], model=model, prior=prior,
                     settings=engine.FitSettings(seed=seed, ability_factor=ability_factor))
    wall = time.perf_counter() - start
    out = {"model": model, "shape": list(shape), "seed": seed, "prior": prior,
           "truths": truths, "passes": res.num_passes,
           "converged": bool(res.converged), "wall_s": wall, "blocks": {},
           "ability_factor": res.extra["ability_factor"]["method"]}
    if "quadrature_not_converged" in res.extra["ability_factor"]:  # auto's fallback, and why
        out["quadrature_not_converged"] = res.extra["ability_factor"]["quadrature_not_converged"]
    moments = res.extra.get("quadrature", {}).get("item_moments", {})
    if moments:  # how the items' intervals were obtained (and the sampler's diagnostics)
        sampler = moments.get("sampler") or {}
        out["item_moments"] = {"method": moments["method"],
                               "intervals": moments.get("intervals")} | {
            key: sampler[key] for key in ("rhat_max", "ess_min", "ess_tail_min", "seconds",
                                          "because", "pilot", "draws", "extended", "not_extended",
                                          "grid_points", "grid_widened", "grid_edge_mass")
            if key in sampler}
        if "nodes" in moments:  # the importance draws' ability grid (widened or not)
            out["item_moments"]["nodes"] = moments["nodes"]
    sds = res.sds()
    k, c = _linking(sim, model, np.asarray(res.guide.loc["ability"]))
    out["linking"] = {"k": k, "c": c}
    if mirt_python:
        out["mirt"] = mirt_wald(model, sim, mirt_python, mirt_timeout, mirt_guessing_beta)
    if nuts:
        out["nuts"] = nuts_coverage(model, sim, prior, res, nuts_extend)
    table = result_columns(res, "item")
    raw = _truth_unconstrained(sim, model)
    out["summary"] = {block: {"mean_truth": float(np.mean(sim[block])),
                              "mean_fitted": float(np.mean(table[f"{block}_mean"])),
                              "mean_error_unconstrained": float(np.mean(
                                  np.asarray(res.guide.loc[block]) - raw[block]))}
                      for block in ("difficulty", "discrimination", "guessing", "feasibility")
                      if block in sim and f"{block}_mean" in table}
    marginal = within_owner_scales(res.spec, res.guide, "item", res.cross)
    for how, (kk, cc) in (("raw", (1.0, 0.0)), ("raw_within_item", (1.0, 0.0)),
                          ("linked", (k, c)), ("linked_within_item", (k, c))):
        for block, truth in _truth_unconstrained(sim, model, kk, cc).items():
            loc, sd = np.asarray(res.guide.loc[block]), np.asarray(sds[block])
            if how.endswith("within_item"):
                sd = marginal.get(block, sd)
            err = loc - truth
            # as items.parquet reports it: sampled quantiles where the fit has them
            low, high = interval_90(loc, sd, res.intervals.get(block)
                                    if how == "raw_within_item" else None)
            out["blocks"].setdefault(block, {"n": int(truth.size)})[how] = {
                "coverage90": float(np.mean((truth >= low) & (truth <= high))),
                "rmse_over_sd": float(np.sqrt(np.mean(err ** 2)) / np.mean(sd)),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. +seeds-1")
    ap.add_argument("--out", default=str(HERE / "results" / "coverage.json"))
    ap.add_argument("--ability-factor", default="auto", choices=["auto", "gaussian", "quadrature"])
    ap.add_argument("--models", default="1pl,2pl")
    ap.add_argument("--prior", default="population",
                    choices=["population", "vague", "hierarchical", "default"],
                    help="default: each model's own (population for the binary models)")
    ap.add_argument("--mirt", default=None, metavar="PYTHON",
                    help="the bench venv's python: add mirt's Wald-interval coverage")
    ap.add_argument("--mirt-only", action="store_true",
                    help="with --mirt: run only mirt on the same data sets (no engine fit)")
    ap.add_argument("--mirt-timeout", type=float, default=None, metavar="S",
                    help="seconds before a mirt run is recorded as failed")
    ap.add_argument("--nuts", action="store_true",
                    help="add NUTS's coverage (fit --method nuts defaults) on the same data")
    ap.add_argument("--nuts-extend", type=int, default=0, metavar="N",
                    help="with --nuts: up to N rounds of more draws while any R-hat is over "
                         "1.01 (NutsSettings.extend; fit.json's `extended` says how many ran)")
    ap.add_argument("--mirt-guessing-beta", default=None, metavar="A,B",
                    help="with --mirt: fit mirt with priors={'guessing': BetaPrior(A, B)}")
    ap.add_argument("--guessing-truth", type=float, default=None, metavar="C",
                    help="every item's true guessing C instead of Beta(2, 8) draws")
    ap.add_argument("--feasibility-truth", type=float, default=None, metavar="D",
                    help="every item's true feasibility D instead of 1 - Beta(2, 8) draws")
    ap.add_argument("--shapes", default=",".join(f"{a}x{b}" for a, b in SHAPES),
                    help="comma-separated SUBJECTSxITEMS")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    prior = None if args.prior == "default" else args.prior
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    truths = {"guessing": args.guessing_truth, "feasibility": args.feasibility_truth}
    truths = {k: v for k, v in truths.items() if v is not None}
    recorded = {"first_seed": args.first_seed, "guessing_truth": args.guessing_truth,
                "feasibility_truth": args.feasibility_truth,
                "mirt_guessing_beta": args.mirt_guessing_beta}
    if args.mirt_only:
        if not args.mirt:
            ap.error("--mirt-only needs --mirt PYTHON")
        runs, table = mirt_only(models, shapes, seeds, args.mirt, args.mirt_timeout,
                                args.mirt_guessing_beta, truths)
        return _write(Path(args.out), {"machine": _machine(), "seeds": args.seeds, **recorded,
                                       "mirt_only": True, "runs": runs, "table": table}, table)
    runs = []
    each = Path(args.out).with_suffix(".runs.jsonl")  # every run as it ends (a long run's
    each.unlink(missing_ok=True)  # seeds are not lost with its process)
    for m in models:
        for s in shapes:
            for seed in seeds:
                runs.append(measure(m, s, seed, args.ability_factor, args.mirt, prior, args.nuts,
                                    args.mirt_timeout, truths, args.mirt_guessing_beta,
                                    args.nuts_extend))
                r = runs[-1]
                with each.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                exact = ({b: round(v, 3) for b, v in r["nuts"].items() if b in _BLOCKS}
                         if "nuts" in r else None)
                how = r.get("item_moments", {})
                print(m, s, seed, r["ability_factor"], how.get("method", ""),
                      f"R-hat {how['rhat_max']}" if "rhat_max" in how else "",
                      f"{r['wall_s']:.1f} s", {
                    b: round(v["raw_within_item"]["coverage90"], 3) for b, v in r["blocks"].items()},
                    f"nuts: {exact}" if exact else "", {
                    b: (round(v["mean_fitted"], 3), round(v["mean_error_unconstrained"], 3))
                    for b, v in r["summary"].items()}, flush=True)
    lines = ["| model | subjects x items | fit | block | 90% coverage, raw truth, items.parquet sd "
             "(mean; range) | RMSE / sd | raw truth, guide sd | linked truth, items.parquet sd "
             "| RMSE / sd | linking k | wall s (mean) | mirt Wald, raw truth (mean; range) "
             "| NUTS 90% quantiles, raw truth (mean; range) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        for s in shapes:
            group = [r for r in runs if r["model"] == m and r["shape"] == list(s)]
            ks = [r["linking"]["k"] for r in group]
            for block in group[0]["blocks"]:
                cells = []
                for how in ("raw_within_item", "raw", "linked_within_item"):
                    cov = [r["blocks"][block][how]["coverage90"] for r in group]
                    ratio = [r["blocks"][block][how]["rmse_over_sd"] for r in group]
                    cells.append(f"{np.mean(cov):.3f} ({min(cov):.3f}-{max(cov):.3f})" +
                                 ("" if how == "raw" else f" | {np.mean(ratio):.2f}"))
                fits = "/".join(sorted({r["ability_factor"] for r in group}))
                methods = [r["item_moments"]["method"] for r in group if "item_moments" in r]
                if methods:  # how many runs' item intervals each route gave
                    fits += " (" + ", ".join(f"{k} {methods.count(k)}/{len(group)}"
                                             for k in sorted(set(methods))) + ")"
                wald = [r["mirt"][block] for r in group if block in r.get("mirt", {})]
                wald_cell = f"{np.mean(wald):.3f} ({min(wald):.3f}-{max(wald):.3f})" if wald else "-"
                exact = [r["nuts"][block] for r in group if block in r.get("nuts", {})]
                nuts_cell = (f"{np.mean(exact):.3f} ({min(exact):.3f}-{max(exact):.3f})"
                             if exact else "-")
                lines.append(f"| {m} | {s[0]} x {s[1]} | {fits} | {block} | {' | '.join(cells)} | "
                             f"{min(ks):.2f}-{max(ks):.2f} | "
                             f"{np.mean([r['wall_s'] for r in group]):.1f} | {wald_cell} | "
                             f"{nuts_cell} |")
    lines += ["", "| model | subjects x items | block | mean truth | mean fitted (items.parquet "
              "mean; range over seeds) | mean error of the location, unconstrained (range) |",
              "|---|---|---|---|---|---|"]
    for m in models:
        for s in shapes:
            group = [r for r in runs if r["model"] == m and r["shape"] == list(s)]
            for block in group[0]["summary"]:
                v = {key: [r["summary"][block][key] for r in group]
                     for key in group[0]["summary"][block]}
                fitted, err = v["mean_fitted"], v["mean_error_unconstrained"]
                lines.append(f"| {m} | {s[0]} x {s[1]} | {block} | {np.mean(v['mean_truth']):.3f} | "
                             f"{np.mean(fitted):.3f} ({min(fitted):.3f} to {max(fitted):.3f}) | "
                             f"{np.mean(err):+.3f} ({min(err):+.3f} to {max(err):+.3f}) |")
    agree = [r for r in runs if "agreement" in r.get("nuts", {})]
    if agree:
        lines += ["", "| model | subjects x items | seed | block | \\|fit - NUTS\\| / NUTS sd "
                  "(median; max) | share within 0.25 | sd ratio fit / NUTS (min; median; max) "
                  "| share in [0.8, 1.25] | NUTS R-hat max | NUTS wall s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in agree:
            for block, a in r["nuts"]["agreement"].items():
                lines.append(f"| {r['model']} | {r['shape'][0]} x {r['shape'][1]} | {r['seed']} | "
                             f"{block} | {a['z_median']:.3f}; {a['z_max']:.3f} | "
                             f"{a['share_z_within_0.25']:.2f} | {a['sd_ratio_min']:.2f}; "
                             f"{a['sd_ratio_median']:.2f}; {a['sd_ratio_max']:.2f} | "
                             f"{a['share_sd_ratio_in_0.8_1.25']:.2f} | "
                             f"{r['nuts']['rhat_max']:.3f} | {r['nuts']['wall_s']:.0f} |")
    table = "\n".join(lines)
    result = {"machine": _machine(), **recorded,
              "seeds": args.seeds, "ability_factor": args.ability_factor, "prior": args.prior,
              "runs": runs,
              "table": table}
    return _write(Path(args.out), result, table)


def _machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor()}


def _write(out: Path, result: dict, table: str) -> int:
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    print(table)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
