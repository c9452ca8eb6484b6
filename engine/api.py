"""The library API the CLI is thin over: fit a model to a store, an array or a path."""

from __future__ import annotations

import os
from pathlib import Path

import dask
import dask.array as da
import numpy as np

from engine.data.blocks import BlockSource, InMemorySource
from engine.data.sparse import SparseSource
from engine.data.store import Store, open_store
from engine.data.streaming import StreamingSource
from engine.errors import DataFormatError
from engine.infer.checkpoint import Checkpointer
from engine.infer.fit import FitResult, fit_source
from engine.infer.guide import GuideState, init_guide
from engine.infer.settings import FitSettings
from engine.models.registry import get_model

__all__ = ["fit", "response_stats", "load_responses", "make_source", "default_memory_budget",
           "IN_MEMORY_FACTOR"]

# An in-memory fit holds the matrix about three times over: the host copy, the padded
# device-resident tiles and per-cell temporaries; COO observations take 9 bytes each.
IN_MEMORY_FACTOR = 3
_COO_BYTES = 9


def default_memory_budget() -> int:
    """Half the memory the machine has available now (at least 256 MiB)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return max(256 << 20, available // 2)


def make_source(store: Store, settings: FitSettings) -> BlockSource:
    """The block source for a store under ``settings.memory_budget``.

    Dense stores load into memory when ``IN_MEMORY_FACTOR`` copies fit the budget and
    stream tiles through Dask otherwise; sparse stores give observation batches (loaded,
    or streamed when larger than the budget), never a dense matrix.
    """
    budget = settings.memory_budget or default_memory_budget()
    if store.layout == "sparse":
        in_memory = store.num_observed * _COO_BYTES * IN_MEMORY_FACTOR <= budget
        return SparseSource.from_store(store, settings.max_block_cells, in_memory=in_memory)
    if store.num_subjects * store.num_items * IN_MEMORY_FACTOR <= budget:
        return InMemorySource(np.asarray(store.responses.compute()),  # read through Dask
                              max_block_cells=settings.max_block_cells)
    return StreamingSource.from_store(store, settings.max_block_cells)


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
        values = da.where(observed, y, 0).astype(np.float64)
        n_s, n_i, w_s, w_i = dask.compute(observed.sum(axis=1), observed.sum(axis=0),
                                          values.sum(axis=1), values.sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"subject_n": np.asarray(n_s), "subject_mean": w_s / n_s,
                "item_n": np.asarray(n_i), "item_mean": w_i / n_i}


def response_stats(y: np.ndarray) -> dict[str, np.ndarray]:
    """Observed counts and mean responses per subject (rows) and item (columns)."""
    observed = y >= 0
    values = np.where(observed, y, 0).astype(np.float64)
    n_s, n_i = observed.sum(axis=1), observed.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "subject_n": n_s,
            "subject_mean": values.sum(axis=1) / n_s,
            "item_n": n_i,
            "item_mean": values.sum(axis=0) / n_i,
        }


def _ids(values) -> np.ndarray:
    return np.array([str(v) for v in np.asarray(values).tolist()], dtype=object)


def _check_array(data) -> np.ndarray:
    y = np.asarray(data)
    if y.ndim != 2:
        raise DataFormatError(f"responses must be a 2-D subjects x items array, got shape {y.shape}")
    if not np.isin(np.unique(y), (-1, 0, 1)).all():
        raise DataFormatError("binary responses must be 0, 1 or -1 (missing); "
                              f"found {sorted(set(np.unique(y).tolist()) - {-1, 0, 1})[:5]}")
    return y.astype(np.int8)


def _prepare(data, settings: FitSettings) -> tuple[BlockSource, np.ndarray, np.ndarray, dict, dict]:
    """Block source, subject ids, item ids, response statistics and provenance of any input."""
    if isinstance(data, (str, Path)):
        data = open_store(data)
    if isinstance(data, Store):
        source = make_source(data, settings)
        info = {"store": str(data.path), "checksum": data.meta.get("checksum"), "kind": data.kind,
                "layout": data.layout}
        return source, _ids(data.subjects), _ids(data.items), _store_stats(data, source), info
    y = _check_array(data)
    ids = lambda n: np.array([str(i) for i in range(n)], dtype=object)  # noqa: E731
    source = InMemorySource(y, max_block_cells=settings.max_block_cells)
    return source, ids(y.shape[0]), ids(y.shape[1]), response_stats(y), {"store": None,
                                                                          "checksum": None}


# Settings that do not change a fit's result (or may change on resume).
_UNFINGERPRINTED = ("progress", "memory_budget", "prefetch", "checkpoint_every")


def fit(data, model: str = "2pl", settings: FitSettings = FitSettings(), *, prior: str = "vague",
        signed_discrimination: bool = False, init: GuideState | None = None,
        frozen: frozenset = frozenset(), progress_fn=None, checkpoint_dir: str | Path | None = None,
        resume: bool = False) -> FitResult:
    """Fit a named IRT model by variational inference.

    Parameters
    ----------
    data : a ``Store``, a store path, or an int8 ``(subjects, items)`` array with -1 missing.
    model : a name from ``engine.models.MODELS`` (``1pl``, ``2pl``, ``3pl``, ``4pl``, ``feas``).
    prior : ``vague`` or ``hierarchical`` (seed 003).
    init, frozen : start from a guide and hold the named blocks fixed at it.
    checkpoint_dir : save the fit's progress there every ``settings.checkpoint_every`` passes.
    resume : continue from the checkpoint in ``checkpoint_dir`` when there is one; the
        result equals an uninterrupted fit with the same seed.

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
    options = {"prior": prior, "signed_discrimination": signed_discrimination}
    spec = get_model(model, **options)
    source, subjects, items, stats, info = _prepare(data, settings)
    shape = (source.num_subjects, source.num_items)
    if init is not None:
        base = init_guide(spec, *shape)
        init = GuideState({**base.loc, **init.loc}, {**base.log_scale, **init.log_scale})
    checkpointer = None
    if checkpoint_dir is not None:
        kept = {k: v for k, v in settings.to_dict().items() if k not in _UNFINGERPRINTED}
        fingerprint = {"model": model, "model_options": options, "settings": kept,
                       "frozen": sorted(frozen), "shape": list(shape),
                       "checksum": info.get("checksum"), "init": init is not None}
        checkpointer = Checkpointer(Path(checkpoint_dir), settings.checkpoint_every, fingerprint)
    result = fit_source(spec, source, settings, init=init, frozen=frozen, progress_fn=progress_fn,
                        checkpointer=checkpointer, resume=resume)
    result.extra.update(
        model=model, model_options=options, subjects=subjects, items=items,
        stats=stats, data=info,
    )
    return result


def load_responses(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """``(responses, subject ids, item ids, provenance)`` of a store, store path or array.

    The whole matrix is read into memory (a sparse store is densified): for data that fits.
    """
    if isinstance(data, (str, Path)):
        data = open_store(data)
    if isinstance(data, Store):
        info = {"store": str(data.path), "checksum": data.meta.get("checksum"), "kind": data.kind}
        return data.load(), _ids(data.subjects), _ids(data.items), info
    y = _check_array(data)
    ids = lambda n: np.array([str(i) for i in range(n)], dtype=object)  # noqa: E731
    return y, ids(y.shape[0]), ids(y.shape[1]), {"store": None, "checksum": None}
