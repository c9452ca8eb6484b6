"""The library API the CLI is thin over: fit a model to a store, an array or a path."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.data.kinds import READS, as_responses, boundary_counts, detect_kind, source_for
from engine.data.store import Store, open_store
from engine.errors import ModelError
from engine.infer.fit import FitResult, fit_source
from engine.infer.guide import GuideState, init_guide
from engine.infer.settings import FitSettings
from engine.models.registry import get_model

__all__ = ["fit", "response_stats", "resolve_model", "load_responses"]


def response_stats(y: np.ndarray) -> dict[str, np.ndarray]:
    """Observed counts and mean responses per subject (rows) and item (columns)."""
    observed = y >= 0  # False for -1 (int8) and NaN (float32)
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
    # int8 with -1 missing (binary), or float32 with NaN missing (unit scores, errors)
    y, kind = as_responses(data)
    ids = lambda n: np.array([str(i) for i in range(n)], dtype=object)
    return y, ids(y.shape[0]), ids(y.shape[1]), {"store": None, "checksum": None, "kind": kind}


def resolve_model(model: str, options: dict, y: np.ndarray, kind: str | None = None):
    """Build ``model`` for the data ``y``: check its response kind, let it adapt to the data.

    A model may ask for options the data calls for (``ModelSpec.adapt``), e.g. zero/one
    inflation when unit scores hit 0 or 1 exactly; the returned options record them.

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
                         f"choose a model for {kind} responses")
    if spec.adapt is not None:
        updates = spec.adapt(y)
        if updates:
            options = {**options, **updates}
            spec = get_model(model, **options)
    spec.constant_values(*y.shape)  # a Q-matrix of the wrong size fails here, not in the fit
    return spec, options


def fit(data, model: str = "2pl", settings: FitSettings = FitSettings(), *, prior: str = "vague",
        signed_discrimination: bool = False, init: GuideState | None = None,
        frozen: frozenset = frozenset(), progress_fn=None,
        model_options: dict | None = None) -> FitResult:
    """Fit a named IRT model by variational inference.

    Parameters
    ----------
    data : a ``Store``, a store path, an int ``(subjects, items)`` array with -1 missing, or a
        float array with NaN missing (unit scores or non-negative errors).
    model : a name from ``engine.models.MODELS`` (``1pl``, ``2pl``, ``beta``, ``mirt-comp`` ...).
    prior : ``vague`` or ``hierarchical`` (seed 003).
    init, frozen : start from a guide and hold the named blocks fixed at it.
    model_options : further builder keywords (``dims``, ``q_matrix``, ``inflation`` ...).

    Returns
    -------
    FitResult with ``extra`` holding ids, response statistics and data provenance.

    Examples
    --------
    >>> res = fit(responses, model="2pl", settings=FitSettings(seed=0))  # doctest: +SKIP
    >>> res.means()["ability"]  # doctest: +SKIP
    """
    options = {"prior": prior, "signed_discrimination": signed_discrimination, **(model_options or {})}
    y, subjects, items, info = _as_matrix(data)
    # options go to fit.json and rebuild the model on load: arrays become lists
    options = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in options.items()}
    spec, options = resolve_model(model, options, y, info.get("kind"))
    info = {**info, "kind": info.get("kind") or detect_kind(y)}
    if info["kind"] != "binary":
        info["boundary"] = boundary_counts(y)  # exact 0 / 1 cells, fitted by inflation
    source = source_for(y, settings.max_block_cells)
    if init is None and spec.initial is not None:  # a model-declared, data-driven start
        init = GuideState(spec.initial(y), {})
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
