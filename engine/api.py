"""The library API the CLI is thin over: fit a model to a store, an array or a path."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from engine.memory import default_memory_budget
from engine.compile_cache import count_compiles, use_compilation_cache
from engine.data.blocks import BlockSource, InMemorySource
from engine.data.kinds import (KIND_MEANING, READS, as_responses, boundary_counts, detect_kind,
                               source_for)
from engine.data.sparse import SparseSource
from engine.data.store import Store, open_store
from engine.data.tally import tally
from engine.errors import DataFormatError, ModelError, SettingsError
from engine.infer.checkpoint import Checkpointer
from engine.infer.fit import FitResult, fit_source
from engine.infer.guide import GuideState, init_guide
from engine.infer.marginal import choose_ability_factor, fit_marginal_result, pool_identical_rows
from engine.infer.settings import FitSettings
from engine.models.registry import get_model, resolve_prior
from engine.rows import sheet_digests

__all__ = ["fit", "fit_nuts", "response_stats", "resolve_model", "load_responses", "make_source",
           "default_memory_budget", "IN_MEMORY_FACTOR"]

# An in-memory fit holds the matrix about three times over: the host copy, the padded
# device-resident tiles and per-cell temporaries; COO observations take 9 bytes each.
IN_MEMORY_FACTOR = 3
_COO_BYTES = 9
# What a fit holds per subject and per item whatever streams: variational parameters,
# optimizer state, gradients, read-out tables and ids. Peak RSS over a 590 MB start, 1 x
# 1,000,000 binary store: 1PL 1.23 KiB per item (1.26 at 1 x 200,000), 2PL 2.5 KiB.
FIT_ID_BYTES = 2600


def make_source(store: Store, settings: FitSettings) -> BlockSource:
    """The block source for a store under ``settings.memory_budget``.

    Dense stores load into memory when ``IN_MEMORY_FACTOR`` copies fit the budget and
    stream tiles through Dask otherwise; sparse stores give observation batches (loaded,
    or streamed when larger than the budget), never a dense matrix.
    """
    budget = settings.memory_budget or default_memory_budget()
    check_fit_memory(store, max(budget, default_memory_budget()))
    if store.layout == "sparse":
        in_memory = store.num_observed * _COO_BYTES * IN_MEMORY_FACTOR <= budget
        return SparseSource.from_store(store, settings.block_cells, in_memory=in_memory)
    cell_bytes = store.dtype.itemsize  # 1 (int8) or 4 (float32 kinds)
    if store.num_subjects * store.num_items * cell_bytes * IN_MEMORY_FACTOR <= budget:
        return source_for(store.load(),  # checks the observed count against the metadata
                          settings.block_cells)
    from engine.data.streaming import StreamingSource  # Dask only for stores it streams

    return StreamingSource.from_store(store, settings.block_cells)


def check_fit_memory(store: Store, budget: int) -> None:
    """Refuse a store whose subjects and items need more than ``budget`` bytes for the fit's
    parameters (``FIT_ID_BYTES`` each), before anything is read: responses stream from the
    store, parameters do not."""
    need = (store.num_subjects + store.num_items) * FIT_ID_BYTES
    if need > budget:
        from engine.memory import size_text as size

        raise SettingsError(
            f"{store.path}: a fit of {store.num_subjects:,} subjects x {store.num_items:,} items "
            f"needs about {size(need)} for its parameters, optimizer state and read-outs "
            f"(~{FIT_ID_BYTES:,} bytes per subject or item), over the memory budget of "
            f"{size(budget)}; responses already stream from the store, parameters cannot: raise "
            f"--memory-budget if the machine has the memory, or fit a subset of the items")


def _store_stats(store: Store, source: BlockSource) -> dict[str, np.ndarray]:
    """``response_stats`` without a dense matrix: Dask reductions or COO counts."""
    if isinstance(source, InMemorySource):
        return response_stats(source.responses)
    if store.layout == "sparse":
        n_s, w_s = np.zeros(store.num_subjects, np.int64), np.zeros(store.num_subjects)
        n_i, w_i = np.zeros(store.num_items, np.int64), np.zeros(store.num_items)
        step = source.batch_size
        for start in range(0, source.length, step):  # a batch at a time: no dense matrix
            s, i, v = (np.asarray(a[start:start + step]) for a in source.arrays)
            seen = v >= 0
            s, i, v = s[seen], i[seen], v[seen].astype(np.float64)
            n_s += np.bincount(s, minlength=store.num_subjects)
            w_s += np.bincount(s, v, minlength=store.num_subjects)
            n_i += np.bincount(i, minlength=store.num_items)
            w_i += np.bincount(i, v, minlength=store.num_items)
    else:
        y = store.responses
        observed = y >= 0
        import dask
        import dask.array as da

        values = da.where(observed, y, 0).astype(np.float64)
        n_s, n_i, w_s, w_i = dask.compute(observed.sum(axis=1), observed.sum(axis=0),
                                          values.sum(axis=1), values.sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"subject_n": np.asarray(n_s), "subject_mean": w_s / n_s,
                "item_n": np.asarray(n_i), "item_mean": w_i / n_i}


def response_stats(y: np.ndarray) -> dict[str, np.ndarray]:
    """Observed counts and mean responses per subject (rows) and item (columns)."""
    t = tally(y)  # one threaded pass; -1 (int8) and NaN (float32) are missing
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"subject_n": t.row_n, "subject_mean": t.row_sum / t.row_n,
                "item_n": t.col_n, "item_mean": t.col_sum / t.col_n}


def _ids(values) -> np.ndarray:
    return np.array([str(v) for v in np.asarray(values).tolist()], dtype=object)


def _array_ids(n: int) -> np.ndarray:
    return np.array([str(i) for i in range(n)], dtype=object)


def _matrix(data) -> tuple[np.ndarray, str, np.ndarray, np.ndarray]:
    """``(responses, kind, subject ids, item ids)`` of an in-memory matrix. A pandas
    DataFrame's index and columns name the subjects and items (its ``<NA>`` cells are
    missing); an array's rows and columns are numbered from 0."""
    if _is_dataframe(data):
        from pandas.api.types import is_bool_dtype, is_integer_dtype, is_numeric_dtype

        from engine.data.formats.wide import ID_NAMES

        for c, dtype in zip(data.columns, data.dtypes):
            if not (is_numeric_dtype(dtype) or is_bool_dtype(dtype)):
                raise DataFormatError(
                    f"DataFrame column {c!r} ({dtype}) holds no numbers; convert it (e.g. "
                    f"df[{c!r}].astype(float)), or, if it holds the subject ids, make it the "
                    f"index: df.set_index({c!r})")
        first = data.columns[0] if len(data.columns) else None
        if first is not None and str(first).strip().lower() in ID_NAMES:
            raise DataFormatError(f"DataFrame column {first!r} is named as subject ids; make it "
                                  f"the index: df.set_index({first!r})")
        subjects, items = _ids(data.index), _ids(data.columns)
        for axis, ids in (("index (subjects)", subjects), ("columns (items)", items)):
            seen, twice = set(), None
            for i in ids:
                if i in seen:
                    twice = i
                    break
                seen.add(i)
            if twice is not None:  # after str(): 1 and "1" are one id
                raise DataFormatError(f"DataFrame {axis}: {twice!r} appears more than once; "
                                      f"give each its own id")
        if all(is_integer_dtype(t) or is_bool_dtype(t) for t in data.dtypes):
            # whole numbers, as an int array reads them: -1 (and <NA>) missing, no float copy
            small = all(getattr(t, "itemsize", 8) == 1 for t in data.dtypes)
            values = data.to_numpy(dtype=np.int8 if small else np.int64, na_value=-1)
        else:
            values = data.to_numpy(dtype=np.float64, na_value=np.nan)
        y, kind = as_responses(values)
        return y, kind, subjects, items
    y, kind = as_responses(data)
    return y, kind, _array_ids(y.shape[0]), _array_ids(y.shape[1])


