"""Pure update steps: natural-gradient variational Newton and optax Adam.

``make_update(spec, settings, frozen) -> update(state, z, eps, lik_terms, scale)``
returns ``(state, StepInfo)``; it never logs or reads the clock. ``z``, ``eps`` and
``lik_terms`` carry a leading axis of Monte Carlo draws (``stack_draws`` builds it; one
draw is an axis of length 1): every term is averaged over the draws. ``init_opt_state``
gives the state either update carries between steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp

from engine.infer.elbo import Terms, entropy, log_prior, prior_terms
from engine.infer.guide import FitState, GuideState, StepInfo, reparameterise, sample
from engine.infer.settings import FitSettings
from engine.exported import exported_jit
from engine.models.spec import ModelSpec

if TYPE_CHECKING:  # imported where Adam is built: Newton fits do not load it
    import optax

__all__ = ["make_update", "make_optimizer", "init_opt_state", "draw", "draw_many",
           "stack_draws"]


@exported_jit
def draw(state: FitState, sizes: dict | None = None) -> tuple[FitState, dict, dict]:
    """Advance the state's key and take one reparameterised draw from the guide.

    ``sizes`` (name -> int32 count of real entries, leading ones of each block) is given
    when the guide is padded to a bucketed shape: the real entries then get exactly the
    normals an unpadded guide of those sizes would get (JAX's partitionable Threefry makes
    the first ``m`` of ``n`` normals the ``m`` normals of the same key) and padded entries
    ``eps = 0``. The sizes are traced values, so one program serves every size in a bucket.
    """
    key, sub = jax.random.split(state.rng_key)
    if sizes is None:
        z, eps = sample(state.guide, rng_key=sub)
        return state._replace(rng_key=key), z, eps
    names = sorted(state.guide.loc)
    total = sum(state.guide.loc[n].size for n in names)
    flat = jax.random.normal(sub, (total,), jnp.float32)
    eps, offset = {}, jnp.zeros((), jnp.int32)
    for n in names:
        shape = state.guide.loc[n].shape
        i = jnp.arange(state.guide.loc[n].size, dtype=jnp.int32)
        real = i < sizes[n]
        eps[n] = jnp.where(real, flat[jnp.where(real, offset + i, 0)], 0.0).reshape(shape)
        offset = offset + sizes[n]
    return state._replace(rng_key=key), reparameterise(state.guide, eps), eps


def draw_many(state: FitState, draws: int, sizes: dict | None = None
              ) -> tuple[FitState, list, list]:
    """``draws`` successive :func:`draw` calls: the state after them and the lists of ``z``
    and ``eps`` (one draw is exactly one :func:`draw`, so its random stream is unchanged)."""
    zs, epss = [], []
    for _ in range(draws):
        state, z, eps = draw(state, sizes)
        zs.append(z)
        epss.append(eps)
    return state, zs, epss


def stack_draws(*trees):
    """Stack pytrees of one draw each (``z``, ``eps`` or likelihood ``Terms``) along a new
    leading draws axis, as ``update`` takes them."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _mean(x):
    return jnp.mean(x, axis=0)


def make_optimizer(settings: FitSettings) -> "optax.GradientTransformation | None":
    """Adam with a decaying rate for the models that take it; None for Newton's (which do not
    import optax: 30 ms of every fit process)."""
    if settings.optimizer != "adam":
        return None
    import optax

    steps = settings.max_passes * settings.steps_per_pass
    schedule = optax.exponential_decay(settings.learning_rate, steps, 0.05)
    return optax.adam(schedule)


def init_opt_state(settings: FitSettings, guide: GuideState, lik_shapes: Terms):
    """What the update carries between steps: Adam's moments, or for Newton a running
    mean of the likelihood's cross curvatures (zeros until the first step sets it)."""
    optimizer = make_optimizer(settings)
    if optimizer is not None:
        return optimizer.init(guide)
    return {k: jnp.zeros(s.shape, s.dtype) for k, s in lik_shapes.cross.items()}


