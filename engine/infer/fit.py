"""The fit loop: blocks -> pmapped terms -> jitted update, until the ELBO converges."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from engine.compile_cache import count_compiles, use_compilation_cache
from engine.host import prng_key
from engine.exported import exported_jit
from engine.data.blocks import Block, BlockSource, InMemorySource
from engine.data.tally import count_observed
from engine.infer.checkpoint import Checkpointer, FitProgress
from engine.infer.elbo import add_terms, make_block_terms, make_observation_terms
from engine.infer.guide import FitState, GuideState, constrained_means, init_guide
from engine.infer.parallel import make_parallel_terms, num_local_devices, stack_blocks
from engine.infer.settings import FitSettings
from engine.infer.step import draw_many, init_opt_state, make_update, stack_draws
from engine.infer.terms import Terms, terms_shapes
from engine.models.spec import ModelSpec

__all__ = ["fit_source", "FitResult", "converged_at", "bucket_size"]


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
    # Sampled or importance-weighted items (the quadrature fit's sampler, or its importance
    # draws where they hold enough effective draws): each block's 5% and 95% quantiles of
    # its unconstrained value, (2, *full_shape), NaN where not drawn; the read-outs'
    # intervals then come from these instead of the Gaussian's
    intervals: dict = field(default_factory=dict)
    # and their constrained values' posterior means and sds, split R-hats, effective
    # draws and the sds' Monte Carlo standard errors, (5, *full_shape), NaN where not
    # sampled; the read-outs' means and sds then
    # come from these, with the diagnostics beside them
    moments: dict = field(default_factory=dict)
    # A quadrature fit's scalar abilities: each subject's exact posterior quantiles at the
    # probabilities of normal scores, ``{block: (z (J,), values (J, S))}``; the rank
    # statistics' draws are mapped through them (engine.readout.quantile_draws)
    quantile_functions: dict = field(default_factory=dict)

    @property
    def num_passes(self) -> int:
        return len(self.trace)

    @property
    def elbo(self) -> float:
        return self.trace[-1]["elbo_smooth"] if self.trace else float("nan")

    def means(self) -> dict[str, np.ndarray]:
        """The variational guide's location of every block, constrained (``exp`` of a positive
        block's: its median under the guide). Not the posterior means a run reports where
        the fit read out more than the guide (quadrature, the item sampler, NUTS draws):
        those are :func:`engine.run.posterior_tables`' (``items.parquet``,
        ``subjects.parquet``)."""
        return {k: np.asarray(v) for k, v in constrained_means(self.spec, self.guide).items()}

    def sds(self) -> dict[str, np.ndarray]:
        """The variational guide's sd of every block on its unconstrained axis (a positive
        block's log). The mean-field guide's sds can be narrower than the posterior's (on
        LSAT7 the 2PL's difficulties 0.07-0.13 where the posterior reads 0.12-0.34): the
        posterior sds and intervals of a run are :func:`engine.run.posterior_tables`'."""
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
        observed = sum(count_observed(b.y) for b in blocks)
        stacked = stack_blocks(blocks, num_devices)
        return Block(*(jax.device_put(a, sharding) for a in stacked)), observed

    return load


_add_terms = exported_jit(add_terms)  # one compiled sum, not an eager op per leaf and shape
_stack_draws = jax.jit(stack_draws)  # likewise for the draws axis of the update's inputs


def _compile_ahead(update, state, lik_shapes: Terms, sum_groups: bool,
                   draws: int, valid=None) -> threading.Thread:
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
            jax.block_until_ready(update(state, *stacked, np.float32(1.0), valid))
            if sum_groups:
                jax.block_until_ready(_add_terms(lik, lik))
        except Exception:  # the real call compiles again and reports any error itself
            pass

    thread = threading.Thread(target=run, name="irt-engine-compile", daemon=True)
    thread.start()
    return thread


_OPT_STATE_PROGRAMS: dict = {}


def _initial_opt_state(settings: FitSettings, guide: GuideState, shapes):
    """``init_opt_state`` as one program, kept per settings and terms' shapes for the
    process's later fits (eagerly, each of its zeros compiled a program per shape)."""
    key = (settings, tuple((k, s.shape, np.dtype(s.dtype).str)
                           for k, s in sorted(shapes.cross.items())))
    program = _OPT_STATE_PROGRAMS.get(key)
    if program is None:
        if len(_OPT_STATE_PROGRAMS) >= 32:
            _OPT_STATE_PROGRAMS.clear()
        program = _OPT_STATE_PROGRAMS[key] = jax.jit(
            lambda g: init_opt_state(settings, g, shapes))
    return program(guide)


