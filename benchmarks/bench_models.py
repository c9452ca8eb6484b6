"""Continuous and multidimensional models against the 2PL pass, and against the incumbents.

Measures, in one run (every fit in its own child process, peak RSS per process):

1. ``beta`` (Beta-IRT) on a 161 x 11,873 unit-score matrix simulated from the Beta-IRT model
   itself (seeded truth, every score strictly inside (0, 1), so no inflation), against the 2PL
   on a simulated binary matrix of the same shape; runs interleaved 2PL, beta, 2PL, beta.
2. ``mirt-comp`` with D = 3 (exploratory, pinned loadings) on the real 90 x 82,756 NLU matrix
   against the 2PL on the same matrix; interleaved 2PL, mirt-comp D=3, 2PL, mirt-comp D=2
   (the D=2 fit is the like-for-like partner of ``mirt(data, 2)``).
3. Incumbents: mirt for Python's exploratory 2-factor 2PL (the port of R's ``mirt(data, 2)``)
   on NLU and on the SQuAD-sized simulated binary matrix, each with a time limit, and py-irt
   0.7.1's ``multidim_2pl`` on the SQuAD-sized matrix; irt-engine's ``mirt-comp`` D=2 there.

``--parts profile`` times one tile's block terms (with and without the Hessian, and the
log-likelihood alone) for beta, mirt-comp and the 2PL, and the special functions of a beta cell.

Targets (issue 6): cells/s per pass of ``beta`` and of ``mirt-comp`` D=3 at least 50% of the
2PL's on the same shape. Cells/s per pass = observed cells x passes / fit wall time (JAX
compilation included); also reported from the median per-pass time of the trace (first pass,
which compiles, left out).

Abilities of D-skill fits are compared through the reference composite ``theta_s . mean_n
(a_n)`` (Reckase's direction of the mean loading vector). It is what the compensatory logit
``a_n . theta_s`` sees on average, and it does not depend on the rotation, so fits with
different identification constraints (pinned loadings, mirt's unrotated EM solution, py-irt's
per-dimension priors) can be compared directly. The first varimax-rotated dimension is
reported too, as a reading that depends on the rotation.

    IRT_ENGINE_PYTHON=/path/to/.venv/bin/python python benchmarks/bench_models.py
    python benchmarks/bench_models.py --parts beta --quick      # smoke test on small shapes
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
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import engine_side  # noqa: E402
import incumbents  # noqa: E402
import report  # noqa: E402
from bench_core import load_nlu  # noqa: E402
from simulate import simulate_2pl  # noqa: E402

NLU_PARQUET = Path("/work/shared/data/nlu/responses_items_x_subjects.parquet")
SQUAD_SHAPE = (161, 11_873)
PARTS = ("beta", "mirt", "incumbents", "mirt-nlu", "profile")
# Cells are redrawn (truncated Beta) until they lie in [_LO, 1 - _LO]: float32 then keeps every
# score strictly inside (0, 1), so the model needs no zero/one inflation.
_LO = 1e-4
_ROTATION_STEPS = 100


# ---------------------------------------------------------------- data


def simulate_beta(num_subjects: int, num_items: int, *, seed: int, log_disc_sd: float = 0.3,
                  precision_mean: float = 1.5, precision_sd: float = 0.5) -> dict:
    """Simulate Beta-IRT (Molenaar) unit scores from seeded truth.

    ``theta ~ N(0, 1)``, ``beta ~ N(0, 1)``, ``log alpha ~ N(0, log_disc_sd^2)``, per-item
    log-precision ``o ~ N(precision_mean, precision_sd^2)``; ``eta = alpha theta - beta``,
    ``y ~ Beta(exp((eta + o)/2), exp((o - eta)/2))``. Draws outside ``[1e-4, 1 - 1e-4]`` are
    redrawn (their count is returned), and the matrix is float32.
    """
    rng = np.random.default_rng(seed)
    ability = rng.standard_normal(num_subjects)
    difficulty = rng.standard_normal(num_items)
    discrimination = np.exp(log_disc_sd * rng.standard_normal(num_items))
    log_precision = precision_mean + precision_sd * rng.standard_normal(num_items)
    eta = discrimination[None, :] * ability[:, None] - difficulty[None, :]
    a = np.exp(0.5 * (eta + log_precision[None, :]))
    b = np.exp(0.5 * (log_precision[None, :] - eta))
    y = rng.beta(a, b)
    redrawn = 0
    for _ in range(100):
        bad = (y < _LO) | (y > 1.0 - _LO)
        if not bad.any():
            break
        redrawn += int(bad.sum())
        y[bad] = rng.beta(a[bad], b[bad])
    y = y.astype(np.float32)
    if not ((y > 0) & (y < 1)).all():
        raise RuntimeError("simulated Beta scores left (0, 1) after redrawing")
    return dict(responses=y, ability=ability, difficulty=difficulty,
                discrimination=discrimination, log_precision=log_precision,
                redrawn_cells=redrawn)


# ---------------------------------------------------------------- reading fits


def loadings(fit: dict) -> np.ndarray | None:
    """Items x D loadings of a D-skill fit as the tool's logit uses them (None for 1-D)."""
    est = fit.get("estimates", {})
    disc = est.get("discrimination")
    if disc is None or np.ndim(disc) != 2:
        return None
    if fit.get("tool") == "irt-engine":  # alpha = discrimination * skill_mask (pinned rows)
        from engine.models.multidim import pinned_mask

        disc = disc * pinned_mask(*disc.shape)
    return np.asarray(disc, float)