def _log_prior(spec: ModelSpec, z: dict, valid: dict | None):
    """``log_prior``; with ``valid`` (name -> 1 real / 0 padded entry) padded entries count
    for nothing."""
    if valid is None:
        return log_prior(spec, z)
    env = {p.name: p.constrain(z[p.name]) for p in spec.params if p.owner == "global"}
    return sum(jnp.sum(valid[p.name] * p.prior.log_prob(z[p.name], env)) for p in spec.params)


def _prior_terms(spec: ModelSpec, z: dict, valid: dict | None) -> Terms:
    """``prior_terms`` over the real entries (``valid``): padded ones get zero terms."""
    if valid is None:
        return prior_terms(spec, z)
    return prior_terms(spec, z, lambda zz: _log_prior(spec, zz, valid))


def _entropy(log_scale: dict, valid: dict | None):
    if valid is None:
        return entropy(log_scale)
    half_log_2pie = 0.5 * (1.0 + jnp.log(2.0 * jnp.pi))
    return sum(jnp.sum(valid[n] * (v + half_log_2pie)) for n, v in log_scale.items())


def _keep_padded(new: GuideState, old: GuideState, valid: dict | None) -> GuideState:
    """Padded entries stay where they started (they have no data and no prior terms)."""
    if valid is None:
        return new
    pick = lambda part_new, part_old: {n: jnp.where(valid[n] > 0, v, part_old[n])
                                       for n, v in part_new.items()}
    return GuideState(pick(new.loc, old.loc), pick(new.log_scale, old.log_scale))


def _total(spec: ModelSpec, z: dict, lik: Terms, scale, valid: dict | None = None
           ) -> tuple[Terms, dict]:
    """Joint (likelihood + prior) terms, and a positive curvature for Newton precisions.

    Where the summed likelihood curvature of an entry is not concave (e.g. a
    discrimination far from its optimum) it contributes zero, so the prior sets the
    scale and steps stay ascending.
    """
    prior = _prior_terms(spec, z, valid)
    grad = {n: prior.grad[n] + scale * lik.grad.get(n, 0.0) for n in prior.grad}
    hess = {n: prior.hess[n] + scale * lik.hess.get(n, 0.0) for n in prior.hess}
    curv = {n: jnp.maximum(-prior.hess[n], 0.0) + jnp.maximum(-scale * lik.hess.get(n, 0.0), 0.0)
            for n in prior.hess}
    cross = {k: scale * h for k, h in lik.cross.items()}
    return Terms(prior.value + scale * lik.value, grad, hess, cross), curv


def _info(guide: GuideState, tot: Terms, delta: dict, moved: dict, *, smooth: bool = True,
          valid: dict | None = None) -> StepInfo:
    """Diagnostics from per-draw ``tot`` and ``delta`` (leading draws axis), averaged.

    ``smooth``: also a second-order (Taylor) estimate of the ELBO around the locations,
    which removes most Monte Carlo noise where each precision matches the curvature (the
    Newton step's guide). For other guides the estimate can be far off, so their smoothed
    ELBO is the plain Monte Carlo one.
    """
    ent = _entropy(guide.log_scale, valid)
    elbo = _mean(tot.value) + ent
    if not smooth:
        max_step = jnp.max(jnp.stack([jnp.max(jnp.abs(m)) for m in moved.values()]))
        return StepInfo(elbo, elbo, max_step, jnp.isfinite(elbo) & jnp.isfinite(max_step))
    var = {n: jnp.exp(2 * v) for n, v in guide.log_scale.items()}
    taylor = sum(
        jnp.sum(-tot.grad[n] * delta[n] + 0.5 * tot.hess[n] * (delta[n] ** 2 + var[n]))
        for n in delta
    )
    for key, h in tot.cross.items():
        a, b = key.split("|")
        taylor = taylor + jnp.sum(h * delta[a] * delta[b])
    taylor = taylor / tot.value.shape[0]
    max_step = jnp.max(jnp.stack([jnp.max(jnp.abs(m)) for m in moved.values()]))
    finite = jnp.isfinite(elbo) & jnp.isfinite(max_step)
    return StepInfo(elbo, elbo + taylor, max_step, finite)