def _require_observed(y: np.ndarray) -> None:
    """A matrix without one observed cell has nothing to fit (ingest refuses its subjects)."""
    observed = (y >= 0) if y.dtype == np.int8 else np.isfinite(y)
    if not observed.any():
        raise DataFormatError(f"responses ({y.shape[0]} x {y.shape[1]}): every cell is missing; "
                              f"there is nothing to fit")


def _is_dataframe(data) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def _prepare(data, settings: FitSettings):
    """Block source, subject ids, item ids, response statistics, provenance and the matrix
    (``None`` when the data is not held in memory) of any input."""
    if isinstance(data, (str, Path)):
        data = open_store(data)
    if isinstance(data, Store):
        source = make_source(data, settings)
        info = {"store": str(data.path), "checksum": data.meta.get("checksum"), "kind": data.kind,
                "layout": data.layout}
        y = source.responses if isinstance(source, InMemorySource) else None
        if y is None and data.boundary is not None:  # streamed or sparse float store
            info["boundary_cells"] = data.boundary
        return source, _ids(data.subjects), _ids(data.items), _store_stats(data, source), info, y
    # int8 with -1 missing (binary), or float32 with NaN missing (unit scores, errors)
    y, kind, subjects, items = _matrix(data)
    source = source_for(y, settings.block_cells)
    info = {"store": None, "checksum": None, "kind": kind}
    return source, subjects, items, response_stats(y), info, y


