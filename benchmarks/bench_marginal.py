"""The quadrature (marginal) fit beside the mean-field fit and NUTS, on LSAT7 and simulated 2PL.

For each data set: ``ability_factor=auto`` (which takes quadrature on these shapes), the
mean-field fit (``ability_factor=gaussian``, the default) and NUTS (``engine.fit_nuts``, the
exact posterior of the same model). Per block it reports the median and largest
``|mean - NUTS mean| / NUTS sd`` and the median sd ratio (fit / NUTS), on the unconstrained
scale (log-discrimination), with items' sds as ``items.parquet`` reports them. For LSAT7 the
items' discriminations are printed beside R mirt's marginal ML estimates and Oakes standard
errors as quoted in issue 16 (mirt itself is not run here), and the spread of the abilities of
the 308 subjects who answered 11111.

    python benchmarks/bench_marginal.py [--data lsat7,2000x12] [--no-nuts] [--out PATH]
        [--nuts-cache DIR] [--nuts-samples N] [--marginal-nuts results/nuts-marginal.json]
        [--prior vague|hierarchical|population] [--nuts-only] [--nuts-warmup N] [--nuts-chains N]
        [--model 1pl|2pl] [--signed --negative 0.1] [--laplace]
    python benchmarks/bench_marginal.py --mirt /work/bench-venv/bin/python [--model 3pl]

``--data`` also takes ``SxNcK``: the simulated ``SxN`` with its last ``K`` items made
constant (alternately all right and all wrong), which the fit sets aside.

``--signed`` fits the 2PL with ``signed_discrimination`` (and NUTS of the same model), on
simulated data with ``--negative`` of the items' discriminations flipped; ``--laplace`` adds
the quadrature fit with the item sampler off (``sampler_chains=0``: the Laplace
approximation at the marginal mode), to show what the sampler changes.

``--nuts-samples`` sets NUTS's draws per chain (1,000 by default, as ``fit --method nuts``);
``--mirt PYTHON`` instead puts LSAT7 item by item beside mirt for Python, run in the bench
venv (``mirt_wald.py``: EM, Oakes standard errors, EAP abilities), and NUTS: the default fit's
mean, sd and 90% interval as ``items.parquet`` reports them, NUTS's, and mirt's estimate,
standard error and Wald interval, with the abilities' Kendall tau against mirt's EAP scores.

``--marginal-nuts`` also compares the items with ``nuts_marginal.py``'s long runs on the
items' marginal posterior (a second exact reference, for the heavy tails where 4,000 joint
draws leave the sd uncertain).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from simulate import simulate_1pl, simulate_2pl  # noqa: E402

LSAT7 = Path("/work/shared/data/psych_human_r/lsat7.parquet")
OPENML = Path("/work/shared/data/openml_classifiers/responses_items_x_subjects.parquet")
NLU = Path("/work/shared/data/nlu/responses_items_x_subjects.parquet")
# issue 16: R mirt's 2PL on LSAT7 (marginal ML, Oakes standard errors), items 3 and 5
MIRT_QUOTED = {"item": [3, 5], "a": [1.70, 0.74], "a_se": [0.32, 0.15]}


def _load(name: str, seed: int = 0, model: str = "2pl", negative: float = 0.0) -> np.ndarray:
    if name == "lsat7":
        import pandas as pd

        df = pd.read_parquet(LSAT7)
        return df[[c for c in df.columns if c.startswith("Q")]].to_numpy().astype(np.int8)
    if name.startswith("openml:"):  # one data set's leaderboard: 19 classifiers x its instances
        import pandas as pd

        dataset = name.split(":", 1)[1]
        df = pd.read_parquet(OPENML)
        rows = df[df["dataset"] == dataset]
        if rows.empty:
            raise SystemExit(f"{OPENML}: no dataset {dataset!r}")
        return rows.iloc[:, 3:].to_numpy().T.astype(np.int8)
    if name.startswith(("nlu:", "nlu90:")):  # one test set's leaderboard: ``nlu:`` the 18
        import pandas as pd  # final (``_best``) checkpoints, ``nlu90:`` all 90

        dataset = name.split(":", 1)[1]
        df = pd.read_parquet(NLU)
        rows = df[df["dataset"] == dataset]
        if rows.empty:
            raise SystemExit(f"{NLU}: no dataset {dataset!r}")
        keep = [c for c in df.columns[3:] if name.startswith("nlu90:") or c.endswith("_best")]
        return rows[keep].to_numpy().T.astype(np.int8)
    with_constant = re.fullmatch(r"(\d+x\d+)c(\d+)", name)
    if with_constant:  # SxNcK: the last K of the N items constant, half all right, half all wrong
        y = _load(with_constant[1], seed, model, negative).copy()
        constant = int(with_constant[2])
        y[:, y.shape[1] - constant:] = np.arange(constant) % 2 == 0
        return y
    s, n = (int(v) for v in name.split("x"))
    if negative:  # the 2PL with a share of the discriminations flipped
        sim = simulate_2pl(s, n, seed=seed)
        rng = np.random.default_rng(seed + 1_000)
        a = sim["discrimination"] * np.where(rng.random(n) < negative, -1.0, 1.0)
        p = 1 / (1 + np.exp(-a * (sim["ability"][:, None] - sim["difficulty"])))
        return (rng.random(p.shape) < p).astype(np.int8)
    return (simulate_1pl if model == "1pl" else simulate_2pl)(s, n, seed=seed)["responses"]


def _scales(res) -> dict[str, np.ndarray]:
    """Unconstrained sds as the read-outs report them (items: within-item marginal)."""
    from engine.readout.posterior import within_owner_scales

    sds = {k: np.exp(np.asarray(v, np.float64)) for k, v in res.guide.log_scale.items()}
    if res.cross:
        sds.update(within_owner_scales(res.spec, res.guide, "item", res.cross))
    return sds


def _reference(res) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """NUTS's posterior mean and sd per block (unconstrained), as kept in ``--nuts-cache``."""
    sds = _scales(res)
    return {k: (np.asarray(v, np.float64), sds[k]) for k, v in res.guide.loc.items()}


