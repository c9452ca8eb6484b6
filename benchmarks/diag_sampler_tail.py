"""Are the item sampler's far draws in the posterior's typical set? (issue 16, part 2)

The 4PL at 2,000 x 12 (seed 0) reported discrimination sds up to 2.9 times NUTS's where the
90% intervals agree. This fits the simulated data set at default settings, keeps the item
sampler's kept draws (``engine.infer.sampler.sample_items`` wrapped: the fit keeps only
their moments), and reads for each discrimination the sd per chain and the share of draws
with a > 3; then the log joint density of the draws that reach furthest (the marginal
likelihood on 81 Gauss-Hermite nodes of the N(0, 1) ability population, each pooled item
block's prior with its hyper-parameters integrated out on a grid, the asymptotes' Beta
priors) beside the log joint of 300 draws at random. Far draws whose log joint sits inside
the random draws' range are the posterior's own tail, not a sampler fault.

    python benchmarks/diag_sampler_tail.py [--model 4pl] [--shape 2000x12] [--seed 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import special, stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def kept_draws(model: str, shape: tuple[int, int], seed: int):
    """The data set and the item sampler's kept draws ``(chains, draws, items, k)``."""
    import engine
    import engine.infer.sampler as sampler
    from bench_coverage import simulate

    saved, original = {}, sampler.sample_items

    def keep(*args, **kwargs):
        out = original(*args, **kwargs)
        if out[0] is not None:
            settings = kwargs.get("settings", args[10] if len(args) > 10 else None)
            saved["xs"], saved["chains"] = np.asarray(out[0][-1].xs), settings.sampler_chains
        return out

    sampler.sample_items = keep  # the fit imports it at its call
    try:
        sim = simulate(model, shape, seed)
        res = engine.fit(sim["responses"], model=model)
    finally:
        sampler.sample_items = original
    if "xs" not in saved:
        raise SystemExit("the fit did not sample its items (its pilot agreed with the Laplace "
                         "approximation, or it took another route); nothing to read")
    xs = saved["xs"]
    chains = saved["chains"]
    return sim, res, xs.reshape((chains, -1) + xs.shape[1:])


def log_joint_fn(y: np.ndarray, spec):
    """The 4PL / 3PL / 2PL log joint density of one draw of every item's unconstrained
    values ``(n, k)`` (the sampler's layout: difficulty, log discrimination, logit guessing,
    logit feasibility, as the model has them), the abilities integrated out."""
    names = [p.name for p in spec.by_owner("item") if p.name in
             ("difficulty", "discrimination", "guessing", "feasibility")]
    pats, counts = np.unique(np.asarray(y, float), axis=0, return_counts=True)
    nodes, weights = np.polynomial.hermite_e.hermegauss(81)
    log_w = np.log(weights / weights.sum())
    mu, lu = np.linspace(-6, 6, 241), np.linspace(-6, 5, 221)
    M, LU = np.meshgrid(mu, lu, indexing="ij")
    cell = np.log(mu[1] - mu[0]) + np.log(lu[1] - lu[0])

    def block(xs, mu_sd, shape, rate):  # N(x; m, 1/u), m ~ N(0, mu_sd^2), u ~ Gamma(shape, rate)
        lp = stats.norm.logpdf(M, 0, mu_sd) + stats.gamma.logpdf(np.exp(LU), shape, scale=1 / rate) + LU
        lp = lp + sum(stats.norm.logpdf(x, M, np.exp(-LU / 2)) for x in xs)
        return float(special.logsumexp(lp) + cell)

    def logit_beta(z, a, b):
        return stats.beta.logpdf(special.expit(z), a, b) + special.log_expit(z) + special.log_expit(-z)

    def log_joint(v):
        at = dict(zip(names, v.T))
        b = at["difficulty"]
        a = np.exp(at.get("discrimination", np.zeros_like(b)))
        g = special.expit(at["guessing"]) if "guessing" in at else 0.0
        d = special.expit(at["feasibility"]) if "feasibility" in at else 1.0
        p = g + (d - g) * special.expit(a * (nodes[:, None] - b))
        lp = pats @ np.log(p).T + (1 - pats) @ np.log1p(-p).T
        out = float(counts @ special.logsumexp(lp + log_w, axis=1)) + block(b, 3.0, 1.0, 1.0)
        if "discrimination" in at:
            out += block(at["discrimination"], 1.0, 2.0, 0.5)
        if "guessing" in at:
            out += logit_beta(at["guessing"], 2, 8).sum()
        if "feasibility" in at:
            out += logit_beta(at["feasibility"], 8, 2).sum()
        return out

    return names, log_joint


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="4pl")
    ap.add_argument("--shape", default="2000x12")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    sim, res, x = kept_draws(args.model, shape, args.seed)
    names, log_joint = log_joint_fn(sim["responses"], res.spec)
    j = names.index("discrimination")
    a = np.exp(x[..., j].astype(np.float64))  # (chains, draws, items)
    rng = np.random.default_rng(0)
    chains, draws = x.shape[:2]
    typical = [log_joint(x[c, t].astype(np.float64)) for c, t in
               zip(rng.integers(0, chains, 300), rng.integers(0, draws, 300))]
    far = np.argsort(-x[..., j].max(axis=2), axis=None)[:10]
    out = {"model": args.model, "shape": list(shape), "seed": args.seed,
           "draws": [int(chains), int(draws)],
           "discrimination": {"sd": a.reshape(-1, a.shape[2]).std(axis=0).round(3).tolist(),
                              "sd_per_chain": a.std(axis=1).round(3).tolist(),
                              "max_per_chain": a.max(axis=1).round(2).tolist(),
                              "share_over_3": (a > 3).mean(axis=(0, 1)).round(4).tolist()},
           "log_joint_random_draws": {f"q{int(q * 100):02d}": round(float(v), 1) for q, v in
                                      zip((0.01, 0.05, 0.5, 0.95), np.quantile(typical, [0.01, 0.05, 0.5, 0.95]))},
           "farthest": [{"chain": int(c), "draw": int(t),
                         "largest_a": round(float(np.exp(x[c, t, :, j].max())), 2),
                         "log_joint": round(log_joint(x[c, t].astype(np.float64)), 1)}
                        for c, t in zip(*np.unravel_index(far, (chains, draws)))]}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
