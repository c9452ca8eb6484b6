"""Multidimensional IRT: compensatory, non-compensatory and DAD's IRT-vec (D skills).

- ``mirt-comp`` (seed 000 section 11.2, seed 004 eq. 6, intercept form):
  ``P(y=1) = sigmoid(sum_d alpha_nd theta_sd - b_n)``, ``alpha >= 0``.
- ``mirt-noncomp`` (seed 000 section 11.3): ``P(y=1) = prod_d sigmoid(alpha_nd (theta_sd - b_nd))``
  over the skills the item needs.
- ``irt-vec`` (seed 002 section 2): ``P(y=1) = sigmoid(gamma_n sum_d (theta_sd - b_nd))``.

Which item needs which skill is the constant ``skill_mask`` (items x skills of 0/1).
Confirmatory mode takes it from a Q-matrix (alpha forced to zero where Q is 0; seed 000
section 11.6). Exploratory ``mirt-comp`` pins the rotation instead: the loadings of the
first D - 1 items are lower-triangular (item k loads on skills 1..k+1 only), which with
``theta ~ N(0, I)`` and ``alpha >= 0`` leaves no continuous rotation. Read the exploratory
axes after a post-hoc ``rotate(loadings, "varimax" | "oblimin")``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from engine.errors import ModelError
from engine.models.logistic import _block as prior_block, bernoulli_loglik
from engine.models.priors import check_family, normal
from engine.models.spec import Constant, Linear, ModelSpec, ParamSpec, Symmetry
from engine.models.special import softplus

__all__ = ["mirt_model", "pinned_mask", "rotate", "read_q_matrix", "MIRT_KINDS"]

MIRT_KINDS = ("comp", "noncomp", "vec")


def pinned_mask(num_items: int, dims: int) -> np.ndarray:
    """Lower-triangular loadings for the first ``dims - 1`` items, all skills for the rest."""
    mask = np.ones((num_items, dims), np.float32)
    for k in range(min(dims - 1, num_items)):
        mask[k, k + 1:] = 0.0
    return mask


def _binary_cell(eta, extras, y, mask):
    return bernoulli_loglik(eta, y)


def _comp_item(params):
    return params["discrimination"] * params["skill_mask"], -params["difficulty"], ()


def _vec_item(params):
    """``gamma sum_d q_d (theta_d - b_d) = sum_d (gamma q_d) theta_d - gamma sum_d q_d b_d``."""
    q, gamma = params["skill_mask"], params["discrimination"]
    return gamma[..., None] * q, -gamma * jnp.sum(q * params["difficulty"], axis=-1), ()


def _ability(params):
    return params["ability"]


_COMP = Linear(subject=_ability, item=_comp_item, cell=_binary_cell)
_VEC = Linear(subject=_ability, item=_vec_item, cell=_binary_cell)


def _noncomp_log_pq(params):
    """``log P(y=1)`` and ``log P(y=0)``, the latter with no cancellation.

    ``1 - prod_d s_d = sum_d (1 - s_d) prod_{k<d} s_k`` over the needed skills, so
    ``log P(y=0)`` is a log-sum-exp of exact log-sigmoid terms.
    """
    q = params["skill_mask"]
    z = params["discrimination"] * (params["ability"] - params["difficulty"])
    log_s = -q * softplus(-z)  # log sigmoid(z); skills an item does not need: factor 1
    before = jnp.cumsum(log_s, axis=-1) - log_s
    fail = jnp.where(q > 0, before - softplus(z), -jnp.inf)  # log sigmoid(-z) + before
    return jnp.sum(log_s, axis=-1), jax.scipy.special.logsumexp(fail, axis=-1)


def _noncomp_loglik(params, y, mask):
    log_p, log_q = _noncomp_log_pq(params)
    return y * log_p + (1.0 - y) * log_q


def _linear_expected(linear, params):
    return jax.nn.sigmoid(linear.eta(params)[0])


def _axis(d: int, dims: int, value: float = 1.0) -> tuple[float, ...]:
    return tuple(value if k == d else 0.0 for k in range(dims))


def _symmetries(kind: str, dims: int, signed: bool) -> tuple[Symmetry, ...]:
    """Per-skill moves that leave every cell's likelihood unchanged."""
    out = []
    for d in range(dims):
        e = _axis(d, dims)
        if kind == "comp":
            # alpha_d theta_d: theta_d * k, alpha_d / k (log-alpha shifts by -log k)
            out.append(Symmetry(f"scale_{d}", (("ability", e, 0.0), ("discrimination", 0.0, _axis(d, dims, -1.0)))))
        elif kind == "noncomp":
            out.append(Symmetry(f"shift_{d}", (("ability", 0.0, e), ("difficulty", 0.0, e))))
            out.append(Symmetry(f"scale_{d}", (("ability", e, 0.0), ("difficulty", e, 0.0),
                                               ("discrimination", 0.0, _axis(d, dims, -1.0)))))
        else:
            out.append(Symmetry(f"shift_{d}", (("ability", 0.0, e), ("difficulty", 0.0, e))))
    if kind == "vec":
        a_move = ("discrimination", -1.0, 0.0) if signed else ("discrimination", 0.0, -1.0)
        out.append(Symmetry("scale", (("ability", 1.0, 0.0), ("difficulty", 1.0, 0.0), a_move)))
    return tuple(out)


