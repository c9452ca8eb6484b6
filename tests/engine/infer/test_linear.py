"""The linear-predictor path gives the same block terms as the generic per-cell path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.data.blocks import MISSING
from engine.errors import ModelError
from engine.infer.elbo import make_block_terms, make_observation_terms
from engine.infer.linear import make_linear_block_terms, supports_linear
from engine.models import MODELS, get_model

S, N = 6, 11
def _options(name):
    return {"dims": 3} if name.startswith(("mirt", "irt-vec")) else {}


LINEAR = [name for name in MODELS if supports_linear(get_model(name, **_options(name)))]


def _case(spec, seed=0):
    rng = np.random.default_rng(seed)
    if spec.kind == "binary":
        y = rng.integers(0, 2, size=(S, N)).astype(np.int8)
        y[rng.random((S, N)) < 0.25] = MISSING
    else:
        y = rng.uniform(0.05, 0.95, size=(S, N)).astype(np.float32)
        y[rng.random((S, N)) < 0.25] = np.nan
    z = {p.name: jnp.asarray(rng.normal(p.init, 0.6, size=p.full_shape(S, N)), jnp.float32)
         for p in spec.params}
    # a padded tile: the last row and column point at index 0 and hold no response
    sub = np.r_[np.arange(S), 0].astype(np.int32)
    item = np.r_[np.arange(N), 0].astype(np.int32)
    tile = np.full((S + 1, N + 1), MISSING if y.dtype == np.int8 else np.nan, y.dtype)
    tile[:S, :N] = y
    return z, (jnp.asarray(sub), jnp.asarray(item), jnp.asarray(tile))


def _assert_same(got, want):
    np.testing.assert_allclose(float(got.value), float(want.value), rtol=1e-5)
    for part in ("grad", "hess", "cross"):
        a, b = getattr(got, part), getattr(want, part)
        assert set(a) == set(b), part
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=2e-4, atol=2e-5, err_msg=f"{part} {key}")


def test_the_models_with_one_logit_declare_it():
    assert {"1pl", "2pl", "3pl", "4pl", "feas", "mirt-comp", "irt-vec"} <= set(LINEAR)
    assert "mirt-noncomp" not in LINEAR  # a product of per-skill sigmoids: no single predictor


# every declaring model with vague priors; the hierarchical family for one of each kind
# (its hyper-parameters are globals outside the likelihood, the same for every model)
CASES = [(name, "vague") for name in LINEAR] + [(n, "hierarchical") for n in ("2pl", "mirt-comp", "beta")]


@pytest.mark.parametrize("name,prior", CASES)
def test_linear_terms_equal_per_cell_terms(name, prior):
    spec = get_model(name, prior=prior, **_options(name))
    z, tile = _case(spec)
    for with_hessian in (True, False):
        fast = jax.jit(make_block_terms(spec, S, N, with_hessian))(z, *tile)
        slow = jax.jit(make_block_terms(spec, S, N, with_hessian, per_cell=True))(z, *tile)
        _assert_same(fast, slow)


@pytest.mark.parametrize("name", ["2pl", "4pl", "mirt-comp"])
def test_frozen_blocks_get_no_terms(name):
    spec = get_model(name, **_options(name))
    z, tile = _case(spec, seed=3)
    items = frozenset(p.name for p in spec.params if p.owner == "item")
    fast = jax.jit(make_block_terms(spec, S, N, True, items))(z, *tile)
    slow = jax.jit(make_block_terms(spec, S, N, True, items, per_cell=True))(z, *tile)
    assert set(fast.grad) == {"ability"}
    _assert_same(fast, slow)


def test_signed_discrimination_and_q_matrix():
    q = np.zeros((N, 2), np.float32)
    q[: N // 2, 0] = 1
    q[N // 2 :, 1] = 1
    q[0] = 1
    for spec in (get_model("2pl", signed_discrimination=True),
                 get_model("irt-vec", q_matrix=q, signed_discrimination=True),
                 get_model("mirt-comp", q_matrix=q)):
        z, tile = _case(spec, seed=5)
        _assert_same(jax.jit(make_block_terms(spec, S, N))(z, *tile),
                     jax.jit(make_block_terms(spec, S, N, per_cell=True))(z, *tile))


def test_a_model_without_a_predictor_is_refused():
    with pytest.raises(ModelError, match="no linear predictor"):
        make_linear_block_terms(get_model("mirt-noncomp", dims=2), S, N)


def test_inflated_beta_with_exact_zeros_and_ones():
    spec = get_model("beta", inflation="zero-one")
    z, (sub, item, tile) = _case(spec, seed=7)
    y = np.asarray(tile).copy()
    y[0, :3], y[1, 2:5] = 0.0, 1.0
    tile = jnp.asarray(y)
    _assert_same(jax.jit(make_block_terms(spec, S, N))(z, sub, item, tile),
                 jax.jit(make_block_terms(spec, S, N, per_cell=True))(z, sub, item, tile))


@pytest.mark.parametrize("name", ["2pl", "4pl", "mirt-comp", "beta"])
def test_observation_batches_equal_per_cell_terms(name):
    """The sparse layout: one observation per entry, padding marked missing."""
    spec = get_model(name, **_options(name))
    z, (sub, item, tile) = _case(spec, seed=11)
    rows, cols = np.meshgrid(np.arange(S + 1), np.arange(N + 1), indexing="ij")
    batch = (jnp.asarray(np.asarray(sub)[rows.ravel()]), jnp.asarray(np.asarray(item)[cols.ravel()]),
             jnp.asarray(np.asarray(tile).ravel()))
    for with_hessian in (True, False):
        fast = jax.jit(make_observation_terms(spec, S, N, with_hessian))(z, *batch)
        slow = jax.jit(make_observation_terms(spec, S, N, with_hessian, per_cell=True))(z, *batch)
        _assert_same(fast, slow)
        _assert_same(fast, jax.jit(make_block_terms(spec, S, N, with_hessian))(z, sub, item, tile))