# Settings that do not change the path of a fit; the pass bounds only decide where it may stop,
# so a resumed fit may be given a larger cap and continue.
_UNFINGERPRINTED = ("progress", "memory_budget", "prefetch", "checkpoint_every", "max_passes",
                    "min_passes")


def _models_reading(kind: str) -> str:
    """The registered models that read ``kind`` responses, for an error message, grouped
    by what each reads a response as (a model of errors reads scores as errors)."""
    from engine.models.registry import models_by_default

    groups: dict[str, list[str]] = {}
    for name, spec in models_by_default().items():
        if kind in READS.get(spec.kind, ()):
            groups.setdefault(spec.kind, []).append(name)
    return "; ".join(f"{', '.join(names)}: each response {KIND_MEANING.get(own, own)}"
                     for own, names in groups.items()) or "none registered"


def resolve_model(model: str, options: dict, y: np.ndarray | None, kind: str | None = None,
                  shape: tuple[int, int] | None = None):
    """Build ``model`` for the data ``y``: check its response kind, let it adapt to the data.

    A model may ask for options the data calls for (``ModelSpec.adapt``), e.g. zero/one
    inflation when unit scores hit 0 or 1 exactly; the returned options record them. ``y`` is
    ``None`` for data not held in memory (streamed or sparse stores): then ``kind`` and ``shape``
    must be given and the model is not adapted.

    Returns
    -------
    (spec, options) : the model and the full options that rebuild it.

    Raises
    ------
    ModelError : the model reads another response kind, or its constants do not fit.
    """
    spec = get_model(model, **options)
    kind = kind or detect_kind(y)
    if kind not in READS.get(spec.kind, (spec.kind,)):
        raise ModelError(f"model {model!r} reads {spec.kind} responses but the data is {kind}; "
                         f"choose a model for {kind} responses ({_models_reading(kind)})"
                         + ("; if the data should be 0/1, `irt-engine ingest --kind binary` "
                            "names the first cell that is not" if spec.kind == "binary" else ""))
    if spec.adapt is not None and y is not None:
        updates = spec.adapt(y)
        if updates:
            options = {**options, **updates}
            spec = get_model(model, **options)
    spec.constant_values(*(shape or y.shape))  # a Q-matrix of the wrong size fails here, not in the fit
    return spec, options


def _resolve_streamed(model: str, options: dict, y, info: dict, shape, cells: dict | None):
    """``resolve_model``; for a float store not held in memory, the model adapts to a probe
    holding the store's exact boundary values (recorded at ingest), so a streamed or sparse
    fit chooses the same inflation as an in-memory one."""
    if cells is None:
        return resolve_model(model, options, y, info.get("kind"), shape)
    probe = np.array([[0.0] * (cells["zeros"] > 0) + [1.0] * (cells["ones"] > 0) + [0.5]],
                     np.float32)
    try:
        return resolve_model(model, options, probe, info.get("kind"), shape)
    except DataFormatError:
        found = "; ".join(f"{cells[k + 's']} response(s) equal {v} exactly (first at row "
                          f"{cells['first_' + k][0]}, column {cells['first_' + k][1]})"
                          for k, v in (("zero", 0), ("one", 1)) if cells[k + "s"])
        raise DataFormatError(f"{info['store']}: {found}; model {model!r} with options "
                              f"{options} does not fit exact boundary values: use "
                              f"inflation='auto'; values are never clipped") from None