def _spread(dims: int, width: float = 0.3) -> tuple[float, ...]:
    """Distinct starting values per skill, so skills do not start (and stay) identical."""
    return tuple(float(v) for v in np.linspace(-width, width, dims)) if dims > 1 else (0.0,)


def mirt_model(kind: str, *, dims: int | None = None, q_matrix: Sequence[Sequence[float]] | None = None,
               skills: Sequence[str] | None = None, prior: str = "vague",
               signed_discrimination: bool = False, pin: bool = True) -> ModelSpec:
    """Build a D-skill model: ``kind`` is ``comp``, ``noncomp`` or ``vec``.

    Parameters
    ----------
    dims : number of skills D (exploratory); implied by ``q_matrix`` when given.
    q_matrix : items x skills 0/1 (confirmatory): item n needs skill d where Q[n, d] = 1.
    skills : names of the skills (default ``skill1..skillD``; a Q-matrix file's columns).
    prior : ``vague`` (``theta_d ~ N(0, 1)``, ``b ~ N(0, 10^3)``, ``log alpha ~ N(0, 1)``) or
        ``hierarchical`` (ability and difficulty pool through ``N(mu, 1/u)``).
    signed_discrimination : only ``vec`` (its one discrimination per item may be negative).
    pin : exploratory ``comp`` only: lower-triangular loadings of the first D - 1 items.
    """
    if kind not in MIRT_KINDS:
        raise ModelError(f"unknown multidimensional kind {kind!r}; use one of {', '.join(MIRT_KINDS)}")
    check_family(prior)
    if signed_discrimination and kind != "vec":
        raise ModelError(f"mirt-{kind} keeps discriminations >= 0 (its loadings); "
                         "--signed-discrimination applies to irt-vec only")
    q = None
    if q_matrix is not None:
        q = np.asarray(q_matrix, np.float32)
        if q.ndim != 2 or q.shape[1] < 1 or not np.isin(q, (0, 1)).all():
            raise ModelError("q_matrix must be items x skills of 0/1")
        empty = np.flatnonzero(q.sum(axis=1) == 0)
        if empty.size:
            raise ModelError(f"q_matrix row {int(empty[0])} needs no skill; every item needs at least one")
        if dims is not None and dims != q.shape[1]:
            raise ModelError(f"dims={dims} but the q_matrix has {q.shape[1]} skill columns")
        dims = q.shape[1]
    if dims is None or dims < 1:
        raise ModelError(f"mirt-{kind} needs dims >= 1 or a q_matrix, got dims={dims}")
    skills = tuple(skills) if skills is not None else tuple(f"skill{d + 1}" for d in range(dims))
    if len(skills) != dims or len(set(skills)) != dims:
        raise ModelError(f"need {dims} distinct skill names, got {list(skills)}")

    vec = (dims,)
    item_vec = vec if kind in ("noncomp", "vec") else ()
    params = [replace(p, shape=vec, init=_spread(dims)) if p.name == "ability" else p
              for p in prior_block("ability", "subject", prior, normal(0.0, 1.0))]
    params += [replace(p, shape=item_vec) if p.name == "difficulty" else p
               for p in prior_block("difficulty", "item", prior, normal(0.0, 1e3))]
    if kind == "vec":
        if signed_discrimination:
            params.append(ParamSpec("discrimination", "item", normal(1.0, 1.0), init=1.0, max_step=0.3))
        else:
            params.append(ParamSpec("discrimination", "item", normal(0.0, 1.0), transform="exp", max_step=0.3))
    else:
        params.append(ParamSpec("discrimination", "item", normal(0.0, 1.0), vec, "exp", max_step=0.3))

    if q is not None:
        mask_fn = partial(_fixed_mask, q)
        mode = "confirmatory (Q-matrix)"
    elif kind == "comp" and pin and dims > 1:
        mask_fn = lambda num_subjects, num_items: pinned_mask(num_items, dims)
        mode = "exploratory, rotation pinned by lower-triangular loadings"
    else:
        mask_fn = lambda num_subjects, num_items: np.ones((num_items, dims), np.float32)
        mode = "exploratory"
    linear = {"comp": _COMP, "noncomp": None, "vec": _VEC}[kind]
    if linear is None:
        loglik, expected = _noncomp_loglik, lambda p: jnp.exp(_noncomp_log_pq(p)[0])
    else:
        loglik, expected = None, partial(_linear_expected, linear)  # loglik: linear's
    name = "irt-vec" if kind == "vec" else f"mirt-{kind}"
    initial = None
    if q is None and kind == "comp" and dims > 1:
        initial = lambda y: _svd_start(y, dims, mask_fn, with_loadings=True)
    elif q is None and kind == "noncomp" and dims > 1:
        # abilities only: per-skill difficulties and loadings have no principal-component reading
        initial = lambda y: _svd_start(y, dims, mask_fn, with_loadings=False)
    return ModelSpec(
        name=name,
        kind="binary",
        params=tuple(params),
        loglik=loglik,
        description=f"{name} with {dims} skills ({', '.join(skills)}); {mode}; {prior} priors",
        symmetries=_symmetries(kind, dims, signed_discrimination),
        constants=(Constant("skill_mask", "item", mask_fn,
                            masks=("discrimination",) if kind != "vec" else ()),),
        skills=skills,
        expected=expected,
        initial=initial,
        linear=linear,
    )


