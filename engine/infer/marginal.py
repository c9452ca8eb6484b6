"""Marginal fit: abilities integrated out by adaptive quadrature, items at the marginal mode.

For a model with one scalar ability per subject, binary responses and item blocks only
(the logistic 1PL-4PL and IRT-feas under the population or vague priors), the subjects are
independent given the items, so each ability can be integrated out exactly (up to
quadrature):

    log p(items | y) = sum_s log int N(theta; 0, 1) prod_n p(y_sn | theta, item n) dtheta
                       + sum_n log p(item n) + const.

This is marginal maximum a posteriori estimation (Bock and Aitkin 1981, with the item
priors): the items are placed at the mode of their *marginal* posterior, with covariance
from its curvature (Louis 1982: the complete-data curvature minus the posterior variance of
the scores, all items jointly when that fits in memory, per item otherwise), and the
abilities are reported as their posterior mean and sd given the items (EAP). The ability
population is the model's own prior N(0, 1), which fixes the scale the way marginal maximum
likelihood does: the reported abilities do not change scale with the matrix's shape.

The integral uses adaptive Gauss-Hermite quadrature (Schilling and Bock 2005): each
subject's nodes sit at its current posterior mean, spread by its posterior sd, so a
posterior of sd 0.05 (a thousand items) is integrated as accurately as one of sd 0.7
(twelve items). The EM's M-step is one damped Newton step per item on the expected
complete-data log posterior, from the model's own per-cell ``loglik`` (autodiff), and is
only accepted where it raises that item's objective.

Identical response patterns are computed once (the matrix's distinct rows, weighted by
their counts), so subjects with identical answer sheets get identical read-outs by
construction.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np

from engine.errors import ModelError, SettingsError
from engine.exported import QUICK_COMPILE, compiler_options, exported_jit
from engine.host import to_device
from engine.infer.ability_quantiles import INTERVAL_ROWS, PROBABILITIES, Z_NODES
from engine.infer.guide import GuideState
from engine.infer.linear import node_cell_scores, node_item_terms, supports_nodes
from engine.infer.terms import value_grad_hessian
from engine.models.spec import ModelSpec
from engine.rows import all_distinct, identical_rows

__all__ = ["MarginalSettings", "marginal_applies", "fit_marginal", "fit_marginal_result",
           "distinct_rows", "items_per_subject", "pool_identical_rows", "choose_ability_factor"]


@dataclass(frozen=True)
class MarginalSettings:
    """Settings of the marginal fit.

    num_nodes : adaptive Gauss-Hermite nodes per subject.
    max_iter, tol : EM iterations; converged when the marginal log posterior changes by less
        than ``tol`` (relative, at least 1e-3 nats) and no item moves by more than 1e-3, or
        by less than 5% of its conditional posterior sd in two passes running. A search that
        uses all ``max_iter`` without converging has its items' posterior sampled from the
        last pass (where the sampler applies), as a stalled one from its best.
    max_step : largest change of an item's unconstrained value per Newton step.
    divergence_patience : the fit stops, not converged, at the values of its best pass when
        it has gone this many passes without raising its objective by more than rounding
        (fit.json ``quadrature.diverged``).
    flat_progress : while some item's information is singular or indefinite (no sd to judge
        its moves by, so the fit cannot be declared converged), a pass counts as progress only
        where it raises the objective this many nats over the last that did. A 2PL of NLU
        rte's 18 checkpoints x 139 items with 10% held out crept 0.02 nats per 30 passes and
        ran all 500 (41 s) before falling back to the mean-field fit; it now stops at pass
        460, and its best pass is sampled: R-hat 1.014, every value within 0.06 sd of NUTS.
    volume_from_pass : under pooled priors the first passes fit the items with the
        hyper-parameters at their starting values and without the items' volumes (trace rows
        ``items_volume: false``); from this pass on the objective is the Laplace marginal
        posterior. At the start an item whose answers follow the abilities has an indefinite
        information in its log discrimination (the residuals' term), and its volume peaks
        where that information is singular: started with the volumes, such items sat on that
        peak and every step off it was refused (a 2PL of 24 x 120: stalled 20 nats below the
        mode reached this way, then sampled from its best pass: 14-18 s against 3 s).
    full_cov_max : the items' joint covariance is computed when the item vector has at most
        this many values (and the score matrix has at most ``score_cells_max`` cells); per
        item otherwise.
    score_chunk, cell_chunk : cells per chunk of the scores (patterns x nodes x item values)
        and of the log-likelihood (patterns x nodes x items); they set the fit's peak memory
        (:func:`within_budget`) and nothing else.
    importance_draws, importance_max_params, importance_cells_max, importance_min_ess :
        posterior means and covariances of the items (and the abilities' posterior moments
        over the items' uncertainty) by importance sampling from the Laplace approximation,
        where the item vector has at most ``importance_max_params`` values and
        ``draws x patterns x nodes x items`` is at most ``importance_cells_max``; kept
        only when the weights' effective sample size is at least 200 and
        ``importance_min_ess`` of the draws. The proposal's sds are ``importance_spread``
        times the Laplace sds (LSAT7: a skewed item's tail is reached at 1.3, not at 1),
        narrowed where the item vector is long enough that so wide a proposal would waste
        the draws (:func:`proposal_spread`). Otherwise the mode and its curvature (Laplace)
        are reported.
    importance_refit_sd, importance_refit_shift : another importance round (three at most)
        from a round's weighted mean and covariance where some weighted sd differs from its
        proposal's sd (the Laplace sd in the first round) by more than this factor, or some
        mean from the proposal's centre by more than this many of its sds (LSAT7: item 5's
        difficulty sd is 1.6 times the Laplace one).
    importance_nodes : adaptive Gauss-Hermite nodes per pattern while weighting the draws
        (at the fit's nodes' mean and sd). 11 gave the same LSAT7 moments as 21 to three
        decimals, and 1.9x the draws for the same cells (1,000 x 50: 369 effective, not 287).
    importance_target_ess : a round with fewer effective draws than this draws more from
        the same proposal, up to ``importance_draws`` in all, where weighting them on the
        shared ability grid (:class:`_DrawNodes`) stays within ``importance_cells_max``
        (1,000 x 50: 727 draws a round on adaptive nodes, 4,000 on the grid; the items'
        largest distance from converged NUTS fell from 0.20 to 0.13 NUTS sd).
    importance_pilot_ess, importance_cells_retry : a round with fewer effective draws than
        it needs but at least ``importance_pilot_ess`` moves the next round's proposal to its
        weighted mean, and that round draws up to ``importance_cells_retry`` cells.
    importance_quantile_ess : with at least this many effective draws the items' 90%
        intervals are the weighted draws' 5% and 95% quantiles (a skewed posterior's ends),
        not the Gaussian's; the Monte Carlo error of a 5% quantile is about
        ``2.1 / sqrt(ess)`` posterior sds, 0.07 at 1,000 (LSAT7's difficulties: the
        Gaussian's ends up to 0.28 NUTS sd from NUTS's).
    sampler_chains, sampler_warmup, sampler_draws, sampler_item_steps : where importance
        sampling does not apply or is not kept, a pilot of the items' marginal posterior
        sampled (:mod:`engine.infer.sampler`: abilities drawn on the shared grid, items by
        ``sampler_item_steps`` Metropolis steps a sweep, several chains) is compared with the
        Laplace approximation; where it departs from it (``sampler_check_laplace``), the
        chains run on (``sampler_warmup`` sweeps in all, then ``sampler_draws`` kept, and as
        many again, at most ``sampler_extend_max`` times, while some split R-hat is over
        ``sampler_rhat_max`` or some value keeps fewer than ``sampler_ess_min`` effective
        draws, of its mean or of its tails (ArviZ's mean and tail ESS); an extension beyond
        the first one on R-hat only within ``sampler_cells_max`` cells) and the draws'
        moments are reported where at most ``sampler_unmixed_share`` of the values are over
        it (fit.json ``item_moments.sampler.not_mixed`` lists them). 0 chains turns it off.
        The ESS floor: a 90% interval's end from ``ess`` draws is off by about
        ``2.1 / sqrt(ess)`` posterior sds, an sd by ``1 / sqrt(2 ess)`` of itself (more in a
        long tail); the 4PL at 2,000 x 12 kept 32 for its worst discrimination, whose sd
        then differed from NUTS's by up to 2x.
        ``sampler_grid_max``: the most points of the shared grid (a 4PL's stalled mode
        search at 50 x 1,000 needed 261, one subject's wide posterior at 4.5 setting the
        span: at 256 its abilities fell back to the mean-field fit; the cost is bounded by
        ``sampler_cells_max`` all the same); ``sampler_values``: the
        kept draws are thinned to this many item values a chain (each extension adds as
        many again); ``sampler_cells_max``:
        larger fits keep the Laplace approximation (3PL 1,000 x 50: 4e9 cells, 10-25 s; at
        50 x 1,000 the 3PL's seeds need up to 2.6e10 cells, 150-270 s of sampling; at
        2e10 the bound, not the fit, decided which of them were sampled).
    laplace_draws : where neither importance sampling nor the sampler is kept, the abilities'
        posterior moments are averaged over this many item draws from the Laplace
        approximation (within ``importance_cells_max`` cells; at least 50 draws, else the
        moments at the mode plus the items' variance to first order).
    seed : the Monte Carlo draws' seed (importance sampling, the Laplace draws, the item
        sampler's chains, the set-aside items' draws); None: ``FitSettings.seed`` in
        :func:`fit_marginal_result` (the fit's one source of randomness), 0 otherwise. Refit
        with another seed to see the Monte Carlo error of the reported moments.
    bucket_patterns : pad the distinct answer patterns with unanswered ones, counted zero
        times, to a bucketed number (``engine.infer.fit.bucket_size``: at most 12.5% more),
        so that a new data set with as many items and a similar number of patterns runs the
        same XLA programs and finds them in the persistent compilation cache. The item
        sampler's chains (the fit's largest program) also pad the items with items nobody
        answers, to a bucketed number, and take a finer shared grid of two sizes a doubling
        (:func:`engine.infer.sampler.sample_items`): the padding is inert, the grid no
        coarser than before.
    quick_compile_cells : a fit whose quadrature grid (patterns, at most ``2^items``, x
        nodes x items) has at most this many cells compiles its programs at XLA's
        optimisation level 0. Such a fit is compile-bound: LSAT7 (32 x 21 x 5) spent 3 of
        its 3.3 s cold fit compiling, and level 0 compiles in about half the time; its
        iterations are too small for the optimised code to gain. A call of the importance
        draws over more than ``_QUICK_DRAW_CELLS`` cells is compiled optimised all the same
        (`ability`, 1,280 x 21 x 16: 427M cells a call). 0 turns it off.
    quick_compile_passes : such a fit that runs this many passes compiles its programs
        optimised from there on (19 OpenML classifiers x 501 instances: 100 passes or more,
        a pass 0.45 s at level 0; LSAT7 takes 9 passes, `ability` 7).
    """

    num_nodes: int = 21
    max_iter: int = 500
    divergence_patience: int = 30
    flat_progress: float = 0.1
    volume_from_pass: int = 3
    tol: float = 1e-8
    max_step: float = 1.0
    full_cov_max: int = 4000
    score_cells_max: int = 60_000_000
    score_chunk: int = 60_000_000
    cell_chunk: int = 8_000_000
    importance_draws: int = 4000
    importance_max_params: int = 200
    importance_cells_max: int = 400_000_000
    importance_min_ess: float = 0.05
    importance_spread: float = 1.3
    importance_refit_sd: float = 1.15
    importance_refit_shift: float = 0.5
    importance_pilot_ess: float = 30.0
    importance_nodes: int = 11
    importance_target_ess: float = 400.0
    importance_cells_retry: int = 2_000_000_000
    importance_quantile_ess: float = 1000.0
    laplace_draws: int = 400
    sampler_chains: int = 4
    sampler_warmup: int = 1000
    sampler_draws: int = 2000
    sampler_item_steps: int = 10
    sampler_rhat_max: float = 1.1
    sampler_ess_min: float = 100.0
    sampler_extend_max: int = 2
    sampler_values: int = 4_000_000
    sampler_grid_max: int = 320
    sampler_check_laplace: bool = True
    sampler_unmixed_share: float = 0.05
    sampler_cells_max: int = 50_000_000_000
    seed: int | None = None
    bucket_patterns: bool = True
    quick_compile_cells: int = 1 << 20
    quick_compile_passes: int = 20


# Peak bytes per chunk cell. Measured on a 2,000 x 200 2PL: score chunks of 4M cells instead
# of 16.8M lowered the peak by 236 MB (18 bytes a cell: the scores in float32 and float64
# copies), log-likelihood chunks of 1M instead of 8M by 119 MB (17 bytes a cell); 48 leaves
# room for XLA's temporaries.
SCORE_CELL_BYTES = 48
_F32_EPS = float(np.finfo(np.float32).eps)  # relative resolution of a float32 sum
JOINT_COPIES = 4  # the joint information, its Cholesky factor, the covariance, a product


def _seed(settings: MarginalSettings) -> int:
    """The Monte Carlo draws' seed: ``settings.seed`` (None: 0) as the unsigned 32-bit
    number NumPy and JAX take (``--seed -1`` as the mean-field fit takes it)."""
    return (settings.seed or 0) % 2 ** 32


def within_budget(settings: MarginalSettings, budget: int) -> tuple[MarginalSettings, dict]:
    """``settings`` with chunks small enough for ``budget`` bytes, and the joint covariance
    bound (``(n k)^2`` float64 values, ``JOINT_COPIES`` times) lowered to what it allows;
    with the record of what was capped for fit.json."""
    score = min(settings.score_chunk, max(budget // SCORE_CELL_BYTES, 1))
    cells = min(settings.cell_chunk, max(budget // SCORE_CELL_BYTES, 1))
    full = min(settings.full_cov_max, int((budget / (8 * JOINT_COPIES)) ** 0.5))
    return (replace(settings, score_chunk=score, cell_chunk=cells, full_cov_max=full),
            {"memory_budget": int(budget), "score_chunk": score, "cell_chunk": cells,
             "full_cov_max": full})


def proposal_spread(d: int, cap: float, efficiency: float = 0.25) -> float:
    """The importance proposal's sd factor for ``d`` item values: ``cap``, or less where a
    Gaussian target equal to the Laplace approximation would keep under ``efficiency`` of
    the draws effective.

    For target ``N(0, 1)`` and proposal ``N(0, s^2)`` per value the effective fraction is
    ``(s^2 / sqrt(2 s^2 - 1))^-d``; solving ``s^2 / sqrt(2 s^2 - 1) = g = efficiency^(-1/d)``
    gives ``s^2 = g^2 + sqrt(g^4 - g^2)``. At 1.3 for the 32 values of a 16-item 2PL only
    5% of the draws would count even with an exact Laplace; the rule gives 1.19 there and
    keeps 1.3 for LSAT7's 10.
    """
    g2 = efficiency ** (-2.0 / max(d, 1))
    return float(min(cap, np.sqrt(g2 + np.sqrt(g2 * g2 - g2))))


def marginal_applies(spec: ModelSpec) -> bool:
    """True for binary models with one scalar ability whose prior is a fixed density (no
    hyper-parameters), scalar item blocks, no constants, and globals (if any) that are
    scalar hyper-parameters of the item priors only: fixed priors of their own, outside the
    likelihood (the ``population`` prior family's pooled item blocks)."""
    subject = spec.by_owner("subject")
    hyper = spec.by_owner("global")
    names = {p.name for p in hyper}
    return (spec.kind == "binary" and len(subject) == 1 and subject[0].shape == ()
            and subject[0].in_likelihood and not subject[0].prior.references()
            and not spec.constants
            and all(p.shape == () and not p.in_likelihood and not p.prior.references()
                    for p in hyper)
            and all(p.shape == () and set(p.prior.references()) <= names
                    for p in spec.by_owner("item")))


def items_per_subject(y: np.ndarray) -> float:
    """Median observed responses per subject (the information each ability gets)."""
    return float(np.median((np.asarray(y) >= 0).sum(axis=1)))


def distinct_rows(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(patterns (U, n), inverse (s,), counts (U,))``: the distinct rows of ``y``, compared
    byte for byte (so missing cells, -1 or NaN, match each other)."""
    first, inverse, counts = identical_rows(y)
    return np.asarray(y)[first], inverse, counts


def pool_identical_rows(spec: ModelSpec, guide: GuideState, y: np.ndarray,
                        frozen=frozenset()) -> GuideState:
    """The guide with every subject block's factor shared by subjects with identical rows of
    ``y``: the mean location and the root-mean-square scale of the group. Where a subject
    block is held at given values (``frozen``), twins' posteriors may differ: the guide is
    returned as it is.

    The exact posterior of two identical answer sheets is the same; a stochastic fit gives
    them factors that differ by Monte Carlo noise, which their average reduces. Subjects
    with a row of their own keep their factor to the bit.
    """
    if all_distinct(y) or any(p.name in frozen for p in spec.by_owner("subject")):
        return guide  # (all distinct: the usual case of a long test, found without sorting)
    _, inverse, counts = distinct_rows(y)
    if counts.max(initial=1) == 1:
        return guide
    loc, log_scale = dict(guide.loc), dict(guide.log_scale)
    for p in spec.by_owner("subject"):
        m = np.asarray(loc[p.name], np.float64)
        v = np.exp(2.0 * np.asarray(log_scale[p.name], np.float64))
        flat = (-1,) + m.shape[1:]
        mean = np.zeros((counts.size,) + m.shape[1:])
        var = np.zeros_like(mean)
        np.add.at(mean, inverse, m.reshape(flat))
        np.add.at(var, inverse, v.reshape(flat))
        c = counts.reshape((-1,) + (1,) * (m.ndim - 1))
        shared = counts[inverse] > 1
        pooled_loc = (mean / c)[inverse].astype(np.float32)
        pooled_log = (0.5 * np.log(var / c))[inverse].astype(np.float32)
        keep = shared.reshape((-1,) + (1,) * (m.ndim - 1))
        loc[p.name] = np.where(keep, pooled_loc, np.asarray(loc[p.name]))
        log_scale[p.name] = np.where(keep, pooled_log, np.asarray(log_scale[p.name]))
    return GuideState(loc, log_scale)


def choose_ability_factor(spec: ModelSpec, y: np.ndarray | None, ability_factor: str,
                          max_items: int, *, max_cells: int | None = None,
                          frozen: bool = False, init: bool = False,
                          variational: bool = False) -> dict:
    """How the abilities are fitted, read from the model and the data, for fit.json.

    ``quadrature`` where :func:`marginal_applies`, the matrix is in memory, no block is
    frozen and no start is given, and (``auto``) the median subject has at most
    ``max_items`` observed responses, the matrix at most ``max_cells`` observed cells (no
    bound when ``None``) and no variational setting was asked for
    (``variational``: an optimizer or Monte Carlo draws named); ``gaussian`` (mean-field)
    otherwise.

    Raises
    ------
    SettingsError : ``quadrature`` was asked for where it does not apply.
    """
    record = {"requested": ability_factor, "max_items_per_subject": max_items}
    if max_cells is not None:
        record["max_observed_cells"] = max_cells
    if y is not None:
        record["items_per_subject"] = items_per_subject(y)
        record["observed_cells"] = int(np.count_nonzero(y >= 0))
    reasons = []
    if not marginal_applies(spec):
        reasons.append(f"model {spec.name!r} ({spec.description}) is not binary with one "
                       "scalar ability with a fixed prior and fixed or pooled item priors")
    if y is None:
        reasons.append("the matrix is not held in memory (streamed or sparse store)")
    if frozen or init:
        reasons.append("blocks are frozen or a start is given")
    if ability_factor == "quadrature" and reasons:
        raise SettingsError(f"ability_factor='quadrature': {'; '.join(reasons)}; use "
                            "--ability-factor gaussian or auto")
    if variational and ability_factor == "auto":
        reasons.append("variational settings were given (optimizer or Monte Carlo draws)")
    if ability_factor == "gaussian" or reasons:
        method = "gaussian"
    elif ability_factor == "quadrature":
        method = "quadrature"
    else:
        short = record["items_per_subject"] <= max_items
        small = max_cells is None or record["observed_cells"] <= max_cells
        method = "quadrature" if short and small else "gaussian"
    if method == "gaussian" and reasons:
        record["gaussian_because"] = reasons
    return record | {"method": method}


def _item_blocks(spec: ModelSpec):
    return [p for p in spec.params if p.owner == "item"]


def _pooled_blocks(spec: ModelSpec) -> np.ndarray:
    """Indices of the item blocks whose prior refers to globals (the pooled ones, which
    the items' volume integrates out), in :func:`_item_blocks` order."""
    return np.array([j for j, p in enumerate(_item_blocks(spec)) if p.prior.references()],
                    dtype=int)


def _cell_loglik(spec: ModelSpec, x, theta, y, mask):
    """Per-cell log-likelihood ``(U, Q, n)``: items ``x`` ``(n, k)`` unconstrained, nodes
    ``theta`` ``(U, Q)``, responses ``y`` and ``mask`` ``(U, n)``."""
    blocks = _item_blocks(spec)
    (subject,) = spec.by_owner("subject")
    params = {subject.name: subject.constrain(theta)[:, :, None]}
    for j, p in enumerate(blocks):
        if p.in_likelihood:
            params[p.name] = p.constrain(x[:, j])[None, None, :]
    return spec.loglik(params, y[:, None, :], mask[:, None, :]) * mask[:, None, :]


@exported_jit(static_argnames=("spec",))
def _ability_log_prior(spec, theta):
    """The ability prior's log density at nodes ``theta``: one compiled program, where the
    density's operations run one by one (each its own small program) outside jit."""
    (subject,) = spec.by_owner("subject")
    return subject.prior.log_prob(theta, {})


_PRIOR_CHUNK = 4096  # the one shape the ability prior's program is called at


def _ability_prior(spec, theta: np.ndarray) -> np.ndarray:
    """:func:`_ability_log_prior` at ``theta`` of any shape (float64), in chunks of one
    fixed length: a fit asks at its nodes, its importance nodes and its shared grid, three
    shapes that were three programs to load (or compile) in every fresh process."""
    flat = np.asarray(theta, np.float64).reshape(-1)
    padded = np.concatenate([flat, np.zeros(-flat.size % _PRIOR_CHUNK)])
    out = [np.asarray(_ability_log_prior(spec, to_device(padded[i:i + _PRIOR_CHUNK])), np.float64)
           for i in range(0, padded.size, _PRIOR_CHUNK)]
    return np.concatenate(out)[:flat.size].reshape(np.shape(theta))


@exported_jit(static_argnames=("spec",))
def _node_loglik(spec, x, theta, y, mask):
    """``(U, Q)``: each pattern's log-likelihood at each of its nodes."""
    return jnp.sum(_cell_loglik(spec, x, theta, y, mask), axis=-1)


@exported_jit(static_argnames=("spec",))
def _item_terms(spec, x, theta, y, mask, w):
    """Expected complete-data log-likelihood of each item under node weights ``w`` ``(U, Q)``
    (pattern counts folded in) with its gradient ``(n, k)`` and Hessian ``(n, k, k)``.
    Through the linear predictor where the model declares one (2PL at ``ability``'s shape:
    10x faster), else per cell."""
    if supports_nodes(spec):
        return node_item_terms(spec, _item_blocks(spec), x, theta, y, mask, w)
    return _item_terms_per_cell(spec, x, theta, y, mask, w)


def _item_terms_per_cell(spec, x, theta, y, mask, w):
    """:func:`_item_terms` by differentiating each cell in its item's values (traced)."""
    def per_item(xn, yn, mn):  # one item: xn (k,), yn / mn (U,)
        ll = _cell_loglik(spec, xn[None, :], theta, yn[:, None], mn[:, None])[..., 0]
        return jnp.sum(w * ll)

    return jax.vmap(value_grad_hessian(per_item), in_axes=(0, 1, 1))(x, y, mask)


@exported_jit(static_argnames=("spec",))
def _item_values(spec, x, theta, y, mask, w):
    """``(n,)``: the expected complete-data log-likelihood of each item (no derivatives)."""
    return jnp.einsum("uq,uqn->n", w, _cell_loglik(spec, x, theta, y, mask))


# the pooled blocks' information floor per value (an sd of about 3 on the unconstrained
# scale): ``-1/2 log |det|`` grows without bound as an item's information passes through
# singular; a 4PL at 50 x 1,000 (50 responses per item, its likelihood not log-concave) ran
# items to that pole, and its EM steps over it lost up to 36 nats a pass or, halved, were
# refused from pass 22 on. A hard floor (no gradient below it) left a cusp that items sat on,
# every step off it refused (from pass 47 on); the floor is smooth. It is even in the
# determinant, as ``log |det|`` is: a floor that also capped indefinite informations (every
# negative determinant at the floor's value, no gradient) trapped a 2PL's items there, whose
# informations are indefinite far from the mode (50 x 1,000: stalled 233 nats below the
# mode that ``log |det|`` reaches in 23 passes).
_VOLUME_FLOOR = 0.1


def _volume_of_det(det, p: int):
    """``-1/2 log hypot(det, c)``, ``c = _VOLUME_FLOOR ** p``: ``-1/2 log |det|`` less
    ``c^2 / (4 det^2)`` where ``|det| >> c``, smooth, and at most ``-1/2 log c`` (at a
    singular information)."""
    return -0.5 * jnp.log(jnp.hypot(det, _VOLUME_FLOOR ** p))


def _volume_slope(det, p: int):
    """``d vol / d det`` of :func:`_volume_of_det` times ``-2``: ``det / (det^2 + c^2)``,
    ``1 / det`` far from the floor (numpy)."""
    return det / np.hypot(det, _VOLUME_FLOOR ** p) ** 2


def _log_volume(info):
    """One item's volume from its pooled information ``(p, p)`` (traced): ``-1/2 log det``,
    smoothly floored (:func:`_volume_of_det`)."""
    return _volume_of_det(jnp.linalg.det(info), info.shape[0])


@exported_jit(static_argnames=("spec", "with_grad", "small"))
def _item_volume(spec, x, theta, y, mask, w, g, with_grad=True, small=False):
    """Each item's log posterior volume ``-1/2 log det A_i`` ``(n,)``: ``A_i`` is item
    ``i``'s expected complete-data information under the node weights ``w`` ``(U, Q)``
    (pattern counts folded in) plus its prior's, given the globals ``g``, in its pooled
    blocks. This is the Laplace term that integrating the pooled values out adds to their
    mode's log density. Blocks with a fixed prior (an asymptote's logit-uniform) stay at
    the mode: their information vanishes at the boundary, where the volume would grow
    without bound (a 3PL's guessing ran off to 0 and the fit never settled). With
    ``with_grad`` also the gradients of their sum in ``x`` ``(n, k)`` and in ``w``.

    The information's entries are the cells' second derivatives by two forward-mode
    derivatives, as on the shared grid (:func:`_pooled_volume`). At 20 patterns x 21 nodes x
    501 items, optimised code: a 2PL call 1.0 ms without the gradients against 2.1 ms
    through ``jax.hessian``, 29 against 42 ms with them; a 3PL's 81 against 380 ms with
    them, but 15.8 against 12.3 ms without. ``small``: the volumes (and their pullback)
    through ``jax.hessian``, whose programs compile faster, for a compile-bound fit."""
    env = _env(spec, g)
    blocks = _item_blocks(spec)
    pooled = _pooled_blocks(spec)

    def terms(yn, mn):  # one item's cells' log-likelihoods (U, Q) and log prior at v (k,)
        def at(v):
            ll = _cell_loglik(spec, v[None, :], theta, yn[:, None], mn[:, None])[..., 0]
            return ll, sum(p.prior.log_prob(v[j], env) for j, p in enumerate(blocks))
        return at

    if small:
        def volumes(xx, ww):
            def one(xn, yn, mn):  # one item: xn (k,), yn / mn (U,)
                def log_post(v):
                    ll, prior = terms(yn, mn)(v)
                    return jnp.sum(ww * ll) + prior

                return _log_volume(-jax.hessian(log_post)(xn)[np.ix_(pooled, pooled)])

            return jax.vmap(one, in_axes=(0, 1, 1))(xx, y, mask)

        if not with_grad:
            return volumes(x, w), None, None
        vol, pullback = jax.vjp(volumes, x, w)
        return (vol, *pullback(jnp.ones_like(vol)))

    def one(xn, yn, mn):
        return _pooled_volume(terms(yn, mn), xn, (w,), pooled, with_grad)

    if not with_grad:
        return jax.vmap(one, in_axes=(0, 1, 1))(x, y, mask), None, None
    vol, gx, (gw,) = jax.vmap(one, in_axes=(0, 1, 1))(x, y, mask)
    return vol, gx, gw.sum(axis=0)


def _pooled_volume(terms, v, weights, pooled, with_grad: bool):
    """One item's volume ``-1/2 log det A`` (traced) at its values ``v`` ``(k,)``, where its
    log posterior is ``sum_i <weights_i, T_i(v)> + prior(v)`` and ``terms(v)`` gives
    ``(T_1, ..., prior)``, each ``T_i`` of ``weights_i``'s shape (the cells' log-likelihoods
    on the nodes, or the curves on a grid). ``A`` is minus the pooled blocks' second
    derivatives, each two forward-mode derivatives (along ``e_l``, then ``e_j``, pooled
    ``j <= l``) of the terms. With ``with_grad`` also the gradients of the volume in ``v``
    (one reverse pass through those second derivatives) and in each ``weights_i`` (the
    volume's derivative in each second derivative times the terms'): ``(vol, gv, (gw_1,
    ...))``; the volume alone otherwise.

    The reverse-mode pullback through ``jax.hessian`` that this replaces took 3-8x as long a
    call (1,000 items, 256 grid points, an idle core: 3PL 0.94 s against 0.11 s, 2PL 0.134
    against 0.044 s; the volumes alone 0.038 against 0.011 s and 0.006 against 0.002 s).
    The two agree to float64's rounding (tested); in float32 this is the nearer to
    float64's (3PL: volumes within 4e-6 against 7e-5)."""
    npool = pooled.size
    if npool == 0:  # no pooled block: the volume of an empty information, a constant
        vol = _log_volume(jnp.zeros((0, 0), v.dtype))
        return vol if not with_grad else (vol, jnp.zeros_like(v),
                                          tuple(jnp.zeros_like(wt) for wt in weights))
    eye = jnp.eye(v.shape[0], dtype=v.dtype)
    pairs = [(a, b) for a in range(npool) for b in range(a, npool)]

    def second(vv):  # each pair's second derivative of every term, each (r, *its shape)
        outs = [_second_derivative(terms, vv, eye[pooled[a]], eye[pooled[b]]) for a, b in pairs]
        return tuple(jnp.stack(o) for o in zip(*outs))

    def volume_of(d):  # the volume from the log posterior's second derivatives d (r,)
        r = {pair: d[i] for i, pair in enumerate(pairs)}
        info = jnp.stack([jnp.stack([r[min(a, b), max(a, b)] for b in range(npool)])
                          for a in range(npool)])
        return _log_volume(-info)

    def combined(ts):  # sum_i <weights_i, T_i''> + prior'' for each pair (r,)
        return sum(jnp.tensordot(t, wt, axes=wt.ndim) for t, wt in zip(ts[:-1], weights)) + ts[-1]

    if not with_grad:
        return volume_of(combined(second(v)))
    ts, pullback = jax.vjp(second, v)
    vol, dv = jax.value_and_grad(volume_of)(combined(ts))
    (gv,) = pullback(tuple(jnp.tensordot(dv, wt, axes=0) for wt in weights) + (dv,))
    return vol, gv, tuple(jnp.tensordot(dv, t, axes=1) for t in ts[:-1])


@exported_jit(static_argnames=("spec",))
def _weighted_scores(spec, x, theta, y, mask, c):
    """``(n, k)``: the gradient in the items of ``sum c * (cell log-likelihood)`` for node
    weights ``c`` ``(U, Q)``."""
    return jax.grad(lambda xx: jnp.sum(c[:, :, None] * _cell_loglik(spec, xx, theta, y, mask)))(x)


def _volume(spec, x, theta, log_base, y, mask, counts, g, limit: int, with_grad: bool = True,
            dtype=jnp.float32, one_program: bool = False):
    """The items' volumes (:func:`_item_volume`) at items ``x`` on the nodes ``theta``, in
    chunks of items of about ``limit`` cells, and the gradient of their sum ``(n, k)``
    (None unless ``with_grad``), in float64 numpy. ``one_program``: the volumes alone come
    from the program with the gradients too, in its quickly compiled form (``small``: one
    program to compile, not two).

    The gradient follows the abilities' posterior weights as the items move: along the
    scale, an item's information changes only through them. The weights' cotangent from
    every chunk is carried back through the weights' softmax and then, chunk by chunk,
    through the cells' log-likelihood."""
    n, k = x.shape
    U, Q = theta.shape
    th = to_device(theta, dtype)
    lw = _chunked_node_loglik(spec, x, theta, y, mask, limit, dtype) + log_base
    soft = np.exp(lw - lw.max(axis=1, keepdims=True))
    soft /= soft.sum(axis=1, keepdims=True)
    w = to_device(soft * counts[:, None], dtype)
    gj = to_device(g, dtype)
    vol, grad, dw = np.zeros(n), np.zeros((n, k)), np.zeros((U, Q))
    chunks = _chunks(U, Q * 4 * k * k, n, limit)
    for sl in chunks:
        v, gx, gw = _item_volume(spec, to_device(x[sl], dtype), th, to_device(y[:, sl]),
                                 to_device(mask[:, sl]), w, gj,
                                 with_grad=with_grad or one_program, small=one_program)
        vol[sl] = np.asarray(v, np.float64)
        if with_grad:
            grad[sl], dw = np.asarray(gx, np.float64), dw + np.asarray(gw, np.float64)
    if not with_grad:
        return vol, None
    # w = counts * softmax(lw): the cotangent of lw, then of each item through its cells
    dlw = counts[:, None] * soft * (dw - (soft * dw).sum(axis=1, keepdims=True))
    c = to_device(dlw, dtype)
    for sl in _chunks(U, Q * 4, n, limit):
        grad[sl] += np.asarray(_weighted_scores(spec, to_device(x[sl], dtype), th,
                                                to_device(y[:, sl]), to_device(mask[:, sl]),
                                                c), np.float64)
    return vol, grad


def _grid_curves(spec, x, grid):
    """``(log P(1), log P(0))``, each ``(G, n)``: the curves of items ``x`` ``(n, k)`` on the
    grid ``grid`` ``(G,)`` (traced). A binary cell's log-likelihood is ``y log P(1) + (1 - y)
    log P(0)``, so these two give every pattern's on the grid by a matrix product."""
    n, nodes = x.shape[0], grid[None, :]  # one "pattern" whose nodes are the grid
    return (_cell_loglik(spec, x, nodes, jnp.ones((1, n)), jnp.ones((1, n)))[0],
            _cell_loglik(spec, x, nodes, jnp.zeros((1, n)), jnp.ones((1, n)))[0])


@exported_jit(static_argnames=("spec", "with_grad", "small"))
def _grid_item_volume(spec, x, g, grid, a1, a0, with_grad=True, small=False):
    """:func:`_item_volume` with the abilities' posterior weights on one grid ``grid``
    ``(G,)`` shared by every pattern, given as the weighted counts of ones ``a1`` and zeros
    ``a0`` ``(G, n)`` at each grid point (``w' y1``, ``w' y0``): a binary cell's
    log-likelihood is ``y log P(1) + (1 - y) log P(0)``, so an item's expected complete-data
    log-likelihood is ``sum_g a1_g log P(1 | grid_g) + a0_g log P(0 | grid_g)``, and its
    curvature takes ``G`` cells, not ``U Q``. With ``with_grad`` also the gradients of the
    volumes' sum in ``x`` ``(n, k)``, ``a1`` and ``a0``.

    The information from two forward-mode derivatives of the curves on the grid and of the
    prior (:func:`_pooled_volume`). ``small``: the gradients by a pullback through
    ``jax.hessian``, whose program compiles faster (`ability`'s shape at XLA's level 0: 1.33
    against 1.83 s), for a compile-bound fit."""
    env = _env(spec, g)
    blocks = _item_blocks(spec)
    pooled = _pooled_blocks(spec)

    def log_prior(v):
        return sum(p.prior.log_prob(v[j], env) for j, p in enumerate(blocks))

    def curves(v):  # an item's (log P(1), log P(0)) on the grid, each (G,)
        l1, l0 = _grid_curves(spec, v[None, :], grid)
        return l1[:, 0], l0[:, 0]

    def terms(v):
        return (*curves(v), log_prior(v))

    def volume(xn, a1n, a0n):
        return _pooled_volume(terms, xn, (a1n, a0n), pooled, False)

    def with_gradients(xn, a1n, a0n):
        vol, gx, (g1, g0) = _pooled_volume(terms, xn, (a1n, a0n), pooled, True)
        return vol, gx, g1, g0

    if not with_grad:
        return jax.vmap(volume)(x, a1.T, a0.T), None, None, None
    if small:
        def hessian_volume(xn, a1n, a0n):
            def log_post(v):
                l1, l0 = curves(v)
                return a1n @ l1 + a0n @ l0 + log_prior(v)

            return _log_volume(-jax.hessian(log_post)(xn)[np.ix_(pooled, pooled)])

        vol, pullback = jax.vjp(lambda xx, b1, b0: jax.vmap(hessian_volume)(xx, b1.T, b0.T),
                                x, a1, a0)
        return (vol, *pullback(jnp.ones_like(vol)))
    vol, gx, g1, g0 = jax.vmap(with_gradients)(x, a1.T, a0.T)
    return vol, gx, g1.T, g0.T


def _second_derivative(fn, v, u, w):
    """``u' (hess fn) w`` at ``v``: forward over forward, for ``fn``'s outputs of any
    pytree (traced)."""
    return jax.jvp(lambda vv: jax.jvp(fn, (vv,), (u,))[1], (v,), (w,))[1]


def _grid_log_weights(spec, x, grid, log_base, y1, y0=None, answered=None):
    """``(U, G)``: each pattern's log-likelihood on the shared grid plus ``log_base`` (log
    prior + log rule weight), a matrix product with its observed ones ``y1`` and zeros
    ``y0`` ``(U, n)`` (traced). ``y0`` None: every pattern answers every item
    (``y0 = 1 - y1``), one matrix product instead of two; with ``answered`` ``(n,)``, every
    item where it is positive, and no pattern the others."""
    log_one, log_zero = _grid_curves(spec, x, grid)
    if y0 is None:
        if answered is not None:
            log_zero = jnp.where(answered > 0, log_zero, 0.0)
        return y1 @ (log_one - log_zero).T + (log_zero.sum(axis=1) + log_base)[None, :]
    # one matrix product over the ones and zeros side by side, not two and their sum
    # (LSAT7's 4,000 importance draws at XLA's level 0: 26 -> 12 ms)
    return (jnp.concatenate([y1, y0], axis=1)
            @ jnp.concatenate([log_one, log_zero], axis=1).T + log_base)


@exported_jit(static_argnames=("spec",))
def _grid_weights(spec, x, grid, log_base, y1, y0):
    """``(U, G)``: each pattern's ability posterior weights on the shared grid."""
    return jax.nn.softmax(_grid_log_weights(spec, x, grid, log_base, y1, y0), axis=1)


@exported_jit(static_argnames=("spec",))
def _grid_scores(spec, x, grid, c1, c0):
    """``(n, k)``: the gradient in the items of ``sum c1 log P(1) + c0 log P(0)`` on the
    grid (``c1``, ``c0`` ``(G, n)``)."""
    def total(xx):
        log_one, log_zero = _grid_curves(spec, xx, grid)
        return jnp.sum(c1 * log_one) + jnp.sum(c0 * log_zero)

    return jax.grad(total)(x)


@dataclass
class _VolumeRoute:
    """Where a fit takes its items' volumes (:func:`_items_volume`). ``shared``: on one
    shared ability grid where :class:`_DrawNodes` takes one for the fit's nodes, a new grid
    reaching further and finer by ``slack``; each pattern's adaptive nodes otherwise.
    ``one_program``: the first that many calls run one program, the one with the gradients
    (its quickly compiled form, through ``jax.hessian``), so that a compile-bound fit
    compiles one program, not two; later calls run the faster two. LSAT7's fit makes 25
    calls and `ability`'s 21; 19 OpenML classifiers x 501 instances made 2,105 in 100
    passes, each 52 ms with the gradients at XLA's level 0 where 2,005 needed none.
    ``grid``: the last grid, kept while it still spans and resolves the patterns' posteriors
    (a grid of a new size is a new program)."""

    shared: bool = False
    slack: float = 0.1
    one_program: int = 0
    grid: "_DrawNodes | None" = None
    calls: int = 0

    def single(self) -> bool:
        """Whether this call runs the one program (and counts the call)."""
        self.calls += 1
        return self.calls <= self.one_program

    def record(self, num_nodes: int) -> dict:
        if self.shared and self.grid is not None:
            return self.grid.record
        return {"nodes": "adaptive", "points": num_nodes}


def _items_volume(spec, x, quad, y, mask, counts, g, settings: MarginalSettings,
                  with_grad: bool = True, route: _VolumeRoute | None = None,
                  dtype=jnp.float32):
    """The items' volumes ``(n,)`` and the gradient of their sum ``(n, k)`` (None unless
    ``with_grad``) in float64, where ``route`` (the fit's; None: adaptive nodes, two
    programs) says: on the shared ability grid (:func:`_grid_item_volume`; 1,000 x 50: 1.3
    of a 2.4 s fit went here on the adaptive nodes) or on each pattern's adaptive nodes
    (:func:`_volume`)."""
    route = route or _VolumeRoute()
    nodes = None
    if route.shared:
        nodes = route.grid = _DrawNodes(spec, quad, counts, settings.num_nodes, route.grid,
                                        route.slack)
    single = route.single()
    if nodes is None or not nodes.shared:
        return _volume(spec, x, *quad.log_base(spec), y, mask, counts, g, settings.cell_chunk,
                       with_grad, dtype, single)
    soft, y1, y0 = nodes.weights(spec, x, y, mask, dtype)
    grid, xj = to_device(nodes.theta, dtype), to_device(x, dtype)
    w = soft * counts[:, None]
    a1, a0 = w.T @ y1, w.T @ y0  # (G, n): weighted ones and zeros at each grid point
    # the program with the gradients only where they are asked for or the fit is
    # compile-bound (``single``: one program fewer to compile, `ability` cold 0.33 s): at
    # 50 x 1,000 on 256 points a 3PL's call took 0.94 s with them, 0.038 s without (a 2PL's
    # 0.134 and 0.006 s), and 108 of a pass's 115 calls need none
    vol, gx, g1, g0 = _grid_item_volume(spec, xj, to_device(g, dtype), grid,
                                        to_device(a1, dtype), to_device(a0, dtype),
                                        with_grad=with_grad or single, small=single)
    vol = np.asarray(vol, np.float64)
    if not with_grad:
        return vol, None
    # back through a = w' y and w = counts softmax(lw), lw = y1 l1' + y0 l0' + base
    dw = y1 @ np.asarray(g1, np.float64).T + y0 @ np.asarray(g0, np.float64).T  # (U, G)
    dlw = counts[:, None] * soft * (dw - (soft * dw).sum(axis=1, keepdims=True))
    scores = _grid_scores(spec, xj, grid, to_device(dlw.T @ y1, dtype),
                          to_device(dlw.T @ y0, dtype))
    return vol, np.asarray(gx, np.float64) + np.asarray(scores, np.float64)


@exported_jit(static_argnames=("spec",))
def _cell_scores(spec, x, theta, y, mask):
    """``(U, Q, n, k)``: each cell's score with respect to its item's values (through the
    linear predictor where the model declares one)."""
    if supports_nodes(spec):
        return node_cell_scores(spec, _item_blocks(spec), x, theta, y, mask)
    return _cell_scores_per_cell(spec, x, theta, y, mask)


def _cell_scores_per_cell(spec, x, theta, y, mask):
    """:func:`_cell_scores` by differentiating each cell (traced)."""
    def cell(xn, t, yn, mn):
        return _cell_loglik(spec, xn[None, :], t[None, None], yn[None, None], mn[None, None])[0, 0, 0]

    g = jax.grad(cell)
    over_items = jax.vmap(g, in_axes=(0, None, 0, 0))
    over_nodes = jax.vmap(over_items, in_axes=(None, 0, None, None))
    return jax.vmap(over_nodes, in_axes=(None, 0, 0, 0))(x, theta, y, mask)


def _env(spec: ModelSpec, g) -> dict:
    """The globals' constrained values by name, from their unconstrained vector ``g``."""
    return {p.name: p.constrain(g[i]) for i, p in enumerate(spec.by_owner("global"))}


@exported_jit(static_argnames=("spec",))
def _item_prior_terms(spec, x, g):
    blocks = _item_blocks(spec)
    env = _env(spec, g)

    def lp(xn):  # one item's log prior given the globals, xn (k,)
        return sum(p.prior.log_prob(xn[j], env) for j, p in enumerate(blocks))

    value, grad, hess = jax.vmap(value_grad_hessian(lp))(x)
    return value, grad, jnp.diagonal(hess, axis1=1, axis2=2)


def _item_prior(spec: ModelSpec, x: np.ndarray, g: np.ndarray):
    """Log prior of each item ``(n,)`` given the globals ``g``, with gradient ``(n, k)`` and
    diagonal Hessian ``(n, k)`` (the priors of an item's blocks are independent given them)."""
    return tuple(np.asarray(a, np.float64) for a in _item_prior_terms(
        spec, to_device(x, jnp.float32), to_device(g, jnp.float32)))


def _log_prior(spec, x, g, weights=None):
    """The whole log prior of items ``x`` ``(n, k)`` and globals ``g`` ``(h,)`` (traced).
    ``weights`` ``(n,)``: each item's terms weighted (0 leaves an item out: its values
    integrated out of the prior, as where nobody answered it and it is held still)."""
    env = _env(spec, g)
    w = 1.0 if weights is None else weights
    items = sum(jnp.sum(w * p.prior.log_prob(x[:, j], env))
                for j, p in enumerate(_item_blocks(spec)))
    return items + sum(p.prior.log_prob(g[i], {}) for i, p in enumerate(spec.by_owner("global")))


def _expected_log_prior(spec, x, v, g):
    """The log prior of the globals ``g`` plus the items' log prior given them, averaged over
    the items' conditional posterior ``N(x, diag v)`` to second order (exact for normal item
    priors): what an EM step on the globals maximises with the items integrated out."""
    env = _env(spec, g)
    total = _log_prior(spec, x, g)
    for j, p in enumerate(_item_blocks(spec)):
        curv = jax.vmap(jax.grad(jax.grad(lambda xi, p=p: p.prior.log_prob(xi, env))))(x[:, j])
        total = total + 0.5 * jnp.sum(curv * v[:, j])
    return total


@exported_jit(static_argnames=("spec",))
def _prior_value(spec, x, g):
    return _log_prior(spec, x, g)


@exported_jit(static_argnames=("spec",))
def _hyper_terms(spec, x, v, g):
    """:func:`_expected_log_prior` with its gradient ``(h,)`` and Hessian ``(h, h)`` in ``g``."""
    return value_grad_hessian(functools.partial(_expected_log_prior, spec), 2)(x, v, g)


@exported_jit(static_argnames=("spec",))
def _prior_cross(spec, x, g):
    """The log prior's mixed derivatives ``d^2 / dx dg`` ``(n, k, h)``."""
    return jax.jacfwd(jax.grad(_log_prior, 1), 2)(spec, x, g)


def _update_globals(spec: ModelSpec, x: np.ndarray, v: np.ndarray, g: np.ndarray,
                    max_step: float, steps: int = 25) -> np.ndarray:
    """An EM step on the globals (the item priors' hyper-parameters): the maximum of their
    log prior plus the items' expected log prior over the items' conditional posterior
    ``N(x, diag v)`` (damped Newton; the likelihood does not see the globals). Its gradient
    is the Laplace objective's (:func:`_item_volume`) in the globals."""
    if g.size == 0:
        return g
    args = [to_device(a, jnp.float32) for a in (x, v)]

    def terms(at):
        at = to_device(at, jnp.float32)
        return [np.asarray(t, np.float64) for t in _hyper_terms(spec, *args, at)]

    value = terms(g)[0]
    for _ in range(steps):
        _, grad, hess = terms(g)
        step = _newton_direction(grad[None], hess[None], max_step)[0]
        for _half in range(20):
            trial = g + step
            t_val = terms(trial)[0]
            if t_val >= value - 1e-9 * abs(value):
                break
            step = 0.5 * step
        else:
            return g
        g, moved, value = trial, float(np.abs(step).max()), t_val
        if moved < 1e-6:
            break
    return g


def _hyper_derivatives(spec: ModelSpec, x: np.ndarray, info: np.ndarray, g: np.ndarray):
    """The gradient ``(h,)`` and Hessian ``(h, h)`` in the globals of their EM objective
    (:func:`_expected_log_prior` with the items' variances as their volume sees them, from
    the per-item information ``info`` ``(n, k, k)``: :func:`_volume_variances`), and the log
    prior's mixed derivatives ``(n, k, h)``."""
    n, k = x.shape
    xj, gj = to_device(x, jnp.float32), to_device(g, jnp.float32)
    v = to_device(_volume_variances(spec, info), jnp.float32)
    _, grad, hess = _hyper_terms(spec, xj, v, gj)
    cross = _prior_cross(spec, xj, gj)
    return tuple(np.asarray(a, np.float64) for a in (grad, hess, cross))


def _augmented(info: np.ndarray, cross: np.ndarray, g_hess: np.ndarray) -> np.ndarray:
    """The joint information of the items ``(n k, n k)`` and the globals: the globals enter
    through the prior only, so their blocks are minus the mixed and the globals' Hessians."""
    d, h = info.shape[0], g_hess.shape[0]
    out = np.zeros((d + h, d + h))
    out[:d, :d] = info
    out[:d, d:] = -cross.reshape(d, h)
    out[d:, :d] = -cross.reshape(d, h).T
    out[d:, d:] = -g_hess
    return out


def _volume_variances(spec: ModelSpec, info: np.ndarray) -> np.ndarray:
    """Each item value's variance ``(n, k)`` as the items' volume (:func:`_item_volume`)
    sees it: the diagonal of the inverse of the pooled blocks' information (signed where
    that is indefinite, as ``log |det|``'s derivative is), scaled towards zero near a
    singular one where the volume is floored (:func:`_log_volume`), and zero in the blocks
    with a fixed prior (no global moves their curvature). With
    these the globals' EM objective (:func:`_expected_log_prior`) has the Laplace
    objective's gradient in the globals. The whole item's conditional variances did not:
    a 3PL's took the guessing's uncertainty into the pooled blocks' (the inverse of the
    3 x 3 block, not of its 2 x 2 pooled part), and clipping at 0 changed items whose
    information was not positive definite. Their gradient in ``log u`` was off by up to
    0.7 (2PL) and 1.5 (3PL) on a 60 x 6 test, and a 3PL at 50 x 1,000 had every joint
    Newton step refused while the objective fell along the computed ascent direction."""
    pooled = _pooled_blocks(spec)
    out = np.zeros(info.shape[:2])
    if pooled.size:
        sub = info[:, pooled[:, None], pooled[None, :]]
        # d vol / d A = -1/2 f(det) adj(A)' (:func:`_log_volume`, f: :func:`_volume_slope`):
        # the variances are f(det) times the adjugate's diagonal
        f = _volume_slope(np.linalg.det(sub), pooled.size)
        keep = [np.delete(np.arange(pooled.size), j) for j in range(pooled.size)]
        minors = np.stack([np.linalg.det(sub[:, r[:, None], r[None, :]]) if r.size
                           else np.ones(len(sub)) for r in keep], -1)  # adj(A)'s diagonal
        out[:, pooled] = f[:, None] * minors
    return out


def _conditional_variances(info: np.ndarray) -> np.ndarray:
    """Each item value's variance ``(n, k)`` from the per-item information ``(n, k, k)``."""
    return np.maximum(np.diagonal(np.linalg.pinv(info), axis1=1, axis2=2), 0.0)


def _flat_items(info: np.ndarray) -> np.ndarray:
    """``(n,)``: which items' information ``info`` ``(n, k, k)`` is singular or not positive
    definite (no conditional sd)."""
    eig = np.linalg.eigvalsh(info)  # (n, k)
    return eig.min(axis=-1) <= 1e-8 * np.abs(eig).max(axis=-1)


def _move_in_sds(spec: ModelSpec, x_before: np.ndarray, x: np.ndarray, g_before: np.ndarray,
                 g: np.ndarray, info: np.ndarray) -> float:
    """A pass's largest move in conditional posterior sds: the items' from their per-item
    information ``info``, the hyper-parameters' from their EM objective's curvature.

    Where items are barely identified (every discrimination near 0.2, so the difficulties'
    sds are logits) the Newton and EM steps settled into a cycle of 0.01-sized moves, 0.03
    sd, with the objective flat to 1e-5, and ran to the iteration limit (a simulated 2PL,
    100 x 8). A move under 5% of an sd is converged (the agreement target with NUTS is 25%),
    whatever its size on the parameter scale; the caller also asks the objective's change
    to stay under 1e-3 and the moves to stay small in two passes running. Conditional sds
    are at most the marginal ones, so this is the stricter reading. An item whose
    information is singular or not positive definite has no sd to measure by: its move
    counts as infinite. (Measuring such an item by ``1 / sqrt`` of its information's
    diagonal instead let the Bioresponse 2PL, 19 x 501, whose mode runs off along ridges,
    be declared converged there in some runs and reported at that mode.)"""
    flat = _flat_items(info)
    var = _conditional_variances(info)
    moves = [np.abs(x - x_before) / np.maximum(np.sqrt(var), 1e-12)]
    moves[0][flat] = np.inf
    if g.size:
        _, _, g_hess = _hyper_terms(spec, to_device(x, jnp.float32), to_device(var, jnp.float32),
                                    to_device(g, jnp.float32))
        g_var = np.diagonal(np.linalg.pinv(-np.asarray(g_hess, np.float64)))
        moves.append(np.abs(g - g_before) / np.maximum(np.sqrt(np.maximum(g_var, 0.0)), 1e-12))
    return max(float(np.max(m)) for m in moves)


def _total_prior(spec: ModelSpec, x: np.ndarray, g: np.ndarray, item_prior: np.ndarray) -> float:
    """The log prior of items and globals (``item_prior``: the items' own, given ``g``)."""
    if g.size == 0:
        return float(item_prior.sum())
    return float(_prior_value(spec, to_device(x, jnp.float32), to_device(g, jnp.float32)))


def _globals_covariance(info_items: np.ndarray, cross: np.ndarray, g_hess: np.ndarray) -> np.ndarray:
    """The globals' covariance with the items integrated out (Laplace), from the items'
    per-item information ``(n, k, k)``: the inverse of ``-H_gg - sum_i C_i' info_i^-1 C_i``
    with ``C`` the prior's mixed Hessian ``(n, k, h)``."""
    solved = np.linalg.solve(info_items, cross)  # (n, k, h)
    return np.linalg.pinv(-g_hess - np.einsum("nki,nkj->ij", cross, solved))


def _gauss_hermite(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``z`` and log weights for integrating against a density in ``z`` (the rule's
    weight ``exp(-z^2 / 2)`` taken back out)."""
    z, w = np.polynomial.hermite_e.hermegauss(num_nodes)
    return z, np.log(w) + 0.5 * z ** 2


class _Quadrature:
    """Adaptive Gauss-Hermite nodes per pattern and the posterior weights on them."""

    def __init__(self, num_nodes: int, num_patterns: int, cell_chunk: int = 8_000_000):
        self.z, self.log_w = _gauss_hermite(num_nodes)
        self.cell_chunk = cell_chunk
        self.mean = np.zeros(num_patterns)
        self.sd = np.ones(num_patterns)

    def nodes(self) -> np.ndarray:
        return self.mean[:, None] + self.sd[:, None] * self.z[None, :]

    def log_base(self, spec, num_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(nodes, log ability prior + log quadrature weight)`` ``(U, Q)``: on this
        quadrature's nodes, or on ``num_nodes`` placed at the same means and sds."""
        if num_nodes is None:
            theta, log_w = self.nodes(), self.log_w
        else:
            z, log_w = _gauss_hermite(num_nodes)
            theta = self.mean[:, None] + self.sd[:, None] * z[None, :]
        prior = _ability_prior(spec, theta)
        return theta, prior + log_w[None, :] + np.log(self.sd)[:, None]

    def posterior(self, spec, x, y, mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(nodes, normalised weights (U, Q), log marginal likelihood (U,))`` at items ``x``."""
        theta, base = self.log_base(spec)
        lw = _chunked_node_loglik(spec, x, theta, y, mask, self.cell_chunk) + base
        top = lw.max(axis=1, keepdims=True)
        w = np.exp(lw - top)
        total = w.sum(axis=1, keepdims=True)
        return theta, w / total, (top + np.log(total))[:, 0]

    def adapt(self, theta: np.ndarray, w: np.ndarray) -> None:
        """Recentre each pattern's nodes on its posterior mean and sd."""
        mean = (w * theta).sum(axis=1)
        sd = np.sqrt(np.maximum((w * (theta - mean[:, None]) ** 2).sum(axis=1), 1e-12))
        self.mean, self.sd = mean, np.clip(sd, 1e-3, 10.0)


def _chunks(num_patterns: int, num_nodes: int, num_items: int, limit: int) -> list[slice]:
    per = max(1, limit // max(num_patterns * num_nodes, 1))
    return [slice(a, min(a + per, num_items)) for a in range(0, num_items, per)]


def _chunked_node_loglik(spec, x, theta, y, mask, limit: int, dtype=jnp.float32) -> np.ndarray:
    U, Q = theta.shape
    out = np.zeros((U, Q))
    th = to_device(theta, dtype)
    for sl in _chunks(U, Q, x.shape[0], limit):
        out += np.asarray(_node_loglik(spec, to_device(x[sl], dtype), th,
                                       to_device(y[:, sl]), to_device(mask[:, sl])), np.float64)
    return out


def _expected_values(spec, x, theta, y, mask, w, limit) -> np.ndarray:
    U, Q = theta.shape
    th, ww = to_device(theta, jnp.float32), to_device(w, jnp.float32)
    return np.concatenate([
        np.asarray(_item_values(spec, to_device(x[sl], jnp.float32), th, to_device(y[:, sl]),
                                to_device(mask[:, sl]), ww), np.float64)
        for sl in _chunks(U, Q, x.shape[0], limit)])


def _expected_terms(spec, x, theta, y, mask, w, limit):
    U, Q = theta.shape
    th, ww = to_device(theta, jnp.float32), to_device(w, jnp.float32)
    parts = [_item_terms(spec, to_device(x[sl], jnp.float32), th, to_device(y[:, sl]),
                         to_device(mask[:, sl]), ww)
             for sl in _chunks(U, Q * 4, x.shape[0], limit)]
    return tuple(np.concatenate([np.asarray(p[i], np.float64) for p in parts]) for i in range(3))


def _newton_direction(grad: np.ndarray, hess: np.ndarray, max_step: float) -> np.ndarray:
    """Per-item Newton ascent direction ``-H^-1 g``, with the Hessian shifted until it is
    negative definite, each step capped at ``max_step``."""
    k = grad.shape[1]
    eye = np.eye(k)
    top = np.linalg.eigvalsh(hess).max(axis=1)  # ascent needs H < 0
    shift = np.where(top > -1e-6, top + 1e-3 + 0.1 * np.abs(hess).max(axis=(1, 2)), 0.0)
    step = np.linalg.solve(-(hess - shift[:, None, None] * eye), grad[..., None])[..., 0]
    size = np.abs(step).max(axis=1, keepdims=True)
    return step * np.minimum(1.0, max_step / np.maximum(size, 1e-12))


def _joint_fits(n: int, k: int, U: int, Q: int, settings: MarginalSettings) -> bool:
    return n * k <= settings.full_cov_max and U * Q * n * k <= settings.score_cells_max


def _louis(spec, x, theta, w, counts, y, mask, hess, joint: bool, settings: MarginalSettings,
           with_sensitivity: bool = False):
    """The items' marginal posterior information (Louis 1982) and, optionally, each
    pattern's ability sensitivity ``d E[theta | y, items] / d items`` ``(U, n, k)``.

    information = -(E_w[complete-data Hessian] + prior Hessian) - sum_s Var_w[score_s]:
    ``(n k, n k)`` when ``joint``, its ``(n, k, k)`` within-item blocks otherwise. ``hess``
    is ``(n, k, k)``, complete-data plus prior.
    """
    n, k = x.shape
    U, Q = theta.shape
    if joint:
        info = np.zeros((n * k, n * k))
        for i in range(n):
            info[i * k:(i + 1) * k, i * k:(i + 1) * k] = -hess[i]
    else:
        info = -hess.copy()
    sens = np.zeros((U, n, k)) if with_sensitivity else None
    th = np.asarray(theta, np.float32)  # sliced on the host: no program per slice
    xj = to_device(x, jnp.float32)
    per = max(1, settings.score_chunk // max(Q * n * k, 1))
    for start in range(0, U, per):
        sl = slice(start, min(start + per, U))
        g = np.asarray(_cell_scores(spec, xj, to_device(th[sl]), to_device(y[sl]),
                                    to_device(mask[sl])),
                       np.float64)
        ws = w[sl]
        centred = g - np.einsum("uq,uqnk->unk", ws, g)[:, None]
        if with_sensitivity:
            dev = theta[sl] - (ws * theta[sl]).sum(axis=1, keepdims=True)
            sens[sl] = np.einsum("uq,uq,uqnk->unk", ws, dev, centred)
        scaled = centred * np.sqrt(ws * counts[sl, None])[:, :, None, None]
        if joint:
            flat = scaled.reshape(-1, n * k)
            info -= flat.T @ flat
        else:
            info -= np.einsum("uqni,uqnj->nij", scaled, scaled)
    return info, sens


def _covariance(info: np.ndarray, joint: bool) -> np.ndarray:
    """The inverse of the information (pseudo-inverse where singular or, joint, not
    positive definite). numpy only: importing scipy.linalg cost a fit process 0.15-0.3 s."""
    try:
        if joint:
            np.linalg.cholesky(info)  # positive definite, or LinAlgError
        cov = np.linalg.inv(info)
        return 0.5 * (cov + np.swapaxes(cov, -1, -2))
    except np.linalg.LinAlgError:
        return _symmetric_pinv(info)


def _symmetric_pinv(a: np.ndarray, rcond: float = 1e-15) -> np.ndarray:
    """``np.linalg.pinv`` of symmetric matrices ``(..., d, d)`` by their eigendecomposition
    (the singular values are the eigenvalues' magnitudes; the same cutoff, ``rcond`` times
    the largest): ``eigh`` instead of an SVD. The 3PL's joint information at 50 x 1,000
    (3,004 x 3,004) is not positive definite after its mode search stalls, and its two
    pseudo-inverses took 200 of a 713 s six-pass profile; on such a matrix ``eigh`` took 35 s
    against the SVD's 160 s (one core shared three ways)."""
    a = 0.5 * (a + np.swapaxes(a, -1, -2))
    w, v = np.linalg.eigh(a)
    cut = rcond * np.abs(w).max(axis=-1, keepdims=True)
    inv = np.where(np.abs(w) > cut, 1.0 / np.where(w == 0, 1.0, w), 0.0)
    return (v * inv[..., None, :]) @ np.swapaxes(v, -1, -2)


def _em_step(spec, x, g, theta, yy, mask, wc, grad, hess, base, settings,
             volume=None) -> np.ndarray:
    """One damped Newton step per item on the expected complete-data log posterior (plus
    each item's ``volume(x)`` ``(n,)`` where given), halved per item until that item's
    objective does not fall."""
    n = x.shape[0]
    x = x.copy()
    step = _newton_direction(grad, hess, settings.max_step)
    accepted = np.zeros(n, bool)
    for _half in range(8):
        trial = x + step
        t_val = _expected_values(spec, trial, theta, yy, mask, wc, settings.cell_chunk) + \
            _item_prior(spec, trial, g)[0]
        if volume is not None:
            t_val = t_val + volume(trial)
        ok = (t_val >= base - 1e-9 * np.abs(base)) & ~accepted
        x[ok] = trial[ok]
        accepted |= ok
        step = np.where(accepted[:, None], 0.0, 0.5 * step)
        if accepted.all():
            break
    return x


def _marginal_newton(info: np.ndarray, grad: np.ndarray, max_step: float) -> np.ndarray | None:
    """``info^-1 grad`` in ``grad``'s shape, capped at ``max_step``; None where the
    information is not positive definite (far from the mode)."""
    try:
        lower = np.linalg.cholesky(info)
    except np.linalg.LinAlgError:
        return None
    step = np.linalg.solve(lower.T, np.linalg.solve(lower, grad.reshape(-1))).reshape(grad.shape)
    if not np.isfinite(step).all():
        return None
    size = float(np.abs(step).max())
    return step * min(1.0, max_step / max(size, 1e-12))


# cells of one batch of importance draws (2 MiB of float32): a batch's weights stay in a
# core's cache (`ability`'s 1,895 draws x 1,280 patterns x 44 points in one call: 0.92 s in
# batches of 37 draws, 8 MiB, against 0.44 s in batches of 9; the same values)
_DRAW_BATCH_CELLS = 1 << 19


def _pattern_moments(lw, theta):
    """Each pattern's log marginal likelihood and ability posterior mean and second moment
    ``(U,)`` from its log weights ``lw`` ``(U, Q)`` on the nodes ``theta`` (``(U, Q)``, or
    ``(Q,)`` shared by every pattern) (traced)."""
    top = lw.max(axis=1, keepdims=True)
    w = jnp.exp(lw - top)
    if theta.ndim == 1:  # one grid: the weights' three sums as one matrix product, and
        # the weights never normalised in full (LSAT7's importance draws at XLA's level 0)
        sums = w @ jnp.stack([jnp.ones_like(theta), theta, theta * theta], axis=1)
        total, first, second = sums[:, 0], sums[:, 1], sums[:, 2]
    else:
        total = w.sum(axis=1)
        first, second = (w * theta).sum(axis=1), (w * theta ** 2).sum(axis=1)
    return top[:, 0] + jnp.log(total), first / total, second / total


@exported_jit(static_argnames=("spec",))
def _draw_moments(spec, xs, gs, theta, y, mask, log_base):
    """For item draws ``xs`` ``(D, n, k)`` with their globals ``gs`` ``(D, h)``: the log prior
    of each draw ``(D,)``, and each pattern's log marginal likelihood and ability posterior
    mean and second moment ``(D, U)`` on the fixed nodes ``theta`` (``log_base``: log prior +
    quadrature weight)."""
    def one(xg):
        x, g = xg
        lw = jnp.sum(_cell_loglik(spec, x, theta, y, mask), axis=-1) + log_base
        return (_log_prior(spec, x, g), *_pattern_moments(lw, theta))

    return _map_draws(one, xs, gs, theta.size * y.shape[-1])


@exported_jit(static_argnames=("spec",))
def _grid_draw_moments(spec, xs, gs, grid, log_base, y1, y0):
    """:func:`_draw_moments` on one grid of abilities ``grid`` ``(G,)`` shared by every
    pattern (``log_base`` ``(G,)``: log prior + log rule weight). A binary cell's
    log-likelihood is ``y log P(1) + (1 - y) log P(0)``, so each draw evaluates its item
    curves once on the grid ``(G, n)`` and every pattern's log-likelihood is a matrix
    product with the observed ones ``y1`` and zeros ``y0`` ``(U, n)``: ``G n`` cells a draw
    instead of ``U Q n``."""
    def one(xg):
        return _grid_draw(spec, *xg, grid, log_base, y1, y0)[1]

    return _map_draws(one, xs, gs, y1.shape[0] * grid.shape[0])  # (U, G): one GEMM a batch


def _grid_draw(spec, x, g, grid, log_base, y1, y0):
    """One item draw's patterns on the shared grid: their log weights ``(U, G)``, and the
    draw's log prior with each pattern's log marginal likelihood and ability moments
    (traced)."""
    lw = _grid_log_weights(spec, x, grid, log_base, y1, y0)
    return lw, (_log_prior(spec, x, g), *_pattern_moments(lw, grid))


@exported_jit(static_argnames=("spec",))
def _grid_draw_aside(spec, xs, gs, grid, log_base, y1, y0, a_grid, a_log_dv, n1, n0):
    """:func:`_grid_draw_moments` with items the fit set aside integrated out on their own
    grid ``a_grid`` ``(B, k)`` (``a_log_dv`` ``(B,)``: its log volumes), against each draw's
    ability posteriors: item ``j``'s likelihood given a draw is
    ``L_j = ∫ p(v | g) prod_u E_u[P(1 | theta, v)]^n1_ju E_u[P(0 | theta, v)]^n0_ju dv``,
    ``E_u`` over pattern ``u``'s ability posterior on the shared grid given the draw's
    items, ``n1``, ``n0`` ``(m, U)`` its patterns' ones and zeros. This is each pattern's
    marginal likelihood with the item in it, divided by the one without, so the draw's
    log prior gains ``sum_j log L_j``: exact for one such item, and for several where
    given the abilities their likelihoods do not overlap (abilities do not see one such
    item through another). Also returns each set-aside item's posterior mean ``(D, m, k)``
    and second moments ``(D, m, k, k)`` given the draw."""
    blocks = _item_blocks(spec)
    curves = [jnp.nan_to_num(jnp.exp(c)) for c in _grid_curves(spec, a_grid, grid)]  # (G, B)

    def one(xg):
        x, g = xg
        lw, (log_prior, *moments) = _grid_draw(spec, x, g, grid, log_base, y1, y0)
        soft = jax.nn.softmax(lw, axis=1)
        data = sum(n @ jnp.log(jnp.maximum(soft @ c, 1e-37)) for n, c in zip((n1, n0), curves))
        env = _env(spec, g)
        t = data + a_log_dv + sum(p.prior.log_prob(a_grid[:, j], env)
                                  for j, p in enumerate(blocks))  # (m, B)
        log_l = jax.nn.logsumexp(t, axis=1)
        r = jnp.exp(t - log_l[:, None])
        return (log_prior + jnp.sum(log_l), *moments,
                r @ a_grid, jnp.einsum("mb,bi,bj->mij", r, a_grid, a_grid))

    return _map_draws(one, xs, gs, y1.shape[0] * (grid.shape[0] + a_grid.shape[0])
                      + n1.shape[0] * a_grid.shape[0])


def _map_draws(one, xs, gs, per_draw: int):
    """``one`` over the item draws ``xs`` and their globals ``gs`` in batches of about
    ``_DRAW_BATCH_CELLS`` cells (``per_draw`` cells a draw): bounded memory, and not one
    loop iteration per draw (4,000 tiny iterations cost LSAT7 0.2 s a call) (traced)."""
    batch = max(1, min(xs.shape[0], _DRAW_BATCH_CELLS // max(per_draw, 1)))
    return jax.lax.map(one, (xs, gs), batch_size=batch)


def answered_moments(m1: np.ndarray, m2: np.ndarray, counts: np.ndarray):
    """The answered patterns' (``counts > 0``) ability posterior means and sds from their
    means ``m1`` and second moments ``m2`` (``(..., U)``): padding patterns answer nothing,
    and their posterior is the prior's."""
    live = np.asarray(counts) > 0
    mean = m1[..., live]
    return mean, np.sqrt(np.maximum(m2[..., live] - mean ** 2, 0.0))


def answered_span(m1: np.ndarray, m2: np.ndarray, counts: np.ndarray, sds: float,
                  rows: int = 256) -> tuple[float, float]:
    """The lowest ``mean - sds sd`` and the highest ``mean + sds sd`` over the answered
    patterns' ability posteriors (:func:`answered_moments` of ``m1``, ``m2`` ``(..., U)``),
    NaNs passed over; ``(inf, -inf)`` where there are none. Taken ``rows`` draws at a
    time: over 1,895 draws x 1,280 patterns (`ability`) the whole arrays' five temporaries
    held 75 MB more of a fit's memory, and on a virtual machine whose new pages cost
    10-50 us each a first touch of them took 0.3 s."""
    live = np.asarray(counts) > 0
    lo, hi = np.inf, -np.inf
    if not live.any():
        return lo, hi
    a = np.reshape(m1, (-1, np.shape(m1)[-1]))
    b = np.reshape(m2, a.shape)
    for start in range(0, len(a), rows):  # in float64, as the whole tables were
        mean, sd = answered_moments(np.asarray(a[start:start + rows], np.float64),
                                    np.asarray(b[start:start + rows], np.float64), counts)
        lo = float(np.fmin(lo, np.fmin.reduce(mean - sds * sd, axis=None)))
        hi = float(np.fmax(hi, np.fmax.reduce(mean + sds * sd, axis=None)))
    return lo, hi


def wider_grid(spec, theta: np.ndarray, m1: np.ndarray, m2: np.ndarray, counts: np.ndarray,
               reach: float = 0.0, max_points: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(grid, log_base)``: an even grid reaching from ``theta``'s ends at least ``reach`` of
    its width further each way and over every answered pattern's ``mean +- _DrawNodes.SPAN
    sd`` (:func:`answered_span` of ``m1``, ``m2``), at ``theta``'s spacing or finer (a
    bucketed number of points, two sizes a doubling), at most ``max_points`` of them but
    never fewer than ``theta``'s (coarser there: :func:`cells_cap`), with the ability prior
    plus the log spacing (the rule's weight) on it. Where a grid laid out at the items' mode
    cuts off the abilities' posteriors under the items' uncertainty (:class:`_DrawNodes`,
    :mod:`engine.infer.sampler`)."""
    from engine.infer.fit import bucket_size

    width, step = float(theta[-1] - theta[0]), float(theta[1] - theta[0])
    low, high = answered_span(m1, m2, counts, _DrawNodes.SPAN)
    lo = min(float(theta[0]) - reach * width, low)
    hi = max(float(theta[-1]) + reach * width, high)
    points = bucket_size(int(np.ceil((hi - lo) / step)) + 1, 2)
    if max_points is not None:
        points = min(points, max(max_points, theta.size))
    grid = np.linspace(lo, hi, points)
    return grid, _ability_prior(spec, grid) + np.log(grid[1] - grid[0])


def cells_cap(points: int, cells: float, cells_max: float) -> int:
    """The most points a widened grid may have where a grid of ``points`` costs ``cells``
    (cost grows with the points) and the bound is ``cells_max``: a bucketed size (two a
    doubling, so that capped grids of boards alike run one program), never below
    ``points`` (the grid is then coarser, not dearer)."""
    from engine.infer.fit import bucket_floor

    return max(points, bucket_floor(int(points * cells_max // max(cells, 1)), 2))


def _ones_and_zeros(y, mask, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Each pattern's observed ones and zeros ``(U, n)`` from its responses ``y`` and
    ``mask``, the ones in ``dtype`` (times the mask's)."""
    y1 = np.asarray(y, dtype) * mask
    return y1, np.asarray(mask, dtype) - y1


class _DrawNodes:
    """Where the abilities are integrated while item draws are weighted: one shared,
    evenly spaced grid, or each pattern's adaptive Gauss-Hermite nodes.

    The shared grid spans every answered pattern's posterior mean +- ``SPAN`` of its sds,
    spaced at the smallest of those sds. The rule on even spacing ``h`` integrates a normal
    of sd ``s`` to a relative error of about ``2 exp(-2 pi^2 s^2 / h^2)`` (5e-9 at ``h = s``),
    and a pattern's log-likelihood on it is a matrix product (:func:`_grid_draw_moments`).
    It is taken where it has at most ``GRID_PER_NODE`` times as many points as a pattern has
    adaptive nodes (short and medium tests: `ability` 1,199 patterns x 16 items, 40 grid
    points against 11 nodes a pattern); on long tests, whose posteriors are narrow, the
    adaptive nodes."""

    SPAN = 8.0
    EDGE_SDS = 5.0  # a posterior this near the grid's end is cut off (:meth:`cuts`)
    MAX_WIDEN = 3  # widenings at most in all (each from the moments the last grid gave)
    GRID_PER_NODE = 8
    # 1,601 2PL item draws at 200 x 400 on a 68-point shared grid (8.7G multiply-adds) took
    # 1.0 s; 2,401 3PL draws there on 11 adaptive nodes (2.1G cells) 12.3 s: ~50 to a cell
    GEMM_PER_CELL = 32

    def __init__(self, spec, quad, counts, num_nodes: int, previous: "_DrawNodes | None" = None,
                 slack: float = 0.0, max_points: int | None = None, per_doubling: int = 8):
        """``previous``: a grid kept where it still spans and resolves the patterns'
        posteriors (the fit's volumes, each pass: a grid of a new size is a new XLA program).
        ``slack``: a new grid reaches that share of its width further each way and is that
        much finer, so that the next passes' posteriors stay on it. ``max_points``: the
        largest shared grid (``GRID_PER_NODE`` adaptive nodes' worth by default).
        ``per_doubling``: the grid's sizes (:func:`engine.infer.fit.bucket_size`); fewer
        of them make a finer grid on the same span, and one program for more data sets."""
        from engine.infer.fit import bucket_size

        live = counts > 0
        mean, sd = quad.mean[live], quad.sd[live]
        lo, hi = float((mean - self.SPAN * sd).min()), float((mean + self.SPAN * sd).max())
        step = float(sd.min())
        if (previous is not None and previous.shared and previous.theta[0] <= lo
                and previous.theta[-1] >= hi and previous.theta[1] - previous.theta[0] <= step):
            self.shared, self.theta, self.log_base = True, previous.theta, previous.log_base
        else:
            size = int(np.ceil((hi - lo) / step)) + 1
            limit = max_points or self.GRID_PER_NODE * num_nodes
            self.shared = size <= limit
            if self.shared:
                reach = slack * (hi - lo)
                lo, hi = lo - reach, hi + reach
                # a bucketed number of points (at most 12.5% more): similar data sets and
                # later passes run the same programs
                points = int(np.ceil((hi - lo) / (step / (1 + slack)))) + 1
                size = bucket_size(points, per_doubling)
                if size > limit:
                    size = bucket_size(points)  # the finest bucketing within the bound
                self.theta = np.linspace(lo, hi, size)
                prior = _ability_prior(spec, self.theta)
                self.log_base = prior + np.log(self.theta[1] - self.theta[0])
            else:
                self.theta, self.log_base = quad.log_base(spec, num_nodes)
        self.record = {"nodes": "shared grid" if self.shared else "adaptive",
                       "points": int(self.theta.shape[-1])}

    def cuts(self, m1: np.ndarray, m2: np.ndarray, counts: np.ndarray) -> bool:
        """Whether, on the shared grid, some answered pattern's ability posterior under some
        item draw (mean ``m1``, second moment ``m2``, ``(D, U)``) comes within ``EDGE_SDS`` of
        its sds of the grid's ends: the grid spans the posteriors at the items' mode, and
        an item draw away from it moves and widens them (feas at 50 x 1,000: sds 0.05 at
        the mode, 0.17-0.36 over the items' posterior)."""
        if not self.shared or self.record.get("widenings", 0) >= self.MAX_WIDEN:
            return False
        lo, hi = answered_span(m1, m2, counts, self.EDGE_SDS)
        return bool(lo < self.theta[0] or hi > self.theta[-1])

    def widened(self, spec, m1: np.ndarray, m2: np.ndarray, counts: np.ndarray,
                max_points: int | None = None) -> "_DrawNodes":
        """A shared grid at this one's spacing or finer spanning every answered pattern's
        posterior mean +- ``SPAN`` of its sd under every item draw (``m1``, ``m2``
        ``(D, U)``), and this grid; at most ``max_points`` points (coarser there; never fewer
        than this grid's)."""
        out = object.__new__(_DrawNodes)
        out.shared = True
        out.theta, out.log_base = wider_grid(spec, self.theta, m1, m2, counts,
                                             max_points=max_points)
        out.record = {"nodes": "shared grid", "points": int(out.theta.size),
                      "spacing": round(float(out.theta[1] - out.theta[0]), 4),
                      "spacing_before": round(float(self.theta[1] - self.theta[0]), 4),
                      "widened_from": self.record.get("widened_from", int(self.theta.size)),
                      "widenings": self.record.get("widenings", 0) + 1}
        return out

    def cells_per_draw(self, num_patterns: int, num_items: int) -> int:
        """What weighting one draw costs, in log-likelihood cells: ``patterns x nodes x
        items`` on adaptive nodes; on the shared grid a weight per pattern and grid point
        plus ``1 / GEMM_PER_CELL`` of a cell per multiply-add of the matrix product."""
        G = self.theta.shape[-1]
        if self.shared:
            return num_patterns * G + num_patterns * num_items * G // self.GEMM_PER_CELL
        return num_patterns * G * num_items

    def weights(self, spec, x, y, mask, dtype=jnp.float32):
        """``(soft, y1, y0)``: each pattern's ability posterior weights on the shared grid
        ``(U, G)`` given items ``x``, and its observed ones and zeros ``(U, n)`` (float64)."""
        y1, y0 = _ones_and_zeros(y, mask, np.float64)
        soft = _grid_weights(spec, to_device(x, dtype), to_device(self.theta, dtype),
                             to_device(self.log_base, dtype), to_device(y1, dtype),
                             to_device(y0, dtype))
        return np.asarray(soft, np.float64), y1, y0

    def aside_cells(self, num_patterns: int, aside: "_SetAsideGrid") -> int:
        """What integrating the set-aside items out costs a draw, in cells as
        :meth:`cells_per_draw` counts them (:func:`_grid_draw_aside`)."""
        G, (B, k), m = self.theta.shape[-1], aside.grid.shape, aside.n1.shape[0]
        return num_patterns * G * B // self.GEMM_PER_CELL + 2 * num_patterns * B + m * B * (1 + k * k)

    def draws(self, w: np.ndarray, xs: np.ndarray, y, mask) -> "AbilityDraws | None":
        """Item draws ``xs`` ``(D, n, k)`` with normalised weights ``w`` whose ability
        moments were computed here, for their exact quantiles; None on adaptive nodes."""
        if not self.shared:
            return None
        from engine.infer.ability_quantiles import AbilityDraws

        return AbilityDraws(xs, w, self.theta, self.log_base,
                            *_ones_and_zeros(y, mask, np.float32))

    def moments(self, spec, xs: np.ndarray, item_shape: tuple[int, int], y, mask,
                aside: "_SetAsideGrid | None" = None):
        """:func:`_draw_moments` of draws ``xs`` ``(D, n k + h)`` (the items' values
        flattened, then the globals'): the per-draw values ``(D,)`` in float64, the
        per-pattern tables ``(D, U)`` (and the set-aside items' ``(D, m, k[, k])``) as
        computed, float32 and read-only. With ``aside`` (on the shared grid only),
        :func:`_grid_draw_aside`: the set-aside items integrated out, and their moments."""
        n, k = item_shape
        items = to_device(xs[:, :n * k].reshape(len(xs), n, k), jnp.float32)
        hyper = to_device(xs[:, n * k:], jnp.float32)
        # a call over many cells runs optimised code even in a quickly compiled fit
        # (`ability`: 1,895 draws x 1,280 patterns x 44 grid points, 0.43 s against 1.4 s)
        heavy = len(xs) * self.cells_per_draw(*np.shape(y)) > _QUICK_DRAW_CELLS
        with compiler_options(None) if heavy else contextlib.nullcontext():
            if self.shared:  # the grid, and each pattern's ones and zeros
                y1, y0 = _ones_and_zeros(y, mask, np.float32)
                grid_args = (to_device(self.theta, jnp.float32),
                             to_device(self.log_base, jnp.float32), to_device(y1),
                             to_device(y0))
                out = (_grid_draw_moments(spec, items, hyper, *grid_args) if aside is None else
                       _grid_draw_aside(spec, items, hyper, *grid_args,
                                        to_device(aside.grid, jnp.float32),
                                        to_device(aside.log_dv, jnp.float32),
                                        to_device(aside.n1, jnp.float32),
                                        to_device(aside.n0, jnp.float32)))
            else:
                out = _draw_moments(spec, items, hyper, to_device(self.theta, jnp.float32),
                                    to_device(y), to_device(mask),
                                    to_device(self.log_base, jnp.float32))
            # per-draw values in float64; the (D, U) tables as computed (float32): a float64
            # copy of each held 58 MB more at 1,895 draws x 1,280 patterns (`ability`),
            # and their users accumulate in float64 (:func:`_weighted_moments`)
            return tuple(np.asarray(a, np.float64) if np.ndim(a) < 2 else np.asarray(a)
                         for a in out)


def _within_item_blocks(full_cov: np.ndarray, n: int, k: int) -> np.ndarray:
    """The ``(n, k, k)`` within-item blocks of the items' joint ``(n k, n k)`` covariance (or
    information)."""
    return np.stack([full_cov[i * k:(i + 1) * k, i * k:(i + 1) * k] for i in range(n)])


def _importance(spec, x, g, full_cov, quad, y, mask, counts, settings: MarginalSettings,
                aside: "_SetAsideGrid | None" = None, start: tuple | None = None):
    """Posterior moments of the items (with the globals ``g`` after them, where there are
    any) and abilities by self-normalised importance sampling from the Laplace approximation
    ``N((x, g), spread^2 full_cov)`` (Ionides' truncated weights), or ``(None, record)``
    where it does not apply or its effective sample size stays too small.

    Up to three rounds (adaptive importance sampling). After a round whose weighted draws
    show its proposal off (:func:`_proposal_off`), or whose effective sample is
    too small to keep but at least ``importance_pilot_ess``, the next round draws around the
    weighted mean, with the weighted covariance where there are at least five effective
    draws per item value and the Laplace covariance otherwise, and after a round too small
    to keep with up to ``importance_cells_retry`` cells. LSAT7: item 5's skewed tail, which
    the mode's curvature does not see, is then inside the proposal; 1,000 x 50: the 100
    item values' posterior mean sits 0.4 sd from the mode along the discriminations, and a
    proposal centred there keeps 11% of the draws where one at the mode kept 5%. Where
    two or more rounds ran, all their draws are also weighted against the mixture of the
    rounds' proposals (:func:`_pooled_weights`), and those moments are reported where they
    keep more effective draws than the last kept round (LSAT7: 1,988 against 382).

    ``aside``: items the fit set aside (:class:`_SetAsideGrid`), integrated out of every
    draw against its ability posteriors (:func:`_grid_draw_aside`) where the shared grid
    holds and the cells allow (the record's ``set_aside`` says which); their moments come
    back as the result's last element. ``start``: ``(centre, covariance)`` of the first
    proposal in their place (:func:`_pool_proposal`), used only with them.
    """
    n, k = x.shape
    U, Q = int((counts > 0).sum()), settings.importance_nodes  # padded patterns count zero
    d = n * k + g.size
    per_draw = max(U * Q * n, 1)
    draws = min(settings.importance_draws, settings.importance_cells_max // per_draw)
    record = {"draws": int(draws)}
    if d > settings.importance_max_params or draws < 200 or full_cov.shape != (d, d):
        return None, record | {"method": "laplace", "because": (
            f"{d} item values or {U} patterns x {n} items: over the importance-sampling bounds")}
    spread = proposal_spread(d, settings.importance_spread)
    record |= {"spread": round(spread, 4), "rounds": []}
    # each pattern's ability integrated on one shared grid, or on fewer adaptive nodes than
    # the fit's (placed at the same posterior mean and sd): the same cells buy more draws
    nodes = _DrawNodes(spec, quad, counts, Q)
    record["nodes"] = nodes.record
    per_draw_cells = nodes.cells_per_draw(U, n)
    if aside is not None:  # the set-aside items integrated out of every draw, where the
        # shared grid holds and the draws stay within the cells
        # (in the units of ``per_draw_cells``: both count the shared grid's cells)
        extra = nodes.aside_cells(U, aside) if nodes.shared else 0
        if nodes.shared and draws * (per_draw_cells + extra) <= settings.importance_cells_max:
            per_draw_cells += extra
            record["set_aside"] = "integrated out of each draw"
        else:
            aside = None
            record["set_aside"] = ("left out: " + ("no shared ability grid" if not nodes.shared
                                                   else f"{extra} cells a draw"))
    more = min(settings.importance_draws,
               settings.importance_cells_max // max(per_draw_cells, 1))
    # a widened grid keeps a round's draws within the cells (they grow with its points)
    grid_max = cells_cap(nodes.theta.shape[-1], max(draws, more) * per_draw_cells,
                         settings.importance_cells_max)
    rng = np.random.default_rng(_seed(settings))
    centre, cov = np.concatenate([x.reshape(-1), g]).astype(np.float64), full_cov
    if start is not None and aside is not None:  # the first proposal about the pool with
        centre, cov = start  # the set-aside items in it (:func:`_pool_proposal`)
    result, used, why = None, 0, None
    pool = []  # each round's draws, log densities, ability moments and proposal

    def draw(count, centre, factor):  # draws, log posterior, log proposal (up to a constant),
        nonlocal nodes  # the abilities' moments, and the set-aside items' (none: (count, 0))
        z = rng.standard_normal((count, d))
        xs = centre + z @ factor.T
        lp, lm, m1, m2, *more_moments = nodes.moments(spec, xs, (n, k), y, mask, aside)
        while nodes.cuts(m1, m2, counts):  # these draws on a grid that spans them (the
            # earlier ones, not cut, integrate alike on either)
            nodes = nodes.widened(spec, m1, m2, counts, grid_max)
            record["nodes"] = nodes.record
            lp, lm, m1, m2, *more_moments = nodes.moments(spec, xs, (n, k), y, mask, aside)
        a1, a2 = more_moments or (np.zeros((count, 0)), np.zeros((count, 0)))
        return xs, lm @ counts + lp, -0.5 * (z ** 2).sum(axis=1), m1, m2, a1, a2

    for round_ in (1, 2, 3):
        why = None  # the reason this round stopped short, if it does
        try:
            chol = np.linalg.cholesky(cov)
        except np.linalg.LinAlgError:
            why = f"round {round_}: covariance not positive definite"
            break
        xs, logp, logq, m1, m2, a1, a2 = draw(draws, centre, spread * chol)
        w, ess = _truncated_weights(logp - logq)
        if ess < settings.importance_target_ess and more > len(xs) and np.isfinite(ess):
            # short of the target: more draws from the same proposal, where the shared
            # grid makes them cheap enough
            xs, logp, logq, m1, m2, a1, a2 = (np.concatenate(pair) for pair in zip(
                (xs, logp, logq, m1, m2, a1, a2), draw(more - len(xs), centre, spread * chol)))
            w, ess = _truncated_weights(logp - logq)
        if not np.isfinite(logp - logq).all():
            why = f"round {round_}: a draw had no finite density"
            break
        draws = len(xs)
        pool.append((xs, logp, m1, m2, centre, spread * chol, a1, a2))
        moments = _weighted_moments(w, xs, m1, m2, n, k, a1, a2)
        mean, weighted_cov = np.concatenate([moments[0].reshape(-1), moments[1]]), moments[2]
        enough = ess >= max(200.0, settings.importance_min_ess * draws)
        record["rounds"].append({"draws": int(draws), "effective_draws": round(ess, 1),
                                 "kept": bool(enough)})
        if enough:
            result, used, weighted = moments, round_, (w, xs, ess)
            if not _proposal_off(centre, cov, mean, weighted_cov, settings):
                break
        elif ess < settings.importance_pilot_ess:
            why = (f"effective sample size {ess:.0f} of {draws} draws in round {round_}: the "
                   "proposal is too far from the posterior to correct")
            break
        else:  # too few to keep, enough to move the proposal: more draws next round
            why = f"effective sample size {ess:.0f} of {draws} draws in round {round_}"
            draws = max(draws, min(settings.importance_draws,
                                   settings.importance_cells_retry // per_draw))
        centre, cov = mean, weighted_cov if ess >= 5 * d else cov
    if result is None:
        return None, record | {"method": "laplace", "because": why}
    if len(pool) > 1:  # every round's draws, weighted against the mixture of the proposals
        xs, w, ess = _pooled_weights(pool)
        record["pooled"] = {"draws": int(len(xs)), "effective_draws": round(ess, 1),
                            "used": False}
        if ess > record["rounds"][used - 1]["effective_draws"]:
            m1, m2, a1, a2 = (np.concatenate([r[i] for r in pool]) for i in (2, 3, 6, 7))
            result = _weighted_moments(w, xs, m1, m2, n, k, a1, a2)
            record["pooled"]["used"] = True
            weighted = (w, xs, ess)
    w, xs, ess = weighted  # the items' 90% intervals from the draws the moments came from
    quantiles = None
    if ess >= settings.importance_quantile_ess:
        quantiles = _weighted_quantiles(w, xs[:, :n * k], (0.05, 0.95)).reshape(2, n, k)
    record["intervals"] = ("weighted draws' quantiles" if quantiles is not None
                           else f"gaussian: {ess:.0f} effective draws, under "
                                f"{settings.importance_quantile_ess:.0f}")
    # and the draws the abilities' moments came from, on their grid (their quantiles)
    result = (*result, quantiles, nodes.draws(w, xs[:, :n * k].reshape(len(xs), n, k), y, mask))
    # the moments are the last kept round's, or all rounds' pooled where that keeps more
    # effective draws; a later round that stopped short says why
    return result, record | {"method": "importance", "used_round": used} | (
        {"later_round_failed": why} if why and round_ > used else {})


def _weighted_quantiles(w: np.ndarray, xs: np.ndarray, qs) -> np.ndarray:
    """Each column's quantiles ``qs`` of draws ``xs`` ``(D, d)`` under normalised weights
    ``w`` ``(D,)``: the smallest draw whose cumulative weight reaches ``q``, ``(len(qs),
    d)``."""
    order = np.argsort(xs, axis=0)
    cumulative = np.cumsum(w[order], axis=0)
    cumulative /= cumulative[-1]
    at = np.stack([(cumulative < q).sum(axis=0) for q in qs])
    return np.take_along_axis(xs, order, axis=0)[np.minimum(at, len(xs) - 1),
                                                  np.arange(xs.shape[1])]


def _weighted_moments(w, xs, m1, m2, n: int, k: int, a1=None, a2=None) -> tuple:
    """Weighted draws ``xs`` ``(D, n k + h)`` as ``_importance``'s result: the items' mean
    ``(n, k)``, the globals' ``(h,)``, the draws' covariance ``(n k + h, n k + h)``, each
    pattern's ability mean and variance over them (``m1``, ``m2`` ``(D, U)``), and the
    set-aside items' mean ``(m, k)`` and covariance ``(m, k, k)`` from their moments
    given each draw (``a1`` ``(D, m, k)``, ``a2`` ``(D, m, k, k)``; ``None`` where there
    are none)."""
    mean = w @ xs
    centred = xs - mean
    ability_mean = w @ m1
    aside = None
    if a1 is not None and a1.size:
        a_mean = np.einsum("d,dmk->mk", w, a1)
        aside = (a_mean, np.einsum("d,dmij->mij", w, a2) - a_mean[:, :, None] * a_mean[:, None, :])
    return (mean[:n * k].reshape(n, k), mean[n * k:], (centred * w[:, None]).T @ centred,
            ability_mean, np.maximum(w @ m2 - ability_mean ** 2, 1e-24), aside)


def _pooled_weights(pool: list) -> tuple[np.ndarray, np.ndarray, float]:
    """All rounds' draws ``(D, d)`` with their weights against the mixture of the rounds'
    proposals, each in proportion to its draws (deterministic-mixture multiple importance
    sampling, Veach and Guibas 1995; Owen and Zhou 2000), truncated as in one round, and
    their effective sample size. ``pool`` holds per round ``(draws, log density, ability
    moments, ability second moments, proposal centre, proposal Cholesky factor)``.

    A round's own weights see only its proposal; against the mixture, a draw from an early
    proposal that missed a tail counts for less where a later one covered it, and every
    round's draws count (LSAT7: rounds of 847, 592 and 382 effective draws)."""
    xs = np.concatenate([r[0] for r in pool])
    logp = np.concatenate([r[1] for r in pool])
    total = len(xs)
    log_q = []
    for centre, factor in (r[4:6] for r in pool):
        z = np.linalg.solve(factor, (xs - centre).T)  # (d, D)
        log_q.append(-0.5 * (z ** 2).sum(axis=0) - np.log(np.abs(np.diag(factor))).sum())
    share = np.log([len(r[0]) / total for r in pool])[:, None]
    log_mix = np.logaddexp.reduce(np.asarray(log_q) + share, axis=0)
    w, ess = _truncated_weights(logp - log_mix)
    return xs, w, ess


def _truncated_weights(logw: np.ndarray) -> tuple[np.ndarray, float]:
    """Self-normalised importance weights from log weights, truncated at ``sqrt(D)`` times
    their mean (Ionides 2008), and their effective sample size (nan where some log weight is
    not finite)."""
    if not np.isfinite(logw).all():
        return np.full(logw.shape, np.nan), float("nan")
    w = np.exp(logw - logw.max())
    w = np.minimum(w, w.mean() * np.sqrt(len(w)))
    w /= w.sum()
    return w, float(1.0 / (w ** 2).sum())


def _laplace_abilities(spec, x, g, proposal, quad, y, mask, counts, settings: MarginalSettings):
    """Each pattern's ability posterior mean and variance ``(U,)`` averaged over item draws
    from the Laplace approximation ``N((x, g), proposal)`` (``proposal`` joint ``(d, d)``,
    the globals after the items, or per item ``(n, k, k)`` at the globals ``g``), by
    the law of total variance; ``(None, record)`` where the draws would exceed the cells.

    The abilities at the items' mode alone are too spread where items are uncertain: at
    50 x 1,000 (50 answers per item) their posterior means lay on 1.048 times NUTS's scale
    (z up to 0.43 NUTS sd), because each subject's own answers pulled the items it was
    scored against. Averaged over the items' uncertainty they shrink as NUTS's do."""
    n, k = x.shape
    U, Q = int((counts > 0).sum()), settings.importance_nodes
    draws = min(settings.laplace_draws, settings.importance_cells_max // max(U * Q * n, 1))
    record = {"method": "laplace draws", "draws": int(draws)}
    if draws < 50:
        return None, record | {"method": "mode", "because": f"{U} patterns x {n} items"}
    draws -= draws % 2
    rng = np.random.default_rng(_seed(settings) + 1)
    # antithetic pairs (z, -z): the means' Monte Carlo error from the part of each ability
    # that is linear in the items cancels, which is most of it
    z = rng.standard_normal((draws // 2, n * k + g.size))
    z = np.concatenate([z, -z])
    try:
        if proposal.ndim == 2:
            centre = np.concatenate([x.reshape(-1), g])
            xs = centre + z @ np.linalg.cholesky(proposal).T
        else:  # per item, given the globals (they enter no likelihood: held at theirs)
            chol = np.linalg.cholesky(proposal)  # (n, k, k)
            items = x + np.einsum("nij,dnj->dni", chol, z[:, :n * k].reshape(draws, n, k))
            xs = np.concatenate([items.reshape(draws, -1), np.broadcast_to(g, (draws, g.size))],
                                axis=1)
    except np.linalg.LinAlgError:
        return None, record | {"method": "mode", "because": "covariance not positive definite"}
    if not np.isfinite(xs).all():
        return None, record | {"method": "mode", "because": "covariance not finite"}
    nodes = _DrawNodes(spec, quad, counts, Q)
    grid_max = cells_cap(nodes.theta.shape[-1], draws * nodes.cells_per_draw(U, n),
                         settings.importance_cells_max)  # a widened grid within the cells
    _, _, m1, m2 = nodes.moments(spec, xs, (n, k), y, mask)
    while nodes.cuts(m1, m2, counts):  # the draws move the posteriors off the mode's grid
        nodes = nodes.widened(spec, m1, m2, counts, grid_max)
        _, _, m1, m2 = nodes.moments(spec, xs, (n, k), y, mask)
    record["nodes"] = nodes.record
    mean = m1.mean(axis=0, dtype=np.float64)
    return (mean, np.maximum(m2.mean(axis=0, dtype=np.float64) - mean ** 2, 1e-24),
            nodes.draws(np.full(draws, 1.0 / draws), xs[:, :n * k].reshape(draws, n, k),
                        y, mask)), record


def _sampled(spec, x, g, cov, g_cov, quad, y, mask, counts, settings: MarginalSettings,
             aside: tuple | None = None):
    """The items' marginal posterior sampled (:func:`engine.infer.sampler.sample_items`)
    where importance sampling was not kept: ``(moments, record)``, ``moments`` ``None``
    where the sampler is off, has no shared grid, would exceed ``sampler_cells_max``, or
    its chains did not mix. ``aside``: ``(columns, n1, n0)``, items the fit set aside with
    each pattern's ones and zeros on them ``(m, U)``, sampled with those answers (each
    pattern's share of them where its subjects differ)."""
    if settings.sampler_chains < 1:
        return None, {"method": "laplace", "because": "sampler_chains is 0"}
    from engine.infer.sampler import sample_items

    U, n, k = int((counts > 0).sum()), x.shape[0], x.shape[1]
    # the sampler's grid in two sizes a doubling (a finer grid, at most 50% more points):
    # its chains are the fit's largest program (24 x 120 2PL: 3.9 of 5.7 s compiling), and
    # two 24 x 120 boards had grids of 40 and 48 points
    nodes = _DrawNodes(spec, quad, counts, settings.importance_nodes,
                       max_points=settings.sampler_grid_max,
                       per_doubling=2 if settings.bucket_patterns else 8)
    G = nodes.theta.shape[-1]
    sweeps = settings.sampler_chains * (settings.sampler_warmup + settings.sampler_draws)
    subjects = int(np.rint(counts).sum())  # each drawn on the grid every sweep
    cells = sweeps * ((1 + bool(spec.symmetries)) * nodes.cells_per_draw(U, n)
                      + settings.sampler_item_steps * G * n + subjects * G)
    if not nodes.shared or cells > settings.sampler_cells_max:
        return None, {"method": "laplace", "because": (
            "no shared ability grid" if not nodes.shared else
            f"{cells:.3g} cells over sampler_cells_max")}
    # a widened grid stays within the cells, which grow with its points
    grid_max = min(settings.sampler_grid_max, cells_cap(G, cells, settings.sampler_cells_max))
    y1, y0 = _ones_and_zeros(y, mask, np.float64)
    judged = None
    if aside is not None:
        columns, n1, n0 = aside
        per = np.where(counts > 0, counts, 1.0)
        y1, y0 = y1.copy(), y0.copy()
        y1[:, columns], y0[:, columns] = (n1 / per).T, (n0 / per).T
        judged = np.ones(y1.shape[1], bool)
        judged[columns] = False  # the pilot compares the fitted items with their Laplace
    try:
        with compiler_options(None):  # long loops: optimised code even in a quick-compiled fit
            return sample_items(spec, x, g, cov, g_cov, nodes.theta, nodes.log_base, y1,
                                y0, counts, settings, seed=_seed(settings), judged=judged,
                                grid_max=grid_max, sweep_cells=cells / sweeps)
    except np.linalg.LinAlgError as err:  # e.g. the globals' draws collapsed in a phase
        return None, {"method": "laplace", "because": f"the sampler's adaptation failed ({err})"}


def _proposal_off(centre, proposal_cov, mean, cov, settings: MarginalSettings) -> bool:
    """True where the weighted draws' sds or mean are far enough from the proposal's
    (the Laplace approximation in the first round) that another, moment-matched round is
    worth its draws."""
    sd0, sd = np.sqrt(np.diag(proposal_cov)), np.sqrt(np.diag(cov))
    ratio = sd / sd0
    return bool((ratio > settings.importance_refit_sd).any()
                or (ratio < 1 / settings.importance_refit_sd).any()
                or (np.abs(mean - centre) > settings.importance_refit_shift * sd0).any())


def _aside_counts(inverse: np.ndarray, aside: np.ndarray, num_patterns: int) -> tuple:
    """``(n1, n0)`` ``(m, U)``: each set-aside item's ones and zeros per pattern, from its
    responses ``aside`` ``(S, m)`` (-1 missing) and each subject's pattern ``inverse``."""
    aside, U = np.asarray(aside), num_patterns
    return tuple(np.stack([np.bincount(inverse, weights=(c == r), minlength=U)[:U]
                           for c in aside.T]) for r in (1, 0))


class _SetAsideGrid:
    """Items the fit set aside, on a fixed grid of their values: each one's likelihood
    against the fitted abilities, and what it says about the globals.

    Each item's responses ``aside`` ``(S, m)`` (-1 missing) are integrated over each
    pattern's ability posterior (nodes ``theta`` ``(U, Q)``, or ``(1, Q)`` shared by every
    pattern, weights ``w`` ``(U, Q)``; ``inverse`` maps subjects to patterns) at every point
    of a grid (:func:`_set_aside_axis`: dense over 6 sds about the pool's location under
    ``g``, where the items' likelihoods turn, geometric beyond, out to 1,000 of its sds).
    A grid spread evenly over the draws' priors missed that turn once the pool's sd ran to
    hundreds, and the draws then drifted without bound (2PL 100 x 8 with five of eight
    items constant).

    :meth:`terms` gives ``sum_j log L_j(g)`` for draws of the globals, ``L_j(g)`` the
    item's likelihood integrated over its prior under ``g``: the factor these items add to
    the globals' posterior. :meth:`read_out` averages each item's grid posterior over
    weighted draws of the globals."""

    def __init__(self, spec, g, theta, w, inverse, aside: np.ndarray, limit: int):
        self.blocks = _item_blocks(spec)
        self.globals_ = spec.by_owner("global")
        k = len(self.blocks)
        th = to_device(theta, jnp.float32)
        U = w.shape[0]
        self.n1, self.n0 = n1, n0 = _aside_counts(inverse, aside, U)  # (m, U)
        axes, log_da = [], []
        for loc, prec in self.priors(np.asarray(g, np.float64)[None, :])[0]:
            axis = _set_aside_axis(float(loc[0]), float(prec[0]) ** -0.5, {1: 121, 2: 41}[k])
            axes.append(axis)
            log_da.append(np.log(np.gradient(axis)))  # trapezoid weights
        self.grid = np.stack([a.reshape(-1) for a in np.meshgrid(*axes, indexing="ij")], -1)
        self.log_dv = sum(a.reshape(-1) for a in np.meshgrid(*log_da, indexing="ij"))  # (G,)
        shared = theta.shape[0] == 1 < w.shape[0]  # every pattern on one grid: a matrix product
        log_p = {}
        for r in (0, 1):  # log P(y = r | pattern u, item at grid point) (U, G)
            parts = []
            for sl in _chunks(theta.shape[0], theta.shape[1], len(self.grid), limit):
                gx = to_device(self.grid[sl], jnp.float32)
                ones = np.ones((theta.shape[0], gx.shape[0]), np.float32)  # on the host: no
                ll = np.asarray(_node_loglik_cells(spec, gx, th, to_device(r * ones),  # program
                                                   to_device(ones)), np.float64)  # per chunk
                top = ll.max(axis=1, keepdims=True)
                with np.errstate(divide="ignore"):  # a pattern with no weight there: -inf
                    if shared:
                        parts.append(top[0] + np.log(w @ np.exp(ll[0] - top[0])))
                    else:
                        parts.append(top[:, 0] + np.log(np.einsum("uq,uqg->ug", w,
                                                                  np.exp(ll - top))))
            # a point whose likelihood is not finite (a = e^300 overflows float32) drops out
            log_p[r] = np.nan_to_num(np.concatenate(parts, axis=1), nan=-1e30, neginf=-1e30,
                                     posinf=-1e30)
        data = n1 @ log_p[1] + n0 @ log_p[0]  # (m, G) each item's log likelihood on the grid
        data = np.where(data > -1e29, data, -np.inf)
        top = data.max(axis=1, keepdims=True)
        self.lik = np.exp(data - np.where(np.isfinite(top), top, 0.0))  # scaled per item

    def priors(self, draws):
        """Each item block's prior ``(loc, prec)`` under each draw of the globals ``(M, h)``,
        and which draws are usable: one far in a proposal's tail whose precision overflows
        (or is 0) is not."""
        with np.errstate(over="ignore"):
            env = {p.name: _host_constrain(p, draws[:, i]) for i, p in enumerate(self.globals_)}
        priors = [tuple(np.broadcast_to(np.asarray(v, np.float64), len(draws))
                        for v in p.prior.normal_params(env)) for p in self.blocks]
        ok = np.all([np.isfinite(loc) & np.isfinite(prec) & (prec > 0) & (prec < 1e300)
                     for loc, prec in priors], axis=0)
        return [(np.where(ok, loc, 0.0), np.where(ok, prec, 1.0)) for loc, prec in priors], ok

    def terms(self, draws):
        """``(sum_j log L_j (M,), up to a constant, -inf where a draw is unusable; each
        draw's log prior on the grid (M, G) less its maximum (M, 1); each L_j (M, m),
        scaled)``, and the priors, for draws of the globals ``(M, h)``."""
        priors, usable = self.priors(draws)
        lp = self.log_dv + sum(0.5 * np.log(prec[:, None] / (2 * np.pi))
                               - 0.5 * prec[:, None] * (self.grid[None, :, j] - loc[:, None]) ** 2
                               for j, (loc, prec) in enumerate(priors))  # (M, G)
        lp = np.where(usable[:, None], lp, -np.inf)
        p_top = np.where(usable[:, None], lp.max(axis=1, keepdims=True), 0.0)
        overlap = np.exp(lp - p_top) @ self.lik.T  # (M, m): each L_j(g_d), scaled
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            value = (np.log(overlap) + p_top).sum(axis=1)
        return np.where(np.isfinite(value) & usable, value, -np.inf), (lp, p_top, overlap), priors

    def read_out(self, draws, wts, parts=None):
        """Each item's posterior mean ``(m, k)`` and covariance ``(m, k, k)``: its grid
        posterior averaged over the globals' draws ``(M, h)`` with weights ``wts`` ``(M,)``
        (``sum_d W_d p_d(grid) L_j / L_j(g_d)``), and which items got a finite, positive
        definite one (the others keep the prior). ``parts``: :meth:`terms`'s of the draws,
        where already evaluated."""
        lp, p_top, overlap = self.terms(draws)[1] if parts is None else parts
        k = len(self.blocks)
        with np.errstate(divide="ignore", invalid="ignore"):
            coef = np.where(wts[:, None] > 0, wts[:, None] / overlap, 0.0)  # (M, m)
        post = self.lik * (coef.T @ np.exp(lp - p_top))  # (m, G)
        means, covs, found = [], [], []
        for row in post:
            total = row.sum()
            if not (np.isfinite(total) and total > 0):  # no grid point with a finite density
                found.append(False)
                means.append(np.zeros(k))
                covs.append(np.eye(k))
                continue
            wt = row / total
            m = wt @ self.grid
            d = self.grid - m
            means.append(m)
            covs.append((d * wt[:, None]).T @ d)
            found.append(_usable_covariance(covs[-1]))
        return np.array(means), np.array(covs), np.array(found, bool)


def _usable_covariance(cov: np.ndarray) -> bool:
    """Whether a ``(k, k)`` covariance is finite and positive definite."""
    return bool(np.isfinite(cov).all() and np.linalg.eigvalsh(cov).min() > 0)


def _set_aside_posteriors(spec, x, g, theta, w, inverse, aside: np.ndarray, limit: int,
                          pool: tuple | None = None, num_draws: int = 1024, seed: int = 0,
                          grid: "_SetAsideGrid | None" = None):
    """Posterior mean ``(m, k)`` and covariance ``(m, k, k)`` of items the fit set aside,
    from their responses ``aside`` ``(S, m)`` (-1 missing) against the fitted abilities,
    on :class:`_SetAsideGrid` (``grid``, where already built from the same arguments).
    The abilities do not see these items, as in the fit; the items see the abilities'
    uncertainty.

    The pool sees them. ``pool`` = ``(g_cov, h, lam)``: the globals' covariance from the
    fit (the proposal's scale) and each fitted item's likelihood as a quadratic
    ``-1/2 x' lam x + h' x`` (:func:`_item_likelihoods`). The globals' posterior is then
    ``p(g) prod_i ∫ N(x; mu(g), U(g)^-1) e^{l_i(x)} dx prod_j L_j(g)`` (the fitted items
    integrated out in closed form, the set-aside ones ``L_j`` on the grid), sampled by
    importance from a Student t (4 df) about its mode, 1.5 times as wide as its curvature
    says (:func:`_ascend`; re-fitted to the weighted draws, at most twice, while their
    effective number is under an eighth of ``num_draws``); each item's
    posterior is its grid posterior averaged over that. An item every subject answered
    alike says its value lies beyond the abilities, where the pool fitted without it
    has little mass: under that pool (simulation-based calibration, 1PL 30 x 20:
    chi-square 94 over 9 df), and under a normal approximation of the globals' posterior
    (the far tail of the pool's precision, where these items put it, is heavier than a
    normal's), they were read too near the centre. Without ``pool`` the globals are held
    at ``g``.

    Also returns ``(m,)`` bool, which items got a finite, positive definite posterior (the
    others keep the prior), a record (draws, their effective number), and the globals'
    draws ``(M, h)`` with their weights ``(M,)``. ``None`` where an item has more than two
    values or a block's prior is not normal."""
    if not _set_aside_applies(spec):
        return None
    g = np.asarray(g, np.float64)
    pooled = pool is not None and np.size(pool[0]) and np.all(np.isfinite(pool[0]))
    if pooled:
        g_cov, h_fit, lam_fit = pool
        try:
            chol = np.linalg.cholesky(np.asarray(g_cov, np.float64))
        except np.linalg.LinAlgError:
            pooled = False
    rng = np.random.default_rng(seed)
    draws = g[None, :]  # held at g unless pooled
    if grid is None:
        grid = _SetAsideGrid(spec, g, theta, w, inverse, aside, limit)

    def evaluate(draws):  # log p(g | y) up to a constant, and the terms the read-out reuses
        value, parts, priors = grid.terms(draws)
        if pooled:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                value = value + _fitted_items_given_globals(spec, draws, priors, h_fit, lam_fit)
        return np.where(np.isfinite(value), value, -np.inf), parts

    record = {"pool_draws": 1}
    if pooled:  # the mode of p(g | y), then a Student t about it scaled by its curvature
        centre, curv, steps = _ascend(lambda d: evaluate(d)[0], g, np.sqrt(np.diag(g_cov)))
        try:
            spread = 1.5 * np.linalg.cholesky(np.linalg.inv(curv))
        except np.linalg.LinAlgError:  # not a clear peak: the fit's covariance, wider
            spread = 1.5 * chol
        record["mode_steps"] = steps
    for attempt in range(3 if pooled else 1):
        if pooled:
            draws = centre + _antithetic(rng, num_draws, g.size) @ spread.T
        log_w, parts = evaluate(draws)
        if pooled:  # over the proposal's density
            z_q = np.linalg.solve(spread, (draws - centre).T)
            log_w = log_w + 0.5 * (_T_DF + g.size) * np.log1p((z_q ** 2).sum(0) / _T_DF)
        if not np.isfinite(log_w).any():
            wts = np.zeros(len(draws))
            break
        wts = np.exp(log_w - log_w.max())
        wts /= wts.sum()
        ess = 1.0 / float((wts ** 2).sum())
        record |= {"pool_draws": len(draws), "effective_draws": round(ess, 1),
                   "rounds": attempt + 1}
        if not pooled or ess >= num_draws / 8 or ess < 2 * g.size + 2:
            break
        centre = wts @ draws  # the weighted draws' moments for the next proposal
        d = draws - centre
        spread = 1.5 * np.linalg.cholesky((d * wts[:, None]).T @ d + 1e-9 * np.eye(g.size))
    if pooled and np.isfinite(wts).all() and wts.sum() > 0:  # how far these items move the
        # pool: its mean in the fit's sds, its sds over the fit's
        fit_sd = np.sqrt(np.maximum(np.diag(g_cov), 1e-24))
        mean = wts @ draws
        record["pool_shift_sds"] = round(float(np.max(np.abs(mean - g) / fit_sd)), 3)
        record["pool_sd_ratio"] = round(float(np.max(np.sqrt(wts @ (draws - mean) ** 2) / fit_sd)), 3)
    return (*grid.read_out(draws, wts, parts), record, (draws, wts))


def _set_aside_axis(loc: float, sd: float, dense: int, tail: int = 16,
                    reach: float = 1000.0) -> np.ndarray:
    """One axis of the set-aside items' grid: ``dense`` even points over ``loc +- 6 sd``,
    then ``tail`` points a side spaced geometrically out to ``loc +- reach sd``."""
    inner = np.linspace(-6.0, 6.0, dense)
    step = inner[1] - inner[0]
    ratio = _geometric_ratio(step, reach - 6.0, tail)
    outer = 6.0 + step * np.cumsum(ratio ** np.arange(1, tail + 1))
    return loc + sd * np.concatenate([-outer[::-1], inner, outer])


def _geometric_ratio(step: float, span: float, count: int) -> float:
    """``r`` with ``step * (r + r^2 + ... + r^count) = span`` (bisection)."""
    lo, hi = 1.0, 10.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if step * mid * (mid ** count - 1) / (mid - 1) < span:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _set_aside_applies(spec) -> bool:
    """Whether :func:`_set_aside_posteriors` reads set-aside items: one or two item blocks,
    each with a normal prior."""
    blocks = _item_blocks(spec)
    return len(blocks) <= 2 and all(p.prior.family == "normal" for p in blocks)


def _item_likelihoods(spec, x, g, info: np.ndarray, joint: bool, answered: np.ndarray):
    """Each answered item's likelihood as a quadratic ``-1/2 x' lam x + h' x`` ``(h (n, k),
    lam (n, k, k))``, from its block of the posterior information ``info`` at the mode
    ``x`` (prior curvature included, as :func:`_louis` gives it) given the globals ``g``:
    ``lam`` is the information less the prior's precision, its negative eigenvalues set to
    0, and ``h = lam x + P U (x - mu)`` keeps the mode where the likelihood's gradient
    balances the prior's (``P`` projects onto the directions ``lam`` curves in). Items not
    ``answered`` are left out."""
    n, k = x.shape
    blocks = _item_blocks(spec)
    env = {name: float(v) for name, v in _env(spec, g).items()}
    loc, prec = (np.array([float(v) for v in c]) for c in
                 zip(*(p.prior.normal_params(env) for p in blocks)))
    per = _within_item_blocks(info, n, k) if joint else np.asarray(info)
    lam = 0.5 * (per + np.swapaxes(per, 1, 2)) - np.diag(prec)
    vals, vecs = np.linalg.eigh(lam)
    kept = vals > 1e-9 * np.maximum(vals.max(axis=1, keepdims=True), 1e-300)
    lam = np.einsum("nij,nj,nkj->nik", vecs, np.where(kept, vals, 0.0), vecs)
    # the prior's pull only along the directions the likelihood curves in: a linear term
    # along a flat one made the likelihood grow without bound there, and the globals'
    # posterior with it as the pool widened (2PL 100 x 8 with five of eight items constant)
    pull = np.einsum("nij,nj,nkj,nk->ni", vecs, kept.astype(float), vecs, prec * (x - loc))
    h = np.einsum("nij,nj->ni", lam, x) + pull
    return h[answered], lam[answered]


def _fitted_items_given_globals(spec, draws, priors, h, lam) -> np.ndarray:
    """``log p(g) + sum_i log ∫ N(x; mu(g), U(g)^-1) exp(-1/2 x' lam_i x + h_i' x) dx`` for
    each draw of the globals ``draws`` ``(M, globals)`` (``priors``: each block's ``(loc, prec)`` under
    the draws), up to a constant: the fitted items' quadratic likelihoods integrated
    against the pool in closed form."""
    out = sum(_host_log_prob(p.prior, draws[:, i]) for i, p in enumerate(spec.by_owner("global")))
    loc = np.stack([c[0] for c in priors], -1)  # (M, k)
    prec = np.stack([c[1] for c in priors], -1)
    post = lam[None] + prec[:, None, :, None] * np.eye(lam.shape[-1])  # (M, n, k, k)
    rhs = h[None] + (prec * loc)[:, None, :]  # (M, n, k)
    if lam.shape[-1] == 1:  # closed forms: numpy's batched slogdet and solve cost 10x more
        det = post[..., 0, 0]
        quad = rhs[..., 0] ** 2 / det
    else:
        a, b, d = post[..., 0, 0], post[..., 0, 1], post[..., 1, 1]
        det = a * d - b * b
        quad = (d * rhs[..., 0] ** 2 - 2 * b * rhs[..., 0] * rhs[..., 1]
                + a * rhs[..., 1] ** 2) / det
    sign, logdet = np.sign(det), np.log(np.abs(det))
    per = 0.5 * (np.log(prec).sum(-1)[:, None] - logdet + quad) \
        - 0.5 * (prec * loc ** 2).sum(-1)[:, None]
    return out + np.where(sign > 0, per, -np.inf).sum(1)


def _pool_proposal(shape: tuple[int, int], full_cov, answered, pool_draws, priors, h, lam):
    """An importance proposal ``(centre, covariance)`` over the items and globals for the
    posterior with the set-aside items in the pool: the mixture, over the pool's weighted
    draws ``pool_draws`` ``((M, h), (M,))`` (``priors``: each block's ``(loc, prec)``
    under them), of each fitted item's conditional ``N`` from its quadratic likelihood
    ``(h, lam)`` and the pool (the set-aside items: the pool itself), moment-matched; its
    correlations are the fit's ``full_cov``'s (items ``shape`` ``(n, k)``, the globals
    after them). Items every subject answered alike widen the
    pool the others are shrunk to: the fit's Laplace approximation, centred without them,
    kept 50 of 4,000 draws on a 1PL leaderboard of 18 subjects x 28 items, 12 of them
    constant."""
    draws, wts = pool_draws
    n, k = shape
    loc = np.stack([c[0] for c in priors], -1)  # (M, k)
    prec = np.stack([c[1] for c in priors], -1)
    mean = np.empty((len(draws), n, k))
    var = np.empty((len(draws), n, k))
    cov = np.linalg.inv(lam[None] + prec[:, None, :, None] * np.eye(k))  # (M, n_answered, k, k)
    mean[:, answered] = np.einsum("mnij,mnj->mni", cov, h[None] + (prec * loc)[:, None, :])
    var[:, answered] = np.diagonal(cov, axis1=2, axis2=3)
    mean[:, ~answered] = loc[:, None, :]
    var[:, ~answered] = 1.0 / prec[:, None, :]
    item_mean = np.einsum("m,mnk->nk", wts, mean)
    item_var = np.einsum("m,mnk->nk", wts, var + (mean - item_mean) ** 2)
    g_mean = wts @ draws
    g_var = wts @ (draws - g_mean) ** 2
    sd = np.sqrt(np.concatenate([item_var.reshape(-1), g_var]))
    old_sd = np.sqrt(np.diag(full_cov))
    corr = full_cov / np.outer(old_sd, old_sd)
    return np.concatenate([item_mean.reshape(-1), g_mean]), corr * np.outer(sd, sd)


def _ascend(log_density, x0: np.ndarray, scale: np.ndarray, iters: int = 60):
    """The mode of a smooth ``log_density`` (vectorised over rows of points) near ``x0`` by
    Newton steps on central differences (step 1e-3 of ``scale`` per axis), halved until
    the density rises, with a gradient step where the curvature is not negative definite.
    Returns the mode, the negative Hessian there, and the steps taken."""
    d = x0.size
    h = 1e-3 * np.maximum(scale, 1e-6)
    eye = np.diag(h)
    pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
    x, fx = np.asarray(x0, np.float64), float(log_density(x0[None])[0])
    neg_hess = np.diag(1.0 / scale ** 2)
    for step in range(iters):
        pts = [x] + [x + eye[i] for i in range(d)] + [x - eye[i] for i in range(d)]
        pts += [x + eye[i] + eye[j] for i, j in pairs] + [x - eye[i] - eye[j] for i, j in pairs]
        f = log_density(np.array(pts))
        if not np.isfinite(f).all():
            break
        plus, minus = f[1:1 + d], f[1 + d:1 + 2 * d]
        grad = (plus - minus) / (2 * h)
        hess = np.diag((plus - 2 * f[0] + minus) / h ** 2)
        for n, (i, j) in enumerate(pairs):  # f(x+hi+hj) + f(x-hi-hj) = 2f + H_ii hi^2 + ...
            both = f[1 + 2 * d + n] + f[1 + 2 * d + len(pairs) + n]
            hess[i, j] = hess[j, i] = (both - 2 * f[0] - hess[i, i] * h[i] ** 2
                                       - hess[j, j] * h[j] ** 2) / (2 * h[i] * h[j])
        neg_hess = -hess
        try:
            np.linalg.cholesky(neg_hess)
            move = np.linalg.solve(neg_hess, grad)
        except np.linalg.LinAlgError:
            move = scale ** 2 * grad / max(1.0, float(np.abs(scale * grad).max()))
        for _ in range(30):
            trial = float(log_density((x + move)[None])[0])
            if trial >= fx:
                break
            move = 0.5 * move
        else:
            return x, neg_hess, step
        x, done = x + move, trial - fx < 1e-8
        fx = trial
        if done:
            return x, neg_hess, step + 1
    return x, neg_hess, iters


def _host_constrain(p, x: np.ndarray) -> np.ndarray:
    """``p.constrain(x)`` in NumPy where the transform is one of these (a small batch of JAX
    operations compiles a program for each new shape)."""
    name = p.transform
    if name == "identity":
        return np.asarray(x, np.float64)
    if name == "exp":
        return np.exp(x)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    return np.asarray(p.constrain(x), np.float64)


def _host_log_prob(prior, x: np.ndarray) -> np.ndarray:
    """``prior.log_prob(x, {})`` in NumPy for the hyper-priors' families (normal and
    log-gamma with fixed values); JAX for the others."""
    if prior.family == "normal" and not prior.references():
        loc, prec = (float(v) for v in prior.normal_params({}))
        return 0.5 * (np.log(prec) - np.log(2 * np.pi)) - 0.5 * prec * (x - loc) ** 2
    if prior.family == "log_gamma":
        a, b = float(prior.shape_), float(prior.rate)
        with np.errstate(over="ignore"):
            return a * np.log(b) - math.lgamma(a) + a * x - b * np.exp(x)
    return np.asarray(prior.log_prob(x, {}), np.float64)


_T_DF = 4.0  # the globals' proposal: Student's t, whose tails cover the pool's precision


def _antithetic(rng, num: int, dim: int) -> np.ndarray:
    """``num`` standard Student-t draws (``_T_DF`` degrees of freedom) in ``dim``
    dimensions, in pairs ``z, -z``."""
    z = rng.standard_normal((num // 2, dim)) / np.sqrt(rng.chisquare(_T_DF, (num // 2, 1)) / _T_DF)
    return np.concatenate([z, -z])


@exported_jit(static_argnames=("spec",))
def _node_loglik_cells(spec, x, theta, y, mask):
    return _cell_loglik(spec, x, theta, y, mask)


_GRID_VOLUME_CELLS = 1 << 17  # adaptive nodes' cells (patterns x nodes x items) above which
# the items' volumes are taken on a shared grid (:func:`_items_volume`)
_ONE_PROGRAM_CALLS = 60  # a compile-bound fit's volume calls that run one program
_QUICK_DRAW_CELLS = 1 << 25  # LSAT7's 4,000 draws x 32 patterns x 11 nodes x 5 items: 7M


def fit_marginal(spec: ModelSpec, y: np.ndarray,
                 settings: MarginalSettings = MarginalSettings(),
                 aside: tuple[np.ndarray, np.ndarray] | None = None,
                 progress_fn: Callable | None = None) -> tuple[GuideState, dict, dict]:
    """:func:`_fit_marginal`, its programs compiled quickly where the quadrature grid is
    small (``MarginalSettings.quick_compile_cells``; recorded as ``quick_compile``).
    ``progress_fn(pass_index, trace_row)`` is called after every pass of the mode search."""
    num_subjects, num_items = np.shape(y)
    cells = min(num_subjects, 2 ** min(num_items, 62)) * settings.num_nodes * num_items
    quick = cells <= settings.quick_compile_cells
    with contextlib.ExitStack() as options:
        options.enter_context(compiler_options(QUICK_COMPILE if quick else None))

        def optimise():  # XLA's own optimisation for the programs compiled from here on
            options.enter_context(compiler_options(None))

        guide, cross, info = _fit_marginal(spec, y, settings, aside, quick, optimise,
                                           progress_fn)
    return guide, cross, info | {"quick_compile": quick}


def _fit_marginal(spec: ModelSpec, y: np.ndarray, settings: MarginalSettings,
                  aside: tuple[np.ndarray, np.ndarray] | None,
                  quick: bool = False,
                  optimise: Callable[[], None] = lambda: None,
                  progress_fn: Callable | None = None) -> tuple[GuideState, dict, dict]:
    """Fit ``spec`` to binary responses ``y`` (int8 ``(s, n)``, -1 missing) by marginal MAP.

    Each iteration takes the E-step (posterior weights on every pattern's nodes), then a
    Newton step on the marginal log posterior with the Louis information where the items'
    joint information fits in memory and is positive definite and the step raises the
    marginal log posterior, and an EM step (one Newton step per item) otherwise.

    Pooled item priors (the ``population`` family: each item block ``N(mu, 1/u)`` with
    ``mu`` and ``u`` global) are fitted with the items integrated out to second order
    (Laplace): the objective adds each item's ``-1/2 log det`` of its information
    (:func:`_item_volume`), the hyper-parameters move with the items in the Newton steps and
    by EM steps (:func:`_update_globals`) otherwise, and the items' covariance integrates
    the hyper-parameters out. At the items' mode alone the pooled prior's ``n/2 log u``
    shrinks every item towards its block's location and the scale with it (2PL 200 x 400:
    the difficulties' sd 0.2 and falling after 30 iterations, against 1.0 simulated).

    Returns
    -------
    ``(guide, cross, info)``: the guide holds the items' marginal modes with their conditional
    sds (``1 / sqrt`` of the marginal precision's diagonal) and the abilities' posterior means
    and sds; ``cross`` holds the within-item off-diagonal curvatures (``"a|b"`` -> ``(n,)``)
    so that the read-outs' within-item marginal sds (``within_owner_scales``) are the marginal
    covariance's; ``info`` holds the trace, convergence and counts.

    The ability sd adds the items' uncertainty to the posterior sd at the fitted items (delta
    method through each pattern's sensitivity, with the items' joint covariance where it is
    computed: a common error of the scale moves every ability together).

    Raises
    ------
    ModelError : the model is not one ``marginal_applies`` accepts.

    ``aside``: ``(columns, responses)`` of items set aside in ``y`` (all -1 there: constant
    items) with their responses ``(S, m)``. Under pooled priors their read-outs are their
    own posterior against the fitted abilities (:func:`_set_aside_posteriors`), not the
    pool's prior; the abilities and the pool do not see them.
    """
    if not marginal_applies(spec):
        raise ModelError(f"model {spec.name!r}: the marginal fit needs binary responses, one "
                         f"scalar ability with a fixed prior, and item priors that are fixed or "
                         f"pooled through global hyper-parameters; use ability_factor='gaussian'")
    t0 = time.perf_counter()
    blocks = _item_blocks(spec)
    (subject,) = spec.by_owner("subject")
    y = np.asarray(y)
    patterns, inverse, counts = distinct_rows(y)
    num_patterns = patterns.shape[0]
    if settings.bucket_patterns:  # padded with unanswered patterns counted zero times
        from engine.infer.fit import bucket_size

        pad = bucket_size(num_patterns) - num_patterns
        patterns = np.concatenate([patterns, np.full((pad, y.shape[1]), -1, patterns.dtype)])
        counts = np.concatenate([counts, np.zeros(pad, counts.dtype)])
    mask = (patterns >= 0).astype(np.float32)
    yy = np.where(patterns >= 0, patterns, 0).astype(np.float32)
    counts_f = counts.astype(np.float64)
    n, k, U, Q = y.shape[1], len(blocks), patterns.shape[0], settings.num_nodes
    joint = _joint_fits(n, k, num_patterns, Q, settings)  # the data's patterns, not the padding
    x = np.stack([np.full(n, p.init if np.isscalar(p.init) else 0.0, np.float64)
                  for p in blocks], -1)
    if spec.initial is not None:
        start = spec.initial(y)
        for j, p in enumerate(blocks):
            if p.name in start and np.shape(start[p.name]) == (n,):
                x[:, j] = np.asarray(start[p.name], np.float64)
    hyper = spec.by_owner("global")  # the item priors' hyper-parameters, if any
    g = np.array([p.init if np.isscalar(p.init) else 0.0 for p in hyper], np.float64)
    quad = _Quadrature(Q, U, settings.cell_chunk)
    trace, converged, previous, newton_steps, settled = [], False, None, 0, False
    optimised_from = None  # the pass from which a quickly compiled fit compiles optimised
    best, diverged = (-np.inf, x, g, 0), None  # (objective, items, hyper-parameters, pass)
    mark = (-np.inf, 0)  # (objective, pass) of the last pass that made progress
    # the items' volumes: on a shared grid unless the adaptive nodes are few enough that the
    # grid's three more programs cost more to compile than they save (LSAT7, 32 x 21 x 5:
    # 0.2 s more cold; `ability`, 1,280 x 21 x 16: the same cold, 0.47 s less warm). A new
    # grid reaches further and is finer by its slack, as the posteriors narrow while the
    # items sharpen: a quickly compiled fit is compile-bound, and at 0.1 `ability`'s
    # 48-point grid gave way to a 64-point one mid-fit (every grid program compiled twice;
    # 104 points at 0.5); a longer test's calls cost more on a finer grid (200 x 400: 7.1 s
    # fit at 0.1, 10.3 s at 0.5)
    route = _VolumeRoute(shared=num_patterns * Q * n > _GRID_VOLUME_CELLS,
                         slack=0.5 if quick else 0.1,
                         one_program=_ONE_PROGRAM_CALLS if quick else 0)
    for _ in range(3):  # place the nodes before the first M-step
        theta, w, _ = quad.posterior(spec, x, yy, mask)
        quad.adapt(theta, w)

    vol_on = False  # the items' volumes in the objective (from ``volume_from_pass`` on)

    def objective_at(xx, gg) -> float:  # the marginal log posterior at items xx, globals gg
        _, _, marg = quad.posterior(spec, xx, yy, mask)
        value = counts_f @ marg + _total_prior(spec, xx, gg, _item_prior(spec, xx, gg)[0])
        if vol_on:
            value += _items_volume(spec, xx, quad, yy, mask, counts_f, gg, settings, False,
                                   route)[0].sum()
        return float(value)

    def backtracked(step, tries: int, trial_at):
        """The first of ``step``, ``step / 2``, ... (at most ``tries``) whose trial values
        ``trial_at(step)`` -> ``(items, globals)`` do not lower this pass's objective by more
        than float32's resolution of it (the cells' log-likelihoods are float32: at 1e-9
        the signed 2PL at 200 x 400 had its Newton steps refused by rounding from the 10th
        iteration on and crept by EM steps for 60 more; 27 iterations now, same answer);
        None where none does."""
        for _half in range(tries):
            if objective_at(*trial_at(step)) >= objective - _F32_EPS * abs(objective):
                return step
            step = 0.5 * step
        return None

    for it in range(settings.max_iter):
        t_it = time.perf_counter()
        if quick and it == settings.quick_compile_passes:
            optimise()  # a quickly compiled fit that runs long: optimised code from here on
            optimised_from = it + 1
        x_before, g_before = x, g
        vol_on = bool(hyper) and it >= settings.volume_from_pass
        if vol_on and it == settings.volume_from_pass and it > 0:
            # the objective changes: progress is counted afresh
            best, mark, previous = (-np.inf, x, g, it), (-np.inf, it), None
        theta, w, log_marg = quad.posterior(spec, x, yy, mask)
        prior_val, prior_grad, prior_hess = _item_prior(spec, x, g)
        wc = w * counts_f[:, None]
        value, grad, hess = _expected_terms(spec, x, theta, yy, mask, wc, settings.cell_chunk)
        grad = grad + prior_grad  # the gradient of the marginal log posterior (Fisher)
        hess = hess + prior_hess[:, :, None] * np.eye(k)
        vol = np.zeros(n)
        if vol_on:  # the items' volume: pooled priors are fitted with the items integrated out
            vol, vol_grad = _items_volume(spec, x, quad, yy, mask, counts_f, g, settings,
                                          route=route)
            grad = grad + vol_grad
        objective = float(counts_f @ log_marg + _total_prior(spec, x, g, prior_val) + vol.sum())
        if objective > best[0]:
            best = (objective, x, g, it)
        # progress beyond rounding; while an item has no sd (its information singular or
        # indefinite) the fit cannot converge, and only a real gain counts
        flat = int(_flat_items(-hess).sum()) if vol_on else 0
        least = settings.flat_progress if flat else 1e-3
        if objective > mark[0] + max(settings.tol * abs(objective), least,
                                     8 * _F32_EPS * abs(objective)):
            mark = (objective, it)  # the last pass that made progress
        elif it - mark[1] >= settings.divergence_patience:
            # an ascent that has made no progress for this long is running off or stuck (19
            # classifiers x 501 OpenML instances: best near pass 20, then 1,000 nats lower by
            # pass 500 as discriminations ran into the hundreds; with the EM step kept from
            # falling, a step refused from pass 26 on): back to the best values, not converged
            diverged = {"at_pass": it + 1, "best_pass": best[3] + 1,
                        "last_progress_pass": mark[1] + 1, "best_objective": best[0],
                        "objective": objective, "flat_items": flat}
            x, g = best[1], best[2]
            break
        full_step = float(np.abs(_newton_direction(grad, hess, settings.max_step)).max())
        moved = refused = False
        if joint and it >= 2:
            info_mat, _ = _louis(spec, x, theta, w, counts_f, yy, mask, hess, True, settings)
            if vol_on:  # items and hyper-parameters in one step: they move together
                g_grad, g_hess, cross = _hyper_derivatives(spec, x, -hess, g)
                step = _marginal_newton(_augmented(info_mat, cross, g_hess),
                                        np.concatenate([grad.reshape(-1), g_grad]),
                                        settings.max_step)
            else:
                step = _marginal_newton(info_mat, grad.reshape(-1), settings.max_step)
            # halved under pooled priors, where the volume's curvature (left out) matters
            def joint_trial(s):  # the items and globals moved by the joint step s
                return x + s[:n * k].reshape(n, k), g + s[n * k:] if s.size > n * k else g

            step = backtracked(step, 0 if step is None else 4 if hyper else 1, joint_trial)
            if step is not None:
                (x, g), moved, newton_steps = joint_trial(step), True, newton_steps + 1
                full_step = float(np.abs(step).max())
        if not moved:
            volume = ((lambda trial: _items_volume(spec, trial, quad, yy, mask, counts_f, g,
                                                   settings, False, route)[0])
                      if vol_on else None)
            x_em = _em_step(spec, x, g, theta, yy, mask, wc, grad, hess,
                            value + prior_val + vol, settings, volume)
            if hyper:  # each item's volume moves with every item's step (through the
                # abilities' weights), so the per-item checks do not bound the whole step: a
                # 4PL at 50 x 1,000 lost up to 36 nats in some passes and never settled. The
                # step is halved as a whole until the objective does not fall; there the
                # objective along the step peaked near 1/64 of it (+8.9 nats; at 1/8, -51)
                kept = backtracked(x_em - x, 10, lambda s: (x + s, g))
                x_em, refused = (x, True) if kept is None else (x + kept, False)
            x = x_em
        if vol_on and not moved:  # an EM step on the hyper-parameters
            g_new = _update_globals(spec, x, _volume_variances(spec, -hess), g,
                                    settings.max_step)

            def g_part(gg):  # the objective's terms that move with the hyper-parameters
                return _total_prior(spec, x, gg, _item_prior(spec, x, gg)[0]) + _items_volume(
                    spec, x, quad, yy, mask, counts_f, gg, settings, False, route)[0].sum()

            now = g_part(g)
            for _half in range(4):  # kept only where the objective does not fall
                if g_part(g_new) >= now - _F32_EPS * abs(objective):
                    break
                g_new = 0.5 * (g + g_new)
            else:
                g_new = g
            full_step = max(full_step, float(np.abs(g_new - g).max()))
            g = g_new
        trace.append({"pass": it + 1, "elbo": objective, "elbo_smooth": objective,
                      "max_step": full_step, "seconds": time.perf_counter() - t_it}
                     | ({"items_volume": vol_on} if hyper else {}))
        if progress_fn is not None:
            progress_fn(it, trace[-1])
        quad.adapt(theta, w)
        change = abs(objective - previous) if previous is not None else np.inf
        previous = objective
        small = change < max(settings.tol * abs(objective), 1e-3)
        # a refused step moves nothing and proves nothing: the ascent direction lost ground
        # even at 1/1,024 of it (a 4PL at 50 x 1,000 from pass 57 on)
        within_sd = (small and not refused
                     and _move_in_sds(spec, x_before, x, g_before, g, -hess) < 0.05)
        # not before the volumes (and the pool's hyper-parameters) have entered
        if (it >= 2 and small and (vol_on or not hyper)
                and (full_step < 1e-3 or (within_sd and settled))):
            converged = True
            break
        settled = within_sd  # a move within 5% of an sd counts in two passes running
    # final posterior at the fitted items, with the nodes recentred once more
    theta, w, _ = quad.posterior(spec, x, yy, mask)
    quad.adapt(theta, w)
    theta, w, log_marg = quad.posterior(spec, x, yy, mask)
    prior_val, _, prior_hess = _item_prior(spec, x, g)
    _, _, hess = _expected_terms(spec, x, theta, yy, mask, w * counts_f[:, None],
                                 settings.cell_chunk)
    hess = hess + prior_hess[:, :, None] * np.eye(k)
    info_mat, sens = _louis(spec, x, theta, w, counts_f, yy, mask, hess, joint, settings,
                            with_sensitivity=True)
    total_prior = _total_prior(spec, x, g, prior_val)
    g_cov = np.zeros((0, 0))
    if hyper:
        _, g_hess, g_cross = _hyper_derivatives(spec, x, -hess, g)
    if hyper and joint:  # the items' covariance with the hyper-parameters integrated out
        proposal = _covariance(_augmented(info_mat, g_cross, g_hess), True)
        full_cov, g_cov = proposal[:n * k, :n * k], proposal[n * k:, n * k:]
    else:  # per item: given the hyper-parameters (empirical Bayes)
        full_cov = proposal = _covariance(info_mat, joint)
        if hyper:
            g_cov = _globals_covariance(info_mat, g_cross, g_hess)
    if joint:
        cov = _within_item_blocks(full_cov, n, k)
        flat = sens.reshape(U, n * k)
        item_var = np.einsum("ui,ij,uj->u", flat, full_cov, flat)
    else:
        cov = full_cov
        item_var = np.einsum("uni,nij,unj->u", sens, cov, sens)
    mean = (w * theta).sum(axis=1)
    var = np.maximum((w * (theta - mean[:, None]) ** 2).sum(axis=1), 1e-24)
    sd = np.sqrt(var + np.maximum(item_var, 0.0))
    mode = x
    pool_items = aside_grid = None  # the fitted items' likelihoods at the mode, and the
    theta_a, w_a = theta, w  # set-aside items' against the patterns' posteriors there
    if aside is not None and hyper and len(aside[0]) and _set_aside_applies(spec):
        answered = np.ones(n, bool)
        answered[aside[0]] = False
        pool_items = _item_likelihoods(spec, x, g, info_mat, joint, answered)
        nodes = _DrawNodes(spec, quad, counts_f, settings.num_nodes)
        if nodes.shared:  # the patterns' posteriors on one grid: a matrix product per grid
            # point (2PL 1,000 x 50 with 8 such items: 13.8 -> 0.9 s)
            theta_a, w_a = nodes.theta[None, :], nodes.weights(spec, mode, yy, mask)[0]
        aside_grid = _SetAsideGrid(spec, g, theta_a, w_a, inverse, aside[1], settings.cell_chunk)
    aside_found = start = None
    if aside_grid is not None:  # the set-aside items read under the pool's posterior with
        # them in it, the fitted items' likelihoods quadratic
        aside_found = _set_aside_posteriors(spec, x, g, theta_a, w_a, inverse, aside[1],
                                            settings.cell_chunk, (g_cov, *pool_items),
                                            seed=_seed(settings), grid=aside_grid)
        d = n * k + g.size
        if (proposal.shape == (d, d) and d <= settings.importance_max_params
                and np.all(np.diag(proposal) > 0)):
            draws_g = aside_found[4]
            start = _pool_proposal(x.shape, proposal, answered, draws_g,
                                   aside_grid.priors(draws_g[0])[0], *pool_items)
    # importance sampling weighs the draws of the globals by the set-aside items' L_j(g) too,
    # from a proposal about that pool: they widen the pool the answered items are shrunk to
    moments, moments_record = _importance(spec, x, g, proposal, quad, yy, mask, counts_f,
                                          settings, aside_grid, start)
    # where sampled: the sampler's moments, the items' 5% and 95% quantiles (2, n, k), and
    # their constrained values' means and sds, split R-hats, effective draws and the sds'
    # Monte Carlo standard errors (5, n, k)
    sampled = quantiles = constrained = None
    ability_draws = None  # the item draws the abilities' moments came from (their quantiles)
    aside_moments = None  # the set-aside items' where importance sampling integrated them
    if moments is not None:  # posterior means and covariances, not the mode's curvature
        x, g, item_cov, mean, total_var, aside_moments, quantiles, ability_draws = moments
        cov = _within_item_blocks(item_cov, n, k)
        g_cov = item_cov[n * k:, n * k:]
        sd = np.sqrt(total_var)
        moments_record["abilities"] = "importance"
    # where importance sampling left the set-aside items out (their grid would cost too
    # much a draw: the 2PL's), its draws are the posterior without them; sampled with their
    # answers instead, where the sampler runs (simulation-based calibration of the 2PL at
    # 30 x 20: their log discriminations' ranks chi-square 24.0 over 9 df read on the grid
    # after importance sampling, 4.5 sampled)
    left_out = moments is not None and aside_found is not None and aside_moments is None
    with_aside = None  # the set-aside items' (columns, n1, n0) where sampled with their answers
    if moments is None or left_out:
        # sampled where the Laplace approximation
        # departs from the posterior; where the mode search stalled (a 4PL at 50 x 1,000: no
        # progress from pass 56 on, most items' information indefinite) a Laplace
        # approximation at a point that is not the mode is no reference, so the posterior is
        # sampled from the best pass whatever its pilot shows, and read out where it mixes;
        # a search that used all of max_iter (NLU mutual, 18 x 443, 2PL: 13 Newton steps,
        # then EM steps gaining 0.02-0.03 nats a pass to pass 500) from its last pass
        x_s, cov_s, with_aside = x, cov, None
        if aside_found is not None:  # the set-aside items sampled with their answers, from
            # their read-out: the pool, the answered items and the abilities see them
            columns = aside[0]
            x_s, cov_s = x.copy(), cov.copy()
            ok = aside_found[2]
            x_s[columns[ok]], cov_s[columns[ok]] = aside_found[0][ok], aside_found[1][ok]
            with_aside = (columns, aside_grid.n1, aside_grid.n0)
        elif aside is not None and hyper and len(aside[0]):  # no grid read-out (three item
            # blocks, or an asymptote's beta prior): sampled with their answers from the
            # pool's prior, where the sampler would hold them at one value (3PL 50 x 200 with
            # an item all subjects answered right and one all answered wrong: both read as
            # difficulty -0.08 with sd 0)
            with_aside = (aside[0], *_aside_counts(inverse, aside[1], counts_f.shape[0]))
        sampled, moments_record["sampler"] = _sampled(
            spec, x_s, g, cov_s, g_cov, quad, yy, mask, counts_f,
            # where items were set aside the Laplace approximation is the pool's without
            # them: not kept on the pilot's median (NLU wic, 18 x 319 with 53 such items:
            # the pilot agreed, 81 answered items were over 0.25 NUTS sd off)
            settings if converged and with_aside is None
            else replace(settings, sampler_check_laplace=False), with_aside)
        if diverged is not None:
            moments_record["sampler"]["started_at"] = (
                f"the best pass ({diverged['best_pass']}) of a mode search that made no "
                f"progress from pass {diverged['last_progress_pass']} on")
        elif not converged:
            last = settings.divergence_patience
            gained = (f" (it gained {trace[-1]['elbo'] - trace[-1 - last]['elbo']:.3g} nats over "
                      f"its last {last})" if len(trace) > last else "")
            moments_record["sampler"]["started_at"] = (
                f"the last pass ({len(trace)}) of a mode search that had not converged in "
                f"max_iter passes{gained}")
    if sampled is not None:
        x, g, cov, g_cov, mean, total_var, quantiles, constrained, ability_draws = sampled
        sd = np.sqrt(total_var)
        if with_aside is not None:  # sampled with their answers
            aside_moments = (x[aside[0]], cov[aside[0]])
            moments_record["sampler"]["set_aside"] = "sampled with their answers"
        moments_record |= {"method": "sampled", "abilities": "sampled",
                           "intervals": "the sampled draws' quantiles"}
    if moments_record["method"] == "laplace":  # the abilities over the items' Laplace
        averaged, record = _laplace_abilities(spec, x, g, proposal, quad, yy, mask, counts_f,
                                              settings)
        moments_record["abilities"] = record
        if averaged is not None:
            mean, total_var, ability_draws = averaged
            sd = np.sqrt(total_var)
    set_aside = None
    if aside is not None and hyper and len(aside[0]):
        columns, responses = aside
        if aside_moments is not None:  # integrated out of each importance draw, or sampled
            means, covs = aside_moments
            ok = np.array([_usable_covariance(c) for c in covs])
            moved = {k: v for k, v in (aside_found[3] if aside_found is not None else {}).items()
                     if k.startswith("pool_s")}
            found = (means, covs, ok, {"method": "sampled with their answers" if sampled
                                       is not None else "integrated out of every importance draw"}
                     | moved)
        else:
            found = aside_found
        if found is not None:  # the set-aside items' own posterior, not the pool's prior
            means, covs, ok, pool_record = found[:4]
            x, cov = x.copy(), cov.copy()
            x[columns[ok]], cov[columns[ok]] = means[ok], covs[ok]
            if quantiles is not None and sampled is None:  # the importance draws' ends are
                quantiles = quantiles.copy()  # not these items': their Gaussian's instead
                quantiles[:, columns[ok]] = np.nan
                moments_record["intervals"] += f"; the {int(ok.sum())} set-aside items' gaussian"
            set_aside = {"items": int(ok.sum()), "method": "grid against the fitted abilities",
                         **pool_record}
            if not ok.all():
                set_aside["at_the_prior"] = int((~ok).sum())
    # items: conditional sds in the guide, within-item couplings in cross, so that the
    # read-outs' within-item marginal sds are this covariance's diagonal
    prec = np.linalg.pinv(cov)
    loc = {p.name: x[:, j].astype(np.float32) for j, p in enumerate(blocks)}
    log_scale = {p.name: (-0.5 * np.log(np.maximum(prec[:, j, j], 1e-12))).astype(np.float32)
                 for j, p in enumerate(blocks)}
    cross = {f"{blocks[i].name}|{blocks[j].name}": (-prec[:, i, j]).astype(np.float32)
             for i in range(k) for j in range(i + 1, k)}
    loc[subject.name] = mean[inverse].astype(np.float32)
    log_scale[subject.name] = np.log(sd[inverse]).astype(np.float32)
    # each pattern's 90% interval from its exact posterior (a short test's is skewed), where
    # its moments came from item draws on a shared grid; else mean -+ 1.645 sd
    ability_quantiles = None
    if ability_draws is not None:  # the quantile function at PROBABILITIES, per subject
        ability_quantiles = ability_draws.quantiles(spec, mean, sd, _seed(settings),
                                                    PROBABILITIES)[:, inverse]
        moments_record["ability_intervals"] = ability_draws.record
    else:
        moments_record["ability_intervals"] = "the posterior mean +- 1.645 sd"
    g_sd = np.sqrt(np.maximum(np.diag(g_cov), 1e-24))
    for i, p in enumerate(hyper):
        loc[p.name] = np.asarray(g[i], np.float32)
        log_scale[p.name] = np.asarray(np.log(g_sd[i]), np.float32)
    # converged: the read-outs' computation converged, the mode search's or, where that
    # stalled, the sampler's chains mixed (``mode_converged`` says which)
    info = {"trace": trace, "converged": converged or sampled is not None,
            "mode_converged": converged, "num_patterns": int(num_patterns),
            "patterns_padded_to": int(U),
            "num_nodes": Q, "joint_item_covariance": joint, "newton_steps": newton_steps,
            "log_marginal_posterior": float(counts_f @ log_marg + total_prior),
            "ability_sd_at_items": np.sqrt(var)[inverse], "item_covariance": cov,
            "item_moments": moments_record, "item_mode": mode, "set_aside": set_aside,
            "item_quantiles": quantiles, "item_constrained": constrained,
            "ability_quantiles": ability_quantiles, "ability_draws": ability_draws,
            "pattern_of_subject": inverse, "seed": _seed(settings),
            "volume_nodes": route.record(Q) if hyper else None,
            "diverged": diverged, "optimised_from_pass": optimised_from,
            "wall_s": time.perf_counter() - t0}
    return GuideState(loc, log_scale), cross, info


def fit_marginal_result(spec: ModelSpec, y: np.ndarray, fit_settings,
                        settings: MarginalSettings | None = None, aside=None,
                        progress_fn: Callable | None = None):
    """:func:`fit_marginal` as a :class:`~engine.infer.fit.FitResult` (the trace's ``elbo``
    is the marginal log posterior), for the same run directory and read-outs. ``aside``:
    ``(columns, responses)`` of items set aside in ``y`` (see :func:`fit_marginal`).
    ``settings`` None: the defaults with ``fit_settings.max_passes`` as ``max_iter``, so
    that ``--max-passes`` bounds the mode search as it bounds the mean-field fit."""
    from engine.infer.fit import FitResult
    from engine.memory import default_memory_budget

    if settings is None:
        settings = MarginalSettings(max_iter=fit_settings.max_passes)
    if settings.seed is None:  # the fit's one source of randomness
        settings = replace(settings, seed=fit_settings.seed)

    if not fit_settings.bucket_shapes:
        settings = replace(settings, bucket_patterns=False)
    settings, memory = within_budget(settings, fit_settings.memory_budget or default_memory_budget())
    guide, cross, info = fit_marginal(spec, y, settings, aside, progress_fn)
    y = np.asarray(y)
    # each subject's exact ability quantiles at PROBABILITIES (None: mean -+ 1.645 sd)
    ability, table = spec.by_owner("subject")[0].name, info["ability_quantiles"]

    def by_block(a):  # a sampled summary (m, n, k) as {block: (m, n)}; {} where not sampled
        return {} if a is None else {p.name: a[:, :, j].astype(np.float32)
                                     for j, p in enumerate(_item_blocks(spec))}

    return FitResult(
        spec=spec, guide=guide, settings=fit_settings, trace=info["trace"],
        converged=info["converged"], wall_time_s=info["wall_s"],
        compile_time_s=info["trace"][0]["seconds"] if info["trace"] else 0.0,
        num_subjects=y.shape[0], num_items=y.shape[1], num_observed=int((y >= 0).sum()),
        num_devices=1, frozen=(),
        extra={"source": "quadrature", "layout": "dense", "mc_draws": 0,
               "quadrature": {k: info[k] for k in (
                   "num_patterns", "patterns_padded_to", "num_nodes", "joint_item_covariance",
                   "newton_steps", "log_marginal_posterior", "item_moments", "set_aside",
                   "diverged", "mode_converged", "quick_compile", "optimised_from_pass",
                   "volume_nodes")}
                   | {"memory": memory},
               # the item draws the abilities were averaged over, where every item was
               # fitted (none set aside): `score` averages new subjects over the same ones
               # (with each subject's pattern among them, and the quantiles' seed)
               **({"ability_draws": (info["ability_draws"], info["pattern_of_subject"],
                                     info["seed"])} if info["ability_draws"] is not None
                  and (aside is None or not len(aside[0])) else {})},
        cross=cross,
        intervals=by_block(info["item_quantiles"]) | (
            {} if table is None else {ability: table[list(INTERVAL_ROWS)].astype(np.float32)}),
        moments=by_block(info["item_constrained"]),
        quantile_functions={} if table is None else {
            ability: (np.asarray(Z_NODES), table.astype(np.float32))})
