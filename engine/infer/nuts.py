"""NUTS on the same ModelSpec log density: the exact reference for the variational fit.

The target is the joint density of the unconstrained parameters: the spec's priors (which
are densities of the unconstrained values, Jacobians included, hyper-parameters too) plus
the per-cell log-likelihood over the observed cells, both from :mod:`engine.infer.elbo`, so
no model is defined twice. Chains run side by side under ``jax.vmap``; each adapts its own
step size and diagonal mass matrix with blackjax's window adaptation, then draws.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engine.errors import ModelError, SettingsError
from engine.exported import Unkeyable, fingerprint, load_or_export, register_structures
from engine.infer.elbo import log_prior, make_log_likelihood
from engine.infer.fit import FitResult
from engine.infer.guide import GuideState, init_guide
from engine.infer.pointwise import cell_loglik_draws
from engine.infer.sampler import sd_standard_error
from engine.memory import size_text, usable_cores
from engine.models.spec import ModelSpec
from engine.versions import installed

__all__ = ["NutsSettings", "NutsDraws", "make_log_density", "make_log_joint", "make_sampler",
           "poolable_blocks", "pooled_blocks", "shrinkage", "shrinkage_restart",
           "sample_nuts", "pool_identical_rows", "nuts_fit_result",
           "nuts_memory_bytes", "check_nuts_memory", "diagnostics", "to_inference_data",
           "add_pointwise", "replicate_binary", "observed_cells",
           "NUTS_CELL_FACTOR"]

# Bytes per response cell and chain that a NUTS gradient holds (the cell's parameters,
# predictor, log-likelihood and their cotangents in float32), plus the matrix itself.
NUTS_CELL_FACTOR = 48

# The default rule for sampling a pooled block standardised (NutsSettings.noncentred_below)
NONCENTRED_ENTRIES = 50
NONCENTRED_SUBJECTS = 30  # item blocks standardised where fewer subjects answer (see NutsSettings)
VAGUE_LOCATION_VARIANCE = 100.0
ANCHOR_ITEMS = 50  # items from which the shift and scale are taken up by the abilities (NutsSettings.anchor)
SHRINKAGE_RESTART = 0.5  # an item block's mean shrinkage from which an unconverged run restarts standardised
# ArviZ's log_likelihood and posterior_predictive groups (add_pointwise): values kept at
# most in each (chains x draws x observed cells; float32 and int8: 160 MiB together), and
# the fewest draws per chain worth keeping
POINTWISE_MAX_VALUES = 1 << 25
POINTWISE_MIN_DRAWS = 100
POINTWISE_CHUNK_VALUES = 1 << 20  # draw-cell log-likelihoods evaluated together


_OPTION = {"num_chains": " (--chains)", "num_samples": " (--samples)", "num_warmup": " (--warmup)",
           "low_rank": " (--low-rank)", "extend": " (--extend)",
           "target_accept": " (--target-accept)"}
_HINT = {"num_chains": "; 4 is usual, R-hat needs at least 2",
         "num_warmup": "; a few hundred adapt the step size and mass matrix"}


@dataclass(frozen=True)
class NutsSettings:
    """How NUTS samples.

    num_chains : chains run side by side (``jax.vmap``); R-hat needs at least 2.
    num_warmup : window-adaptation steps per chain (step size, diagonal mass matrix).
    num_samples : draws kept per chain after warm-up (1,000: with 500, the largest of a
        thousand abilities' R-hats passed 1.01 by chance on LSAT7).
    target_accept : the acceptance rate the step size is adapted to. Raise it (0.95) where
        transitions diverge: OpenML kc2 (19 x 157, 2PL, seed 0, one added round) 466 -> 47
        divergences in 8,000 draws, in 3.2x the time (765 leapfrog steps a draw against
        241), with the same posterior (``mu_discrimination`` 0.678 / 0.666, log
        discriminations' mean 0.696 / 0.698).
    max_tree_depth : at most ``2^max_tree_depth - 1`` leapfrog steps per draw.
    max_rhat : a run is converged only when every parameter's R-hat is at most this.
    init_jitter : chains start at the model's initial values plus ``U(-j, j)`` noise on the
        unconstrained scale, so R-hat compares chains that began apart.
    seed : the one source of randomness.
    memory_budget : bytes NUTS may use (None = a share of the machine's available memory).
    noncentred_below : sample a pooled block (prior ``N(mu, 1/u)`` with ``mu`` and ``u``
        global) with fewer entries than this as ``z = (x - mu) sqrt(u)``: the same posterior
        in other coordinates (:func:`pooled_blocks`); 0 samples every block as it is. None
        (the default) standardises a block with fewer than 50 entries only when its
        location's own prior is vague (variance >= 100, :data:`VAGUE_LOCATION_VARIANCE`: seed
        003's hierarchical family). Under the population family's proper hyper-priors the
        blocks as they are sample faster everywhere measured (2PL, 4 x 1,000 draws): LSAT7
        31 leapfrog steps per draw against 80 standardised and min bulk ESS 1,299 against
        746; 2,000 x 12 23 steps against 127; 30 x 6 no divergences against 6; in
        simulation-based calibration at 100 x 8, 69% of replicates without a divergence
        against 43%. Under vague locations few entries leave a block free to drift (LSAT7's
        five items: R-hat 1.56 and 279 divergences as they are, 1.007 standardised). Where
        fewer than 30 subjects answer (:data:`NONCENTRED_SUBJECTS`) each item's data are
        weak against its pool's prior, the funnel that standardising removes, and every
        pooled item block is standardised (2PL, 4 x 1,000 draws, R-hat / min bulk ESS as
        they are -> standardised: NLU rte 18 x 139 1.023 / 127 -> 1.004 / 661, OpenML kc2
        19 x 157 1.161 / 19.5 -> 1.019 / 305, ilpd 19 x 175 1.377 / 9.4 -> 1.018 / 243; the
        sampler's wall 1.4-1.7x); 30 x 6 above is on the other side.
    low_rank : adapt the mass matrix as a diagonal plus at most this many directions
        (blackjax's ``window_adaptation_low_rank``, the Fisher-divergence metric of nutpie)
        instead of a diagonal alone (0, the default): for posteriors whose parameters move
        together along a few directions, as all abilities and difficulties shift together.
    extend : at most this many rounds of ``num_samples`` more draws per chain while any R-hat
        exceeds ``max_rhat`` (0, the default: the run is what was asked for). Each round goes
        on from where the chains stopped, with their adapted step size and mass matrix, and
        the diagnostics are read from all draws. ``fit``'s ``auto`` samples with 1: at
        4 x 1,000 draws NLU mutual (18 x 443) ended at R-hat 1.012 and OpenML kc2 (19 x 157)
        at 1.019, and with 2,000 draws a chain both converged.
    anchor : the likelihood's symmetries taken up by the abilities (:func:`anchored_moves`), the
        same posterior in other coordinates: ``all`` samples the blocks a common shift or scale
        moves relative to the abilities' mean and to the scale (read from the discriminations'
        pool location where the model has one, else from the abilities' spread),
        ``translations`` the shift alone, ``none`` the blocks as they are. The abilities'
        mean is one coordinate of its own (:func:`_mean_first`). None (the default):
        ``translations`` where an item block is standardised for fewer than 30 subjects, else
        ``all`` where there are at least 50 items (:data:`ANCHOR_ITEMS`), else ``none``.
        Measured (2PL, seed 0, 4 x (500 + 1,000), R-hat / least bulk ESS / steps per draw,
        none -> all with the scale from the abilities' spread): 200 x 400 1.045 / 76 / 24.5 ->
        1.010 / 376 / 28.9, where the shift and scale every item shares were the slow
        directions, and with the scale from ``mu_discrimination`` and the mean as its own
        coordinate 1.006 / 2,130 / 27.3 (seeds 1-2: 1.006 / 1,890-2,330); LSAT7 (5 items)
        1.008 / 923 / 34 -> 1.010 / 634 / 25; OpenML ilpd (19 x 175,
        items standardised) 1.020 / 264 -> 1.159 / 17. Where an item block is standardised for
        fewer than 30 subjects the default is ``translations`` (``none`` where it is
        standardised for another reason: not measured): the items follow their pool's location,
        and the slowest direction left was that location shifting with every ability (4 x 1,000
        draws, R-hat / least bulk ESS, none -> translations): OpenML kc2 (19 x 157) 1.035 / 181
        -> 1.017 / 207, and after ``auto``'s one added round 1.033 / 225 -> 1.009 / 592; ilpd
        (one round added) 1.010 / 469 -> 1.010 / 712; NLU mutual 1.007 / 288 -> 1.006 / 514, rte
        1.011 / 531 -> 1.009 / 528, cb 1.010 / 866 -> 1.006 / 1,089, copa 1.004 / 1,181 -> 1.005
        / 912, wsc 1.005 / 1,508 -> 1.004 / 1,466.
    standardise : sample exactly these pooled blocks standardised (a tuple of names), in
        place of ``noncentred_below``'s rule; None (the default): that rule. Set by the
        default rule's restart (:func:`shrinkage_restart`): where a run at 30 subjects or
        more and 50 items or more ends unconverged with its item blocks as they are, and an
        item block's draws are mostly its pool's prior (mean shrinkage ``u Var(x_i | y)``
        within chains, over 0.5, :data:`SHRINKAGE_RESTART`), it samples again from the start
        with every pooled item block standardised (and any block the rule had standardised),
        the scale read from the discriminations' pool location: a second full run, so up to
        twice the time. Named blocks take both symmetries up at 30 subjects or more and 50
        items or more, and the ``anchor`` default's rule otherwise.
    chain_threads : host threads the chains are split over, each running the same compiled
        sampler on its share (must divide ``num_chains``). None (the default): on a CPU,
        the largest divisor of ``num_chains`` up to the cores this process may use, because
        XLA runs a small matrix's operations on one core (LSAT7's 4 chains in one program
        kept one of two cores busy); one thread on an accelerator, which runs every chain
        in one program.
    """

    num_chains: int = 4
    num_warmup: int = 500
    num_samples: int = 1000
    target_accept: float = 0.8
    max_tree_depth: int = 10
    max_rhat: float = 1.01
    init_jitter: float = 1.0
    seed: int = 0
    memory_budget: int | None = None
    noncentred_below: int | None = None
    chain_threads: int | None = None
    low_rank: int = 0
    extend: int = 0
    anchor: str | None = None
    standardise: tuple | None = None

    def __post_init__(self):
        for name, low in (("num_chains", 1), ("num_samples", 1), ("max_tree_depth", 1),
                          ("num_warmup", 0), ("noncentred_below", 0), ("chain_threads", 1),
                          ("low_rank", 0), ("extend", 0)):
            value = getattr(self, name)
            if name in ("noncentred_below", "chain_threads") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise SettingsError(f"NUTS setting {name}={value!r}{_OPTION.get(name, '')}: must "
                                    f"be an integer >= {low}{_HINT.get(name, '')}")
        if self.standardise is not None and (
                not isinstance(self.standardise, (tuple, list))
                or not all(isinstance(n, str) for n in self.standardise)):
            raise SettingsError(f"NUTS setting standardise={self.standardise!r}: must be None "
                                f"(the default rule) or a tuple of pooled block names")
        if self.standardise is not None and self.noncentred_below is not None:
            raise SettingsError(
                f"NUTS settings standardise={self.standardise!r} and noncentred_below="
                f"{self.noncentred_below!r}: give one of them (standardise names the blocks "
                f"outright, noncentred_below sets the rule that picks them)")
        if self.standardise is not None:
            object.__setattr__(self, "standardise", tuple(sorted(set(self.standardise))))
        if self.anchor not in (None, "all", "translations", "none"):
            raise SettingsError(f"NUTS setting anchor={self.anchor!r}: must be None (the "
                                f"default rule), 'all', 'translations' or 'none'")
        if self.chain_threads is not None and self.num_chains % self.chain_threads:
            raise SettingsError(f"NUTS setting chain_threads={self.chain_threads}: must divide "
                                f"num_chains={self.num_chains} (--chains)")
        if not 0.0 < self.target_accept < 1.0:
            raise SettingsError(f"NUTS setting target_accept={self.target_accept!r}"
                                f"{_OPTION['target_accept']}: must be in (0, 1), e.g. 0.8, or "
                                f"0.95 where transitions diverge")
        if not self.max_rhat >= 1.0:
            raise SettingsError(f"NUTS setting max_rhat={self.max_rhat!r}: must be >= 1, e.g. 1.01")
        if not self.init_jitter >= 0.0:
            raise SettingsError(f"NUTS setting init_jitter={self.init_jitter!r}: must be >= 0")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise SettingsError(f"NUTS setting memory_budget={self.memory_budget!r}: must be a "
                                f"positive number of bytes")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "NutsSettings":
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SettingsError(f"unknown NUTS settings {sorted(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> "NutsSettings":
        return dataclasses.replace(self, **changes)


class NutsDraws(NamedTuple):
    """Unconstrained draws ``(chains, samples, *full_shape)`` per block, with per-draw stats."""

    position: dict
    diverging: jax.Array  # (chains, samples) bool
    acceptance_rate: jax.Array
    num_steps: jax.Array  # leapfrog steps per draw
    logdensity: jax.Array
    step_size: jax.Array  # (chains,) adapted step size
    last: dict | None = None  # (chains, *full_shape) per block: where each chain stopped, in
    inverse_mass_matrix: object = None  # the sampler's coordinates, and its adapted metric
    energy: jax.Array | None = None  # (chains, samples) Hamiltonian at each draw (ArviZ's BFMI)


register_structures(NutsDraws)  # the sampler's exported programs return them


def _check_model(spec: ModelSpec) -> None:
    if not spec.params:
        raise ModelError(f"model {spec.name!r} has no continuous parameters, so NUTS has nothing "
                         f"to sample; use a model with continuous parameter blocks")


def _vague_location(spec: ModelSpec, loc) -> bool:
    """Whether a pooled block's location is a global with a vague normal prior."""
    if not isinstance(loc, str):
        return False
    prior = spec.param(loc).prior
    if prior.family != "normal":
        return False
    if prior.precision is not None:  # N(m, 1/precision)
        return (not isinstance(prior.precision, str)
                and 1.0 / prior.precision >= VAGUE_LOCATION_VARIANCE)
    return (prior.variance is not None and not isinstance(prior.variance, str)
            and prior.variance >= VAGUE_LOCATION_VARIANCE)


def poolable_blocks(spec: ModelSpec) -> dict[str, tuple]:
    """Every subject or item block whose prior is normal with a global precision (the
    hierarchical and population families): name -> (loc, precision), each a number or a
    global's name."""
    return {p.name: (p.prior.loc, p.prior.precision) for p in spec.params
            if p.owner != "global" and p.prior.family == "normal"
            and isinstance(p.prior.precision, str)}


def pooled_blocks(spec: ModelSpec, num_subjects: int, num_items: int,
                  below: int | None, names: tuple | None = None) -> dict[str, tuple]:
    """The :func:`poolable_blocks` with fewer than ``below`` entries. ``below=None``: fewer
    than :data:`NONCENTRED_ENTRIES` entries and a vague location, or an item block answered
    by fewer than :data:`NONCENTRED_SUBJECTS` subjects (:class:`NutsSettings`). ``names``
    (``NutsSettings.standardise``): exactly these blocks, each of which must be pooled."""
    poolable = poolable_blocks(spec)
    if names is not None:
        unknown = sorted(set(names) - set(poolable))
        if unknown:
            raise SettingsError(f"NUTS setting standardise names {unknown}, which are not "
                                f"pooled blocks of model {spec.name!r} (those are "
                                f"{sorted(poolable)})")
        return {n: poolable[n] for n in names}
    out = {}
    for name, (loc, precision) in poolable.items():
        p = spec.param(name)
        count = {"subject": num_subjects, "item": num_items}.get(p.owner, 0) * int(np.prod(p.shape))
        if below is None:
            chosen = ((count < NONCENTRED_ENTRIES and _vague_location(spec, loc))
                      or (p.owner == "item" and num_subjects < NONCENTRED_SUBJECTS))
        else:
            chosen = count < below
        if chosen:
            out[name] = (loc, precision)
    return out


class Anchored(NamedTuple):
    """One of the likelihood's symmetries taken up by one block (:func:`anchored_moves`)."""

    anchor: str  # a scalar subject block, or a global (kind value); the same in both coordinates
    kind: str  # "mean" (a translation) or "log_sd" (a scale)
    per: float  # the anchor's own v (mean) or m (log_sd)
    moves: dict  # block -> (m, v): its value is z exp(t m) + t v


def anchored_moves(spec: ModelSpec, num_subjects: int, pooled: dict,
                   which: str = "all") -> tuple[Anchored, ...]:
    """The symmetries the sampler takes up in the abilities: scales first, then translations.

    A :class:`Symmetry` (with the pool globals it carries, :meth:`Symmetry.with_hypers`) moves
    each block as ``x exp(t m) + t v``. Where one scalar subject block (the anchor, not
    standardised) is moved by a translation (every ``m`` 0) or a pure scale (its ``v`` 0, and
    no block both scaled and shifted), each other block it moves is sampled as ``z`` with
    ``x = z exp(t m) + t v`` at ``t`` read from the anchor: ``mean / v`` or ``log sd / m``.
    Moving the anchor along the symmetry then moves ``t`` by as much, so in the sampler's
    coordinates the symmetry moves the anchor alone, and the direction every block shares
    (all abilities and difficulties shifting, or the abilities' spread against the
    discriminations) is the anchor's own, not one a diagonal mass matrix must find among
    hundreds of blocks. Standardised blocks (``pooled``) are left out: they follow their
    location and precision, which move. The map is a bijection, triangular in the anchor,
    with ``log |det| = t * sum(m)`` over the moved entries, so the posterior is the same.

    Under ``"all"``, a scale that only shifts one pool location (a scalar global that some
    block's normal prior is centred on: the 2PL's ``mu_discrimination``) is read from that
    number instead (kind ``value``, ``t = value / v``), and it moves the abilities with the
    items; a standardised block centred there follows it, so the map stays exact (3PL at
    50 x 1,000, the items standardised, seed 0: R-hat 1.0088 with the scale from the
    abilities' spread, 1.0051-1.0069 from ``mu_discrimination``). It comes first, so a
    translation's mean is read from the abilities after they are scaled; no other symmetry
    may move it. 2PL at 200 x 400, seeds
    0-2, with :func:`_mean_first`: R-hat 1.012 (``mu_discrimination``) -> 1.006, least bulk
    ESS 155-272 -> 1,890-2,330; without the reflection R-hat 1.009, least ESS 227 (seed 0).
    ``which``: ``"all"``, ``"translations"`` or ``"none"``."""
    if which == "none":
        return ()
    by_name = {p.name: p for p in spec.params}
    scalar = lambda n: by_name[n].owner == "subject" and by_name[n].shape == () and n not in pooled
    locations = {p.prior.loc for p in spec.params if p.prior.family == "normal"
                 and isinstance(p.prior.loc, str)
                 and by_name[p.prior.loc].owner == "global" and by_name[p.prior.loc].shape == ()}
    found = []
    for sym in spec.symmetries:
        moves = sym.plain_moves(spec.params)
        if moves is None:
            continue
        if all(m == 0.0 for _, m, _ in moves):
            kind, anchors = "mean", [(n, v) for n, _, v in moves if scalar(n) and v != 0.0]
        elif which == "all" and num_subjects >= 2:
            # a pool's location that the scale only shifts (the log discriminations'):
            # the scale read from that one number; else from the abilities' spread
            value = [(n, v) for n, m, v in moves if n in locations and m == 0.0 and v != 0.0]
            kind, anchors = (("value", value) if len(value) == 1 else
                             ("log_sd", [(n, m) for n, m, v in moves if scalar(n) and m != 0.0]))
        else:
            continue
        if len(anchors) != 1:
            continue
        anchor, per = anchors[0]
        rest = {n: (float(m), float(v)) for n, m, v in moves
                if n != anchor and n not in pooled and (m, v) != (0.0, 0.0)}
        found.append(Anchored(anchor, kind, float(per), rest))
    anchors = {a.anchor for a in found}
    if any(a.kind != "value" and anchors & set(a.moves) for a in found):
        return ()  # an anchor moved by another symmetry: not triangular, left as it is
    return tuple(sorted(found, key=lambda a: a.kind == "mean"))


class Coordinates(NamedTuple):
    """The sampler's coordinates: ``pooled`` blocks standardised (:func:`pooled_blocks`),
    ``anchored`` symmetries taken up by the abilities (:func:`anchored_moves`)."""

    pooled: dict
    anchored: tuple


def default_anchor(spec: ModelSpec, num_subjects: int, num_items: int, pooled: dict) -> str:
    """``NutsSettings.anchor=None``: where an item block is standardised, ``translations``
    if that is for fewer than :data:`NONCENTRED_SUBJECTS` subjects and ``none`` otherwise
    (a vague location, or ``noncentred_below``: not measured); else ``all`` where there are
    at least :data:`ANCHOR_ITEMS` items, ``none`` otherwise (see ``NutsSettings``)."""
    if any(spec.param(n).owner == "item" for n in pooled):
        return "translations" if num_subjects < NONCENTRED_SUBJECTS else "none"
    return "all" if num_items >= ANCHOR_ITEMS else "none"


def coordinates_summary(coords: Coordinates) -> dict:
    """What fit.json records of the sampler's coordinates: the standardised blocks and each
    symmetry taken up (its anchor, how ``t`` is read, the blocks it moves)."""
    return {"standardised": sorted(coords.pooled),
            "anchored": [{"anchor": a.anchor, "kind": a.kind, "moves": sorted(a.moves)}
                         for a in coords.anchored]}


def sampler_coordinates(spec: ModelSpec, num_subjects: int, num_items: int,
                        settings: "NutsSettings") -> Coordinates:
    """The coordinates NUTS samples ``spec`` in for this shape and these settings."""
    pooled = pooled_blocks(spec, num_subjects, num_items, settings.noncentred_below,
                           settings.standardise)
    which = settings.anchor or (
        # blocks named (the restart's): both symmetries where the rule would sample the items
        # as they are, the measured shift alone below 30 subjects
        ("all" if num_items >= ANCHOR_ITEMS else "none")
        if settings.standardise is not None and num_subjects >= NONCENTRED_SUBJECTS
        else default_anchor(spec, num_subjects, num_items, pooled))
    return Coordinates(pooled, anchored_moves(spec, num_subjects, pooled, which))


def _anchor_t(a: Anchored, values: dict):
    """The symmetry's position ``t`` read from the anchor (its owner axis is its last)."""
    x = values[a.anchor]
    if a.kind == "value":
        return x / a.per
    if a.kind == "mean":
        return jnp.mean(x, axis=-1) / a.per
    return jnp.log(jnp.std(x, axis=-1)) / a.per


def _anchor(coords: Coordinates, values: dict, inverse: bool = False) -> tuple[dict, jax.Array]:
    """``values`` moved by the anchored symmetries (sampler -> model coordinates, the
    translations' anchors reflected first, :func:`_mean_first`; ``inverse``: back), and the
    forward map's ``log |det|``. Leading axes (chains, draws) are carried."""
    out, log_jac = (dict(values) if inverse else _mean_first(coords, values)), jnp.float32(0.0)
    for a in (reversed(coords.anchored) if inverse else coords.anchored):
        t = _anchor_t(a, out)  # the anchor is the same in both coordinates
        for name, (m, v) in a.moves.items():
            tw = _widen(t, out[name])
            if inverse:
                out[name] = (out[name] - tw * v) * jnp.exp(-tw * m)
            else:
                out[name] = out[name] * jnp.exp(tw * m) + tw * v
                log_jac = log_jac + jnp.sum(tw * m * jnp.ones_like(out[name]))
    return (_mean_first(coords, out) if inverse else out), log_jac


def _mean_first(coords: Coordinates, values: dict) -> dict:
    """``values`` with each translation's anchor reflected along its owner axis (its last):
    the Householder reflection that swaps the first unit vector with ``1 / sqrt(n)``, so that
    the block's first coordinate is ``sqrt(n)`` times its mean and the others are orthogonal
    to it. The reflection is its own inverse, orthogonal (``log |det| = 0``) and linear.

    The translation moves every block with the anchor's mean (:func:`anchored_moves`), and
    that mean is a direction of all the abilities together, whose posterior sd (about ``1 /
    sqrt(n)`` from the abilities' prior) is not what one ability's says; a diagonal mass
    matrix adapts one scale per coordinate, so in these coordinates it adapts the shift's
    own. 2PL at 200 x 400, seeds 0-2: the least bulk ESS of ``mu_difficulty`` 155-272 ->
    4,400-8,600, of the abilities 284-485 -> 830-1,100."""
    out = dict(values)
    for name in {a.anchor for a in coords.anchored if a.kind == "mean"}:
        x = out[name]
        n = x.shape[-1]
        if n < 2:
            continue
        u = np.full(n, -1.0 / np.sqrt(n))
        u[0] += 1.0
        u = jnp.asarray(u / np.linalg.norm(u), x.dtype)
        out[name] = x - 2.0 * u * jnp.sum(u * x, axis=-1, keepdims=True)
    return out


def _widen(v, like):
    """``v`` with trailing axes so that it broadcasts against ``like`` from the left."""
    v = jnp.asarray(v)
    return v.reshape(v.shape + (1,) * (jnp.ndim(like) - v.ndim))


def _loc_scale(spec: ModelSpec, pooled: dict, values: dict) -> dict:
    """Each pooled block's prior location and sd, from the globals in ``values`` (either
    coordinate system: the globals are the same in both), widened to the block's shape."""
    env = {p.name: p.constrain(values[p.name]) for p in spec.params if p.owner == "global"}
    get = lambda a: env[a] if isinstance(a, str) else a
    return {name: (_widen(get(loc), values[name]), 1.0 / jnp.sqrt(_widen(get(prec), values[name])))
            for name, (loc, prec) in pooled.items()}


def _centre(spec: ModelSpec, coords: Coordinates, z: dict) -> tuple[dict, jax.Array]:
    """The model's unconstrained values from sampler coordinates ``z`` (anchored symmetries
    taken up, :func:`anchored_moves`, then pooled blocks as standardised ``(x - mu) sqrt(u)``
    about their moved globals), and ``log |dx / dz|`` summed. Leading axes (chains, draws)
    are carried through."""
    x, log_jac = _anchor(coords, z)
    for name, (loc, scale) in _loc_scale(spec, coords.pooled, x).items():
        x[name] = loc + z[name] * scale
        log_jac = log_jac + jnp.sum(jnp.log(scale) * jnp.ones_like(z[name]))
    return x, log_jac


def _standardise(spec: ModelSpec, coords: Coordinates, x: dict) -> dict:
    """Sampler coordinates of the model's unconstrained values ``x`` (inverse of
    :func:`_centre`)."""
    z = dict(x)
    for name, (loc, scale) in _loc_scale(spec, coords.pooled, x).items():
        z[name] = (x[name] - loc) / scale
    return _anchor(coords, z, inverse=True)[0]


def make_log_density(spec: ModelSpec, num_subjects: int, num_items: int) -> Callable:
    """``log_density(z, y) -> scalar``: log prior plus log-likelihood of a whole matrix ``y``
    (int8 with -1 missing, or float32 with NaN missing) at unconstrained ``z``; the data is an
    argument, so one compiled program serves every matrix of this shape."""
    _check_model(spec)
    loglik = make_log_likelihood(spec, num_subjects, num_items)
    whole = slice(None)  # every row and column: no gather, so no scatter in the gradient

    def log_density(z, y):
        return log_prior(spec, z) + loglik(z, whole, whole, y)

    return log_density


def make_log_joint(spec: ModelSpec, y: np.ndarray) -> Callable:
    """``log_joint(z) -> scalar``: :func:`make_log_density` at the matrix ``y``."""
    log_density = make_log_density(spec, *np.shape(y))
    yd = jnp.asarray(y)
    return lambda z: log_density(z, yd)


def nuts_memory_bytes(spec: ModelSpec, num_subjects: int, num_items: int,
                      settings: NutsSettings) -> int:
    """Bytes NUTS needs: per-cell gradient temporaries for every chain, plus the draws kept
    (unconstrained and constrained, float32), the responses, and the observed cells,
    pointwise log-likelihood (float32) and replicated responses (int8) of ArviZ's groups
    (:func:`add_pointwise`)."""
    cells = num_subjects * num_items
    size = sum(int(np.prod(p.full_shape(num_subjects, num_items))) for p in spec.params)
    kept = settings.num_chains * settings.num_samples * (1 + settings.extend)
    # the groups' per-cell coordinates (cell, subject_index, item_index: 16 bytes in each
    # of three) and observed values, then float32 log-likelihoods and int8 replicates
    pointwise = 52 * cells + 5 * min(POINTWISE_MAX_VALUES, cells * kept)
    return cells * 4 + cells * NUTS_CELL_FACTOR * settings.num_chains + 2 * 4 * size * kept \
        + pointwise


def check_nuts_memory(spec: ModelSpec, num_subjects: int, num_items: int,
                      settings: NutsSettings, budget: int) -> int:
    """Refuse a matrix NUTS cannot hold in ``budget`` bytes; returns the estimate."""
    need = nuts_memory_bytes(spec, num_subjects, num_items, settings)
    if need > budget:
        raise SettingsError(
            f"NUTS on {num_subjects} x {num_items} responses ({num_subjects * num_items:,} cells, "
            f"{settings.num_chains} chains x {settings.num_samples} draws) needs about "
            f"{size_text(need)} in memory, over the budget of {size_text(budget)}; fit it with the "
            f"default variational method (--method vi, which streams any size), or lower "
            f"--chains/--samples, or "
            f"raise --memory-budget")
    return need


def _initial_positions(spec: ModelSpec, y: np.ndarray, settings: NutsSettings, key) -> dict:
    """Each chain's start: the model's initial values (its data-driven start where it declares
    one) plus uniform jitter, in the sampler's coordinates (:func:`_centre`)."""
    loc = dict(init_guide(spec, *y.shape).loc)
    if spec.initial is not None:
        loc.update({k: np.asarray(v, np.float32) for k, v in spec.initial(y).items()})
    coords = sampler_coordinates(spec, *np.shape(y), settings)
    if not settings.init_jitter > 0.0 and any(a.kind == "log_sd" for a in coords.anchored):
        raise SettingsError(f"NUTS setting init_jitter=0 with anchor={settings.anchor!r}, which "
                            f"at {np.shape(y)[1]} items takes up the scale: every chain would "
                            f"start with all abilities at one value, where their spread, which "
                            f"the scale is read from, is 0; use init_jitter > 0, or "
                            f"anchor='translations' or 'none'")
    if coords.pooled:
        start = {k: jnp.asarray(v, jnp.float32) for k, v in loc.items()}
        plain = coords._replace(anchored=())
        loc = {k: np.asarray(v) for k, v in _standardise(spec, plain, start).items()}
    keys = jax.random.split(key, len(loc))
    out = {}
    for k, (name, v) in zip(keys, sorted(loc.items())):
        shape = (settings.num_chains,) + v.shape
        noise = jax.random.uniform(k, shape, jnp.float32, -1.0, 1.0) * settings.init_jitter
        out[name] = jnp.asarray(v, jnp.float32)[None] + noise
    # the anchored symmetries are taken up from the jittered abilities: a scale's ``log sd``
    # needs abilities that differ (the model's start puts them all at one value)
    return _anchor(coords, out, inverse=True)[0] if coords.anchored else out


def _target(spec: ModelSpec, num_subjects: int, num_items: int, settings: NutsSettings):
    """``(target_at(z, y), coords)``: the log density in the sampler's coordinates
    (:func:`sampler_coordinates`, :func:`_centre`), Jacobian included."""
    log_density = make_log_density(spec, num_subjects, num_items)
    coords = sampler_coordinates(spec, num_subjects, num_items, settings)

    def target_at(z, y):
        x, log_jac = _centre(spec, coords, z)
        return log_density(x, y) + log_jac

    return target_at, coords


def _draw_chain(spec: ModelSpec, coords: Coordinates, settings: NutsSettings, target, key, state,
                params) -> NutsDraws:
    """``settings.num_samples`` NUTS draws of one chain from ``state`` with adapted
    ``params`` (step size, inverse mass matrix), in the model's own coordinates."""
    import blackjax

    kernel = blackjax.nuts(target, params["step_size"], params["inverse_mass_matrix"],
                           max_num_doublings=settings.max_tree_depth)

    def body(state, k):
        state, info = kernel.step(k, state)
        return state, (state.position, info.is_divergent, info.acceptance_rate,
                       info.num_integration_steps, state.logdensity, info.energy)

    last, out = jax.lax.scan(body, state, jax.random.split(key, settings.num_samples))
    position = _centre(spec, coords, out[0])[0]  # the model's own coordinates
    return NutsDraws(position, *out[1:5], params["step_size"], last.position,
                     params["inverse_mass_matrix"], out[5])


def make_sampler(spec: ModelSpec, num_subjects: int, num_items: int,
                 settings: NutsSettings) -> Callable:
    """``sample(y, keys, positions) -> NutsDraws`` for all chains at once, jitted once for
    this shape: a new matrix of the same shape and dtype reuses the compiled program (the
    data is an argument, not a constant of the program).

    ``keys`` is ``(chains, 2)``, ``positions`` each chain's unconstrained start per block
    (:func:`_initial_positions`). Each chain adapts its own step size and diagonal mass
    matrix (blackjax window adaptation), then draws.
    """
    import blackjax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    target_at, coords = _target(spec, num_subjects, num_items, settings)

    def sample(y, keys, positions):
        target = lambda z: target_at(z, y)
        if settings.low_rank:
            from blackjax.adaptation.low_rank_adaptation import window_adaptation_low_rank

            warmup = window_adaptation_low_rank(
                blackjax.nuts, target, max_rank=settings.low_rank,
                target_acceptance_rate=settings.target_accept,
                max_num_doublings=settings.max_tree_depth)  # its own info function: no buffers
        else:
            warmup = blackjax.window_adaptation(
                blackjax.nuts, target, target_acceptance_rate=settings.target_accept,
                adaptation_info_fn=get_filter_adapt_info_fn(),  # no per-step warm-up history
                max_num_doublings=settings.max_tree_depth)

        def one_chain(key, position):
            warm_key, draw_key = jax.random.split(key)
            if settings.num_warmup > 0:
                (state, params), _ = warmup.run(warm_key, position, num_steps=settings.num_warmup)
            else:
                state = blackjax.nuts.init(position, target)
                size = sum(v.size for v in jax.tree.leaves(position))
                params = {"step_size": jnp.float32(0.1), "inverse_mass_matrix": jnp.ones(size)}
            return _draw_chain(spec, coords, settings, target, draw_key, state, params)

        return jax.vmap(one_chain)(keys, positions)

    return jax.jit(sample)


def make_continuation(spec: ModelSpec, num_subjects: int, num_items: int,
                      settings: NutsSettings) -> Callable:
    """``more(y, keys, last, step_size, inverse_mass_matrix) -> NutsDraws``: each chain's
    next ``settings.num_samples`` draws from where it stopped (``NutsDraws.last``), with the
    step size and metric its warm-up adapted; jitted once for this shape."""
    import blackjax

    target_at, coords = _target(spec, num_subjects, num_items, settings)

    def more(y, keys, last, step_size, inverse_mass_matrix):
        target = lambda z: target_at(z, y)

        def one_chain(key, position, step, metric):
            state = blackjax.nuts.init(position, target)
            return _draw_chain(spec, coords, settings, target, key, state,
                               {"step_size": step, "inverse_mass_matrix": metric})

        return jax.vmap(one_chain)(keys, last, step_size, inverse_mass_matrix)

    return jax.jit(more)


def chain_threads(settings: NutsSettings) -> int:
    """Host threads the chains run in (:attr:`NutsSettings.chain_threads`, resolved)."""
    if settings.chain_threads is not None:
        return settings.chain_threads
    if jax.default_backend() != "cpu":
        return 1
    top = max(1, min(usable_cores(), settings.num_chains))
    return max(g for g in range(1, top + 1) if settings.num_chains % g == 0)


_LAPACK: dict[int, tuple[object, bool]] = {}  # id(sampler) -> (sampler, calls LAPACK)


def _calls_lapack(jitted, lowered) -> bool:
    """Whether ``lowered`` calls LAPACK; decided once per sampler (rendering the program's
    text costs, and an SBC loop calls one sampler hundreds of times)."""
    hit = _LAPACK.get(id(jitted))
    if hit is None or hit[0] is not jitted:
        if len(_LAPACK) >= 16:
            _LAPACK.pop(next(iter(_LAPACK)))
        hit = _LAPACK[id(jitted)] = (jitted, "lapack_" in lowered.as_text())
    return hit[1]


def _shares(args: tuple, threads: int) -> list[tuple]:
    """Each thread's consecutive share of the chains: ``args`` (each a pytree whose leaves
    lead with the chain axis) sliced along that axis."""
    per = jax.tree.leaves(args)[0].shape[0] // threads
    return [jax.tree.map(lambda v: v[i * per:(i + 1) * per], args) for i in range(threads)]


def _run_shares(program, y, shares: list[tuple]) -> NutsDraws:
    """``program(y, *share)`` for each share, in its own host thread where there are
    several (XLA releases the GIL while it runs), the chains joined again on the host."""
    run = lambda share: jax.device_get(program(y, *share))
    if len(shares) == 1:
        return run(shares[0])
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(shares)) as pool:
        parts = list(pool.map(run, shares))
    return jax.tree.map(lambda *v: np.concatenate(v, axis=0), *parts)


# what a sampler's program returns, in its exported program's key: a trace written before
# the draws kept their energy returns fewer outputs and is not read
_OUTPUTS = "outputs=energy"

# settings a compiled sampler does not depend on: left out of its exported program's key
_OUTSIDE_PROGRAM = {"seed": 0, "memory_budget": None, "chain_threads": None, "extend": 0,
                    "max_rhat": 1.01, "init_jitter": 1.0}


def _traced(name: str, spec: ModelSpec, settings: NutsSettings, jitted: Callable,
            args: tuple) -> Callable:
    """``jitted`` (:func:`make_sampler`, :func:`make_continuation`) as its ``jax.export``
    program for ``args``' shapes, kept in the compilation cache's traces folder
    (:func:`engine.exported.load_or_export`): a later process of the same model, shape and
    settings reads the trace instead of tracing blackjax's adaptation and the tree building
    again (cb, 18 x 28: 3.6 s of tracing and lowering against 0.15 s). ``jitted`` itself
    where the model cannot be keyed (a function from outside ``engine``), the cache is off
    or the program does not export. The key adds blackjax's version, whose code the program
    holds. A low-rank metric (``low_rank``) is a structure that does not serialize: that
    sampler is not exported."""
    if settings.low_rank:
        return jitted
    try:
        parts = [name, fingerprint(spec), fingerprint(settings.replace(**_OUTSIDE_PROGRAM)),
                 f"blackjax={installed('blackjax')}", _OUTPUTS]
    except Unkeyable:
        return jitted
    exp = load_or_export(name, parts, jitted, list(args))
    return jitted if exp is None else jax.jit(exp.call)


def _seed_keys(settings: NutsSettings) -> tuple:
    """``(init_key, chain_key)`` from the seed: the chains' starts, and their draws (the
    first round's and, folded with the round, each added round's)."""
    return tuple(jax.random.split(jax.random.PRNGKey(settings.seed)))


def sample_nuts(spec: ModelSpec, y: np.ndarray, settings: NutsSettings, *,
                sampler: Callable | None = None) -> tuple[NutsDraws, dict]:
    """Draw from the exact posterior of ``spec`` given the whole matrix ``y``.

    The chains are split over :func:`chain_threads` host threads, each calling one compiled
    sampler on its share; a chain's draws do not depend on the split (its key and start
    are its own; the same up to float rounding, since XLA may vectorise a share of another
    size differently). A low-rank sampler, or a program that calls LAPACK, runs in one
    thread. ``timings["chain_threads"]`` says how many ran.

    ``sampler`` (from :func:`make_sampler` for ``y``'s shape and these settings) is reused
    when given, so many matrices of one shape compile once; its first call then compiles
    inside ``wall_s`` (``compile_s`` is 0).

    Returns
    -------
    (draws, timings) : host arrays; timings hold ``wall_s`` and ``compile_s``.
    """
    start = time.perf_counter()
    _check_model(spec)
    init_key, chain_key = _seed_keys(settings)
    positions = _initial_positions(spec, y, settings, init_key)
    keys = jax.random.split(chain_key, settings.num_chains)
    yd = jnp.asarray(y)
    # LAPACK called from two threads at once hung (blackjax's low-rank adaptation on the
    # CPU), so a low-rank sampler, or any program found to call LAPACK, runs in one thread;
    # so does a passed sampler already compiled for one chain count (no ``lower``)
    threads = 1 if settings.low_rank else chain_threads(settings)
    plain = sampler if sampler is not None else make_sampler(spec, *np.shape(y), settings)

    def program(shares):  # the sampler for one share's shapes, exported where it can be
        return plain if sampler is not None else _traced(
            "nuts-sampler", spec, settings, plain, (yd, *shares[0]))

    shares = _shares((keys, positions), threads)
    jitted, lowered = program(shares), None
    if threads > 1 and not hasattr(jitted, "lower"):
        threads = 1
    elif threads > 1:
        lowered = jitted.lower(yd, *shares[0])
        if _calls_lapack(jitted, lowered):
            threads, lowered = 1, None
    if len(shares) != threads:  # one thread after all: all chains in one share
        shares = _shares((keys, positions), threads)
        jitted = program(shares)
    if sampler is None:  # compile apart, to report the time it takes
        sampler = (lowered or jitted.lower(yd, *shares[0])).compile()
    compile_s = time.perf_counter() - start
    draws = _run_shares(sampler, yd, shares)
    return draws, {"wall_s": time.perf_counter() - start, "compile_s": compile_s,
                   "chain_threads": threads}


def continue_nuts(spec: ModelSpec, y: np.ndarray, settings: NutsSettings, draws: NutsDraws,
                  round_: int, threads: int, *, program: Callable | None = None
                  ) -> tuple[NutsDraws, dict]:
    """The chains of ``draws`` (from :func:`sample_nuts`, or an earlier round of this) drawn
    on for ``settings.num_samples`` more draws each, in ``threads`` host threads as
    :func:`sample_nuts` ran them; round ``round_`` (1, 2, ...) has its own keys.

    ``program`` is an earlier round's ``timings["program"]`` (the continuation compiled for
    this shape and share), reused so that a fit compiles it once however many rounds it
    adds. Returns ``(draws, timings)`` of the new draws alone (:func:`join_draws` appends
    them); ``timings`` hold ``wall_s``, ``compile_s`` (0 when ``program`` was given) and
    ``program``."""
    start = time.perf_counter()
    keys = jax.random.split(jax.random.fold_in(_seed_keys(settings)[1], round_),
                            settings.num_chains)
    yd = jnp.asarray(y)
    args = (keys, draws.last, draws.step_size, draws.inverse_mass_matrix)
    shares = _shares(args, threads)
    if program is None:
        jitted = _traced("nuts-continuation", spec, settings,
                         make_continuation(spec, *np.shape(y), settings), (yd, *shares[0]))
        program = jitted.lower(yd, *shares[0]).compile()
    compile_s = time.perf_counter() - start
    out = _run_shares(program, yd, shares)
    return out, {"wall_s": time.perf_counter() - start, "compile_s": compile_s,
                 "program": program}


def join_draws(first: NutsDraws, then: NutsDraws) -> NutsDraws:
    """``first``'s draws followed by ``then``'s, per chain; where the chains stopped is
    ``then``'s."""
    along = lambda a, b: np.concatenate([np.asarray(a), np.asarray(b)], axis=1)
    return NutsDraws({k: along(v, then.position[k]) for k, v in first.position.items()},
                     along(first.diverging, then.diverging),
                     along(first.acceptance_rate, then.acceptance_rate),
                     along(first.num_steps, then.num_steps),
                     along(first.logdensity, then.logdensity), first.step_size, then.last,
                     first.inverse_mass_matrix,
                     None if first.energy is None or then.energy is None
                     else along(first.energy, then.energy))


def constrain_draws(spec: ModelSpec, position: dict) -> dict[str, np.ndarray]:
    """Constrained values of unconstrained draws, same shapes; an entry a constant masks
    (``Constant.masks``: a loading the Q-matrix or the rotation pins) is its effective
    value, 0, as the tables report it: its draws are the prior's, which the likelihood
    never reads."""
    out = {p.name: np.asarray(p.constrain(jnp.asarray(position[p.name])), np.float32)
           for p in spec.params}
    for name, free in free_entries(spec, out).items():
        out[name] = np.where(free, out[name], np.float32(0.0))
    return out


def free_entries(spec: ModelSpec, values: dict) -> dict[str, np.ndarray]:
    """``{block: bool (*full_shape)}``, False where a constant masks the entry
    (:meth:`ModelSpec.mask_values`); ``values`` holds draws ``(chains, samples, *full_shape)``
    of every block, from which the subject and item counts are read."""
    return {name: m != 0 for name, m in spec.masks_of(values, axis=2).items()}


def _dims(spec: ModelSpec, p) -> list[str]:
    lead = {"subject": ["subject"], "item": ["item"], "global": []}[p.owner]
    rest = ["skill" if len(spec.skills) == n else f"{p.name}_dim{i}" for i, n in enumerate(p.shape)]
    return lead + rest


def to_inference_data(spec: ModelSpec, constrained: dict, draws: NutsDraws, *, subjects=None,
                      items=None):
    """ArviZ ``InferenceData``: constrained draws in ``posterior`` (dims chain, draw,
    subject/item[, skill]), per-draw NUTS statistics in ``sample_stats`` (``energy`` among
    them, for ``az.bfmi``, where the draws kept it)."""
    az = _arviz()
    coords = {}
    if subjects is not None:
        coords["subject"] = [str(s) for s in subjects]
    if items is not None:
        coords["item"] = [str(i) for i in items]
    if spec.skills:
        coords["skill"] = list(spec.skills)
    stats = {"diverging": np.asarray(draws.diverging), "acceptance_rate":
             np.asarray(draws.acceptance_rate), "n_steps": np.asarray(draws.num_steps),
             "lp": np.asarray(draws.logdensity)}
    if draws.energy is not None:
        stats["energy"] = np.asarray(draws.energy)
    return az.from_dict(posterior=constrained, sample_stats=stats, coords=coords,
                        dims={p.name: _dims(spec, p) for p in spec.params})


def observed_cells(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every observed cell (int8 ``-1`` and NaN are missing), row-major."""
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.floating):
        y = np.where(np.isnan(y), -1.0, y)
    return np.nonzero(y >= 0)


def add_pointwise(spec: ModelSpec, idata, constrained: dict, y: np.ndarray, *,
                  max_values: int = POINTWISE_MAX_VALUES, seed: int = 0) -> dict:
    """Add ArviZ's ``observed_data``, ``log_likelihood`` and (binary responses)
    ``posterior_predictive`` groups to ``idata``, so that ``az.loo``, ``az.waic``,
    ``az.loo_pit`` and ``az.plot_ppc`` run on a sampler's draws; returns what was kept
    (fit.json).

    All three are over the observed cells (dim ``cell``, row-major, with each cell's
    ``subject_index`` and ``item_index``, its positions on ``posterior``'s ``subject`` and
    ``item``): leave-one-out is then over responses, the unit of an IRT matrix. Missing
    cells, and items a fit under fixed vague priors set aside (fit.json's
    ``constant_items``), are not cells.
    ``observed_data.y`` is each cell's response, the data the draws condition on.
    ``log_likelihood.y`` is ``log p(y_c | params)`` at each draw of ``constrained`` (the
    draws as sampled, those of ``posterior``).
    ``posterior_predictive.y`` is a replicated response of each cell at each of those draws
    (int8), drawn with probability ``exp`` of the log-likelihood of a 1, which the model's own
    likelihood gives: no second definition of it. Responses of other kinds (proportions,
    scores) are not replicated; fit.json says so.
    At most ``max_values`` values of each are kept: where chains x draws x cells is more,
    evenly spaced draws of each chain are kept (the ``draw`` coordinate names them, as in
    ``posterior``), and none where fewer than :data:`POINTWISE_MIN_DRAWS` per chain would
    fit. ``seed`` draws the replicated responses."""
    import xarray as xr

    y = np.asarray(y)
    rows, cols = observed_cells(y)
    first = constrained[spec.likelihood_params[0].name]
    chains, samples = first.shape[:2]
    cells = int(rows.size)
    per_chain = min(samples, max_values // max(1, chains * cells))
    observed = y[rows, cols]
    # each cell's subject and item as positions on posterior's subject / item dims: ids as
    # text, one per cell in each group, would outweigh the draws (80 MB at 10^6 cells)
    by_cell = {"cell": np.arange(cells), "subject_index": ("cell", rows.astype(np.int32)),
               "item_index": ("cell", cols.astype(np.int32))}
    groups = {"observed_data": xr.Dataset({"y": (("cell",), observed)}, coords=by_cell)}
    info = {"cells": cells, "draws_per_chain": int(per_chain), "of_draws_per_chain": int(samples),
            "max_values": int(max_values), "posterior_predictive": False}
    if spec.kind != "binary":
        info["posterior_predictive_omitted"] = (
            f"{spec.kind} responses are not replicated: only binary responses' distribution "
            f"is read from the model's likelihood")
    if per_chain < min(samples, POINTWISE_MIN_DRAWS):
        info = {**info, "draws_per_chain": 0, "omitted": (
            f"{chains} chains x {min(samples, POINTWISE_MIN_DRAWS)} draws x {cells:,} observed "
            f"cells is over the {max_values:,} values kept; az.loo needs the log_likelihood "
            f"group, which this run leaves out (and posterior_predictive with it)")}
        idata.add_groups(groups)
        return info
    keep = np.unique(np.linspace(0, samples - 1, per_chain).round().astype(int))
    lik = [p.name for p in spec.likelihood_params]
    values = np.empty((chains, keep.size, cells), np.float32)
    draws = {k: np.asarray(constrained[k])[:, keep].reshape((-1,) + np.shape(constrained[k])[2:])
             for k in lik}
    # written into ``values`` a few draws at a time: float32, nothing of its size copied
    cell_loglik_draws(spec, draws, rows, cols, observed, num_subjects=y.shape[0],
                      num_items=y.shape[1], out=values.reshape(chains * keep.size, cells),
                      chunk_values=POINTWISE_CHUNK_VALUES)
    per_draw = {"chain": np.arange(chains), "draw": keep, **by_cell}
    groups["log_likelihood"] = xr.Dataset({"y": (("chain", "draw", "cell"), values)},
                                          coords=per_draw)
    if spec.kind == "binary":
        groups["posterior_predictive"] = xr.Dataset(
            {"y": (("chain", "draw", "cell"), replicate_binary(values, observed, seed))},
            coords=per_draw)
        info["posterior_predictive"] = True
    idata.add_groups(groups)
    return {**info, "draws_per_chain": int(keep.size)}


def replicate_binary(loglik: np.ndarray, observed: np.ndarray, seed: int = 0,
                     chunk_values: int = POINTWISE_CHUNK_VALUES) -> np.ndarray:
    """Replicated binary responses, int8 of ``loglik``'s shape ``(chains, draws, cells)``:
    each is 1 with probability ``P(y_c = 1 | draw)``, read from the log-likelihood of the
    observed response ``observed[c]`` (``exp(l)`` where it is 1, ``-expm1(l)`` where it is 0,
    accurate where ``l`` is near 0). A few draws at a time (about ``chunk_values`` values),
    so that the float temporaries stay small; the uniforms are drawn in order, so the result
    does not depend on ``chunk_values``."""
    rng = np.random.default_rng((int(seed) % 2**32, 0x5050))  # a stream of its own
    out = np.empty(loglik.shape, np.int8)
    one = np.asarray(observed) == 1
    flat, dest = loglik.reshape(-1, one.size), out.reshape(-1, one.size)
    step = max(1, chunk_values // max(1, one.size))
    for k in range(0, flat.shape[0], step):
        l = np.array(flat[k:k + step], np.float32)  # a copy: loglik is left as it is
        p = np.exp(l)
        np.negative(np.expm1(l, out=l), out=l)  # 1 - exp(l), in place
        np.copyto(p, l, where=~one)
        dest[k:k + step] = rng.random(l.shape, dtype=np.float32) < p
    return out


def _arviz():
    with warnings.catch_warnings():  # arviz 0.x announces its 1.0 refactor on import
        warnings.simplefilter("ignore", FutureWarning)
        import arviz
    return arviz


def diagnostics(spec: ModelSpec, idata, settings: NutsSettings,
                draws: NutsDraws) -> dict:
    """R-hat (rank-normalised split), bulk and tail ESS per block (max / min over its
    entries), the largest Monte Carlo error of a posterior sd relative to that sd
    (``mcse_sd_rel_max``: ArviZ's ``mcse(method="sd")``, by
    :func:`~engine.infer.sampler.sd_standard_error`), divergences, and ``converged``:
    every R-hat finite and at most ``max_rhat``.

    The sd's error is reported because R-hat and ESS do not show it: on LSAT7 a heavy-tailed
    difficulty's sd came out 0.79 from 4 x 1,000 draws and 0.62-0.63 from 4 x 4,000, with
    R-hat 1.007 and bulk ESS 548 in the short run."""
    az = _arviz()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # one chain: R-hat undefined
        rhat = az.rhat(idata)
        bulk = az.ess(idata, method="bulk")
        tail = az.ess(idata, method="tail")
    sds = idata.posterior.std(dim=("chain", "draw"))
    free = free_entries(spec, {k: idata.posterior[k].values for k in idata.posterior.data_vars})
    blocks, worst = {}, 1.0
    for p in spec.params:
        keep = free.get(p.name, Ellipsis)  # entries a constant masks (always 0) left out
        r = np.asarray(rhat[p.name].values, np.float64)[keep]
        eb = np.asarray(bulk[p.name].values, np.float64)[keep]
        et = np.asarray(tail[p.name].values, np.float64)[keep]
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = (sd_standard_error(np.asarray(idata.posterior[p.name].values)) / np.asarray(
                sds[p.name].values, np.float64))[keep]
        blocks[p.name] = {"rhat_max": float(np.max(r)) if np.isfinite(r).all() else float("nan"),
                          "ess_bulk_min": float(np.nanmin(eb)) if np.isfinite(eb).any() else 0.0,
                          "ess_tail_min": float(np.nanmin(et)) if np.isfinite(et).any() else 0.0,
                          "mcse_sd_rel_max": float(np.nanmax(rel)) if np.isfinite(rel).any()
                          else float("nan"),
                          "size": int(r.size)}
        worst = max(worst, blocks[p.name]["rhat_max"]) if np.isfinite(r).all() else float("nan")
    divergences = int(np.sum(draws.diverging))
    converged = bool(np.isfinite(worst) and worst <= settings.max_rhat)
    return {"rhat_max": worst, "ess_bulk_min": min(b["ess_bulk_min"] for b in blocks.values()),
            "ess_tail_min": min(b["ess_tail_min"] for b in blocks.values()),
            "mcse_sd_rel_max": max((b["mcse_sd_rel_max"] for b in blocks.values()
                                    if np.isfinite(b["mcse_sd_rel_max"])), default=float("nan")),
            "blocks": blocks, "divergences": divergences, "converged": converged,
            "max_rhat": settings.max_rhat, "target_accept": settings.target_accept,
            "transitions": int(np.size(draws.diverging)),
            "step_size": [float(s) for s in np.asarray(draws.step_size)],
            "mean_steps_per_draw": float(np.mean(draws.num_steps)),
            "mean_acceptance": float(np.mean(draws.acceptance_rate))}


def shrinkage(spec: ModelSpec, draws: NutsDraws) -> dict[str, float]:
    """Each pooled item block's mean shrinkage over its entries, ``E[u] Var(x_i | y)`` with
    ``u`` its pool's precision, from the draws: about ``u / (u + I_i)`` for an item whose
    data give ``I_i``, so near 1 where the draws are mostly the pool's prior (the funnel
    that standardising removes) and near 0 where the data decide the item."""
    out = {}
    free = free_entries(spec, draws.position)  # a pinned loading's draws are its prior's
    for name, (_, precision) in poolable_blocks(spec).items():
        if spec.param(name).owner != "item":
            continue
        x = np.asarray(draws.position[name], np.float64)
        u = np.asarray(spec.param(precision).constrain(jnp.asarray(draws.position[precision])),
                       np.float64)
        # within each chain: an unconverged run's chains that disagree do not widen it
        kappa = u.mean() * x.var(axis=1).mean(axis=0)
        out[name] = float(np.mean(kappa[free[name]] if name in free else kappa))
    return out


def shrinkage_restart(spec: ModelSpec, shape: tuple, settings: NutsSettings, draws: NutsDraws,
                      converged: bool) -> tuple[NutsSettings | None, dict]:
    """The default rule's second look (``NutsSettings.standardise``): settings that sample
    again with every pooled item block standardised where a run under the default rule, at
    :data:`NONCENTRED_SUBJECTS` subjects or more and :data:`ANCHOR_ITEMS` items or more,
    with no item block standardised, did not converge and an item block's mean
    :func:`shrinkage` is over :data:`SHRINKAGE_RESTART`; else None. Also the shrinkages
    read (empty where none was). The subjects and items alone do not decide it: at 90
    subjects the NLU test sets' items are decided by their data (2PL, shrinkage of the
    discriminations 0.08-0.30) and sample better as they are, while 50 simulated subjects
    leave them near their prior (about 0.55) and standardising converges the 3PL at 50 x
    1,000 (BENCHMARKS.md)."""
    num_subjects, num_items = shape
    if (converged or settings.noncentred_below is not None or settings.standardise is not None
            or settings.num_chains < 2 or num_subjects < NONCENTRED_SUBJECTS
            or num_items < ANCHOR_ITEMS):  # (at 50 items the default standardises no item)
        return None, {}
    kappa = shrinkage(spec, draws)
    if not any(k > SHRINKAGE_RESTART for k in kappa.values()):  # NaN: not over
        return None, kappa
    # the blocks the rule standardised already (a vague location's abilities) stay so
    already = sampler_coordinates(spec, *shape, settings).pooled
    return settings.replace(standardise=tuple(sorted(set(kappa) | set(already)))), kappa


def pool_identical_rows(spec: ModelSpec, y: np.ndarray, draws: NutsDraws) -> tuple[NutsDraws, int]:
    """Give subjects with identical response rows (missing cells included) the same draws.

    Their factors are exchangeable in the posterior, so each has the group's marginal;
    draw ``t`` of the group is member ``t mod m``'s draw ``t`` of every subject block
    (jointly drawn with every other parameter at ``t``), so every member gets the same
    abilities (every skill), intervals and tie group, from all members' draws. (The pooled
    columns tie in every draw, so they do not rank and are no joint posterior:
    :func:`nuts_fit_result` keeps the draws as sampled in its InferenceData, ``draws.nc``,
    which the rank statistics read.) Returns ``(draws, rows whose draws were replaced)``.
    """
    subject = spec.by_owner("subject")
    if not subject:
        return draws, 0
    rows = np.where(np.asarray(y) >= 0, np.asarray(y, np.float64), -1.0)  # NaN -> -1
    _, group, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    if counts.max() == 1:
        return draws, 0
    position = dict(draws.position)
    values = {p.name: np.asarray(position[p.name]) for p in subject}  # (chains, samples, S, ...)
    first = next(iter(values.values()))
    t = np.arange(first.shape[0] * first.shape[1]).reshape(first.shape[:2])
    out, pooled = {k: v.copy() for k, v in values.items()}, 0
    for g in np.flatnonzero(counts > 1):
        members = np.flatnonzero(group == g)
        pick = members[t % members.size]  # (chains, samples): one member's joint draw
        for k, v in values.items():
            index = pick.reshape(pick.shape + (1,) * (v.ndim - 2))
            out[k][:, :, members] = np.take_along_axis(v, index, axis=2)
        pooled += members.size
    return draws._replace(position={**position, **out}), pooled


def nuts_fit_result(spec: ModelSpec, y: np.ndarray, settings: NutsSettings, *,
                    subjects=None, items=None) -> FitResult:
    """Sample, diagnose and package NUTS draws as a :class:`FitResult`.

    ``draws`` holds the constrained draws ``(chains, samples, *full_shape)``; the guide is
    the draws' mean and log sd on the unconstrained scale, so read-outs that read a guide
    still work; ``extra["idata"]`` is the ArviZ InferenceData and ``extra["diagnostics"]``
    goes to fit.json (``converged`` there is the R-hat rule).
    """
    def read(draws, settings):  # constrained draws, InferenceData, diagnostics
        constrained = constrain_draws(spec, draws.position)
        idata = to_inference_data(spec, constrained, draws, subjects=subjects, items=items)
        return constrained, idata, diagnostics(spec, idata, settings, draws)

    draws, timings = sample_nuts(spec, y, settings)
    constrained, idata, diag = read(draws, settings)  # of the chains as drawn
    restart, kappa = shrinkage_restart(spec, np.shape(y), settings, draws, diag["converged"])
    first = None
    if restart is not None:  # the items mostly their pools' prior: sampled standardised
        first = {"rhat_max": diag["rhat_max"], "ess_bulk_min": diag["ess_bulk_min"],
                 "wall_s": timings["wall_s"], "coordinates": coordinates_summary(
                     sampler_coordinates(spec, *np.shape(y), settings)),
                 "shrinkage_over": {b: v for b, v in kappa.items() if v > SHRINKAGE_RESTART},
                 "shrinkage_threshold": SHRINKAGE_RESTART}
        settings = restart
        draws = constrained = idata = None  # at most one run's draws held at once
        draws, t = sample_nuts(spec, y, settings)
        timings = {**t, "wall_s": timings["wall_s"] + t["wall_s"],
                   "compile_s": timings["compile_s"] + t["compile_s"]}
        constrained, idata, diag = read(draws, settings)
    rounds, program = 0, None
    while not diag["converged"] and rounds < settings.extend and settings.num_chains > 1:
        rounds += 1
        more, t = continue_nuts(spec, y, settings, draws, rounds, timings["chain_threads"],
                                program=program)
        program = t["program"]  # compiled once, on the first added round
        draws = join_draws(draws, more)
        timings["wall_s"] += t["wall_s"]
        timings["compile_s"] += t["compile_s"]
        constrained, idata, diag = read(draws, settings)
    diag["log_likelihood"] = add_pointwise(spec, idata, constrained, y,  # as sampled
                                           seed=settings.seed)
    draws, pooled = pool_identical_rows(spec, y, draws)
    if pooled:  # the tables read the pooled draws; idata (draws.nc) keeps them as sampled,
        # each twin's own, for the rank read-outs (independent abilities) and the boards
        constrained = constrain_draws(spec, draws.position)
    diag["pooled_rows"] = pooled
    flat = {k: np.asarray(v, np.float64).reshape((-1,) + v.shape[2:])
            for k, v in draws.position.items()}
    guide = GuideState({k: v.mean(axis=0).astype(np.float32) for k, v in flat.items()},
                       {k: np.log(np.maximum(v.std(axis=0), 1e-12)).astype(np.float32)
                        for k, v in flat.items()})
    observed = int((np.asarray(y) >= 0).sum())
    ess_per_s = diag["ess_bulk_min"] / max(timings["wall_s"], 1e-9)
    coords = sampler_coordinates(spec, *np.shape(y), settings)
    diag = {"method": "nuts", "num_chains": settings.num_chains,
            "num_warmup": settings.num_warmup, "num_samples": settings.num_samples * (1 + rounds),
            "extended": rounds, **diag,
            "ess_bulk_min_per_s": ess_per_s, "chain_threads": timings["chain_threads"],
            "coordinates": coordinates_summary(coords) | {
                "shrinkage": kappa, "restarted_from": first}}
    return FitResult(spec=spec, guide=guide, settings=settings, trace=[],
                     converged=diag["converged"], wall_time_s=timings["wall_s"],
                     compile_time_s=timings["compile_s"], num_subjects=y.shape[0],
                     num_items=y.shape[1], num_observed=observed, num_devices=1,
                     extra={"idata": idata, "diagnostics": diag},
                     draws=constrained)