def summaries(fit: dict) -> dict[str, np.ndarray]:
    """Scalar ability summaries of one fit: ``ability`` (1-D fits), or ``composite`` and
    ``rotated1`` (D-skill fits; see the module docstring). Computed once per fit."""
    if "_summaries" not in fit:
        fit["_summaries"] = _summaries(fit)
    return fit["_summaries"]


def _summaries(fit: dict) -> dict[str, np.ndarray]:
    est = fit.get("estimates", {})
    theta = est.get("ability")
    if theta is None:
        return {}
    if np.ndim(theta) == 1:
        return {"ability": np.asarray(theta, float)}
    A = loadings(fit)
    out = {"composite": theta @ A.mean(axis=0)}
    from engine.models.multidim import rotate

    # Capped: on 82,756 items the default 1,000 gradient-projection steps take minutes.
    rotated, T = rotate(A, "varimax", max_iter=_ROTATION_STEPS)
    scores = theta @ T
    sign = np.sign(rotated.sum(axis=0))
    sign[sign == 0] = 1.0
    rotated, scores = rotated * sign, scores * sign
    first = int(np.argmax((rotated ** 2).sum(axis=0)))
    out["rotated1"] = scores[:, first]
    out["rotated1_share"] = float((rotated[:, first] ** 2).sum() / (rotated ** 2).sum())
    return out


def ability_table(fits: list[dict], accuracy: np.ndarray, truth: np.ndarray | None) -> dict:
    """Kendall tau of every ok fit's ability summaries against accuracy, truth and each other."""
    named = {}
    for f in fits:
        if f.get("status") != "ok":
            continue
        for key, value in summaries(f).items():
            if isinstance(value, np.ndarray):
                named[f"{f['label']}:{key}"] = value
    refs = {"accuracy": accuracy, **({"truth": truth} if truth is not None else {})}
    out = {"vs_reference": {n: {r: report.correlations(v, ref)["kendall"]
                                for r, ref in refs.items()} for n, v in named.items()},
           "pairwise_kendall": {}}
    names = sorted(named)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a.split(":")[0] != b.split(":")[0]:
                out["pairwise_kendall"][f"{a} ~ {b}"] = report.correlations(named[a],
                                                                           named[b])["kendall"]
    return out


def recovery(fit: dict, truth: dict) -> dict:
    """Pearson r (and Kendall tau) with the truth for each parameter block the fit has."""
    est = fit.get("estimates", {})
    return {k: report.correlations(est[k], v) for k, v in truth.items()
            if k in est and np.ndim(est[k]) == 1 and np.shape(est[k]) == np.shape(v)}


# ---------------------------------------------------------------- running


def _engine(label: str, model: str, y: np.ndarray, options: dict | None, timeout: float) -> dict:
    load = os.getloadavg()
    print(f"  {label}: irt-engine {model} {options or ''} (load {load[0]:.1f}) ...", flush=True)
    res = engine_side.run_engine_model(model, y, model_options=options, timeout=timeout)
    res.update(label=label, tool="irt-engine", model=model, load_before=load)
    _print(res)
    return res


