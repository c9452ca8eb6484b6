"""NUTS reference benchmarks: wall time and ESS per second, and NUTS against the variational fit.

Usage::

    python benchmarks/bench_nuts.py [--parts lsat7,sim,squad] [--out benchmarks/results/nuts.json]

Parts:

- ``lsat7``: the real LSAT7 (1,000 x 5, /work/shared/data/psych_human_r/lsat7.parquet), 2PL,
  NUTS with the default settings (4 chains, 500 warm-up, 1,000 draws) timed end to end, and the
  same items' posterior means / sds next to the default variational fit's.
- ``coordinates``: pooled item blocks sampled as they are against standardised
  (``NutsSettings.noncentred_below`` 0 and 50), 2PL under the population priors, on LSAT7
  and simulated 30 x 6, 100 x 12 and 2,000 x 12 (seed 1): leapfrog steps per draw, R-hat,
  bulk ESS, divergences.
- ``sim``: a simulated 2PL, 200 x 400 (benchmarks/simulate.py, seed 0), default settings;
  abilities' correlation with the simulated truth.
- ``squad``: a simulated 2PL of the SQuAD leaderboard's size, 161 x 11,873 (1.9M cells,
  23,907 parameters), with reduced settings (``--squad-chains``, ``--squad-warmup``,
  ``--squad-samples``): the time per gradient and per draw, to say what a full run costs.

- ``profile``: the 200 x 400 2PL's cost per gradient (one chain, and four under ``vmap``),
  the sampler's compile time, and the posterior's geometry at the mode (Laplace: the exact
  1,000 x 1,000 Hessian): the spread of the covariance's eigenvalues after whitening by
  the marginal sds (what a diagonal mass matrix can do), after also taking out the model's
  declared symmetry directions (shift, scale), and how closely those directions match the
  top eigenvectors.

Each NUTS time includes compilation (reported apart). ESS/s is the smallest bulk ESS over
every parameter divided by the whole wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulate import simulate_2pl  # noqa: E402

from engine.api import fit, fit_nuts  # noqa: E402
from engine.infer.nuts import NutsSettings  # noqa: E402
from engine.infer.settings import FitSettings  # noqa: E402

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _timed_nuts(y, model: str, settings: NutsSettings):
    """``fit_nuts`` with the process's CPU seconds (all threads) beside the wall time: on a
    shared machine the CPU time is what the run costs on two free cores (JAX uses both)."""
    start = resource.getrusage(resource.RUSAGE_SELF)
    res = fit_nuts(y, model, settings)
    end = resource.getrusage(resource.RUSAGE_SELF)
    res.extra["cpu_s"] = (end.ru_utime + end.ru_stime) - (start.ru_utime + start.ru_stime)
    return res


def _summary(res) -> dict:
    d = res.extra["diagnostics"]
    keep = ("rhat_max", "ess_bulk_min", "ess_tail_min", "divergences", "converged",
            "mean_steps_per_draw", "mean_acceptance", "ess_bulk_min_per_s", "num_chains",
            "num_warmup", "num_samples")
    return {"wall_s": round(res.wall_time_s, 2), "compile_s": round(res.compile_time_s, 2),
            "cpu_s": round(res.extra["cpu_s"], 2),
            **{k: d[k] for k in keep}, "blocks": d["blocks"], "load_avg": os.getloadavg()}


def _gradient_ms(y: np.ndarray, model: str = "2pl", reps: int = 20) -> float:
    """Milliseconds per value-and-gradient of the log joint (one chain), jitted."""
    import jax

    from engine.infer.nuts import _initial_positions, make_log_joint
    from engine.models.registry import get_model

    spec = get_model(model)
    z = {k: v[0] for k, v in
         _initial_positions(spec, y, NutsSettings(num_chains=1), jax.random.PRNGKey(0)).items()}
    g = jax.jit(jax.value_and_grad(make_log_joint(spec, y)))
    jax.block_until_ready(g(z))
    start = time.perf_counter()
    for _ in range(reps):
        out = g(z)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / reps * 1e3


def profile(shape=(200, 400)) -> dict:
    """Where the 200 x 400 2PL's NUTS time goes (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.flatten_util import ravel_pytree

    from engine.infer.nuts import _initial_positions, make_log_joint, make_sampler
    from engine.models.registry import get_model

    y = simulate_2pl(*shape, seed=0)["responses"]
    spec = get_model("2pl")
    settings = NutsSettings()
    positions = _initial_positions(spec, y, settings, jax.random.PRNGKey(0))
    keys = jax.random.split(jax.random.PRNGKey(1), settings.num_chains)
    start = time.perf_counter()
    make_sampler(spec, *shape, settings).lower(jnp.asarray(y), keys, positions).compile()
    compile_s = time.perf_counter() - start
    log_joint = make_log_joint(spec, y)
    g4 = jax.jit(jax.vmap(jax.value_and_grad(log_joint)))
    jax.block_until_ready(g4(positions))
    start = time.perf_counter()
    for _ in range(50):
        out = g4(positions)
    jax.block_until_ready(out)
    grad4_ms = (time.perf_counter() - start) / 50 * 1e3
    flat, unravel = ravel_pytree({k: v[0] * 0 for k, v in positions.items()})
    neg = jax.jit(lambda x: -log_joint(unravel(x)))
    opt, vg = optax.lbfgs(), optax.value_and_grad_from_state(neg)

    @jax.jit
    def step(x, st):
        v, g = vg(x, state=st)
        u, st = opt.update(g, st, x, value=v, grad=g, value_fn=neg)
        return optax.apply_updates(x, u), st

    x, st = flat, opt.init(flat)
    for _ in range(300):
        x, st = step(x, st)
    cov = np.linalg.inv(np.asarray(jax.jit(jax.hessian(neg))(x), np.float64))
    sd = np.sqrt(np.diag(cov))
    white = cov / sd[:, None] / sd[None, :]
    val, vec = np.linalg.eigh(white)
    mode = unravel(x)
    names = sorted(mode)
    tangent = lambda d: np.asarray(ravel_pytree({k: jnp.asarray(d[k], jnp.float32) for k in names})[0])
    directions = {"shift": tangent({"ability": np.ones(shape[0]), "difficulty": np.ones(shape[1]),
                                    "discrimination": np.zeros(shape[1])}),
                  "scale": tangent({"ability": mode["ability"], "difficulty": mode["difficulty"],
                                    "discrimination": -np.ones(shape[1])})}
    overlap = {}
    for name, v in directions.items():
        u = v / sd
        u /= np.linalg.norm(u)
        overlap[name] = {"top1": float(abs(vec[:, -1] @ u)), "top2": float(abs(vec[:, -2] @ u)),
                         "whitened_variance": float(u @ white @ u)}
    rest = val[:-2]
    return {"shape": list(shape), "compile_s": round(compile_s, 2),
            "gradient_ms_1_chain": round(_gradient_ms(y), 3), "gradient_ms_4_chains_vmap":
            round(grad4_ms, 3), "whitened_eigenvalues_top": val[-4:].tolist(),
            "whitened_eigenvalues_bottom": val[:3].tolist(),
            "sd_ratio_diagonal": float(np.sqrt(val[-1] / val[0])),
            "sd_ratio_without_top2": float(np.sqrt(rest[-1] / rest[0])),
            "symmetry_overlap": overlap}


