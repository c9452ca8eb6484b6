"""How fast can a Beta-IRT pass be on this machine? The floor of a beta cell against the 2PL.

Times, on one simulated 161 x 11,873 tile (jitted, median of 5 calls, one process):

- the 2PL's complete block terms as a Newton pass computes them;
- Beta-IRT's block terms as the engine computes them (autodiff in ``(eta, o)``);
- a closed-form beta cell (value, the two gradients and three Hessian entries in ``(eta, o)``),
  written once with its outputs separate and once with them summed into one number, which XLA
  computes in a single fused loop that writes nothing back: the floor for these formulas.

The closed form is checked against autodiff of ``engine.models.continuous.beta_logpdf``
(printed as the largest relative difference). With ``a = exp((eta + o)/2)``,
``b = exp((o - eta)/2)``, ``c = a + b``: ``log(a/c) = -softplus(-eta)``,
``log(b/c) = -softplus(eta)``, and every ``log`` of a shape comes from ``eta`` and ``o``.

    python benchmarks/bench_beta_floor.py [--out benchmarks/results/beta_floor.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench_models import SQUAD_SHAPE, _median_time, simulate_beta  # noqa: E402
from simulate import simulate_2pl  # noqa: E402
from engine.infer.elbo import make_block_terms  # noqa: E402
from engine.models import special  # noqa: E402
from engine.models.continuous import beta_logpdf  # noqa: E402
from engine.models.registry import get_model  # noqa: E402

_HALF_LOG_2PI = 0.9189385332046727


def _parts(x, log_x):
    """``(lgamma(x) - Stirling head, digamma(x) - log x, trigamma(x), x^2 trigamma(x) - x - 1/2)``
    sharing one recurrence shift (``x < 6`` moved to ``x + 6``) and one reciprocal."""
    small = x < 6.0
    z = jnp.where(small, x + 6.0, x)
    xs = jnp.where(small, x, 1.0)
    p = special._horner(special._P, xs)
    dp, d2p = special._horner(special._DP, xs), special._horner(special._D2P, xs)
    inv = 1.0 / (z * p)
    r, inv_p = p * inv, z * inv
    w = r * r
    log_z = jnp.log(z)
    tail = r * (1 / 12 - w * (1 / 360 - w * (1 / 1260 - w / 1680)))
    corr = tail + jnp.where(small, (xs + 5.5) * log_z - jnp.log(p) - (xs - 0.5) * log_x - 6.0, 0.0)
    d1 = dp * inv_p
    dpsi = (jnp.where(small, log_z - log_x - d1, 0.0) - 0.5 * r
            - w * (1 / 12 - w * (1 / 120 - w * (1 / 252 - w * (1 / 240 - w / 132)))))
    series = r * (1 / 6 - w * (1 / 30 - w * (1 / 42 - w * (1 / 30 - w * 5 / 66))))
    tri = r + 0.5 * w + w * series + jnp.where(small, d1 * d1 - d2p * inv_p, 0.0)
    resid = jnp.where(small, x * x * tri - x - 0.5, series)
    return corr, dpsi, tri, resid


def beta_cell(eta, o, y):
    """Closed-form ``(value, d/deta, d/do, d2/deta2, d2/deta do, d2/do2)`` of log Beta(y | a, b)."""
    ly, l1y = jnp.log(y), jnp.log1p(-y)
    abs_eta = jnp.abs(eta)
    h = jnp.exp(-0.5 * abs_eta)
    log1p_e = jnp.log1p(h * h)
    sp_pos, sp_neg = jnp.maximum(eta, 0.0) + log1p_e, jnp.maximum(-eta, 0.0) + log1p_e
    m = jnp.exp(0.5 * o)
    pos = eta >= 0
    a, b = jnp.where(pos, m / h, m * h), jnp.where(pos, m * h, m / h)
    c = a + b
    log_c = 0.5 * o + 0.5 * abs_eta + log1p_e
    corr_a, dpsi_a, _, res_a = _parts(a, 0.5 * (eta + o))
    corr_b, dpsi_b, _, res_b = _parts(b, 0.5 * (o - eta))
    corr_c, dpsi_c, tri_c, res_c = _parts(c, log_c)
    lbeta = (-a * sp_neg - b * sp_pos - 0.5 * (o - log_c) + _HALF_LOG_2PI
             + corr_a + corr_b - corr_c)
    value = (a - 1.0) * ly + (b - 1.0) * l1y - lbeta
    a_score = a * (ly + sp_neg + dpsi_c - dpsi_a)
    b_score = b * (l1y + sp_pos + dpsi_c - dpsi_b)
    k = res_c - res_a - res_b - 0.5
    h_oo = 0.25 * (k + a_score + b_score)
    h_ee = h_oo - a * b * tri_c
    h_eo = 0.25 * ((a - b) * (0.5 + res_c) / c - res_a + res_b + a_score - b_score)
    return value, 0.5 * (a_score - b_score), 0.5 * (a_score + b_score), h_ee, h_eo, h_oo


def _autodiff_cell(eta, o, y):
    def cell(q, yy):
        return beta_logpdf(yy, 0.5 * (q[0] + q[1]), 0.5 * (q[1] - q[0]))

    q = jnp.stack([eta, jnp.broadcast_to(o, eta.shape)], -1)
    v = jax.vmap(jax.vmap(cell))(q, y)
    g = jax.vmap(jax.vmap(jax.grad(cell)))(q, y)
    hs = jax.vmap(jax.vmap(jax.hessian(cell)))(q, y)
    return v, g[..., 0], g[..., 1], hs[..., 0, 0], hs[..., 0, 1], hs[..., 1, 1]


def _block_terms_time(model: str, options: dict, y: np.ndarray) -> float:
    S, N = y.shape
    spec = get_model(model, **options)
    rng = np.random.default_rng(0)
    z = {p.name: jnp.asarray(0.3 * rng.standard_normal(p.full_shape(S, N)), jnp.float32)
         for p in spec.likelihood_params}
    terms = jax.jit(make_block_terms(spec, S, N, with_hessian=True))
    return _median_time(terms, z, jnp.arange(S), jnp.arange(N), jnp.asarray(y))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "beta_floor.json")
    args = ap.parse_args(argv)
    S, N = SQUAD_SHAPE
    y = jnp.asarray(simulate_beta(S, N, seed=0)["responses"])
    rng = np.random.default_rng(0)
    eta = jnp.asarray(1.5 * rng.standard_normal((S, N)), jnp.float32)
    o = jnp.asarray(1.5 + 0.5 * rng.standard_normal(N), jnp.float32)[None]
    closed, auto = jax.jit(beta_cell)(eta, o, y), jax.jit(_autodiff_cell)(eta, o, y)
    binary = simulate_2pl(S, N, seed=0)["responses"]
    rel = [float(np.max(np.abs(np.asarray(c) - np.asarray(r)) / (1.0 + np.abs(np.asarray(r)))))
           for c, r in zip(closed, auto)]
    out = {
        "shape": [S, N], "load_avg": os.getloadavg(),
        "closed_form_vs_autodiff_max_rel_diff": dict(zip(
            ["value", "g_eta", "g_o", "h_eta_eta", "h_eta_o", "h_o_o"], rel)),
        "seconds": {
            "2pl_block_terms": _block_terms_time("2pl", {}, binary),
            "beta_block_terms_engine": _block_terms_time("beta", {"inflation": "none"},
                                                         np.asarray(y)),
            "beta_cell_closed_form_six_outputs": _median_time(jax.jit(beta_cell), eta, o, y),
            "beta_cell_closed_form_summed_one_loop": _median_time(
                jax.jit(lambda *a: sum(beta_cell(*a))), eta, o, y),
            "beta_cell_value_only": _median_time(jax.jit(lambda *a: beta_cell(*a)[0]), eta, o, y),
            "beta_cell_gradient_eta_only": _median_time(
                jax.jit(lambda *a: beta_cell(*a)[1]), eta, o, y),
        },
    }
    print(json.dumps(out, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
