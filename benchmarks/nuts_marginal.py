"""A second exact reference for short tests: NUTS on the items' marginal posterior.

The abilities are integrated out on a fixed Gauss-Hermite grid against their N(0, 1) prior
(81 nodes), so the sampler sees only the ``n k`` item values: the posterior the default
(quadrature) fit approximates, with none of the joint sampler's coupling between abilities
and items. Built from the same ModelSpec log density (``engine.infer.marginal``'s per-cell
log-likelihood and item priors) and blackjax's NUTS with window adaptation. Worth it while
patterns x nodes x items stays small (LSAT7: 32 x 81 x 5 cells a gradient).

    python benchmarks/nuts_marginal.py [--data lsat7] [--chains 4] [--warmup 2000]
        [--samples 25000] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def marginal_nuts(y: np.ndarray, model: str = "2pl", chains: int = 4, warmup: int = 2000,
                  samples: int = 25_000, nodes: int = 81, seed: int = 0) -> tuple[dict, dict]:
    """``({block: (mean (n,), sd (n,))}, record)`` of the items' marginal posterior
    (unconstrained), and per-chain sds so that the sampler's own spread is visible."""
    import blackjax
    import jax
    import jax.numpy as jnp

    from engine.infer.marginal import (_ability_log_prior, _cell_loglik, _gauss_hermite,
                                       _item_blocks, _item_prior_terms, distinct_rows)
    from engine.models import get_model

    jax.config.update("jax_enable_x64", True)
    spec = get_model(model)
    names = [p.name for p in _item_blocks(spec)]
    patterns, _, counts = distinct_rows(y)
    n, k = y.shape[1], len(names)
    z, log_w = _gauss_hermite(nodes)
    theta = jnp.asarray(np.tile(z, (patterns.shape[0], 1)))
    base = jnp.asarray(np.asarray(_ability_log_prior(spec, theta), np.float64) + log_w[None, :])
    yy = jnp.asarray(patterns.astype(np.float64))
    mask = jnp.asarray((patterns >= 0).astype(np.float64))
    weights = jnp.asarray(counts.astype(np.float64))

    def logdensity(v):
        x = v.reshape(n, k)
        ll = jnp.sum(_cell_loglik(spec, x, theta, yy, mask), axis=-1) + base
        return jax.scipy.special.logsumexp(ll, axis=1) @ weights + jnp.sum(_item_prior_terms(spec, x, jnp.zeros(0))[0])

    t = time.perf_counter()
    per_chain = []
    for c in range(chains):
        key, start, run = jax.random.split(jax.random.PRNGKey(seed + c), 3)
        adapt = blackjax.window_adaptation(blackjax.nuts, logdensity)
        (state, params), _ = adapt.run(key, 0.1 * jax.random.normal(start, (n * k,)), num_steps=warmup)
        kernel = blackjax.nuts(logdensity, **params).step

        def step(s, key_):
            s, _ = kernel(key_, s)
            return s, s.position

        _, draws = jax.lax.scan(step, state, jax.random.split(run, samples))
        per_chain.append(np.asarray(draws).reshape(samples, n, k))
    every = np.concatenate(per_chain)
    summary = {name: (every[:, :, j].mean(0), every[:, :, j].std(0)) for j, name in enumerate(names)}
    record = {"method": "NUTS on the items' marginal posterior", "chains": chains,
              "warmup": warmup, "samples_per_chain": samples, "nodes": nodes,
              "wall_s": time.perf_counter() - t,
              "sd_per_chain": {name: np.stack([d[:, :, j].std(0) for d in per_chain]).round(4).tolist()
                               for j, name in enumerate(names)}}
    return summary, record


def main(argv: list[str] | None = None) -> int:
    from bench_marginal import _load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="lsat7")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=25_000)
    ap.add_argument("--out", default=str(HERE / "results" / "nuts-marginal.json"))
    args = ap.parse_args(argv)
    runs = {}
    for name in args.data.split(","):
        summary, record = marginal_nuts(_load(name), chains=args.chains, warmup=args.warmup,
                                        samples=args.samples)
        runs[name] = record | {b: {"mean": m.round(4).tolist(), "sd": s.round(4).tolist()}
                               for b, (m, s) in summary.items()}
        print(json.dumps({name: runs[name]}, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(runs, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
