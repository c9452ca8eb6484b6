"""Model declarations: a model is its parameter blocks plus one per-cell log-likelihood.

Inference, streaming, pmap and read-outs only ever see a ``ModelSpec``; nothing
downstream branches on a model's name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Union

import numpy as np

import jax
import jax.numpy as jnp

from engine.errors import ModelError
from engine.models.priors import Prior

__all__ = ["ParamSpec", "ModelSpec", "Symmetry", "Constant", "Linear", "TRANSFORMS", "Owner"]

Owner = Literal["subject", "item", "global"]

# Unconstrained -> constrained maps. Priors are densities on the unconstrained value.
TRANSFORMS: dict[str, Callable] = {
    "identity": lambda x: x,
    "exp": jnp.exp,
    "sigmoid": jax.nn.sigmoid,
}
# their inverses, on NumPy arrays (constrained -> unconstrained)
_INVERSES: dict[str, Callable] = {
    "identity": lambda x: x,
    "exp": np.log,
    "sigmoid": lambda x: np.log(x) - np.log1p(-x),
}


@dataclass(frozen=True)
class ParamSpec:
    """One parameter block.

    Parameters
    ----------
    name : the constrained name used by ``loglik`` and read-outs (``ability``).
    owner : ``subject`` (one per row), ``item`` (one per column) or ``global``.
    shape : per-owner shape, ``()`` for a scalar, ``(D,)`` for D skills.
    transform : ``identity``, ``exp`` or ``sigmoid`` (unconstrained -> constrained).
    prior : density of the unconstrained value; may reference global parameters.
    init : initial unconstrained location; a tuple of ``shape[-1]`` values gives each
        component its own start (e.g. distinct skills, so they do not move as one).
    in_likelihood : False for hyper-parameters that only enter priors.
    max_step : optional trust region: the largest change of this block's unconstrained
        location per step (tighter than the fit settings' ``max_step`` where a block's
        curvature is far from constant, e.g. a discrimination multiplying the ability).
    """

    name: str
    owner: Owner
    prior: Prior
    shape: tuple[int, ...] = ()
    transform: str = "identity"
    init: Union[float, tuple[float, ...]] = 0.0
    in_likelihood: bool = True
    max_step: float | None = None

    def __post_init__(self):
        if self.owner not in ("subject", "item", "global"):
            raise ModelError(f"parameter {self.name!r}: unknown owner {self.owner!r}")
        if self.transform not in TRANSFORMS:
            raise ModelError(
                f"parameter {self.name!r}: unknown transform {self.transform!r}; "
                f"use one of {sorted(TRANSFORMS)}"
            )

    def full_shape(self, num_subjects: int, num_items: int) -> tuple[int, ...]:
        lead = {"subject": (num_subjects,), "item": (num_items,), "global": ()}[self.owner]
        return lead + tuple(self.shape)

    def constrain(self, x):
        return TRANSFORMS[self.transform](x)

    def unconstrain(self, x):
        """The unconstrained value of a constrained NumPy ``x`` (``constrain``'s inverse)."""
        return _INVERSES[self.transform](np.asarray(x, np.float64))


@dataclass(frozen=True)
class Symmetry:
    """A one-parameter family of moves that leaves the likelihood unchanged.

    Each named block's unconstrained value moves as ``x * exp(t * m) + t * v`` with
    ``(m, v) = moves[name]``; e.g. a common shift of ability and difficulty
    (``m=0, v=1``). For a block with per-owner shape ``(D,)``, ``m`` and ``v`` may be
    tuples of ``D`` values (one per component, e.g. scaling one skill only). Only priors and entropy change along it, so inference can optimise
    ``t`` cheaply each step instead of crawling along the ridge.
    """

    name: str
    moves: tuple[tuple[str, "float | tuple[float, ...]", "float | tuple[float, ...]"], ...]

    def with_hypers(self, params: "tuple[ParamSpec, ...]") -> "Symmetry":
        """The move extended to the hyper-parameters of each pooled block it moves.

        A block ``x ~ N(mu, 1/u)`` moved as ``x exp(t m) + t v`` keeps its prior density
        (with the entropy's ``t m`` per entry) when ``mu`` moves the same way and ``log u``
        by ``-2 t m``. Without that, a scale move of pooled items is pinned by their fixed
        hyper-parameters, and the step crawls along the ridge instead of following it.
        Blocks whose move differs per component are left as they are.
        """
        by_name = {p.name: p for p in params}
        moves, moved = list(self.moves), {m[0] for m in self.moves}
        for name, m, v in self.moves:
            if isinstance(m, tuple) or isinstance(v, tuple):
                continue
            loc, prec = pool_of(by_name[name], by_name)
            if loc is not None and loc not in moved:
                moves.append((loc, m, v))
                moved.add(loc)
            if prec is not None and prec not in moved and m != 0.0:
                moves.append((prec, 0.0, -2.0 * m))
                moved.add(prec)
        return Symmetry(self.name, tuple(moves))

    def plain_moves(self, params: "tuple[ParamSpec, ...]") -> tuple | None:
        """The moves of :meth:`with_hypers` where each is one scalar ``(m, v)`` that scales
        or shifts its block, not both; None where any moves per component or scales and
        shifts at once (its moves by ``t`` and by ``-t`` would not undo each other, and ``t``
        cannot be read back from one block's mean or spread)."""
        moves = self.with_hypers(params).moves
        if any(isinstance(m, tuple) or isinstance(v, tuple) or (m and v) for _, m, v in moves):
            return None
        return moves


def pool_of(param: "ParamSpec", by_name: dict) -> tuple[str | None, str | None]:
    """The globals a block ``x ~ N(mu, 1/u)`` is pooled by: ``(mu, u)``, each named where it
    is a global fitted as itself (``mu``, transform ``identity``) or as its log (``u``,
    transform ``exp``), else None (a prior that is not normal: both None)."""
    prior = param.prior
    if prior.family != "normal":
        return None, None
    loc, prec = prior.loc, prior.precision
    return (loc if isinstance(loc, str) and by_name[loc].transform == "identity" else None,
            prec if isinstance(prec, str) and by_name[prec].transform == "exp" else None)


@dataclass(frozen=True)
class Constant:
    """Fixed per-owner data a model's ``loglik`` reads beside its parameters.

    ``value(num_subjects, num_items)`` returns the full array (leading axis the owner's),
    e.g. a Q-matrix mask of which item loads on which skill. The engine gathers it per
    block like a parameter but never fits or differentiates it.

    ``masks`` names blocks of the same owner and shape that the likelihood only reads
    multiplied by this constant (e.g. loadings under a Q-matrix): read-outs report their
    effective value, zero where the constant is zero.
    """

    name: str
    owner: Owner
    value: Callable[[int, int], np.ndarray] = field(compare=False, repr=False)
    masks: tuple[str, ...] = ()

    def __post_init__(self):
        if self.owner not in ("subject", "item"):
            raise ModelError(f"constant {self.name!r}: owner must be 'subject' or 'item'")


@dataclass(frozen=True)
class Linear:
    """The likelihood reads the parameters through one linear predictor per cell.

    ``eta = sum_d u_d v_d + w`` with ``u = subject(params)`` built from subject blocks (and
    subject constants) only, ``(v, w, extras) = item(params)`` from item blocks (and item
    constants) only, and ``loglik = cell(eta, extras, y, mask)``; ``u`` and ``v`` end in a
    skill axis ``(..., D)``, ``extras`` is a tuple of per-item values that enter the cell
    directly (asymptotes, a precision). Every logistic model and Beta-IRT has this form.

    Declaring it lets inference take a cell's derivatives with respect to ``(eta, extras)``
    only (one tangent plus one per extra) and contract them with ``u`` and ``v`` as
    matrix products, instead of differentiating every parameter in every cell.
    """

    subject: Callable = field(compare=False)
    item: Callable = field(compare=False)
    cell: Callable = field(compare=False)

    def eta(self, params):
        """The predictor and the extras from broadcast-ready constrained ``params``."""
        u = self.subject(params)
        v, w, extras = self.item(params)
        return jnp.sum(u * v, axis=-1) + w, tuple(extras)

    def loglik(self, params, y, mask):
        """Per-cell log-likelihood (the model's ``loglik``)."""
        eta, extras = self.eta(params)
        return self.cell(eta, extras, y, mask)


@dataclass(frozen=True)
class ModelSpec:
    """A model: parameter blocks plus ``loglik(params, y, mask) -> Float[Array, "s n"]``.

    ``loglik`` receives constrained parameters already expanded for broadcasting:
    subject blocks as ``(s, 1, *shape)``, item blocks as ``(1, n, *shape)``, globals
    as ``shape``. It must also work when every block is a per-cell scalar (the
    engine evaluates it cell by cell for derivatives). ``y`` holds the responses
    as float32 with missing cells replaced by a valid value; ``mask`` is 1.0 on
    observed cells. The per-cell value is never reduced.

    Optional declarations (all additive; a model without them behaves as before):

    kind : response kind the model reads: ``binary``, ``unit`` (scores in [0, 1]) or
        ``nonnegative`` (errors); read by the data boundary, never by inference.
    constants : fixed per-owner arrays passed to ``loglik`` under their names.
    skills : names of the components of ``(D,)`` ability blocks.
    expected : ``expected(params) -> E[y]`` per cell (the item characteristic curve).
    adapt : ``adapt(y) -> dict`` of builder options the data calls for (e.g. boundary
        inflation when scores hit 0 or 1 exactly); raises if the data cannot be fitted.
    initial : ``initial(y) -> {name: unconstrained location}``, a data-driven start for
        blocks that would otherwise start symmetric (e.g. exploratory skills).
    linear : a :class:`Linear` declaration; ``loglik`` is then ``linear.loglik`` (leave
        ``loglik`` out), and inference takes the cheaper predictor path (same terms, fewer
        per-cell derivatives). A model declares one of ``loglik`` and ``linear``.
    score : ``score(params) -> per-cell score``, higher is better (e.g. ``expected``, or
        minus an expected error), for models whose ability alone does not order subjects
        (a per-subject boundary probability): read-outs then rank subjects by its average
        over the items (``engine.readout.expected.score_draws``).
    optimizer : the variational optimizer ``FitSettings(optimizer="auto")`` takes for this
        model (``newton`` when None): a likelihood whose posterior has a curved ridge the
        diagonal Newton step stalls on declares ``adam``.
    """

    name: str
    kind: str
    params: tuple[ParamSpec, ...]
    loglik: Callable | None = field(default=None, compare=False, repr=False)
    description: str = ""
    symmetries: tuple[Symmetry, ...] = ()
    constants: tuple[Constant, ...] = ()
    skills: tuple[str, ...] = ()
    expected: Callable | None = field(default=None, compare=False, repr=False)
    adapt: Callable | None = field(default=None, compare=False, repr=False)
    initial: Callable | None = field(default=None, compare=False, repr=False)
    linear: Linear | None = field(default=None, compare=False, repr=False)
    score: Callable | None = field(default=None, compare=False, repr=False)
    optimizer: str | None = None

    def __post_init__(self):
        if self.linear is not None:
            if self.loglik is None:
                object.__setattr__(self, "loglik", self.linear.loglik)
            elif self.loglik != self.linear.loglik:
                raise ModelError(f"model {self.name!r}: declare loglik or linear, not both "
                                 "(with linear, loglik is linear.loglik)")
        elif self.loglik is None:
            raise ModelError(f"model {self.name!r}: declare loglik or linear")
        names = [p.name for p in self.params]
        names += [c.name for c in self.constants]
        if len(set(names)) != len(names):
            raise ModelError(f"model {self.name!r}: duplicate parameter names {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise ModelError(f"model {self.name!r} has no parameter {name!r}; it has {self.names}")

    def draw_prior(self, num_subjects: int, num_items: int, rng) -> dict:
        """One draw of every block from its prior, unconstrained (the globals first, so the
        pooled blocks draw from their drawn location and precision): the truth of a
        simulation-based calibration or a prior predictive check."""
        out, env = {}, {}
        for p in self.by_owner("global") + tuple(q for q in self.params if q.owner != "global"):
            out[p.name] = p.prior.sample(rng, p.full_shape(num_subjects, num_items), env)
            if p.owner == "global":
                env[p.name] = p.constrain(out[p.name])
        return out

    def by_owner(self, owner: Owner) -> tuple[ParamSpec, ...]:
        return tuple(p for p in self.params if p.owner == owner)

    @property
    def likelihood_params(self) -> tuple[ParamSpec, ...]:
        return tuple(p for p in self.params if p.in_likelihood)

    def replace(self, **changes) -> "ModelSpec":
        if "linear" in changes and "loglik" not in changes and self.linear is not None:
            changes["loglik"] = None  # derived from the new linear (or an error without one)
        return dataclasses.replace(self, **changes)

    def constant_values(self, num_subjects: int, num_items: int) -> dict[str, np.ndarray]:
        """Every constant at full size, checked against the owner's count."""
        out = {}
        for c in self.constants:
            v = np.asarray(c.value(num_subjects, num_items))
            want = num_subjects if c.owner == "subject" else num_items
            if v.ndim < 1 or v.shape[0] != want:
                raise ModelError(
                    f"model {self.name!r}: {c.name} has {v.shape[0] if v.ndim else 0} rows but the "
                    f"data has {want} {c.owner}s; give one row per {c.owner}")
            out[c.name] = v
        return out

    def mask_values(self, num_subjects: int, num_items: int,
                    owner: Owner | None = None) -> dict[str, np.ndarray]:
        """``{block: mask}`` (float32, the block's full shape) for the blocks a constant
        masks (``Constant.masks``: a loading the Q-matrix or the rotation pins), of
        ``owner`` where given: the block's effective value is zero where its mask is."""
        declared = self._masking(owner)
        if not declared:
            return {}
        values = self.constant_values(num_subjects, num_items)
        return {name: np.asarray(values[c.name], np.float32) for c in declared for name in c.masks}

    def masks_of(self, values: Mapping[str, Any], *, axis: int,
                 owner: Owner | None = None) -> dict[str, np.ndarray]:
        """:meth:`mask_values` at the counts ``values`` hold (:meth:`counts`, ``axis`` as
        there); ``{}`` for a model without a constant that masks (of ``owner``), whatever
        ``values`` hold (an item bank's guide has no subject block)."""
        if not self._masking(owner):
            return {}
        return self.mask_values(*self.counts(values, axis=axis), owner=owner)

    def _masking(self, owner: Owner | None) -> list:
        """The constants that mask blocks (of ``owner``, where given)."""
        return [c for c in self.constants if c.masks and owner in (None, c.owner)]

    def counts(self, values: Mapping[str, Any], *, axis: int) -> tuple[int, int]:
        """``(num_subjects, num_items)`` read from ``values``' blocks along ``axis`` (0 for
        a guide's values, 2 for draws ``(chains, draws, ...)``); 0 for an owner the model
        has no block of. Every block of an owner there must agree, with ``axis`` leading
        dimensions before it and the block's own shape after; an owner whose blocks are all
        missing from ``values`` is an error, never a count of 0."""
        out = []
        for who in ("subject", "item"):
            blocks = self.by_owner(who)
            found = {}
            for p in blocks:
                if p.name not in values:
                    continue
                shape = np.shape(values[p.name])
                if len(shape) != axis + 1 + len(p.shape):
                    raise ModelError(
                        f"model {self.name!r}: {p.name} has shape {shape}; expected {axis} "
                        f"leading dimensions, then one per {who}, then {p.shape}")
                found[p.name] = int(shape[axis])
            if blocks and not found:
                raise ModelError(f"model {self.name!r}: none of its {who} blocks "
                                 f"({', '.join(p.name for p in blocks)}) is given")
            if len(set(found.values())) > 1:
                raise ModelError(f"model {self.name!r}: its {who} blocks disagree on the "
                                 f"number of {who}s: {found}")
            out.append(next(iter(found.values()), 0))
        return out[0], out[1]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            **({"skills": list(self.skills)} if self.skills else {}),
            "params": [
                {
                    "name": p.name,
                    "owner": p.owner,
                    "shape": list(p.shape),
                    "transform": p.transform,
                    "prior": p.prior.to_dict(),
                }
                for p in self.params
            ],
        }