def bucket_size(n: int, per_doubling: int = 8) -> int:
    """The size ``n`` subjects or items are padded to: at least 8, then ``per_doubling``
    buckets per doubling (eight: at most 12.5% padding, 161 -> 176, 1,000 -> 1,024,
    11,873 -> 12,288; two: at most 50%, 33-48 -> 48, 49-64 -> 64)."""
    if n <= 8:
        return 8
    step = max(1, (1 << ((n - 1).bit_length() - 1)) // per_doubling)
    return -(-n // step) * step


def bucket_floor(n: int, per_doubling: int = 8) -> int:
    """The largest size :func:`bucket_size` gives that is at most ``n`` (8 at least)."""
    if n <= 8:
        return 8
    top = 1 << (n.bit_length() - 1)  # sizes past top are multiples of its step
    step = max(1, top // per_doubling)
    return n // step * step


def _bucketed(spec: ModelSpec, source: BlockSource, settings: FitSettings):
    """``(padded source, (S_b, N_b))`` for a matrix held in memory in one tile, padded with
    missing cells to bucketed sizes, so that data sets of similar shape run the same XLA
    programs (and a new one finds them in the persistent compilation cache); ``None`` where
    that does not apply (the setting is off, several tiles, or a model whose constants
    depend on the shape, such as a Q-matrix)."""
    if not (settings.bucket_shapes and isinstance(source, InMemorySource)) or spec.constants:
        return None
    S, N = source.num_subjects, source.num_items
    Sb, Nb = bucket_size(S), bucket_size(N)
    if len(source.keys()) != 1 or Sb * Nb > source.max_block_cells or (Sb, Nb) == (S, N):
        return None
    y = source.responses
    padded = np.full((Sb, Nb), np.nan if np.issubdtype(y.dtype, np.floating) else -1, y.dtype)
    padded[:S, :N] = y
    return type(source)(padded, max_block_cells=source.max_block_cells), (Sb, Nb)


def _pad_guide(spec: ModelSpec, guide: GuideState, shape: tuple[int, int]) -> GuideState:
    """``guide`` grown to ``shape`` (subjects, items); new entries at the initial guide."""
    base = init_guide(spec, *shape)
    loc, log_scale = dict(base.loc), dict(base.log_scale)
    for p in spec.params:
        if p.owner == "global":
            loc[p.name], log_scale[p.name] = guide.loc[p.name], guide.log_scale[p.name]
            continue
        n = np.shape(guide.loc[p.name])[0]
        loc[p.name] = loc[p.name].copy()
        log_scale[p.name] = log_scale[p.name].copy()
        loc[p.name][:n] = np.asarray(guide.loc[p.name])
        log_scale[p.name][:n] = np.asarray(guide.log_scale[p.name])
    return GuideState(loc, log_scale)


def _cut(spec: ModelSpec, tree: dict, S: int, N: int) -> dict:
    """Per-block arrays (keyed by block name, or ``"a|b"`` pairs) cut back to S subjects and
    N items."""
    owner = {p.name: p.owner for p in spec.params}
    size = {"subject": S, "item": N}
    return {k: (np.asarray(v)[: size[owner[k.split("|")[0]]]]
                if owner[k.split("|")[0]] in size else np.asarray(v)) for k, v in tree.items()}


def _padding(spec: ModelSpec, S: int, N: int, shape: tuple[int, int]):
    """``(valid, sizes)`` for ``update`` and ``draw``: 1 / 0 per entry of each padded block,
    and each block's count of real entries (traced values: one program per bucket)."""
    real = {"subject": S, "item": N}
    valid, sizes = {}, {}
    for p in spec.params:
        full = p.full_shape(*shape)
        if p.owner == "global":
            valid[p.name] = np.ones(full, np.float32)
            sizes[p.name] = np.int32(int(np.prod(full)))
            continue
        mask = (np.arange(full[0]) < real[p.owner]).astype(np.float32)
        valid[p.name] = np.ascontiguousarray(
            np.broadcast_to(mask.reshape((-1,) + (1,) * (len(full) - 1)), full))
        sizes[p.name] = np.int32(real[p.owner] * int(np.prod(full[1:])))
    return valid, sizes


@lru_cache(maxsize=16)
def _programs(spec: ModelSpec, sparse: bool, S: int, N: int, with_hessian: bool,
              frozen: frozenset, K: int, settings: FitSettings):
    """The fit's jitted block terms and update, kept for the next fit of the same shape in
    this process (a notebook's or a script's second fit traces nothing: 0.2-0.6 s a fit).
    Keyed like the jit caches, by the model's declared fields (``ModelSpec`` equality)."""
    factory = make_observation_terms if sparse else make_block_terms
    return (make_parallel_terms(factory(spec, S, N, with_hessian, frozen), K),
            make_update(spec, settings, frozen))


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

    A matrix held in memory in one tile is padded with missing cells to bucketed sizes
    (:func:`bucket_size`; ``settings.bucket_shapes``): padded entries take no part in the
    fit, and a data set of similar shape reuses the compiled programs, from the persistent
    compilation cache (:mod:`engine.compile_cache`) in a new process. ``extra["compile"]``
    counts the programs and the time spent tracing, lowering and compiling them.
    """
    use_compilation_cache()
    settings = settings.for_model(spec)
    with count_compiles() as compiles:
        result = _fit_source(spec, source, settings, init=init, frozen=frozen,
                             progress_fn=progress_fn, checkpointer=checkpointer, resume=resume)
    result.extra["compile"] = compiles.to_dict()
    return result


def _fit_source(spec: ModelSpec, source: BlockSource, settings: FitSettings, *, init, frozen,
                progress_fn, checkpointer, resume) -> FitResult:
    S0, N0 = S, N = source.num_subjects, source.num_items
    valid = sizes = None
    bucketed = _bucketed(spec, source, settings)
    if bucketed is not None:
        source, (S, N) = bucketed
        valid, sizes = _padding(spec, S0, N0, (S, N))
        if init is not None:
            init = _pad_guide(spec, init, (S, N))
    K = num_local_devices(settings.num_devices)
    guide = init if init is not None else init_guide(spec, S, N)
    device = jax.local_devices()[0]
    guide = jax.device_put(jax.tree.map(np.asarray, guide), device)  # host arrays: no program
    with_hessian = settings.optimizer == "newton"
    shapes = terms_shapes(spec, S, N, with_hessian, frozenset(frozen))
    state = jax.device_put(FitState(guide, _initial_opt_state(settings, guide, shapes),
                                    np.zeros((), np.int32), prng_key(settings.seed)),
                           device)
    terms_fn, update = _programs(spec, source.layout == "sparse", S, N, with_hessian,
                                 frozenset(frozen), K, settings)
    if valid is not None:
        valid, sizes = jax.device_put((valid, sizes), device)
    group_keys = _group_keys(source, K)
    load = _group_loader(source, K)
    cached = [load(keys) for keys in group_keys] if source.resident else None
    order_key = prng_key(settings.seed + 1)
    draws = settings.draws_for(source.num_observed)

    trace, recent, elapsed, compile_time = [], [], 0.0, 0.0
    if resume and checkpointer is not None:
        progress = checkpointer.load(jax.device_get(state))
        if progress is not None:
            state = jax.device_put(progress.state, device)
            order_key, trace, recent = progress.order_key, list(progress.trace), progress.recent
            elapsed, compile_time = progress.elapsed_s, progress.compile_s
    smooth = [r["elbo_smooth"] for r in trace if "error" not in r]
    converged = bool(trace) and converged_at(smooth, settings.tol, settings.stop_window,
                                             settings.min_passes)
    failed = any("error" in r for r in trace)
    t_start = time.perf_counter()
    ahead = None
    if not (converged or failed) and len(trace) < settings.max_passes:
        ahead = _compile_ahead(update, state, shapes, sum_groups=len(group_keys) > 1,
                               draws=draws, valid=valid)
    for pass_idx in range(len(trace), 0 if converged or failed else settings.max_passes):
        t0 = time.perf_counter()
        order = np.arange(len(group_keys))
        if settings.steps_per_pass > 1:
            order_key, sub = jax.random.split(order_key)
            order = np.asarray(jax.random.permutation(sub, len(group_keys)))
        if cached is not None:
            feed = (cached[g] for g in order)
        else:
            from engine.data.streaming import prefetch  # Dask only for sources read anew

            feed = prefetch((load(group_keys[g]) for g in order), settings.prefetch)
        infos = []
        for chunk in np.array_split(order, min(settings.steps_per_pass, len(group_keys))):
            state, zs, epss = draw_many(state, draws, sizes)
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
                                 _stack_draws(*liks), np.float32(scale), valid)
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
        if converged_at(smooth, settings.tol, settings.stop_window, settings.min_passes):
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
    final = GuideState(*final)
    if frozen and recent:  # held blocks keep their values to the bit (a float32 mean of
        last = jax.tree.map(np.asarray, recent[-1])  # equal values can round)
        final = GuideState({n: last.loc[n] if n in frozen else v for n, v in final.loc.items()},
                           {n: last.log_scale[n] if n in frozen else v
                            for n, v in final.log_scale.items()})
    cross = {k: np.asarray(v) for k, v in jax.device_get(state.opt_state).items()} \
        if settings.optimizer == "newton" and trace else {}
    extra = {"source": type(source).__name__, "layout": source.layout, "mc_draws": draws}
    if valid is not None:  # back to the real subjects and items
        final = GuideState(_cut(spec, final.loc, S0, N0), _cut(spec, final.log_scale, S0, N0))
        cross = _cut(spec, cross, S0, N0)
        extra["bucket"] = [S, N]
    return FitResult(
        spec=spec,
        guide=final,
        settings=settings,
        trace=trace,
        converged=converged,
        wall_time_s=wall,
        compile_time_s=compile_time,
        num_subjects=S0,
        num_items=N0,
        num_observed=source.num_observed,
        num_devices=K,
        frozen=tuple(sorted(frozen)),
        extra=extra,
        cross=cross,
    )
