"""Block terms through a model's linear predictor (``ModelSpec.linear``).

A cell's log-likelihood is ``g(eta, e, y)`` with ``eta = u_s . v_n + w_n`` and per-item
extras ``e_n``. So a block needs ``g``'s derivatives in ``q = (eta, e)`` only (one tangent
per entry of ``q``, not one per parameter entry), and every owner's sums come out as small
matrix products of those per-cell derivatives with ``u`` and ``v``:

- subject side, ``phi_s = u_s``: gradient ``R @ V``, Hessian ``sum_n W v_n v_n^T``;
- item side, ``phi_n = (v_n, w_n, e_n)``: gradient and Hessian from ``R``, ``W`` and the
  extras' derivatives contracted with ``(u_s, 1)``;

with ``R = dg/deta`` and ``W = d2g/deta2`` per cell. The chain rule from ``phi`` to each
owner's unconstrained entries, ``J^T H_phi J + sum_k (dL/dphi_k) d2phi_k``, runs per owner
(``S`` or ``N`` small problems), never per cell. The result equals
:func:`engine.infer.elbo.make_block_terms` on the generic path.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from engine.errors import ModelError
from engine.infer.terms import Terms, cross_pairs
from engine.models.spec import ModelSpec, ParamSpec

__all__ = ["make_linear_block_terms", "make_linear_observation_terms", "node_cell_scores",
           "node_item_terms", "supports_linear", "supports_nodes"]


def supports_linear(spec: ModelSpec) -> bool:
    """True when ``spec`` declares a linear predictor and no global block enters the cells."""
    return spec.linear is not None and all(p.owner != "global" for p in spec.likelihood_params)


def _flat(specs: list[ParamSpec], x: dict) -> jax.Array:
    return jnp.concatenate([jnp.reshape(x[p.name], (-1,)) for p in specs])


def _unflat(specs: list[ParamSpec], flat: jax.Array) -> dict:
    out, at = {}, 0
    for p in specs:
        size = math.prod(p.shape)
        out[p.name] = jnp.reshape(flat[at : at + size], p.shape)
        at += size
    return out


def _small_matmul(a, b):
    """``a @ b`` for matrices of a few rows and columns, as a sum of outer products.

    The chain rule runs vmapped over thousands of owners; XLA on CPU turns a batched dot of
    tiny matrices into a loop of library calls that costs far more than the arithmetic
    (62 ms against 1.8 ms for 46,000 items' 4 x 4 products).
    """
    return sum(a[:, k, None] * b[None, k, :] for k in range(a.shape[1]))


def _chain_rule(phi: Callable, flat, g_phi, h_phi, with_hessian: bool):
    """One owner's gradient ``(F,)`` and Hessian ``(F, F)`` (``None`` without) in its
    unconstrained entries ``flat``, from the sums' derivatives in ``phi = phi(flat)``:
    ``J^T g_phi`` and ``J^T h_phi J + sum_k g_phi_k d2phi_k``."""
    jac = jax.jacfwd(phi)(flat)  # (P, F)
    grad = _small_matmul(jac.T, g_phi[:, None])[:, 0]
    if not with_hessian:
        return grad, None
    second = jax.hessian(lambda v: jnp.sum(g_phi * phi(v)))(flat)
    return grad, _small_matmul(jac.T, _small_matmul(h_phi, jac)) + second


def _owner_chain(params: list[ParamSpec], free: list[ParamSpec], phi_fn: Callable,
                 with_hessian: bool, pairs: list[tuple[str, str]]) -> Callable:
    """``chain(x, c, g_phi, h_phi) -> (grad, hess, cross)`` for one owner (vmapped later).

    ``phi_fn(params, consts)`` maps one owner's constrained values to its ``phi``.
    """
    offsets, at = {}, 0
    for p in free:
        offsets[p.name] = at
        at += math.prod(p.shape)
    free_names = {p.name for p in free}

    def chain(x, c, g_phi, h_phi):
        fixed = {p.name: x[p.name] for p in params if p.name not in free_names}

        def phi(flat):
            xs = {**fixed, **_unflat(free, flat)}
            return phi_fn({p.name: p.constrain(xs[p.name]) for p in params}, c)

        g, h = _chain_rule(phi, _flat(free, x), g_phi, h_phi, with_hessian)
        grad = _unflat(free, g)
        if not with_hessian:
            return grad, {}, {}
        diag = _unflat(free, jnp.diagonal(h))
        cross = {f"{a}|{b}": h[offsets[a], offsets[b]] for a, b in pairs}
        return grad, diag, cross

    return chain


def _weighted_outer(weights, x):
    """``out[a, i, j] = sum_b weights[a, b] x[b, i] x[b, j]`` as one matrix product."""
    k = x.shape[1]
    outer = (x[:, :, None] * x[:, None, :]).reshape(x.shape[0], k * k)
    return (weights @ outer).reshape(weights.shape[0], k, k)


def _hessian_blocks(top, side, corner):
    """``[[top, side], [side^T, corner]]`` over the trailing two axes."""
    return jnp.concatenate([jnp.concatenate([top, side], axis=-1),
                            jnp.concatenate([jnp.swapaxes(side, -1, -2), corner], axis=-1)],
                           axis=-2)


def _tile_cells(u, v, w, extras, cell_fn, y, mask):
    """Each cell's value and derivatives in ``q = (eta, extras)`` over a dense tile."""
    eta = u @ v.T + w[None, :]
    q = jnp.concatenate([eta[..., None],
                         jnp.broadcast_to(extras[None], eta.shape + extras.shape[-1:])], -1)
    return jax.vmap(jax.vmap(cell_fn))(q, y, mask)


def _tile_sums(u, v, w, extras, cell_fn, y, mask, with_hessian):
    """A dense tile: per-row (subject) and per-column (item) sums as matrix products."""
    value, g, h = _tile_cells(u, v, w, extras, cell_fn, y, mask)
    r, u1 = g[..., 0], jnp.concatenate([u, jnp.ones_like(u[:, :1])], axis=1)
    g_u = r @ v
    g_i = jnp.concatenate([r.T @ u1, g[..., 1:].sum(axis=0)], axis=1)
    if not with_hessian:
        return value.sum(), g_u, None, g_i, None
    side = jnp.stack([h[..., 0, 1 + k].T @ u1 for k in range(extras.shape[-1])], axis=2) \
        if extras.shape[-1] else jnp.zeros((v.shape[0], u1.shape[1], 0))
    h_i = _hessian_blocks(_weighted_outer(h[..., 0, 0].T, u1), side, h[..., 1:, 1:].sum(axis=0))
    return value.sum(), g_u, _weighted_outer(h[..., 0, 0], v), g_i, h_i


def _observation_sums(u, v, w, extras, cell_fn, y, mask, with_hessian):
    """An observation batch (``u``, ``v`` per observation): each one's own contributions."""
    eta = jnp.sum(u * v, axis=-1) + w
    value, g, h = jax.vmap(cell_fn)(jnp.concatenate([eta[:, None], extras], axis=1), y, mask)
    r, u1 = g[:, :1], jnp.concatenate([u, jnp.ones_like(u[:, :1])], axis=1)
    g_u, g_i = r * v, jnp.concatenate([r * u1, g[:, 1:]], axis=1)
    if not with_hessian:
        return value.sum(), g_u, None, g_i, None
    outer = lambda x: x[:, :, None] * x[:, None, :]
    weight = h[:, :1, :1]
    h_i = _hessian_blocks(weight * outer(u1), u1[:, :, None] * h[:, None, 0, 1:], h[:, 1:, 1:])
    return value.sum(), g_u, weight * outer(v), g_i, h_i


def _make_terms(spec: ModelSpec, num_subjects: int, num_items: int, with_hessian: bool,
                frozen: frozenset, sums: Callable) -> Callable:
    if not supports_linear(spec):
        raise ModelError(f"model {spec.name!r} declares no linear predictor over subject and "
                         "item blocks; use engine.infer.elbo.make_block_terms")
    lin = spec.linear
    lik = spec.likelihood_params
    by_owner = {o: [p for p in lik if p.owner == o] for o in ("subject", "item")}
    free = {o: [p for p in ps if p.name not in frozen] for o, ps in by_owner.items()}
    consts = {k: jnp.asarray(v, jnp.float32)
              for k, v in spec.constant_values(num_subjects, num_items).items()}
    const_owner = {c.name: c.owner for c in spec.constants}
    pairs = [(a, b) for a, b in cross_pairs(spec) if a not in frozen and b not in frozen]
    owner_of = {p.name: p.owner for p in lik}

    def item_phi(params, c):
        v, w, extras = lin.item({**params, **c})
        return jnp.concatenate([v, jnp.reshape(w, (1,))] + [jnp.reshape(e, (1,)) for e in extras])

    def subject_phi(params, c):
        return lin.subject({**params, **c})

    chains = {o: _owner_chain(by_owner[o], free[o], fn, with_hessian,
                              [(a, b) for a, b in pairs if owner_of[a] == o])
              for o, fn in (("subject", subject_phi), ("item", item_phi))}

    def cell(q, y, m):
        return m * lin.cell(q[0], tuple(q[1:]), y, m)

    def cell_terms(q, y, m):
        if not with_hessian:
            return (*jax.value_and_grad(cell)(q, y, m), None)

        # forward over forward: a 512 x 1,024 tile's terms 2.0-2.3x faster than forward
        # over reverse for the 3PL and 4PL, the same to float32 rounding (the 2PL's
        # identical)
        return _forward_terms(cell)(q, y, m)

    def terms(z, subject_idx, item_idx, y):
        idx = {"subject": subject_idx, "item": item_idx}
        x = {o: {p.name: z[p.name][idx[o]] for p in by_owner[o]} for o in idx}
        c = {o: {k: v[idx[o]] for k, v in consts.items() if const_owner[k] == o} for o in idx}
        params = {o: {p.name: p.constrain(x[o][p.name]) for p in by_owner[o]} for o in idx}
        u = jax.vmap(subject_phi)(params["subject"], c["subject"])
        phi_i = jax.vmap(item_phi)(params["item"], c["item"])  # (n, D + 1 + K)
        dims = u.shape[-1]
        mask = (y >= 0).astype(jnp.float32)
        yf = jnp.where(y >= 0, y, 0).astype(jnp.float32)
        value, *phi_sums = sums(u, phi_i[:, :dims], phi_i[:, dims], phi_i[:, dims + 1:],
                                cell_terms, yf, mask, with_hessian)
        grad, hess, cross = {}, {}, {}
        for owner, (g_phi, h_phi) in zip(idx, (phi_sums[:2], phi_sums[2:])):
            if not free[owner]:
                continue
            gr, hs, cr = jax.vmap(chains[owner])(x[owner], c[owner], g_phi, h_phi)
            size = num_subjects if owner == "subject" else num_items
            for p in free[owner]:
                full = jnp.zeros((size,) + p.shape, jnp.float32)
                grad[p.name] = full.at[idx[owner]].add(gr[p.name])
                hess[p.name] = full.at[idx[owner]].add(hs[p.name]) if with_hessian \
                    else jnp.zeros_like(full)
            for key, val in cr.items():
                cross[key] = jnp.zeros((size,), jnp.float32).at[idx[owner]].add(val)
        return Terms(value, grad, hess, cross)

    return terms


def make_linear_block_terms(spec: ModelSpec, num_subjects: int, num_items: int,
                            with_hessian: bool = True, frozen: frozenset = frozenset()) -> Callable:
    """Return ``terms(z, subject_idx, item_idx, y) -> Terms`` for one padded dense tile.

    Raises ``ModelError`` when ``spec`` has no linear predictor (see :func:`supports_linear`).
    """
    return _make_terms(spec, num_subjects, num_items, with_hessian, frozenset(frozen), _tile_sums)


def make_linear_observation_terms(spec: ModelSpec, num_subjects: int, num_items: int,
                                  with_hessian: bool = True,
                                  frozen: frozenset = frozenset()) -> Callable:
    """Return ``terms(z, subject_idx, item_idx, y) -> Terms`` for one padded batch of
    observations (all ``(b,)``; ``y < 0`` or NaN is padding), as
    :func:`engine.infer.elbo.make_observation_terms` computes them."""
    return _make_terms(spec, num_subjects, num_items, with_hessian, frozenset(frozen),
                       _observation_sums)


# -- the marginal fit's item side: nodes in place of subjects ------------------------------
#
# Each response pattern's ability is integrated over ``Q`` nodes, so its ``(U, Q)`` nodes act
# as ``U Q`` subjects with the node value as ``u`` (one skill) and the node's posterior weight
# (times the pattern's count) scaling its cells. Items need only the column sums.


def supports_nodes(spec: ModelSpec) -> bool:
    """True when the marginal fit's item side can go through the linear predictor: one
    scalar subject block that enters the predictor as one skill."""
    subject = spec.by_owner("subject")
    if not supports_linear(spec) or len(subject) != 1 or subject[0].shape != ():
        return False
    probe = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    u = jax.eval_shape(lambda t: spec.linear.subject({subject[0].name: t}), probe)
    return u.shape == (2, 3, 1)


def _node_route(spec: ModelSpec, blocks: list[ParamSpec]):
    """``(columns, item_phi, cell, nodes_u)`` for items' values ``x`` ``(n, k)`` whose
    columns are ``blocks`` (all scalar): the columns the likelihood reads, ``phi`` of one
    item from those columns, the model's cell, and ``u`` ``(U Q, 1)`` from nodes."""
    if not supports_nodes(spec):
        raise ModelError(f"model {spec.name!r} declares no linear predictor with one scalar "
                         "ability as its one skill; use the per-cell terms")
    lin = spec.linear
    (subject,) = spec.by_owner("subject")
    columns = [j for j, p in enumerate(blocks) if p.in_likelihood]

    def item_phi(xn):
        params = {blocks[j].name: blocks[j].constrain(xn[i]) for i, j in enumerate(columns)}
        v, w, extras = lin.item(params)
        return jnp.concatenate([jnp.reshape(v, (-1,)), jnp.reshape(w, (1,))]
                               + [jnp.reshape(e, (1,)) for e in extras])

    def cell(q, y, m):
        return m * lin.cell(q[0], tuple(q[1:]), y, m)

    def nodes_u(theta):
        u = lin.subject({subject.name: subject.constrain(theta)})
        return jnp.reshape(u, (-1, 1))

    return columns, item_phi, cell, nodes_u


def _centred_column_sums(u, g, h):
    """Per-item gradient ``(n, P)`` and Hessian ``(n, P, P)`` in ``phi_c = (v, w + v c_n,
    extras)``, the predictor written about a centre ``c_n`` per item: ``eta = v (u - c_n) +
    (w + v c_n)``, the same function of the item's values for any ``c_n``.

    With ``c_n`` the ``|d2g/deta2|``-weighted mean of ``u`` over the item's cells, the sums
    of ``W (u - c)^2`` hold no cancellation; raw moments (``sum W u^2 - 2 c sum W u + ...``)
    lost up to 16% of a sharp item's Hessian in float32 (``b = 6``, ``log a = 5``).
    Returns ``(c, g_i, h_i)``."""
    weight, r = h[..., 0, 0], g[..., 0]
    scale = jnp.abs(weight)
    c = jnp.sum(scale * u, axis=0) / jnp.maximum(jnp.sum(scale, axis=0), 1e-30)
    d = u - c[None, :]  # (S, n)
    total = lambda a: jnp.sum(a, axis=0)  # over the nodes: (S, n) -> (n,), one pass each
    wd = weight * d
    g_i = jnp.concatenate([jnp.stack([total(r * d), total(r)], axis=1), total(g[..., 1:])],
                          axis=1)
    top = jnp.stack([jnp.stack([total(wd * d), total(wd)], -1),
                     jnp.stack([total(wd), total(weight)], -1)], -2)
    side = jnp.stack([jnp.stack([total(h[..., 0, 1 + e] * d), total(h[..., 0, 1 + e])], -1)
                      for e in range(g.shape[-1] - 1)], -1) \
        if g.shape[-1] > 1 else jnp.zeros((g.shape[1], 2, 0), g.dtype)
    return c, g_i, _hessian_blocks(top, side, total(h[..., 1:, 1:]))


def _forward_terms(f):
    """``f``'s value, gradient and Hessian in its first argument, a few entries long, by
    forward over forward differentiation: for a cell of ``(eta, extras)`` it ran 1.8x
    faster than forward over reverse (the 4PL's cell at ``ability``'s nodes: 216 against
    385 ms for 430,000 cells)."""
    def terms(q, *rest):
        def grad_and_aux(qq):
            grad = jax.jacfwd(f)(qq, *rest)
            return grad, grad

        hess, grad = jax.jacfwd(grad_and_aux, has_aux=True)(q)
        return f(q, *rest), grad, hess

    return terms


def _spread(values, columns: list[int], k: int, axes: int):
    """Place ``values``' trailing ``axes`` (1 or 2) axes, over ``columns``, into ``k``."""
    if len(columns) == k:
        return values
    idx = jnp.asarray(columns)
    if axes == 1:
        return jnp.zeros(values.shape[:-1] + (k,), values.dtype).at[..., idx].set(values)
    return (jnp.zeros(values.shape[:-2] + (k, k), values.dtype)
            .at[..., idx[:, None], idx[None, :]].set(values))


def _node_inputs(spec: ModelSpec, blocks: list[ParamSpec], x, theta, y):
    """The node route (:func:`_node_route`: columns, ``item_phi``, ``cell``) with its
    inputs at items ``x`` ``(n, k)`` and nodes ``theta`` ``(U, Q)``: the nodes' ``u``, the
    route's columns of ``x``, each item's ``phi`` ``(n, P)``, and the responses ``y``
    ``(U, n)`` repeated per node ``(U * Q, n)``. Traced."""
    columns, item_phi, cell, nodes_u = _node_route(spec, blocks)
    (U, Q), n = theta.shape, x.shape[0]
    xl = x[:, jnp.asarray(columns)]
    ys = jnp.broadcast_to(y[:, None, :], (U, Q, n)).reshape(U * Q, n)
    return columns, item_phi, cell, nodes_u(theta), xl, jax.vmap(item_phi)(xl), ys


def node_item_terms(spec: ModelSpec, blocks: list[ParamSpec], x, theta, y, mask, w):
    """Each item's expected complete-data log-likelihood ``(n,)`` under node weights ``w``
    ``(U, Q)``, with its gradient ``(n, k)`` and Hessian ``(n, k, k)`` in ``x`` ``(n, k)``
    (unconstrained, columns ``blocks``); ``y`` and ``mask`` are ``(U, n)``. Traced.

    The cells' derivatives are taken in ``(eta, extras)`` only and summed per item against
    ``(theta - c, 1)`` (:func:`_centred_column_sums`); the chain rule to ``x`` runs once per
    item. The same numbers as differentiating each cell in ``x`` (``engine.infer.marginal``'s
    per-cell path) to float32 rounding.
    """
    columns, item_phi, cell, u, xl, phi, ys = _node_inputs(spec, blocks, x, theta, y)
    (U, Q), (n, k) = theta.shape, x.shape
    # the node weight rides in the mask's place: the cells come out weighted (the model's
    # cell is told a cell is missing where its weight is 0, which it then multiplies away)
    mw = (w[:, :, None] * mask[:, None, :]).reshape(U * Q, n)
    weighted = lambda q, yy, m: m * cell(q, yy, (m != 0).astype(m.dtype))
    value, g, h = _tile_cells(u, phi[:, :1], phi[:, 1], phi[:, 2:],
                              _forward_terms(weighted), ys, mw)
    c, g_i, h_i = _centred_column_sums(u, g, h)

    def chain(xn, cn, gp, hp):
        centred = lambda v: (lambda f: f.at[1].add(f[0] * cn))(item_phi(v))
        return _chain_rule(centred, xn, gp, hp, True)

    grad, hess = jax.vmap(chain)(xl, c, g_i, h_i)
    return jnp.sum(value, axis=0), _spread(grad, columns, k, 1), _spread(hess, columns, k, 2)


def node_cell_scores(spec: ModelSpec, blocks: list[ParamSpec], x, theta, y, mask):
    """``(U, Q, n, k)``: each cell's score in its item's values ``x`` ``(n, k)`` (columns
    ``blocks``), from the cell's derivative in ``(eta, extras)`` and each item's Jacobian
    of ``phi``. Traced."""
    columns, item_phi, cell, u, xl, phi, ys = _node_inputs(spec, blocks, x, theta, y)
    (U, Q), (n, k) = theta.shape, x.shape
    ms = jnp.broadcast_to(mask[:, None, :], (U, Q, n)).reshape(U * Q, n)
    _, g = _tile_cells(u, phi[:, :1], phi[:, 1], phi[:, 2:], jax.value_and_grad(cell), ys, ms)
    d_phi = jnp.concatenate([g[..., :1] * u[:, :, None], g], axis=-1)  # (UQ, n, P)
    jac = jax.vmap(jax.jacfwd(item_phi))(xl)  # (n, P, kl)
    scores = sum(d_phi[..., p, None] * jac[None, :, p, :] for p in range(jac.shape[1]))
    return _spread(scores, columns, k, 1).reshape(U, Q, n, k)