def lsat7(settings: NutsSettings) -> dict:
    wide = pd.read_parquet(DATA / "psych_human_r" / "lsat7.parquet")
    y = wide.drop(columns=["subject_id"]).to_numpy().astype(np.int8)
    res = _timed_nuts(y, "2pl", settings)
    start = time.perf_counter()
    vi = fit(y, "2pl", FitSettings(seed=0))
    vi_s = time.perf_counter() - start
    d = res.draws
    disc, diff = d["discrimination"].reshape(-1, 5), d["difficulty"].reshape(-1, 5)
    # the variational fit's item read-outs as save_run writes them (delta-method sds)
    from engine.readout.posterior import summarize
    vi_items = summarize(vi.spec, vi.guide, "item", cross=vi.cross)
    table = []
    for j, name in enumerate(wide.columns[1:]):
        table.append({"item": name,
                      "nuts_a_mean": float(disc[:, j].mean()), "nuts_a_sd": float(disc[:, j].std()),
                      "vi_a_mean": float(vi_items["discrimination_mean"][j]),
                      "vi_a_sd": float(vi_items["discrimination_sd"][j]),
                      "nuts_b_mean": float(diff[:, j].mean()), "nuts_b_sd": float(diff[:, j].std()),
                      "vi_b_mean": float(vi_items["difficulty_mean"][j]),
                      "vi_b_sd": float(vi_items["difficulty_sd"][j])})
    theta = d["ability"].reshape(-1, y.shape[0])
    vi_theta = vi.means()["ability"]
    return {"shape": list(y.shape), "nuts": _summary(res), "vi_wall_s": round(vi_s, 2),
            "vi_passes": vi.num_passes, "items": table,
            "ability_corr_nuts_vi": float(np.corrcoef(theta.mean(axis=0), vi_theta)[0, 1]),
            "ability_sd_ratio_vi_over_nuts": float(np.median(
                np.exp(vi.guide.log_scale["ability"]) / theta.std(axis=0))),
            "gradient_ms": round(_gradient_ms(y), 3)}


