"""Tests for engine.infer.elbo: block terms equal autodiff of the masked log-likelihood."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from engine.data.blocks import MISSING, InMemorySource
from engine.infer.elbo import (add_terms, cross_pairs, log_prior, make_block_terms,
                               make_observation_terms)
from engine.infer.terms import terms_shapes, value_grad_hessian
from engine.models import MODELS, get_model

S, N = 7, 9
TILE = (3, 4)  # tiles of 3 x 4 over 7 x 9: the last row and column of tiles are padded
VARIANTS = [("1pl", {}), ("2pl", {}), ("3pl", {}), ("4pl", {}), ("feas", {}),
            ("2pl", {"signed_discrimination": True}), ("2pl", {"prior": "hierarchical"})]


def _data(seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=(S, N)).astype(np.int8)
    y[rng.random((S, N)) < 0.25] = MISSING
    return y


def _z(spec, seed=1):
    rng = np.random.default_rng(seed)
    return {p.name: jnp.asarray(rng.normal(p.init, 0.7, size=p.full_shape(S, N)), jnp.float32)
            for p in spec.params}


def _tiles(y):
    """Hand-made padded tiles: padded rows/columns point at index 0 and hold MISSING."""
    rows, cols = TILE
    out = []
    for r in range(0, S, rows):
        for c in range(0, N, cols):
            part = y[r:r + rows, c:c + cols]
            sub = np.zeros(rows, np.int32)
            sub[:part.shape[0]] = np.arange(r, r + part.shape[0])
            item = np.zeros(cols, np.int32)
            item[:part.shape[1]] = np.arange(c, c + part.shape[1])
            tile = np.full(TILE, MISSING, np.int8)
            tile[:part.shape[0], :part.shape[1]] = part
            out.append((jnp.asarray(sub), jnp.asarray(item), jnp.asarray(tile)))
    return out


def _masked_loglik(spec, y):
    """Reference: sum over observed cells of loglik, as a function of unconstrained z."""
    mask = jnp.asarray(y >= 0, jnp.float32)
    yf = jnp.asarray(np.where(y >= 0, y, 0), jnp.float32)

    def f(z):
        params = {}
        for p in spec.likelihood_params:
            v = p.constrain(z[p.name])
            params[p.name] = v[:, None] if p.owner == "subject" else v[None, :]
        return jnp.sum(mask * spec.loglik(params, yf, mask))

    return f


def _sum_terms(spec, y, with_hessian=True):
    terms = jax.jit(make_block_terms(spec, S, N, with_hessian))
    z = _z(spec)
    total = None
    for sub, item, tile in _tiles(y):
        t = terms(z, sub, item, tile)
        total = t if total is None else add_terms(total, t)
    return z, total


@pytest.mark.parametrize("name,options", VARIANTS)
def test_block_terms_match_autodiff(name, options):
    spec = get_model(name, **options)
    y = _data()
    z, got = _sum_terms(spec, y)
    lik_names = [p.name for p in spec.likelihood_params]
    zl = {n: z[n] for n in lik_names}
    f = _masked_loglik(spec, y)
    value, grad, hess = jax.jit(lambda x: (f(x), jax.grad(f)(x), jax.hessian(f)(x)))(zl)

    np.testing.assert_allclose(float(got.value), float(value), rtol=1e-5)
    assert set(got.grad) == set(lik_names) == set(got.hess)
    for n in lik_names:
        np.testing.assert_allclose(got.grad[n], grad[n], rtol=1e-4, atol=1e-5, err_msg=n)
        h = np.asarray(hess[n][n])
        np.testing.assert_allclose(got.hess[n], np.diagonal(h), rtol=1e-4, atol=1e-5, err_msg=n)
        # per-owner blocks are independent: the exact Hessian block is diagonal
        np.testing.assert_allclose(h - np.diag(np.diagonal(h)), 0.0, atol=1e-6, err_msg=n)
    pairs = cross_pairs(spec)
    assert set(got.cross) == {f"{a}|{b}" for a, b in pairs}
    items = [p.name for p in spec.likelihood_params if p.owner == "item"]
    assert len(pairs) == len(items) * (len(items) - 1) // 2
    for a, b in pairs:
        h = np.asarray(hess[a][b])
        np.testing.assert_allclose(got.cross[f"{a}|{b}"], np.diagonal(h), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{a}|{b}")
        np.testing.assert_allclose(h - np.diag(np.diagonal(h)), 0.0, atol=1e-6)


def test_block_terms_without_hessian():
    spec = get_model("3pl")
    y = _data()
    _, full = _sum_terms(spec, y, with_hessian=True)
    _, cheap = _sum_terms(spec, y, with_hessian=False)
    np.testing.assert_allclose(float(cheap.value), float(full.value), rtol=1e-6)
    for n in full.grad:
        np.testing.assert_allclose(cheap.grad[n], full.grad[n], rtol=1e-6)
        np.testing.assert_array_equal(cheap.hess[n], 0.0)
    assert cheap.cross == {}


def test_missing_cells_contribute_nothing():
    """Whatever a missing cell's subject/item, dropping a response removes exactly its cell."""
    spec = get_model("4pl")
    y = _data()
    terms = jax.jit(make_block_terms(spec, S, N, True))
    z = _z(spec)
    sub, item = jnp.arange(S, dtype=jnp.int32), jnp.arange(N, dtype=jnp.int32)
    full = terms(z, sub, item, jnp.asarray(y))
    # an all-missing block (padding, pointing at subject/item 0) is exactly zero
    empty = InMemorySource(y).empty_block()
    zero = terms(z, *(jnp.asarray(a) for a in empty))
    for leaf in jax.tree.leaves(zero):
        np.testing.assert_array_equal(leaf, 0.0)
    # hiding one more cell changes only its subject's and item's entries
    i, j = np.argwhere(y >= 0)[0]
    y2 = y.copy()
    y2[i, j] = MISSING
    fewer = terms(z, sub, item, jnp.asarray(y2))
    assert float(fewer.value) != pytest.approx(float(full.value))
    diff = np.asarray(full.grad["ability"] - fewer.grad["ability"])
    assert diff[i] != 0 and np.all(np.delete(diff, i) == 0)
    diff = np.asarray(full.grad["difficulty"] - fewer.grad["difficulty"])
    assert diff[j] != 0 and np.all(np.delete(diff, j) == 0)
    # the values in missing cells (the -1) never leak in: all-missing == reference on nothing
    np.testing.assert_allclose(float(fewer.value),
                               float(jax.jit(_masked_loglik(spec, y2))({n: z[n] for n in full.grad})),
                               rtol=1e-5)


