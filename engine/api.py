"""The library API the CLI is thin over: fit a model to a store, an array or a path."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.data.blocks import InMemorySource
from engine.data.store import Store, open_store
from engine.errors import DataFormatError
from engine.infer.fit import FitResult, fit_source
from engine.infer.guide import GuideState, init_guide
from engine.infer.settings import FitSettings
from engine.models.registry import get_model

__all__ = ["fit", "response_stats", "load_responses"]


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


def _as_matrix(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Responses, subject ids, item ids and data provenance from any accepted input."""
    if isinstance(data, (str, Path)):
        data = open_store(data)
    if isinstance(data, Store):
        y = np.asarray(data.responses.compute())  # read through Dask
        info = {"store": str(data.path), "checksum": data.meta.get("checksum"), "kind": data.kind}
        ids = lambda a: np.array([str(v) for v in np.asarray(a).tolist()], dtype=object)
        return y, ids(data.subjects), ids(data.items), info
    y = np.asarray(data)
    if y.ndim != 2:
        raise DataFormatError(f"responses must be a 2-D subjects x items array, got shape {y.shape}")
    if not np.isin(np.unique(y), (-1, 0, 1)).all():
        raise DataFormatError("binary responses must be 0, 1 or -1 (missing); "
                              f"found {sorted(set(np.unique(y).tolist()) - {-1, 0, 1})[:5]}")
    ids = lambda n: np.array([str(i) for i in range(n)], dtype=object)
    return y.astype(np.int8), ids(y.shape[0]), ids(y.shape[1]), {"store": None, "checksum": None}


def fit(data, model: str = "2pl", settings: FitSettings = FitSettings(), *, prior: str = "vague",
        signed_discrimination: bool = False, init: GuideState | None = None,
        frozen: frozenset = frozenset(), progress_fn=None) -> FitResult:
    """Fit a named IRT model by variational inference.

    Parameters
    ----------
    data : a ``Store``, a store path, or an int8 ``(subjects, items)`` array with -1 missing.
    model : a name from ``engine.models.MODELS`` (``1pl``, ``2pl``, ``3pl``, ``4pl``, ``feas``).
    prior : ``vague`` or ``hierarchical`` (seed 003).
    init, frozen : start from a guide and hold the named blocks fixed at it.

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
    y, subjects, items, info = _as_matrix(data)
    source = InMemorySource(y, max_block_cells=settings.max_block_cells)
    if init is not None:
        base = init_guide(spec, *y.shape)
        init = GuideState({**base.loc, **init.loc}, {**base.log_scale, **init.log_scale})
    result = fit_source(spec, source, settings, init=init, frozen=frozen, progress_fn=progress_fn)
    result.extra.update(
        model=model, model_options=options, subjects=subjects, items=items,
        stats=response_stats(y), data=info,
    )
    return result


def load_responses(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """``(responses, subject ids, item ids, provenance)`` of a store, store path or array."""
    return _as_matrix(data)