def sim(settings: NutsSettings, shape=(200, 400)) -> dict:
    s = simulate_2pl(*shape, seed=0)
    res = _timed_nuts(s["responses"], "2pl", settings)
    theta = res.draws["ability"].reshape(-1, shape[0]).mean(axis=0)
    disc = res.draws["discrimination"].reshape(-1, shape[1]).mean(axis=0)
    return {"shape": list(shape), "nuts": _summary(res),
            "ability_corr_truth": float(np.corrcoef(theta, s["ability"])[0, 1]),
            "discrimination_corr_truth": float(np.corrcoef(disc, s["discrimination"])[0, 1]),
            "gradient_ms": round(_gradient_ms(s["responses"]), 3)}


def squad(settings: NutsSettings) -> dict:
    s = simulate_2pl(161, 11873, seed=0)
    grad_ms = _gradient_ms(s["responses"], reps=5)
    res = _timed_nuts(s["responses"], "2pl", settings)
    out = _summary(res)
    draws = settings.num_chains * (settings.num_warmup + settings.num_samples)
    sampling_s = res.wall_time_s - res.compile_time_s
    out.pop("blocks")
    return {"shape": [161, 11873], "nuts": out, "gradient_ms": round(grad_ms, 2),
            "s_per_draw_per_chain": round(sampling_s / draws, 3),
            "ability_corr_truth": float(np.corrcoef(
                res.draws["ability"].reshape(-1, 161).mean(axis=0), s["ability"])[0, 1])}


def coordinates(settings: NutsSettings) -> list[dict]:
    """Pooled blocks sampled as they are (``noncentred_below=0``) against standardised
    (``noncentred_below=50``), 2PL under the population priors: LSAT7 and simulated shapes
    (seed 1)."""
    wide = pd.read_parquet(DATA / "psych_human_r" / "lsat7.parquet")
    data = {"lsat7": wide.drop(columns=["subject_id"]).to_numpy().astype(np.int8)}
    for shape in ((30, 6), (100, 12), (2000, 12)):
        data["x".join(map(str, shape))] = simulate_2pl(*shape, seed=1)["responses"]
    rows = []
    for name, y in data.items():
        for below in (0, 50):
            res = _timed_nuts(y, "2pl", settings.replace(noncentred_below=below))
            d = res.extra["diagnostics"]
            rows.append({"data": name, "noncentred_below": below, "wall_s": round(res.wall_time_s, 1),
                         "cpu_s": round(res.extra["cpu_s"], 1), **{k: d[k] for k in (
                             "mean_steps_per_draw", "rhat_max", "ess_bulk_min", "divergences")}})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="lsat7,sim,squad")
    p.add_argument("--out", default="benchmarks/results/nuts.json")
    p.add_argument("--squad-chains", type=int, default=1)
    p.add_argument("--squad-warmup", type=int, default=50)
    p.add_argument("--squad-samples", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "processor": platform.processor()},
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    default = NutsSettings(seed=args.seed)
    for part in args.parts.split(","):
        print(f"== {part}", flush=True)
        if part == "profile":
            results[part] = profile()
        elif part == "lsat7":
            results[part] = lsat7(default)
        elif part == "coordinates":
            results[part] = coordinates(default)
        elif part == "sim":
            results[part] = sim(default)
        elif part == "squad":
            results[part] = squad(NutsSettings(num_chains=args.squad_chains,
                                               num_warmup=args.squad_warmup,
                                               num_samples=args.squad_samples, seed=args.seed))
        else:
            raise SystemExit(f"unknown part {part!r}; use profile, lsat7, coordinates, sim or squad")
        print(json.dumps(results[part], indent=1, default=float)[:3000], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    Path(args.out).write_text(json.dumps(previous | results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