def _nuts_reference(name: str, y: np.ndarray, cache: Path | None,
                    samples: int = 1000, prior: str = "population",
                    warmup: int = 500, chains: int = 4, model: str = "2pl",
                    options: dict | None = None, target_accept: float = 0.8) -> tuple[dict, dict]:
    """NUTS on ``y`` (default settings), or its summary from ``cache`` when an earlier run
    saved it: the sampler is the expensive part, and a changed fit is compared again for
    free."""
    import jax

    import engine.api
    from engine.infer.nuts import NutsSettings

    tag = ("" if samples == 1000 else f"-{samples}") + ("" if prior == "vague" else f"-{prior}")
    tag += ("" if warmup == 500 else f"-w{warmup}") + ("" if chains == 4 else f"-c{chains}")
    tag += "" if model == "2pl" else f"-{model}"
    tag += "".join(f"-{k}{v}" for k, v in sorted((options or {}).items()))
    tag += "" if target_accept == 0.8 else f"-ta{target_accept:g}"
    path = cache / f"nuts-{name.replace(':', '_')}{tag}.npz" if cache else None
    if path is not None and path.exists():
        z = np.load(path)
        blocks = sorted({k.split("/")[0] for k in z.files if "/" in k})
        return ({b: (z[f"{b}/mean"], z[f"{b}/sd"]) for b in blocks},
                json.loads(str(z["record"])) | {"from_cache": str(path)})
    t = time.perf_counter()
    res = engine.api.fit_nuts(y, model=model, prior=prior, model_options=options,
                              settings=NutsSettings(num_samples=samples, num_warmup=warmup,
                                                    num_chains=chains, target_accept=target_accept))
    ref = _reference(res)
    record = {"wall_s": time.perf_counter() - t,
              "rhat_max": res.extra["diagnostics"]["rhat_max"],
              "ess_bulk_min": res.extra["diagnostics"].get("ess_bulk_min"),
              "divergences": res.extra["diagnostics"].get("divergences"),
              "chains": chains, "warmup": warmup, "samples_per_chain": samples,
              "target_accept": target_accept,
              "device": str(jax.devices()[0])}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"{b}/{w}": v for b, (m, s) in ref.items() for w, v in (("mean", m), ("sd", s))}
        np.savez(path, record=json.dumps(record), **arrays)
    return ref, record