def _along(values: dict, moves, t) -> tuple[dict, dict]:
    """``values`` moved ``t`` along a symmetry, ``x exp(t m) + t v`` per named block, and
    the ``t m`` each block's log-scale moves by (``m``, ``v`` may be per-component)."""
    out, shift = dict(values), {}
    for name, m, v in moves:
        m, v = jnp.asarray(m, jnp.float32), jnp.asarray(v, jnp.float32)
        out[name] = values[name] * jnp.exp(t * m) + t * v
        shift[name] = jnp.broadcast_to(t * m, values[name].shape)
    return out, shift


def _move(guide: GuideState, moves, t) -> GuideState:
    loc, shift = _along(guide.loc, moves, t)
    return GuideState(loc, {n: v + shift.get(n, 0.0) for n, v in guide.log_scale.items()})


def _follow_symmetries(spec: ModelSpec, guide: GuideState, eps: dict, newton_iters: int = 1,
                       max_t: float = 0.5, valid: dict | None = None) -> GuideState:
    """Maximise the ELBO along each likelihood symmetry of ``spec``.

    The expected log-likelihood is constant along a symmetry, so only the prior term
    (estimated with the step's standard-normal draws ``eps``, leading draws axis, averaged)
    and the entropy move. A move of the guide moves its draws the same way,
    ``z(t) = z * exp(t m) + t v``, and the entropy by ``t * sum(m)``: the line search
    differentiates the prior along that path, forward over forward, never back through the
    guide.
    """
    for sym in spec.symmetries:
        for _ in range(newton_iters):
            z0 = jax.vmap(lambda e: reparameterise(guide, e))(eps)

            def objective(t):
                z, shift = _along(z0, sym.moves, t)
                prior = jnp.mean(jax.vmap(lambda zz: _log_prior(spec, zz, valid))(z))
                # the log-scale shift is per entry, not per draw: drop the draws axis
                if valid is None:
                    return prior + sum(jnp.sum(d[0]) for d in shift.values())
                return prior + sum(jnp.sum(valid[n] * d[0]) for n, d in shift.items())

            slope = lambda t: jax.jvp(objective, (t,), (jnp.float32(1.0),))[1]
            d1, d2 = jax.jvp(slope, (jnp.float32(0.0),), (jnp.float32(1.0),))
            t = jnp.clip(-d1 / jnp.minimum(d2, -1e-6), -max_t, max_t)
            t = jnp.where(jnp.isfinite(t), t, 0.0)
            guide = _move(guide, sym.moves, t)
    return guide


