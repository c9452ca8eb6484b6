"""The fit loop: blocks -> pmapped terms -> jitted update, until the ELBO converges."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from engine.data.blocks import Block, BlockSource
from engine.data.streaming import prefetch
from engine.infer.checkpoint import Checkpointer, FitProgress
from engine.infer.elbo import add_terms, make_block_terms, make_observation_terms
from engine.infer.guide import FitState, GuideState, constrained_means, init_guide
from engine.infer.parallel import make_parallel_terms, num_local_devices, stack_blocks
from engine.infer.settings import FitSettings
from engine.infer.step import draw_many, init_opt_state, make_update, stack_draws
from engine.infer.terms import Terms, terms_shapes
from engine.models.spec import ModelSpec

__all__ = ["fit_source", "FitResult", "converged_at"]


@dataclass
class FitResult:
    """A fitted variational posterior with its trace and timings."""

    spec: ModelSpec
    guide: GuideState  # numpy arrays
    settings: FitSettings
    trace: list[dict]
    converged: bool
    wall_time_s: float
    compile_time_s: float
    num_subjects: int
    num_items: int
    num_observed: int
    num_devices: int
    frozen: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)
    # Newton only: the running mean of the likelihood's within-owner cross curvatures
    # ("a|b" -> per-owner array), for the read-outs' within-item marginal intervals
    cross: dict = field(default_factory=dict)
    # A sampler's result (NUTS): constrained posterior draws per block, (chains, draws,
    # *full_shape); read-outs then use these instead of drawing from the guide
    draws: dict = field(default_factory=dict)

    @property
    def num_passes(self) -> int:
        return len(self.trace)

    @property
    def elbo(self) -> float:
        return self.trace[-1]["elbo_smooth"] if self.trace else float("nan")

    def means(self) -> dict[str, np.ndarray]:
        """Constrained point estimates of every parameter block."""
        return {k: np.asarray(v) for k, v in constrained_means(self.spec, self.guide).items()}

    def sds(self) -> dict[str, np.ndarray]:
        """Posterior sd of the unconstrained value of every block."""
        return {k: np.exp(np.asarray(v)) for k, v in self.guide.log_scale.items()}


_MEDIAN_ABS_NORMAL = 0.6744897501960817  # median |z| of a standard normal z


def converged_at(values: list[float], tol: float, window: int, min_passes: int) -> bool:
    """True when the mean ELBO of the last ``window`` passes differs from the mean of the
    ``window`` before by less than ``tol`` relative, or by less than the Monte Carlo noise.
    """
    if len(values) < max(min_passes, 2 * window):
        return False
    last, before = np.asarray(values[-window:]), np.asarray(values[-2 * window : -window])
    change = abs(last.mean() - before.mean())
    # Two standard errors of the difference of window means: below that the ELBO no
    # longer improves detectably and Monte Carlo noise alone explains the change. The
    # noise sd comes from successive differences (blind to trends), through their median
    # absolute value: one wild pass (the first steps of a fit, or a draw in a far tail)
    # must not read as noise, or a fit still climbing by thousands of nats a pass stops
    # (a Gamma-IRT fit on 10 systems stopped at pass 10, 9,000 nats short).
    both = np.concatenate([before, last])
    noise_var = (np.median(np.abs(np.diff(both))) / _MEDIAN_ABS_NORMAL) ** 2 / 2.0
    noise = 2.0 * np.sqrt(2.0 * noise_var / window)
    return bool(change < max(tol * max(abs(last.mean()), 1.0), noise))


def _group_keys(source: BlockSource, num_devices: int) -> list[tuple]:
    """Block keys dealt into groups of ``num_devices`` (None pads with an empty block)."""
    keys = list(source.keys())
    while len(keys) % num_devices:
        keys.append(None)
    return [tuple(keys[i : i + num_devices]) for i in range(0, len(keys), num_devices)]


def _group_loader(source: BlockSource, num_devices: int):
    """``load(keys) -> (stacked device Block, observed cells)`` for one group of blocks."""
    devices = jax.local_devices()[:num_devices]
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.asarray(devices), ("devices",)), jax.sharding.PartitionSpec("devices"))

    def load(keys: tuple) -> tuple[Block, int]:
        blocks = [source.block(k) if k is not None else source.empty_block() for k in keys]
        observed = int(sum((b.y >= 0).sum() for b in blocks))
        stacked = stack_blocks(blocks, num_devices)
        return Block(*(jax.device_put(a, sharding) for a in stacked)), observed

    return load


_add_terms = jax.jit(add_terms)  # one compiled sum, not an eager op per leaf and shape
_stack_draws = jax.jit(stack_draws)  # likewise for the draws axis of the update's inputs


def _compile_ahead(update, state, lik_shapes: Terms, sum_groups: bool,
                   draws: int) -> threading.Thread:
    """Compile ``update`` (and the sum of two groups' terms when a pass has several) on a
    background thread while the first pass compiles the draw and the terms: XLA releases
    the interpreter lock while it compiles, so with two or more cores they overlap. The
    thread calls each function once on zero terms of the right shapes (results dropped;
    ``draws`` copies stacked, as the loop stacks its draws),
    which leaves the executables in their caches for the real calls. Join it first.
    """
    def run():
        try:
            device = jax.local_devices()[0]
            lik = jax.device_put(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), lik_shapes),
                                 device)
            z = state.guide.loc
            stacked = [_stack_draws(*[x] * draws) for x in (z, z, lik)]
            jax.block_until_ready(update(state, *stacked, jnp.float32(1.0)))
            if sum_groups:
                jax.block_until_ready(_add_terms(lik, lik))
        except Exception:  # the real call compiles again and reports any error itself
            pass

    thread = threading.Thread(target=run, name="irt-engine-compile", daemon=True)
    thread.start()
    return thread


def _terms_factory(source: BlockSource):
    return make_observation_terms if source.layout == "sparse" else make_block_terms


def fit_source(spec: ModelSpec, source: BlockSource, settings: FitSettings = FitSettings(),
               *, init: GuideState | None = None, frozen: frozenset = frozenset(),
               progress_fn=None, checkpointer: Checkpointer | None = None,
               resume: bool = False) -> FitResult:
    """Fit ``spec`` to the blocks of ``source`` by stochastic variational inference.

    In-memory sources keep every block on the devices; others (streaming, or sparse
    batches read from a store) are read anew each pass, ``settings.prefetch`` groups
    ahead on a background thread while the devices compute. Both run the same step.

    Parameters
    ----------
    source : a ``BlockSource`` (dense tiles or sparse observation batches).
    init : a starting guide (e.g. a previous run's posterior); frozen blocks keep its values.
    frozen : names of blocks held fixed at ``init``.
    progress_fn : called as ``progress_fn(pass_index, record)`` after every pass.
    checkpointer : saves the fit's progress every ``checkpointer.every`` passes.
    resume : continue from ``checkpointer``'s checkpoint when there is one.
    """
    S, N = source.num_subjects, source.num_items
    K = num_local_devices(settings.num_devices)
    guide = init if init is not None else init_guide(spec, S, N)
    device = jax.local_devices()[0]
    guide = jax.device_put(jax.tree.map(jnp.asarray, guide), device)
    with_hessian = settings.optimizer == "newton"
    shapes = terms_shapes(spec, S, N, with_hessian, frozenset(frozen))
    state = jax.device_put(FitState(guide, init_opt_state(settings, guide, shapes),
                                    np.zeros((), np.int32), jax.random.PRNGKey(settings.seed)),
                           device)
    terms_fn = make_parallel_terms(
        _terms_factory(source)(spec, S, N, with_hessian, frozenset(frozen)), K)
    update = make_update(spec, settings, frozenset(frozen))
    group_keys = _group_keys(source, K)
    load = _group_loader(source, K)
    cached = [load(keys) for keys in group_keys] if source.resident else None
    order_key = jax.random.PRNGKey(settings.seed + 1)
    draws = settings.draws_for(source.num_observed)

    trace, recent, elapsed, compile_time = [], [], 0.0, 0.0
    if resume and checkpointer is not None:
        progress = checkpointer.load(jax.device_get(state))
        if progress is not None:
            state = jax.device_put(progress.state, device)
            order_key, trace, recent = progress.order_key, list(progress.trace), progress.recent
            elapsed, compile_time = progress.elapsed_s, progress.compile_s
    smooth = [r["elbo_smooth"] for r in trace if "error" not in r]
    converged = bool(trace) and converged_at(smooth, settings.tol, settings.patience,
                                             settings.min_passes)
    failed = any("error" in r for r in trace)
    t_start = time.perf_counter()
    ahead = None
    if not (converged or failed) and len(trace) < settings.max_passes:
        ahead = _compile_ahead(update, state, shapes, sum_groups=len(group_keys) > 1,
                               draws=draws)
    for pass_idx in range(len(trace), 0 if converged or failed else settings.max_passes):
        t0 = time.perf_counter()
        order = np.arange(len(group_keys))
        if settings.steps_per_pass > 1:
            order_key, sub = jax.random.split(order_key)
            order = np.asarray(jax.random.permutation(sub, len(group_keys)))
        if cached is not None:
            feed = (cached[g] for g in order)
        else:
            feed = prefetch((load(group_keys[g]) for g in order), settings.prefetch)
        infos = []
        for chunk in np.array_split(order, min(settings.steps_per_pass, len(group_keys))):
            state, zs, epss = draw_many(state, draws)
            liks, observed = [None] * draws, 0
            for _ in chunk:
                group, count = next(feed)
                for k, z in enumerate(zs):
                    t = terms_fn(z, group)
                    if ahead is not None:  # the terms compiled here; the rest on the thread
                        ahead.join()
                        ahead = None
                    liks[k] = t if liks[k] is None else _add_terms(liks[k], t)
                observed += count
            scale = source.num_observed / max(observed, 1)
            state, info = update(state, _stack_draws(*zs), _stack_draws(*epss),
                                 _stack_draws(*liks), jnp.float32(scale))
            infos.append(info)
        infos = jax.device_get(infos)
        record = {
            "pass": pass_idx + 1,
            "elbo": float(np.mean([i.elbo for i in infos])),
            "elbo_smooth": float(np.mean([i.elbo_smooth for i in infos])),
            "max_step": float(np.max([i.max_step for i in infos])),
            "seconds": time.perf_counter() - t0,
        }
        if pass_idx == 0:
            compile_time = record["seconds"]
        if not all(bool(i.finite) for i in infos):
            record["error"] = "non-finite ELBO or step"
            trace.append(record)
            break
        trace.append(record)
        smooth.append(record["elbo_smooth"])
        recent = (recent + [jax.device_get(state.guide)])[-settings.patience:]
        if progress_fn is not None:
            progress_fn(pass_idx, record)
        if converged_at(smooth, settings.tol, settings.patience, settings.min_passes):
            converged = True
            break
        if checkpointer is not None and checkpointer.due(len(trace)):
            checkpointer.save(FitProgress(jax.device_get(state), jax.device_get(order_key), trace,
                                          recent, elapsed + time.perf_counter() - t_start,
                                          compile_time))
    wall = elapsed + time.perf_counter() - t_start
    # Polyak averaging over the final window removes most Monte Carlo jitter.
    final = jax.tree.map(lambda *g: np.mean(np.stack([np.asarray(x) for x in g]), axis=0), *recent) \
        if recent else jax.tree.map(np.asarray, state.guide)
    return FitResult(
        spec=spec,
        guide=GuideState(*final),
        settings=settings,
        trace=trace,
        converged=converged,
        wall_time_s=wall,
        compile_time_s=compile_time,
        num_subjects=S,
        num_items=N,
        num_observed=source.num_observed,
        num_devices=K,
        frozen=tuple(sorted(frozen)),
        extra={"source": type(source).__name__, "layout": source.layout, "mc_draws": draws},
        cross={k: np.asarray(v) for k, v in jax.device_get(state.opt_state).items()}
        if settings.optimizer == "newton" and trace else {},
    )