def _agreement(res, ref: dict, constant: np.ndarray | None = None) -> dict:
    """Per block, the fit against the reference; with ``constant`` (a mask over items), the
    items every subject answered alike also on their own, under ``<block>:constant``."""
    out = {}
    sds = _scales(res)
    blocks = ["ability"] + [p.name for p in res.spec.by_owner("item")]  # guessing, feasibility too
    for block in blocks:
        if block not in ref:
            continue
        ref_loc, ref_sd = ref[block]
        z = np.abs(np.asarray(res.guide.loc[block], np.float64) - ref_loc) / ref_sd
        ratio = sds[block] / ref_sd
        if block != "ability" and constant is not None and constant.any():
            out[f"{block}:constant"] = {
                "median_abs_z": float(np.median(z[constant])), "max_abs_z": float(z[constant].max()),
                "median_sd_ratio": float(np.median(ratio[constant])),
                "sd_ratio_range": [float(ratio[constant].min()), float(ratio[constant].max())],
                "of": int(constant.sum())}
        out[block] = {"median_abs_z": float(np.median(z)), "max_abs_z": float(z.max()),
                      "median_sd_ratio": float(np.median(ratio)),
                      "sd_ratio_range": [float(ratio.min()), float(ratio.max())],
                      "outside": {"z_over_0.25": int((z > 0.25).sum()),
                                  "sd_ratio_outside_0.8_1.25": int(((ratio < 0.8) | (ratio > 1.25)).sum()),
                                  "of": int(z.size)},
                      "lowest_sd_ratio_at": int(np.argmin(ratio))}
    return out


def measure(name: str, nuts: bool, cache: Path | None = None, samples: int = 1000,
            marginal: dict | None = None, prior: str = "population", nuts_only: bool = False,
            warmup: int = 500, chains: int = 4, model: str = "2pl", negative: float = 0.0,
            signed: bool = False, laplace: bool = False, target_accept: float = 0.8) -> dict:
    import engine

    y = _load(name, model=model, negative=negative)
    constant = (y == y[0]).all(axis=0)  # complete matrices: every subject answered alike
    options = {"signed_discrimination": True} if signed else None
    out = {"data": name, "model": model, "shape": list(y.shape), "prior": prior, "fits": {},
           "constant_items": int(constant.sum()),
           "negative": negative, "model_options": options}
    if nuts_only:
        out["fits"]["nuts"] = _nuts_reference(name, y, cache, samples, prior, warmup, chains,
                                              model, options, target_accept)[1]
        return out
    fits = {}
    for label, factor in (("auto", "auto"), ("gaussian", "gaussian")):
        t = time.perf_counter()
        fits[label] = engine.fit(y, model=model, prior=prior, model_options=options,
                                 settings=engine.FitSettings(ability_factor=factor))
        out["fits"][label] = {"wall_s": time.perf_counter() - t,
                              "method": fits[label].extra["ability_factor"]["method"]}
        moments = fits[label].extra.get("quadrature", {}).get("item_moments", {})
        if moments:
            out["fits"][label]["item_moments"] = {
                k: moments.get(k) for k in ("method", "because")} | {
                "sampler": {k: (moments.get("sampler") or {}).get(k)
                            for k in ("method", "pilot", "rhat_max", "ess_min", "seconds")}}
    if laplace:  # the quadrature fit with the item sampler off
        from engine.infer.marginal import MarginalSettings, fit_marginal_result
        from engine.models import get_model

        t = time.perf_counter()
        spec = get_model(model, prior=prior, **(options or {}))
        fits["laplace"] = fit_marginal_result(spec, y, engine.FitSettings(),
                                              MarginalSettings(sampler_chains=0))
        out["fits"]["laplace"] = {"wall_s": time.perf_counter() - t, "method": "quadrature"}
    if nuts:
        ref, out["fits"]["nuts"] = _nuts_reference(name, y, cache, samples, prior, warmup,
                                                   chains, model, options, target_accept)
        for label in fits:
            out["fits"][label]["vs_nuts"] = _agreement(fits[label], ref, constant)
    if marginal and name in marginal:
        items = {b: (np.asarray(v["mean"]), np.asarray(v["sd"])) for b, v in marginal[name].items()
                 if isinstance(v, dict) and "mean" in v}
        for label in ("auto", "gaussian"):
            out["fits"][label]["vs_marginal_nuts"] = _agreement(fits[label], items)
    if name == "lsat7" and model == "2pl" and not signed:
        table = {}
        for label, res in fits.items():
            sds = _scales(res)
            a = np.exp(np.asarray(res.guide.loc["discrimination"], np.float64))
            table[label] = {"a": a.round(3).tolist(),
                            "a_sd": (a * sds["discrimination"]).round(3).tolist(),
                            "b": np.asarray(res.guide.loc["difficulty"]).round(3).tolist()}
            top = (y == 1).all(axis=1)
            theta = np.asarray(res.guide.loc["ability"])[top]
            table[label]["abilities_11111"] = [float(theta.min()), float(theta.max())]
        if nuts:
            a = np.exp(ref["discrimination"][0])
            table["nuts"] = {"a": a.round(3).tolist(),
                             "a_sd": (a * ref["discrimination"][1]).round(3).tolist(),
                             "b": ref["difficulty"][0].round(3).tolist(),
                             "b_sd": ref["difficulty"][1].round(3).tolist()}
        table["mirt_quoted"] = MIRT_QUOTED
        out["lsat7"] = table
    return out