def _svd_start(y: np.ndarray, dims: int, mask_fn, with_loadings: bool) -> dict:
    """Start exploratory skills apart: varimax-rotated principal components of the responses.

    Uses the subjects x subjects Gram matrix (never items x items). Abilities start at the
    standardised component scores; loadings (``with_loadings``) at 4x the probability-scale
    loadings (the logistic slope at p = 1/2), floored at 0.05; difficulties at -logit of
    the item means.
    """
    y = np.asarray(y, np.float64)
    obs = y >= 0  # False for -1 and NaN
    mean = np.where(obs, y, 0).sum(axis=0) / np.maximum(obs.sum(axis=0), 1)
    R = np.where(obs, y - mean, 0.0)
    S = R.shape[0]
    evals, U = np.linalg.eigh(R @ R.T)
    top = np.argsort(evals)[::-1][:dims]
    s = np.sqrt(np.maximum(evals[top], 1e-12))
    U = U[:, top]
    L = (R.T @ U) / np.sqrt(S)  # items x dims, probability units per sd of the score
    L, T = rotate(L, "varimax")
    scores = (U * np.sqrt(S)) @ T
    flip = np.where(L.sum(axis=0) < 0, -1.0, 1.0)
    L, scores = L * flip, scores * flip
    q = mask_fn(S, y.shape[1])
    order = []
    for k in range(dims):  # put each pinned item's strongest skill first among the rest
        rest = [c for c in range(dims) if c not in order]
        row = k if k < y.shape[1] else 0
        order.append(max(rest, key=lambda c: L[row, c] * q[row, len(order)] if k < dims - 1 else -c))
    L, scores = L[:, order], scores[:, order]
    p = np.clip(mean, 0.02, 0.98)
    out = {"ability": (scores / np.maximum(scores.std(axis=0), 1e-6)).astype(np.float32)}
    if with_loadings:
        out["discrimination"] = np.log(np.clip(4.0 * L, 0.05, 5.0)).astype(np.float32)
        out["difficulty"] = (-np.log(p / (1 - p))).astype(np.float32)
    return out


def _fixed_mask(q: np.ndarray, num_subjects: int, num_items: int) -> np.ndarray:
    return q


