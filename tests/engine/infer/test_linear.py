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


# -- the marginal fit's item side: quadrature nodes as subjects ----------------------------

from dataclasses import replace  # noqa: E402

from engine.infer import marginal  # noqa: E402
from engine.infer.linear import node_cell_scores, node_item_terms, supports_nodes  # noqa: E402
from engine.models.priors import normal  # noqa: E402
from engine.models.spec import ParamSpec  # noqa: E402

MARGINAL = [name for name in LINEAR if marginal.marginal_applies(get_model(name, **_options(name)))]


def _nodes_case(spec, seed, U=9, Q=7, n=5):
    rng = np.random.default_rng(seed)
    k = len(marginal._item_blocks(spec))
    x = rng.normal(0.0, 0.6, size=(n, k)).astype(np.float32)
    theta = np.sort(rng.normal(0.0, 1.5, size=(U, Q)), axis=1).astype(np.float32)
    mask = (rng.random((U, n)) < 0.8).astype(np.float32)
    y = (rng.random((U, n)) < 0.5).astype(np.float32) * mask
    w = rng.dirichlet(np.ones(Q), size=U).astype(np.float32) * rng.integers(1, 4, (U, 1))
    w[0, :3] = 0.0  # nodes with no weight
    return tuple(jnp.asarray(a) for a in (x, theta, y, mask, w))


def _assert_node_terms(spec, case):
    blocks = marginal._item_blocks(spec)
    got = jax.jit(lambda *a: node_item_terms(spec, blocks, *a))(*case)
    want = jax.jit(lambda *a: marginal._item_terms_per_cell(spec, *a))(*case)
    for part, a, b in zip(("value", "grad", "hess"), got, want):
        assert a.shape == b.shape, part
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=part)
    got = jax.jit(lambda *a: node_cell_scores(spec, blocks, *a))(*case[:4])
    want = jax.jit(lambda *a: marginal._cell_scores_per_cell(spec, *a))(*case[:4])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg="scores")


@pytest.mark.parametrize("prior", ["population", "vague", "hierarchical"])
@pytest.mark.parametrize("name", MARGINAL)
def test_node_terms_equal_per_cell_terms(name, prior):
    """Each item's expected terms and each cell's scores over quadrature nodes, through the
    predictor, equal differentiating every cell in the item's values."""
    assert {"1pl", "2pl", "3pl", "4pl", "feas"} <= set(MARGINAL)
    spec = get_model(name, prior=prior)
    _assert_node_terms(spec, _nodes_case(spec, seed=len(name)))


def test_node_terms_leave_blocks_outside_the_likelihood_at_zero():
    """An item block the likelihood does not read sits in ``x``'s columns with no terms."""
    spec = get_model("3pl", prior="vague")
    extra = ParamSpec(name="tag", owner="item", prior=normal(0.0, 1.0), in_likelihood=False)
    spec = replace(spec, params=spec.params[:2] + (extra,) + spec.params[2:])
    blocks = marginal._item_blocks(spec)
    assert [p.name for p in blocks].index("tag") not in (0, len(blocks) - 1)
    case = _nodes_case(spec, seed=3)
    _assert_node_terms(spec, case)
    _, grad, hess = jax.jit(lambda *a: node_item_terms(spec, blocks, *a))(*case)
    col = [p.name for p in blocks].index("tag")
    assert np.all(np.asarray(grad)[:, col] == 0) and np.all(np.asarray(hess)[:, col] == 0)
    assert np.all(np.asarray(hess)[:, :, col] == 0) and np.any(np.asarray(hess) != 0)


def test_the_fit_takes_the_predictor_where_declared_and_cells_where_not():
    """``_item_terms`` and ``_cell_scores`` (the compiled programs the fit calls) give the
    same numbers for a 2PL with its predictor and the same 2PL without one."""
    spec = get_model("2pl")
    # its own name: specs compare (and key the compiled programs) without their functions
    plain = replace(spec, linear=None, name="2pl-per-cell")
    assert supports_nodes(spec) and not supports_nodes(plain)
    case = _nodes_case(spec, seed=5)
    for a, b in zip(marginal._item_terms(spec, *case), marginal._item_terms(plain, *case)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(marginal._cell_scores(spec, *case[:4]),
                               marginal._cell_scores(plain, *case[:4]), rtol=2e-5, atol=2e-6)


def test_the_node_route_is_refused_without_a_predictor_of_one_skill():
    spec = replace(get_model("2pl"), linear=None)
    with pytest.raises(ModelError, match="no linear predictor"):
        node_item_terms(spec, marginal._item_blocks(spec), *_nodes_case(get_model("2pl"), 1))
    # a scalar ability that enters as two skills: the fit's programs take the per-cell route
    two = get_model("2pl")
    lin = two.linear
    lin2 = replace(
        lin, subject=lambda params: jnp.stack([params["ability"], params["ability"]], -1),
        item=lambda params: (lambda v, w, e: (jnp.concatenate([v, v], -1) / 2, w, e))(
            *lin.item(params)))
    two = replace(two, name="2pl-two-skills", linear=lin2, loglik=lin2.loglik)
    assert supports_linear(two) and not supports_nodes(two)
    case = _nodes_case(two, seed=2)
    for a, b in zip(marginal._item_terms(two, *case), marginal._item_terms(get_model("2pl"), *case)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_node_terms_keep_a_sharp_items_hessian():
    """A sharp, hard 2PL item (``b = 5``, ``a = e^4``) with the nodes' weight around its
    difficulty: the Hessian in float32 against the per-cell route in float64. Summing raw
    moments of the nodes (``sum W theta^2`` and so on) lost 0.8% of it."""
    spec = get_model("2pl", prior="vague")
    rng = np.random.default_rng(4)
    U, Q = 40, 21
    theta = 5.0 + np.sort(rng.normal(0, np.exp(-4.0), (U, Q)), axis=1)
    x = np.array([[5.0, 4.0]])  # difficulty, log discrimination: the blocks' order
    assert [p.name for p in marginal._item_blocks(spec)] == ["difficulty", "discrimination"]
    y = (rng.random((U, 1)) < 0.5).astype(np.float64)
    mask, w = np.ones((U, 1)), rng.dirichlet(np.ones(Q), size=U)
    # float64 by hand: eta = a (theta - b), H = sum w (W eta' eta'^T + r eta'')
    a, eta = np.exp(4.0), np.exp(4.0) * (theta - 5.0)
    p = 1 / (1 + np.exp(-eta))
    r, W = w * (y - p), -w * p * (1 - p)
    d1 = np.stack([np.full_like(eta, -a), eta])  # d eta / d (b, log a)
    d2 = np.array([[np.zeros_like(eta), np.full_like(eta, -a)], [np.full_like(eta, -a), eta]])
    want = (np.einsum("uq,iuq,juq->ij", W, d1, d1) + np.einsum("uq,ijuq->ij", r, d2))[None]
    f32 = [jnp.asarray(a, jnp.float32) for a in (x, theta, y, mask, w)]
    got = jax.jit(lambda *a: node_item_terms(spec, marginal._item_blocks(spec), *a))(*f32)[2]
    np.testing.assert_allclose(got, want, rtol=2e-4)