def test_block_order_and_tiling_do_not_matter():
    spec = get_model("2pl")
    y = _data()
    z, tiled = _sum_terms(spec, y)
    terms = jax.jit(make_block_terms(spec, S, N, True))
    whole = terms(z, jnp.arange(S, dtype=jnp.int32), jnp.arange(N, dtype=jnp.int32), jnp.asarray(y))
    for a, b in zip(jax.tree.leaves(tiled), jax.tree.leaves(whole)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_log_prior_hierarchical_matches_scipy():
    spec = get_model("2pl", prior="hierarchical")
    z = _z(spec, seed=3)
    x = {k: np.asarray(v, np.float64) for k, v in z.items()}
    want = stats.norm.logpdf(x["ability"], x["mu_ability"], np.exp(-0.5 * x["u_ability"])).sum()
    for block in ("ability", "difficulty", "discrimination"):
        mu, log_u = x[f"mu_{block}"], x[f"u_{block}"]
        if block != "ability":
            want += stats.norm.logpdf(x[block], mu, np.exp(-0.5 * log_u)).sum()
        want += stats.norm.logpdf(mu, 0.0, 1e3)
        want += stats.gamma.logpdf(np.exp(log_u), 1.0, scale=1.0) + log_u
    np.testing.assert_allclose(float(log_prior(spec, z)), want, rtol=1e-5)


@pytest.mark.parametrize("name", ["2pl", "4pl"])
def test_frozen_blocks_get_no_derivatives_and_free_ones_are_unchanged(name):
    spec = get_model(name)
    y = _data()
    z = _z(spec)
    items = frozenset(p.name for p in spec.likelihood_params if p.owner == "item")
    tile = _tiles(y)[0]
    full = jax.jit(make_block_terms(spec, S, N, True))(z, *tile)
    part = jax.jit(make_block_terms(spec, S, N, True, items))(z, *tile)
    np.testing.assert_allclose(float(part.value), float(full.value), rtol=1e-6)
    assert set(part.grad) == set(part.hess) == {"ability"} and part.cross == {}
    np.testing.assert_allclose(part.grad["ability"], full.grad["ability"], rtol=1e-6)
    np.testing.assert_allclose(part.hess["ability"], full.hess["ability"], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_terms_shapes_are_what_the_builders_return(name):
    """The fit compiles its update ahead of the first terms from ``terms_shapes``: every
    builder, path and frozen set must return exactly those shapes."""
    spec = get_model(name, **({"dims": 2} if name.startswith(("mirt", "irt-vec")) else {}))
    z = _z(spec)
    items = frozenset(p.name for p in spec.likelihood_params if p.owner == "item")
    tile = _tiles(_data())[0]
    obs = (jnp.arange(5, dtype=jnp.int32), jnp.arange(5, dtype=jnp.int32), jnp.zeros(5, jnp.int8))
    for frozen in (frozenset(), items):
        for with_hessian in (True, False):
            want = terms_shapes(spec, S, N, with_hessian, frozen)
            for build, args in ((make_block_terms, tile), (make_observation_terms, obs)):
                for per_cell in (True, False):
                    got = jax.eval_shape(build(spec, S, N, with_hessian, frozen, per_cell=per_cell),
                                         z, *args)
                    assert jax.tree.structure(got) == jax.tree.structure(want), (build, per_cell)
                    assert jax.tree.leaves(got) == jax.tree.leaves(want), (build, per_cell)


def test_value_gradient_and_hessian_from_one_pass_match_closed_form():
    """logsumexp(v) + c'v: gradient softmax(v) + c, Hessian diag(p) - p p' (closed form),
    in the second of two arguments, vmapped over rows as the marginal fit's item programs use it."""
    rng = np.random.default_rng(3)
    c, v = rng.normal(size=4), rng.normal(size=(6, 4))

    def f(cc, vv):
        return jax.scipy.special.logsumexp(vv) + cc @ vv

    value, grad, hess = jax.vmap(value_grad_hessian(f, 1), in_axes=(None, 0))(
        jnp.asarray(c), jnp.asarray(v))
    p = np.exp(v - v.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(value, np.log(np.exp(v).sum(1)) + v @ c, rtol=1e-5)
    np.testing.assert_allclose(grad, p + c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hess, np.einsum("ij,jk->ijk", p, np.eye(4))
                               - p[:, :, None] * p[:, None, :], atol=1e-6)