def _incumbent(label: str, job: str, y: np.ndarray, options: dict, timeout: float) -> dict:
    load = os.getloadavg()
    print(f"  {label}: {job} {options} (limit {timeout:.0f} s, load {load[0]:.1f}) ...",
          flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = incumbents.run_incumbent(job, y, timeout=timeout, options=options, env=env)
    res.update(label=label, job=job, options=options, load_before=load,
               tool=res.get("tool", "mirt" if job.startswith("mirt") else "py-irt"))
    if res.get("status") == "timeout":
        tail = res.get("log_tail", "")
        its = [ln for ln in tail.splitlines() if ln.startswith("Iteration")]
        res["last_progress_line"] = its[-1].strip() if its else None
    _print(res)
    return res


def _print(res: dict) -> None:
    if res.get("status") != "ok":
        print(f"    {res.get('status')}: {str(res.get('reason'))[-300:]}  "
              f"{res.get('last_progress_line') or ''}", flush=True)
        return
    print(f"    {res['wall_s']:.1f} s, passes {res.get('passes', res.get('iterations'))}, "
          f"converged {res.get('converged')}, cells/s/pass "
          f"{res.get('cells_per_s_per_pass', float('nan')):.3g}, median pass "
          f"{res.get('median_pass_s') or float('nan'):.3g} s, RSS {res.get('peak_rss_gb'):.2f} GB",
          flush=True)


def ratio(fits: list[dict], model: str, base: str = "2pl") -> dict:
    """Model's cells/s per pass over the 2PL's (mean of the interleaved runs), both readings."""
    def mean(m, key):
        vals = [f[key] for f in fits if f.get("status") == "ok" and f["label"] == m
                and f.get(key)]
        return float(np.mean(vals)) if vals else None

    out = {}
    for key in ("cells_per_s_per_pass", "cells_per_s_median_pass"):
        num, den = mean(model, key), mean(base, key)
        out[key] = dict(model=num, base=den, ratio=(num / den) if num and den else None)
    out["target_met"] = bool(out["cells_per_s_per_pass"]["ratio"]
                             and out["cells_per_s_per_pass"]["ratio"] >= 0.5)
    return out


def part_beta(args) -> dict:
    """Beta-IRT vs 2PL, same shape, interleaved."""
    shape = (161, 1_000) if args.quick else SQUAD_SHAPE
    sim_b = simulate_beta(*shape, seed=0)
    sim_2 = simulate_2pl(*shape, seed=0)
    truth_b = {k: sim_b[k] for k in ("ability", "difficulty", "discrimination", "log_precision")}
    truth_2 = {k: sim_2[k] for k in ("ability", "difficulty", "discrimination")}
    fits = []
    for rep in range(args.reps):
        for label, y, truth in (("2pl", sim_2["responses"], truth_2),
                                ("beta", sim_b["responses"], truth_b)):
            res = _engine(label, label, y, None, args.timeout)
            res["rep"] = rep
            res["recovery"] = recovery(res, truth)
            print(f"    recovery r: { {k: v['pearson'] for k, v in res['recovery'].items()} }",
                  flush=True)
            fits.append(res)
    y = sim_b["responses"]
    return dict(shape=list(shape), observed_cells=int(y.size),
                beta_data=dict(description="simulated Beta-IRT, seed 0: theta ~ N(0,1), "
                               "beta ~ N(0,1), log alpha ~ N(0, 0.3^2), o ~ N(1.5, 0.5^2)",
                               mean=float(y.mean()), min=float(y.min()), max=float(y.max()),
                               redrawn_cells=sim_b["redrawn_cells"],
                               redrawn_share=sim_b["redrawn_cells"] / y.size),
                binary_data="simulated 2PL, seed 0 (bench_core's squad matrix)",
                fits=fits, ratio=ratio(fits, "beta"))


def part_mirt(args, nlu: np.ndarray) -> dict:
    """mirt-comp D=3 (and D=2) vs 2PL on the NLU matrix, interleaved."""
    fits = []
    plan = [("2pl", "2pl", None), ("mirt-comp-3", "mirt-comp", {"dims": 3}),
            ("2pl", "2pl", None), ("mirt-comp-2", "mirt-comp", {"dims": 2})]
    for label, model, options in plan:
        fits.append(_engine(label, model, nlu, options, args.timeout))
    acc = nlu.mean(axis=1)
    return dict(shape=list(nlu.shape), observed_cells=int(nlu.size), fits=fits,
                ratio=ratio(fits, "mirt-comp-3"), ratio_d2=ratio(fits, "mirt-comp-2"),
                abilities=ability_table(fits, acc, None))


def part_incumbents(args, nlu: np.ndarray, nlu_fits: list[dict] | None,
                     squad: bool = True) -> dict:
    """mirt 2-factor and py-irt multidim_2pl, with irt-engine mirt-comp D=2 on the same data;
    ``squad=False``: only mirt's 2-factor attempt on NLU (part ``mirt-nlu``)."""
    if not squad:
        return dict(nlu=_nlu_incumbents(args, nlu, nlu_fits), mirt_limit_s=args.mirt_limit)
    shape = (161, 1_000) if args.quick else SQUAD_SHAPE
    sim = simulate_2pl(*shape, seed=0)
    y = sim["responses"]
    fits = [_engine("mirt-comp-2", "mirt-comp", y, {"dims": 2}, args.timeout),
            _engine("2pl", "2pl", y, None, args.timeout),
            _incumbent("mirt-2f", "mirt_2pl_factors", y, {"factors": 2}, args.mirt_limit)]
    if not args.skip_pyirt:
        fits.append(_incumbent("pyirt-multidim-2", "pyirt_multidim", y,
                                {"dims": 2, "epochs": args.pyirt_epochs}, args.pyirt_limit))
    return dict(
        squad=dict(shape=list(shape), description="simulated 2PL, seed 0 (one true skill)",
                   fits=fits,
                   abilities=ability_table(fits, y.mean(axis=1), sim["ability"])),
        nlu=_nlu_incumbents(args, nlu, nlu_fits))


def _nlu_incumbents(args, nlu: np.ndarray, nlu_fits: list[dict] | None) -> dict:
    """mirt's 2-factor fit of NLU within the limit, and its agreement with irt-engine's."""
    nlu_runs = [_incumbent("mirt-2f", "mirt_2pl_factors", nlu, {"factors": 2}, args.mirt_limit)]
    if nlu_fits is None:  # this run has no NLU engine fits: make them when there is a partner
        ok = nlu_runs[0].get("status") == "ok"
        nlu_fits = [_engine("mirt-comp-2", "mirt-comp", nlu, {"dims": 2}, args.timeout),
                    _engine("2pl", "2pl", nlu, None, args.timeout)] if ok else []
    engine_nlu = [f for f in nlu_fits if f["label"] in ("mirt-comp-2", "mirt-comp-3")]
    engine_nlu += [f for f in nlu_fits if f["label"] == "2pl"][:1]
    return dict(shape=list(nlu.shape), fits=nlu_runs,
                abilities=ability_table(engine_nlu + nlu_runs, nlu.mean(axis=1), None))


def _median_time(fn, *args, calls: int = 5) -> float:
    """Median seconds of ``calls`` calls of a jitted ``fn`` after one warm-up call."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _tile_times(model: str, options: dict, y: np.ndarray) -> dict:
    """One tile's block terms as the Newton pass computes them (with Hessian), value and
    gradient only, and the summed log-likelihood alone; jitted, median of 5 calls."""
    import jax
    import jax.numpy as jnp

    from engine.infer.elbo import make_block_terms
    from engine.models.registry import get_model

    S, N = y.shape
    spec = get_model(model, **options)
    rng = np.random.default_rng(0)
    z = {p.name: jnp.asarray(0.3 * rng.standard_normal(p.full_shape(S, N)), jnp.float32)
         for p in spec.likelihood_params}
    rows, cols, yj = jnp.arange(S), jnp.arange(N), jnp.asarray(y)
    out = {"cells": int(S * N)}
    for hess, key in ((True, "terms_hessian_s"), (False, "terms_gradient_s")):
        terms = jax.jit(make_block_terms(spec, S, N, with_hessian=hess))
        out[key] = _median_time(terms, z, rows, cols, yj)
    consts = {k: jnp.asarray(v, jnp.float32)[None] for k, v in spec.constant_values(S, N).items()}

    def loglik(z, y):
        params = {p.name: p.constrain(z[p.name]) for p in spec.likelihood_params}
        cells = {p.name: params[p.name][:, None] if p.owner == "subject" else params[p.name][None]
                 for p in spec.likelihood_params}
        mask = (y >= 0).astype(jnp.float32)
        return jnp.sum(spec.loglik({**cells, **consts}, jnp.where(y >= 0, y, 0).astype(jnp.float32),
                                   mask))

    out["loglik_only_s"] = _median_time(jax.jit(loglik), z, yj)
    return out


def part_profile(args, nlu: np.ndarray) -> dict:
    """Where a beta or mirt-comp pass spends its time against the 2PL pass, one tile each,
    plus the special functions a beta cell evaluates (one process, in this one)."""
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import digamma, gammaln, polygamma

    shape = (161, 1_000) if args.quick else SQUAD_SHAPE
    beta_y = simulate_beta(*shape, seed=0)["responses"]
    binary_y = simulate_2pl(*shape, seed=0)["responses"]
    tile = nlu[:, :46_000]  # one default tile (max_block_cells 4,194,304) of the NLU matrix
    out = {"squad": {"2pl": _tile_times("2pl", {}, binary_y),
                     "beta": _tile_times("beta", {"inflation": "none"}, beta_y)},
           "nlu_tile": {"2pl": _tile_times("2pl", {}, tile),
                        "mirt-comp-1": _tile_times("mirt-comp", {"dims": 1}, tile),
                        "mirt-comp-3": _tile_times("mirt-comp", {"dims": 3}, tile)}}
    x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 5.0, binary_y.size), jnp.float32)
    funcs = {"log": jnp.log, "softplus": jax.nn.softplus, "gammaln": gammaln,
             "digamma": digamma, "polygamma1": lambda v: polygamma(1, v)}
    out["special_functions_s"] = {k: _median_time(jax.jit(f), x) for k, f in funcs.items()}
    out["special_functions_values"] = int(x.size)
    out["load_avg"] = os.getloadavg()
    return out


def _strip(obj):
    """Drop estimate arrays (and long log tails) before writing JSON."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ("estimates", "_summaries")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help="subset of beta,mirt,incumbents")
    p.add_argument("--reps", type=int, default=2, help="interleaved 2PL/beta pairs (default 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per irt-engine fit")
    p.add_argument("--mirt-limit", type=float, default=600.0,
                   help="seconds before mirt's 2-factor fit counts as did-not-finish")
    p.add_argument("--pyirt-limit", type=float, default=600.0)
    p.add_argument("--pyirt-epochs", type=int, default=500)
    p.add_argument("--skip-pyirt", action="store_true")
    p.add_argument("--quick", action="store_true", help="small shapes and short limits")
    p.add_argument("--nlu-path", type=Path, default=NLU_PARQUET)
    p.add_argument("--out", type=Path, default=HERE / "results" / "models.json")
    args = p.parse_args(argv)
    if set(args.parts.split(",")) - set(PARTS):
        p.error(f"--parts takes a subset of {','.join(PARTS)}")
    if args.quick:
        args.mirt_limit, args.pyirt_limit, args.pyirt_epochs = 60.0, 60.0, 20
    return args


def main(argv=None) -> None:
    """Run the selected parts and write models.json (merging parts from earlier runs)."""
    args = parse_args(argv)
    parts = args.parts.split(",")
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out.update(machine=report.machine_info(incumbents.BENCH_PYTHON, engine_side.ENGINE_PYTHON),
               quick=args.quick)
    run = dict(parts=parts, started=time.strftime("%Y-%m-%d %H:%M:%S"),
               load_avg_start=os.getloadavg())
    out["runs"] = out.get("runs", []) + [run]
    nlu = load_nlu(args.nlu_path)
    if args.quick:
        nlu = nlu[:, :5_000]
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        run["load_avg_end"] = os.getloadavg()
        tmp = args.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_strip(out), indent=1, default=report.json_default))
        os.replace(tmp, args.out)

    if "beta" in parts:
        print("[beta] Beta-IRT vs 2PL, simulated", flush=True)
        out["beta"] = part_beta(args)
        print(f"[beta] ratio {out['beta']['ratio']}", flush=True)
        save()
    nlu_fits = None
    if "mirt" in parts:
        print("[mirt] mirt-comp vs 2PL, NLU", flush=True)
        mirt_part = part_mirt(args, nlu)
        nlu_fits = mirt_part["fits"]
        out["mirt"] = mirt_part
        print(f"[mirt] ratio D=3 {mirt_part['ratio']}", flush=True)
        save()
    if "incumbents" in parts:
        print("[incumbents]", flush=True)
        out["incumbents"] = part_incumbents(args, nlu, nlu_fits)
        print(json.dumps(out["incumbents"]["squad"]["abilities"], indent=1), flush=True)
        print(json.dumps(out["incumbents"]["nlu"]["abilities"], indent=1), flush=True)
        save()
    if "mirt-nlu" in parts:  # a longer attempt at mirt's 2-factor NLU fit alone
        print("[mirt-nlu]", flush=True)
        out["mirt_nlu_attempt"] = part_incumbents(args, nlu, nlu_fits, squad=False)
        save()
    if "profile" in parts:
        print("[profile]", flush=True)
        out["profile"] = part_profile(args, nlu)
        print(json.dumps(out["profile"], indent=1), flush=True)
        save()
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