def beside_mirt(model: str, python: str, samples: int = 1000, prior: str = "population",
                warmup: int = 500, chains: int = 4, timeout: float = 600.0) -> dict:
    """LSAT7 item by item: the default fit's posterior (mean, sd, 90% interval as
    ``items.parquet`` reports them), NUTS's (its draws' own mean, sd and 5% / 95% quantiles,
    as a NUTS run's ``items.parquet`` reports them; the same model and prior) and
    mirt's marginal ML estimates with Oakes standard errors and 90% Wald intervals, on the
    natural scale (discrimination ``a``, difficulty ``b`` of ``a (theta - b)``, asymptotes as
    probabilities); the abilities: Kendall tau against mirt's EAP scores and NUTS, agreement
    with NUTS in its sds, and the spread within each group of identical answer sheets in each
    tool's abilities."""
    from scipy.stats import kendalltau

    import engine
    import engine.api
    from engine.readout.posterior import Z90, result_columns
    from bench_coverage import agreement
    from mirt_wald import run_in

    y = _load("lsat7")
    t = time.perf_counter()
    fit = engine.fit(y, model=model, prior=prior)
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    from engine.infer.nuts import NutsSettings

    nuts = engine.api.fit_nuts(y, model=model, prior=prior, settings=NutsSettings(
        num_samples=samples, num_warmup=warmup, num_chains=chains))
    nuts_s = time.perf_counter() - t
    mirt = run_in(python, y, model, timeout)
    if "failed" in mirt:
        raise RuntimeError(f"mirt on LSAT7 ({model}) failed: {mirt['failed']}")
    tables = {"fit": result_columns(fit, "item"), "nuts": result_columns(nuts, "item")}
    items = {}
    for block in [p.name for p in fit.spec.by_owner("item")]:
        row = {who: {k: tables[who][f"{block}_{k}"].round(4).tolist()
                     for k in ("mean", "sd", "q05", "q95")} for who in tables}
        if mirt.get(block) is not None:
            est = np.asarray(mirt[block], float)
            se = np.asarray([np.nan if v is None else v for v in mirt[f"{block}_se"]], float)
            row["mirt"] = {"estimate": est.round(4).tolist(), "se": se.round(4).tolist(),
                           "q05": (est - Z90 * se).round(4).tolist(),
                           "q95": (est + Z90 * se).round(4).tolist()}
        agree = agreement(tables["fit"], tables["nuts"], block)
        row["fit_vs_nuts"] = {"max_abs_z": agree["z_max"],
                              "sd_ratio_range": [agree["sd_ratio_min"], agree["sd_ratio_max"]],
                              "interval_ends_z_max": agree["interval_ends_z_max"]}
        items[block] = row
    exact = result_columns(nuts, "subject")
    theta = {"fit": np.asarray(fit.guide.loc["ability"], float),
             "nuts": np.asarray(exact["ability_mean"], float),
             "mirt": np.asarray(mirt["ability"], float)}
    nuts_sd = np.asarray(exact["ability_sd"], float)
    _, group = np.unique(y, axis=0, return_inverse=True)
    group = group.ravel()
    spread = {who: max(float(np.ptp(t[group == g])) for g in np.unique(group))
              for who, t in theta.items()}
    abilities = {
        "kendall_tau_fit_mirt": float(kendalltau(theta["fit"], theta["mirt"]).statistic),
        "kendall_tau_nuts_mirt": float(kendalltau(theta["nuts"], theta["mirt"]).statistic),
        "kendall_tau_fit_nuts": float(kendalltau(theta["fit"], theta["nuts"]).statistic),
        "max_abs_z_fit_nuts": float(np.max(np.abs(theta["fit"] - theta["nuts"]) / nuts_sd)),
        "max_abs_fit_minus_mirt_eap": float(np.max(np.abs(theta["fit"] - theta["mirt"]))),
        "answer_sheets": int(group.max() + 1),
        "largest_spread_within_identical_sheets": spread}
    return {"data": "lsat7", "model": model, "shape": list(y.shape), "items": items,
            "abilities": abilities,
            "wall_s": {"fit": fit_s, "nuts": nuts_s, "mirt_fit": mirt["wall_s"]},
            "fit": {"method": fit.extra["ability_factor"]["method"], "passes": fit.num_passes,
                    "converged": bool(fit.converged)},
            "nuts": {k: nuts.extra["diagnostics"].get(k)
                     for k in ("rhat_max", "ess_bulk_min", "ess_tail_min", "divergences")},
            "mirt": {k: mirt.get(k) for k in ("tool_version", "converged", "n_iterations")}}