def fit(data, model: str = "2pl", settings: FitSettings = FitSettings(), *, prior: str | None = None,
        signed_discrimination: bool = False, init: GuideState | None = None,
        frozen: frozenset = frozenset(), progress_fn=None, model_options: dict | None = None,
        checkpoint_dir: str | Path | None = None, resume: bool = False,
        on_checkpoint=None) -> FitResult:
    """Fit a named IRT model by variational inference.

    Parameters
    ----------
    data : a ``Store``, a store path, an int ``(subjects, items)`` array with -1 missing, or a
        float array with NaN missing (unit scores or non-negative errors); a pandas
        DataFrame's index and columns name the subjects and items (``<NA>`` is missing).
    model : a name from ``engine.models.MODELS`` (``1pl``, ``2pl``, ``beta``, ``mirt-comp`` ...).
    prior : ``population``, ``vague`` or ``hierarchical``; None (default): the model's own
        (``engine.models.default_prior``: population for 1PL-4PL and feas, vague otherwise).
    init, frozen : start from a guide and hold the named blocks fixed at it.
    model_options : further builder keywords (``dims``, ``q_matrix``, ``inflation`` ...).
    checkpoint_dir : save the fit's progress there every ``settings.checkpoint_every`` passes.
    resume : continue from the checkpoint in ``checkpoint_dir`` when there is one; the
        result equals an uninterrupted fit with the same seed.
    on_checkpoint : called with ``checkpoint_dir`` after each checkpoint is written whole.

    A store larger than ``settings.memory_budget`` is streamed tile by tile; a sparse
    store is fitted from its observations. All sources run the same step.

    Returns
    -------
    FitResult with ``extra`` holding ids, response statistics and data provenance.

    Examples
    --------
    >>> res = fit(responses, model="2pl", settings=FitSettings(seed=0))  # doctest: +SKIP
    >>> res.means()["ability"]  # doctest: +SKIP
    """
    if not isinstance(settings, FitSettings):  # a dict of options failed later, unnamed
        raise SettingsError(f"settings: pass engine.FitSettings(...), got {type(settings).__name__}")
    prior = resolve_prior(model, prior)
    settings = settings.replace(max_block_cells=settings.block_cells)  # fit.json: the one used
    options = {"prior": prior, "signed_discrimination": signed_discrimination, **(model_options or {})}
    source, subjects, items, stats, info, y = _prepare(data, settings)
    if not frozen and y is not None:  # (a frozen refit scores sheets, answered or not)
        _require_observed(y)
    shape = (source.num_subjects, source.num_items)
    # options go to fit.json and rebuild the model on load: arrays become lists
    options = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in options.items()}
    cells = info.pop("boundary_cells", None)
    if cells is not None:
        info["boundary"] = {"zeros": cells["zeros"], "ones": cells["ones"]}
    spec, options = _resolve_streamed(model, options, y, info, shape, cells)
    info = {**info, "kind": info.get("kind") or detect_kind(y)}
    if info["kind"] != "binary" and y is not None:
        info["boundary"] = boundary_counts(y)  # exact 0 / 1 cells, fitted by inflation
    factor = choose_ability_factor(spec, y, settings.ability_factor, settings.quadrature_max_items,
                                   max_cells=settings.quadrature_max_cells,
                                   frozen=bool(frozen), init=init is not None,
                                   variational=settings.optimizer != "auto" or settings.mc_draws > 0)
    constant = _constant_items(y, stats, info["kind"], spec, frozen)
    if constant.any():  # set aside: they carry no ranking information, only Monte Carlo noise
        y_fit = y.copy()
        y_fit[:, constant] = -1
        source = source_for(y_fit, settings.block_cells)
        info["constant_items"] = int(constant.sum())
    if init is None and spec.initial is not None and y is not None:  # a model-declared start
        init = GuideState(spec.initial(y), {})
    if init is not None:
        base = init_guide(spec, *shape)
        init = GuideState({**base.loc, **init.loc}, {**base.log_scale, **init.log_scale})
    checkpointer = None
    if checkpoint_dir is not None:
        kept = {k: v for k, v in settings.to_dict().items() if k not in _UNFINGERPRINTED}
        fingerprint = {"model": model, "model_options": options, "settings": kept,
                       "frozen": sorted(frozen), "shape": list(shape),
                       "checksum": info.get("checksum"), "init": init is not None}
        checkpointer = Checkpointer(Path(checkpoint_dir), settings.checkpoint_every, fingerprint,
                                    on_saved=on_checkpoint)
    use_compilation_cache()  # IRT_ENGINE_COMPILATION_CACHE=0 turns it off
    if (factor["method"] == "quadrature" and settings.ability_factor == "auto"
            and shape[0] < settings.nuts_first_subjects):  # each item seen by few subjects
        why = (f"{shape[0]} subjects, fewer than nuts_first_subjects "
               f"({settings.nuts_first_subjects})")
        with count_compiles() as compiles:
            sampled = _nuts_instead(spec, y, stats, info, settings, subjects, items,
                                     f"{why}; sampling the posterior with NUTS")
        if sampled is not None:
            result = sampled
            result.extra["compile"] = compiles.to_dict()
            factor = factor | {"method": "nuts", "nuts_first": why}
    if factor["method"] == "quadrature":  # abilities integrated out (engine.infer.marginal)
        with count_compiles() as compiles:
            aside = (np.flatnonzero(constant), y[:, constant]) if constant.any() else None
            result = fit_marginal_result(spec, y_fit if constant.any() else y, settings,
                                         aside=aside, progress_fn=progress_fn)
        result.extra["compile"] = compiles.to_dict()
        if not result.converged and settings.ability_factor == "auto":
            # e.g. 2PL on 19 classifiers x 501 OpenML instances: the objective peaks near pass
            # 25, then makes no progress (fit_marginal stops there); the mean-field fit converges
            diverged = result.extra["quadrature"].get("diverged")
            why = (f"no progress from iteration {diverged['last_progress_pass']} on, stopped "
                   f"at {diverged['at_pass']}" if diverged else f"{result.num_passes} iterations")
            sampler = result.extra["quadrature"]["item_moments"].get("sampler") or {}
            if "started_at" in sampler:  # sampled from its best or last pass: not kept
                why += f"; sampled from there, not kept: {sampler.get('because', 'not mixed')}"
            sampled = _nuts_instead(spec, y, stats, info, settings, subjects, items,
                                     f"the quadrature fit did not converge ({why}); "
                                     "sampling the posterior with NUTS instead")
            if sampled is not None:  # small enough to sample the exact posterior instead
                result, d = sampled, sampled.extra["diagnostics"]
                why += (f"; NUTS sampled the posterior instead ({d['num_chains']} chains x "
                        f"{d['num_samples']} draws, R-hat {d['rhat_max']:.3f}"
                        + ("" if result.converged else f" > {d['max_rhat']}: not converged")
                        + (", sampled again from the start with the items standardised"
                           if d["coordinates"].get("restarted_from") else "") + ")")
            else:
                why += "; the mean-field fit was run instead"
            factor = factor | {"method": "nuts" if sampled is not None else "gaussian",
                               "quadrature_not_converged": why,
                               "quadrature_wall_s": round(compiles.wall_s, 3)}
    if factor["method"] == "gaussian":  # fit_source counts its own compilation
        result = fit_source(spec, source, settings, init=init, frozen=frozen,
                            progress_fn=progress_fn, checkpointer=checkpointer, resume=resume)
        if y is not None:  # identical sheets: one posterior, whatever the skills (the subject
            # blocks not held fixed: `score` freezes the items and reads new sheets alike)
            result.guide = pool_identical_rows(spec, result.guide, y, frozen=frozen)
    result.extra["ability_factor"] = factor
    result.extra.update(
        model=model, model_options=options, subjects=subjects, items=items,
        stats=stats, data=info,
    )
    if y is not None and not frozen:  # the subjects' sheets, for score to find one it has read
        result.extra["sheet_digests"] = sheet_digests(y, info["kind"])
    return result