def read_q_matrix(path, items: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Read an items x skills CSV (first column item ids, one 0/1 column per skill).

    With ``items`` the rows are matched to the data's item ids (any order); every data
    item must appear. Returns ``(q, skill_names)``.
    """
    import pandas as pd

    from engine.data.formats.validate import cell_text
    from engine.errors import DataFormatError

    df = pd.read_csv(path)
    if df.shape[1] < 2:
        raise DataFormatError(f"{path}: need an item id column and at least one skill column")
    ids = df.iloc[:, 0].astype(str)
    body = df.iloc[:, 1:]
    values = body.apply(pd.to_numeric, errors="coerce")
    bad = values.isna() | ~values.isin([0, 1])
    if bad.to_numpy().any():
        r, c = np.argwhere(bad.to_numpy())[0]
        raise DataFormatError(f"{path} line {r + 2}, column {body.columns[c]!r}: got "
                              f"{cell_text(body.iat[r, c])}; expected 0 or 1")
    if ids.duplicated().any():
        raise DataFormatError(f"{path}: item {ids[ids.duplicated()].iloc[0]!r} appears twice")
    q = values.to_numpy(np.float32)
    if items is not None:
        pos = pd.Series(np.arange(len(ids)), index=ids.to_numpy())
        missing = [i for i in items if i not in pos.index]
        if missing:
            raise DataFormatError(f"{path}: no row for item {missing[0]!r} ({len(missing)} item(s) missing); "
                                  "give one row per item of the store")
        q = q[pos.loc[list(items)].to_numpy()]
    return q, [str(c) for c in body.columns]


# ---- post-hoc rotation for reading exploratory loadings --------------------------------

def _varimax_gradient(L):
    L2 = L ** 2
    return -L * (L2 - L2.mean(axis=0, keepdims=True)), -np.sum((L2 - L2.mean(axis=0)) ** 2) / 4


def _oblimin_gradient(L, gamma=0.0):
    L2 = L ** 2
    p = L.shape[0]
    centre = np.eye(p) - gamma / p * np.ones((p, p))
    N = np.ones((L.shape[1], L.shape[1])) - np.eye(L.shape[1])
    G = centre @ L2 @ N
    return L * G, np.sum(L2 * G) / 4


def rotate(loadings: np.ndarray, method: str = "varimax", *, max_iter: int = 1000,
           tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Rotate ``(items, D)`` loadings for reading; returns ``(rotated, T)``.

    Gradient projection (Jennrich 2001, 2002): ``varimax`` is orthogonal (abilities read as
    ``theta @ T``), ``oblimin`` (quartimin, gamma = 0) oblique (``rotated = L inv(T).T``,
    abilities ``theta @ T``). Either way ``rotated @ (theta @ T).T == L @ theta.T``.
    """
    if method not in ("varimax", "oblimin"):
        raise ModelError(f"unknown rotation {method!r}; use 'varimax' or 'oblimin'")
    A = np.asarray(loadings, np.float64)
    k = A.shape[1]
    T = np.eye(k)
    if k == 1:
        return A.copy(), T
    oblique = method == "oblimin"
    crit = _oblimin_gradient if oblique else _varimax_gradient
    L = A @ (np.linalg.inv(T).T if oblique else T)
    Gq, f = crit(L)
    G = -(L.T @ Gq @ np.linalg.inv(T)).T if oblique else A.T @ Gq
    alpha = 1.0
    for _ in range(max_iter):
        if oblique:
            Gp = G - T @ np.diag(np.sum(T * G, axis=0))
        else:
            M = T.T @ G
            Gp = G - T @ (M + M.T) / 2
        if np.linalg.norm(Gp) < tol:
            break
        alpha *= 2
        for _ in range(20):
            X = T - alpha * Gp
            if oblique:
                Tt = X / np.sqrt(np.sum(X ** 2, axis=0, keepdims=True))
                Lt = A @ np.linalg.inv(Tt).T
            else:
                U, _, Vt = np.linalg.svd(X)
                Tt = U @ Vt
                Lt = A @ Tt
            Gq_t, ft = crit(Lt)
            if ft < f - 0.5 * np.linalg.norm(Gp) ** 2 * alpha:
                break
            alpha /= 2
        T, L, Gq, f = Tt, Lt, Gq_t, ft
        G = -(L.T @ Gq @ np.linalg.inv(T)).T if oblique else A.T @ Gq
    return L, T