def beside_mirt_markdown(run: dict) -> str:
    """One row per item and block: fit, NUTS and mirt as ``mean +- sd [5%, 95%]``."""
    lines = [f"LSAT7 {run['model']}: default fit, NUTS and mirt (Oakes SE, 90% Wald)", "",
             "| block | item | fit | NUTS | mirt |", "|---|---|---|---|---|"]
    for block, row in run["items"].items():
        for j in range(len(row["fit"]["mean"])):
            cells = [f"{row[w]['mean'][j]:.3f} +- {row[w]['sd'][j]:.3f} "
                     f"[{row[w]['q05'][j]:.3f}, {row[w]['q95'][j]:.3f}]" for w in ("fit", "nuts")]
            m = row.get("mirt")
            cells.append("-" if m is None else f"{m['estimate'][j]:.3f} +- {m['se'][j]:.3f} "
                         f"[{m['q05'][j]:.3f}, {m['q95'][j]:.3f}]")
            lines.append(f"| {block} | {j + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="lsat7,2000x12",
                    help="comma-separated: lsat7, SxN (simulated, of --model), openml:<dataset> "
                         "or nlu:<dataset> (the 18 final checkpoints)")
    ap.add_argument("--no-nuts", action="store_true")
    ap.add_argument("--nuts-cache", type=Path, default=None,
                    help="directory keeping each data set's NUTS summary (reused when present)")
    ap.add_argument("--nuts-samples", type=int, default=1000)
    ap.add_argument("--nuts-warmup", type=int, default=500)
    ap.add_argument("--nuts-chains", type=int, default=4)
    ap.add_argument("--nuts-target-accept", type=float, default=0.8,
                    help="NutsSettings.target_accept of the reference (0.95 where it diverges)")
    ap.add_argument("--model", default="2pl", choices=["1pl", "2pl", "3pl", "4pl", "feas"],
                    help="3pl, 4pl, feas: on real data (lsat7, nlu:..., openml:...); the "
                         "simulated shapes are the 1PL's or 2PL's")
    ap.add_argument("--marginal-nuts", type=Path, default=None,
                    help="nuts_marginal.py's results, compared with the items as well")
    ap.add_argument("--prior", default="population", choices=["population", "vague", "hierarchical"])
    ap.add_argument("--nuts-only", action="store_true",
                    help="only run (and cache) the NUTS references")
    ap.add_argument("--signed", action="store_true", help="the 2PL's signed discrimination")
    ap.add_argument("--negative", type=float, default=0.0,
                    help="share of simulated discriminations flipped to negative")
    ap.add_argument("--laplace", action="store_true",
                    help="also the quadrature fit with the item sampler off")
    ap.add_argument("--mirt", default=None, metavar="PYTHON",
                    help="only LSAT7 item by item beside mirt (the bench venv's python, e.g. "
                         "/work/bench-venv/bin/python) and NUTS, for --model")
    ap.add_argument("--out", default=None,
                    help="results JSON (default results/marginal.json; with --mirt "
                         "results/marginal-lsat7-mirt-MODEL.json)")
    args = ap.parse_args(argv)
    if args.mirt:
        run = beside_mirt(args.model, args.mirt, args.nuts_samples, args.prior,
                          args.nuts_warmup, args.nuts_chains)
        print(json.dumps(run, indent=1))
        print(beside_mirt_markdown(run))
        out = Path(args.out or HERE / "results" / f"marginal-lsat7-mirt-{args.model}.json")
        out.write_text(json.dumps(run, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    marginal = json.loads(args.marginal_nuts.read_text()) if args.marginal_nuts else None
    runs = []
    for name in args.data.split(","):
        runs.append(measure(name, not args.no_nuts, args.nuts_cache, args.nuts_samples, marginal,
                            args.prior, args.nuts_only, args.nuts_warmup, args.nuts_chains,
                            args.model, args.negative, args.signed, args.laplace,
                            args.nuts_target_accept))
        print(json.dumps(runs[-1], indent=1), flush=True)
    out = Path(args.out or HERE / "results" / "marginal.json")
    out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