def fit_nuts(data, model: str = "2pl", settings=None, *, prior: str | None = None,
             signed_discrimination: bool = False, model_options: dict | None = None) -> FitResult:
    """Sample a named IRT model's exact posterior with NUTS (the variational fit's reference).

    The same data and model resolution as :func:`fit`; items every subject answered alike
    are sampled with their data under pooled priors, set aside as :func:`fit` sets them
    aside otherwise (:func:`nuts_responses`); ``settings``
    is an :class:`engine.infer.nuts.NutsSettings`. The result carries the constrained draws
    (``FitResult.draws``: subjects with identical sheets pooled, as the tables read them),
    the ArviZ InferenceData of the draws as sampled (``extra["idata"]``: those subjects drawn
    apart, as the R-hat / ESS diagnostics read them), and :func:`engine.run.save_run`
    writes it like a variational fit.

    Raises
    ------
    SettingsError : the matrix needs more memory than the budget (NUTS holds it whole).
    ModelError : the model has no continuous parameters, or reads another response kind.
    """
    from engine.infer.nuts import NutsSettings, check_nuts_memory

    use_compilation_cache()
    settings = settings or NutsSettings()
    prior = resolve_prior(model, prior)
    options = {"prior": prior, "signed_discrimination": signed_discrimination, **(model_options or {})}
    options = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in options.items()}
    if isinstance(data, (str, Path)):
        data = open_store(data)
    shape = (data.num_subjects, data.num_items) if isinstance(data, Store) else np.shape(data)
    budget = settings.memory_budget or default_memory_budget()
    check_nuts_memory(get_model(model, **options), *shape, settings, budget)  # before reading
    y, subjects, items, info = load_responses(data)
    _require_observed(y)
    spec, options = resolve_model(model, options, y, info.get("kind"))
    if info["kind"] != "binary":
        info["boundary"] = boundary_counts(y)
    result = _sample_nuts(spec, y, response_stats(y), info, settings, subjects, items)
    result.extra.update(model=model, model_options=options,
                        sheet_digests=sheet_digests(y, info["kind"]))
    return result