def make_update(spec: ModelSpec, settings: FitSettings, frozen: frozenset = frozenset()) -> Callable:
    """Build the jitted ``update(state, z, eps, lik_terms, scale, valid=None) -> (state,
    info)``; ``z``, ``eps`` and ``lik_terms`` carry a leading draws axis (see
    :func:`stack_draws`). ``valid`` (name -> float 1 for a real entry, 0 for padding, in each
    block's shape) is given when the guide is padded to a bucketed shape: padded entries
    then add nothing to the prior, entropy or ELBO and never move, so the real entries
    follow the unpadded fit."""
    optimizer = make_optimizer(settings)
    rho, rho_p = settings.damping, settings.precision_damping
    limits = {p.name: p.max_step for p in spec.params}  # per-block trust regions, if declared
    # A symmetry that moves a frozen block would move the frozen values: skip it.
    # Pooled blocks carry their hyper-parameters along (Symmetry.with_hypers).
    syms = (s.with_hypers(spec.params) for s in spec.symmetries)
    free_syms = tuple(s for s in syms if not any(m[0] in frozen for m in s.moves))
    symmetries = spec.replace(symmetries=free_syms) if free_syms else None

    def newton(state: FitState, z, eps, lik: Terms, scale, valid=None):
        """One damped Newton step of every location, and the precisions moved towards the
        draws' curvature (gradients, curvatures and control variates are per draw, then
        averaged over the draws axis).

        The location step uses the gradient minus a control variate, ``g(z) - H (z - loc)``
        (and the same for the within-owner cross curvatures), which removes most of the
        draw's noise. With the draw's own ``H(z)`` the variate is not mean-zero (its mean
        is ``var * dH/dx``) and the fixed point is not the ELBO's ``E[g] = 0``: abilities
        shrank by 3-4%. So the draw's own curvature is used only for the first
        ``settings.unbiased_after`` steps, while locations move far; after that the
        variate uses curvatures fixed before the draw (the current precision, and a running
        mean of the cross terms), which are mean-zero and as good once they settle. (The
        step still divides by a precision that includes the draw's curvature: a
        second-order effect; dividing by the previous precision instead moved the
        frozen-refit slope from 1.00 to 1.007-1.009 and was not kept.) Stochastic steps
        (``steps_per_pass > 1``) keep the draw's curvature throughout.
        """
        guide = state.guide
        tot, curv = jax.vmap(lambda zz, ll: _total(spec, zz, ll, scale, valid))(z, lik)
        delta = {n: z[n] - guide.loc[n] for n in z}
        # Stochastic steps (steps_per_pass > 1) see part of the data, whose curvature the
        # full-data precision does not match: they keep the draw's own curvature.
        settled = (state.step >= settings.unbiased_after) & (settings.steps_per_pass == 1)
        first = state.step == 0
        cross, cross_mean = {}, {}
        for key, h in tot.cross.items():  # per draw, scaled like the rest of the likelihood
            before = state.opt_state[key]
            cross[key] = jnp.where(settled, before, h)
            cross_mean[key] = jnp.where(first, _mean(h), (1 - rho_p) * before + rho_p * _mean(h))
        loc, log_scale, moved = {}, {}, {}
        for n in guide.loc:
            prec_old = jnp.exp(-2.0 * guide.log_scale[n])
            target = jnp.maximum(_mean(curv[n]), settings.min_precision)
            prec = jnp.where(first, target, (1 - rho_p) * prec_old + rho_p * target)
            g_cv = tot.grad[n] + jnp.where(settled, prec_old, -tot.hess[n]) * delta[n]
            for key, h in cross.items():  # within-owner coupling, e.g. difficulty x discrimination
                a, b = key.split("|")
                if n in (a, b):
                    g_cv = g_cv - h * delta[b if n == a else a]
            limit = min(settings.max_step, limits.get(n) or settings.max_step)
            step = jnp.clip(rho * _mean(g_cv) / prec, -limit, limit)
            if n in frozen:
                loc[n], log_scale[n] = guide.loc[n], guide.log_scale[n]
                moved[n] = jnp.zeros(())
            else:
                loc[n], log_scale[n] = guide.loc[n] + step, -0.5 * jnp.log(prec)
                moved[n] = step * jnp.sqrt(prec)
                if valid is not None:
                    moved[n] = moved[n] * valid[n]
        info = _info(guide, tot, delta, moved, valid=valid)
        new = GuideState(loc, log_scale)
        if symmetries:
            new = _follow_symmetries(symmetries, new, eps, valid=valid)
        new = _keep_padded(new, guide, valid)
        return FitState(new, cross_mean, state.step + 1, state.rng_key), info

    def adam(state: FitState, z, eps, lik: Terms, scale, valid=None):
        import optax

        guide = state.guide
        tot, _ = jax.vmap(lambda zz, ll: _total(spec, zz, ll, scale, valid))(z, lik)
        delta = {n: z[n] - guide.loc[n] for n in z}
        keep = {n: 0.0 if n in frozen else 1.0 for n in guide.loc}
        if valid is not None:  # padded entries: no gradient, not even the entropy's
            keep = {n: k * valid[n] for n, k in keep.items()}
        neg = GuideState(
            {n: -keep[n] * _mean(tot.grad[n]) for n in guide.loc},
            {n: -keep[n] * (_mean(tot.grad[n] * delta[n]) + 1.0) for n in guide.loc},
        )
        updates, opt_state = optimizer.update(neg, state.opt_state, guide)
        new = optax.apply_updates(guide, updates)
        moved = {n: updates.loc[n] / jnp.exp(guide.log_scale[n]) for n in guide.loc}
        info = _info(guide, tot, delta, moved, smooth=False, valid=valid)
        new = _keep_padded(GuideState(*new), guide, valid)
        return FitState(new, opt_state, state.step + 1, state.rng_key), info

    return exported_jit(newton if optimizer is None else adam)