def _sample_nuts(spec, y, stats: dict, info: dict, settings, subjects, items) -> FitResult:
    """NUTS on responses ``y`` held in memory (:func:`fit_nuts`' sampling, and ``auto``'s
    fallback where the quadrature fit does not converge); ``info`` gains the count of items
    set aside (fixed vague priors only: :func:`nuts_responses`)."""
    from engine.infer.nuts import nuts_fit_result

    y_fit = nuts_responses(y, stats, info["kind"], spec)
    if y_fit is not y:  # counted from the items' statistics, not another pass over y
        info["constant_items"] = int(_constant_items(y, stats, info["kind"], spec,
                                                     frozenset()).sum())
    result = nuts_fit_result(spec, y_fit, settings, subjects=subjects, items=items)
    result.extra.update(subjects=subjects, items=items, stats=stats, data=info)
    return result


def _nuts_instead(spec, y, stats: dict, info: dict, settings: FitSettings, subjects,
                   items, why: str) -> FitResult | None:
    """NUTS in ``auto``'s place, where the quadrature fit ends unconverged or the board has
    fewer than ``settings.nuts_first_subjects`` subjects: at NUTS's default settings (the
    seed and memory budget the fit's) where the matrix has at most
    ``settings.nuts_fallback_max_cells`` observed cells and NUTS fits the memory budget;
    ``None`` otherwise. On the 18-subject NLU rte leaderboard the mean-field fit's
    intervals were 0.46-0.77 of NUTS's sds (BENCHMARKS.md). With ``settings.progress`` a
    line on stderr (``why``, then the sampler's size) says so before the sampler starts: it
    runs as one program (20-160 s on the small leaderboards measured) and shows nothing
    while it runs."""
    from engine.infer.nuts import NutsSettings, nuts_memory_bytes

    observed = int(stats["item_n"].sum())
    if y is None or observed > settings.nuts_fallback_max_cells:
        return None
    # once more as many draws where an R-hat is over 1.01 (NLU mutual 1.012 at 4 x 1,000,
    # 1.003 at 4 x 2,000)
    nuts = NutsSettings(seed=settings.seed, memory_budget=settings.memory_budget, extend=1)
    budget = settings.memory_budget or default_memory_budget()
    if nuts_memory_bytes(spec, *y.shape, nuts) > budget:
        return None
    if settings.progress:
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):  # clear of a progress bar
            print(f"{why}: {nuts.num_chains} chains x ({nuts.num_warmup} warm-up + "
                  f"{nuts.num_samples} draws) over {observed:,} cells ({nuts.num_samples} "
                  f"more a chain where an R-hat exceeds {nuts.max_rhat}; from the start with "
                  f"the items standardised where they are mostly their pools' prior), no "
                  f"progress shown while it runs", file=sys.stderr, flush=True)
    return _sample_nuts(spec, y, stats, dict(info), nuts, subjects, items)


def _constant_items(y, stats: dict, kind: str, spec, frozen) -> np.ndarray:
    """Binary items every observed subject answered the same way, ``(N,)`` bool, read from
    ``y``'s :func:`response_stats` (an item's mean is exactly 0 or 1 just when it is constant).

    Their likelihood only pushes the item's own difficulty towards infinity; under a vague
    prior its factor stays nearly as wide as the prior, and its draws feed pure noise into
    every ability step (a 10-subject fit with hundreds of such items never settled). Such
    items are fitted as unobserved (prior only), the usual treatment of extreme items in IRT
    software. Not when item blocks are frozen (scoring: their values are known, so a
    constant column is informative), nor for data not held in memory.

    Under pooled item priors the quadrature fit puts them back after its mode search (which
    they would send to infinity): each is read under the pool's posterior with them in it
    (:func:`engine.infer.marginal._set_aside_posteriors`), and where the items' posterior is
    drawn they are integrated out of every importance draw or sampled with their answers,
    so the pool, the other items and the abilities see them as in the exact posterior
    (NUTS, which samples them with their data under pooled priors: :func:`nuts_responses`).
    """
    if y is None or kind != "binary" or any(p.owner == "item" and p.name in frozen for p in spec.params):
        return np.zeros(0 if y is None else y.shape[1], bool)
    mean = stats["item_mean"]
    return (stats["item_n"] > 0) & ((mean == 0) | (mean == 1))


def nuts_responses(y: np.ndarray, stats: dict, kind: str, spec) -> np.ndarray:
    """The responses NUTS samples: ``y`` itself under pooled item priors (every item with its
    data: the model's exact posterior, in which items every subject answered alike widen
    the pool they are drawn from), else a copy with such items marked missing, as
    :func:`fit` fits them (under fixed vague priors their values would run far out).
    Simulation-based calibration of NUTS under the population priors failed on those
    items while it set them aside (1PL 30 x 20: chi-square 279 over 9 df)."""
    pooled = any(p.owner == "item" and p.prior.references() for p in spec.params)
    constant = _constant_items(y, stats, kind, spec, frozenset())
    if pooled or not constant.any():
        return y
    out = y.copy()
    out[:, constant] = -1
    return out


def constant_columns(y: np.ndarray) -> np.ndarray:
    """``(..., N)`` bool: binary columns (items) of ``y`` (``(..., S, N)``, -1 missing) whose
    observed responses are all 0 or all 1; leading axes are separate matrices (trials)."""
    observed = (y >= 0).sum(axis=-2)
    ones = (y == 1).sum(axis=-2)
    return (observed > 0) & ((ones == 0) | (ones == observed))


def set_aside_constant(ys: np.ndarray) -> np.ndarray:
    """A copy of binary matrices ``ys`` (``(..., S, N)``) with each matrix's constant items
    marked missing, as :func:`fit` fits them (prior only)."""
    out = np.array(ys, copy=True)
    const = constant_columns(out)
    out[np.broadcast_to(const[..., None, :], out.shape)] = -1
    return out


def load_responses(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """``(responses, subject ids, item ids, provenance)`` of a store, store path or array.

    The whole matrix is read into memory (a sparse store is densified): for data that fits.
    """
    if isinstance(data, (str, Path)):
        data = open_store(data)
    if isinstance(data, Store):
        info = {"store": str(data.path), "checksum": data.meta.get("checksum"), "kind": data.kind}
        return data.load(), _ids(data.subjects), _ids(data.items), info
    y, kind, subjects, items = _matrix(data)
    return y, subjects, items, {"store": None, "checksum": None, "kind": kind}
