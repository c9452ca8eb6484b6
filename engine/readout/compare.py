"""Model comparison on held-out cells (seed 002 section 4.2).

A seeded random share of the observed cells is marked missing, each model is fitted on
the rest through :func:`engine.api.fit`, and the held-out cells are scored by the
posterior predictive distribution: ``log p(y | train) ~= log mean_k p(y | params_k)`` over
joint draws ``params_k`` of the variational posterior (never a plug-in of the means).
Binary data also get accuracy (threshold 0.5 on the predictive ``P(y = 1)``), ROC AUC,
macro F1 (the seed's three classification metrics), the Brier score and the expected
calibration error over ten equal-width probability bins. Held-out binary cells of items whose
training responses are all alike are not scored (every model fits such items as unobserved);
``num_heldout_set_aside`` counts them.

Nothing here branches on a model's name: every prediction is ``spec.loglik`` evaluated
cell by cell at gathered draws, exactly as inference evaluates it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
import pandas as pd
from scipy.special import logsumexp
from scipy.stats import rankdata

from engine.atomic import atomic_write
from engine.errors import ModelError, SettingsError
from engine.infer.guide import GuideState
from engine.infer.pointwise import cell_loglik_draws as heldout_loglik_draws
from engine.infer.settings import FitSettings
from engine.models.registry import MODELS, get_model, resolve_prior
from engine.models.spec import ModelSpec
from engine.readout.calibration import expected_calibration_error
from engine.readout.posterior import draw_posterior

__all__ = ["ModelChoice", "parse_models", "split_holdout", "heldout_loglik_draws",
           "predictive", "roc_auc", "macro_f1", "predictive_metrics", "compare",
           "write_comparison", "format_comparison", "COLUMNS"]

COLUMNS = ("model", "heldout_loglik", "heldout_loglik_per_cell", "accuracy", "roc_auc", "macro_f1",
           "ece", "brier", "elbo", "num_params", "passes", "converged", "fit_method", "wall_s",
           "num_train", "num_heldout", "num_heldout_set_aside", "fit_note")
# the fit's route as the table names it: abilities integrated out, or the mean-field fit
_FIT_METHODS = {"quadrature": "quadrature", "gaussian": "mean-field", "nuts": "nuts"}


@dataclass(frozen=True)
class ModelChoice:
    """One model to compare: its label in the table, registry name and builder options."""

    label: str
    name: str
    options: dict = field(default_factory=dict, hash=False)


def parse_models(text: str | Sequence[str], *,
                 q_matrix: tuple[np.ndarray, Sequence[str]] | None = None) -> list[ModelChoice]:
    """``1pl,2pl,mirt-comp:2,mirt-noncomp:q`` -> model choices.

    A token is a registry name, ``name:D`` for ``D`` skills (``--dims D``), ``name:q`` for
    the skills of ``q_matrix`` (``(q, skill_names)``, ``--q-matrix``) or
    ``name:KEY=VALUE[:KEY=VALUE]`` for builder options (``beta:inflation_owner=item``).
    Each choice is built once here, so a bad token fails before any fit.

    Raises
    ------
    SettingsError : an empty list, a repeated token, a bad ``:D`` suffix or ``:q`` without
        a Q-matrix.
    ModelError : an unknown model name, or options the model does not take.
    """
    tokens = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    if not tokens or any(not t for t in tokens):
        raise SettingsError(f"--models {text!r}: give comma-separated model names, "
                            f"e.g. --models 1pl,2pl,mirt-comp:2")
    if len(set(tokens)) != len(tokens):
        dup = next(t for t in tokens if tokens.count(t) > 1)
        raise SettingsError(f"--models: {dup!r} appears twice; list each model once")
    out = []
    for token in tokens:
        name, _, suffix = token.partition(":")
        if name not in MODELS:
            raise ModelError(f"--models: unknown model {name!r} in {token!r}; choose from "
                             f"{', '.join(MODELS)}")
        options: dict = {}
        if suffix == "q":
            if q_matrix is None:
                raise SettingsError(f"--models: {token!r} asks for the Q-matrix's skills; "
                                    f"pass --q-matrix items_x_skills.csv")
            options = {"q_matrix": np.asarray(q_matrix[0]).tolist(), "skills": list(q_matrix[1])}
        elif "=" in suffix:
            options = _key_values(token, suffix)
        elif suffix:
            if not suffix.isdigit() or int(suffix) < 1:
                raise SettingsError(f"--models: {token!r} has a bad skill count {suffix!r}; write "
                                    f"NAME:D with a whole number D >= 1 (e.g. mirt-comp:2) or NAME:q")
            options = {"dims": int(suffix)}
        get_model(name, **options)  # options the builder does not take fail here
        out.append(ModelChoice(token, name, options))
    return out


def _key_values(token: str, suffix: str) -> dict:
    """``inflation_owner=item:s0=2.5`` -> ``{"inflation_owner": "item", "s0": 2.5}``."""
    out: dict = {}
    for part in suffix.split(":"):
        key, eq, value = part.partition("=")
        if not eq or not key.isidentifier() or not value:
            raise SettingsError(f"--models: {token!r} has a bad option {part!r}; write "
                                f"NAME:KEY=VALUE, e.g. beta:inflation_owner=item")
        out[key] = _literal(value)
    return out


def _literal(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _check_fraction(fraction: float) -> None:
    if not isinstance(fraction, (int, float)) or not math.isfinite(fraction) or not 0.0 < fraction < 1.0:
        raise SettingsError(f"--holdout {fraction!r}: give the held-out share of cells as a "
                            f"number strictly between 0 and 1, e.g. --holdout 0.1")


def split_holdout(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mark a seeded random share of the observed cells missing.

    Returns ``(train, subject_idx, item_idx)``: the training matrix (int8 ``-1`` or float
    ``NaN`` where held out) and the held-out cells' coordinates (row-major order).
    """
    _check_fraction(fraction)
    observed = ~np.isnan(y) if np.issubdtype(y.dtype, np.floating) else y >= 0
    rows, cols = np.nonzero(observed)
    count = int(round(fraction * rows.size))
    if count < 1 or count >= rows.size:
        raise SettingsError(f"--holdout {fraction}: {rows.size} observed cells leave {count} to hold "
                            f"out; choose a share that keeps at least one cell on each side")
    pick = np.sort(np.random.default_rng(seed).choice(rows.size, size=count, replace=False))
    s, i = rows[pick], cols[pick]
    train = y.copy()
    train[s, i] = np.nan if np.issubdtype(y.dtype, np.floating) else -1
    return train, s, i


def predictive(spec: ModelSpec, guide: GuideState, subject_idx: np.ndarray, item_idx: np.ndarray,
               y: np.ndarray, *, num_subjects: int, num_items: int, num_draws: int, rng_key,
               binary: bool, sampled: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Posterior predictive ``log p(y_c | train)`` per held-out cell, and for binary data
    the predictive ``P(y_c = 1)`` (both averaged over the same ``num_draws`` joint draws).

    ``sampled``: a sampler's constrained draws ``(chains, samples, *shape)`` per block
    (``FitResult.draws``: NUTS), of which ``num_draws`` evenly spaced are used instead of
    draws from the guide, whose normal approximation loses their tails."""
    names = tuple(p.name for p in spec.likelihood_params)
    if sampled:
        flat = {k: np.asarray(sampled[k]).reshape((-1,) + np.shape(sampled[k])[2:])
                for k in names}
        total = next(iter(flat.values())).shape[0]
        keep = np.linspace(0, total - 1, min(num_draws, total)).round().astype(int)
        draws, num_draws = {k: v[keep] for k, v in flat.items()}, len(keep)
    else:
        draws = draw_posterior(spec, guide, num_draws, rng_key=rng_key, names=names)
    kw = dict(num_subjects=num_subjects, num_items=num_items)
    ll = heldout_loglik_draws(spec, draws, subject_idx, item_idx, y, **kw)
    log_pred = logsumexp(ll, axis=0) - np.log(num_draws)
    p1 = None
    if binary:
        ll1 = heldout_loglik_draws(spec, draws, subject_idx, item_idx, np.ones(len(y)), **kw)
        p1 = np.exp(logsumexp(ll1, axis=0) - np.log(num_draws))
    return log_pred, p1


def roc_auc(score: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve: the Mann-Whitney ``U`` of the positives' ranks (ties
    counted half) over ``n_pos * n_neg``; NaN when one class is absent."""
    y = np.asarray(y) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(score)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def macro_f1(pred: np.ndarray, y: np.ndarray) -> float:
    """Mean over the two classes of F1 (a class never predicted nor present scores 0)."""
    pred, y = np.asarray(pred, bool), np.asarray(y) > 0.5
    scores = []
    for cls in (True, False):
        tp = np.sum((pred == cls) & (y == cls))
        denom = np.sum(pred == cls) + np.sum(y == cls)
        scores.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def predictive_metrics(log_pred: np.ndarray, y: np.ndarray, p1: np.ndarray | None) -> dict:
    """Held-out scores of one model: total and per-cell log predictive density, and for
    binary responses (``p1`` given) accuracy, ROC AUC, macro F1, Brier score and ECE."""
    out = {"heldout_loglik": float(np.sum(log_pred)),
           "heldout_loglik_per_cell": float(np.mean(log_pred))}
    nan = float("nan")
    if p1 is None:
        return {**out, "accuracy": nan, "roc_auc": nan, "macro_f1": nan, "ece": nan, "brier": nan}
    yb = np.asarray(y) > 0.5
    pred = p1 >= 0.5
    return {**out, "accuracy": float(np.mean(pred == yb)), "roc_auc": roc_auc(p1, yb),
            "macro_f1": macro_f1(pred, yb),
            "ece": float(expected_calibration_error(p1[None, :], yb[None, :].astype(np.int8))[0]),
            "brier": float(np.mean((p1 - yb) ** 2))}


def _num_params(spec: ModelSpec, guide: GuideState) -> int:
    """Entries of every fitted parameter block (hyper-parameters and masked loadings included)."""
    return int(sum(np.size(guide.loc[p.name]) for p in spec.params))


def compare(data, models: str | Sequence[str] | Sequence[ModelChoice], holdout: float = 0.1,
            seed: int = 0, settings: FitSettings = FitSettings(), *, prior: str | None = None,
            num_draws: int = 200, q_matrix: tuple[np.ndarray, Sequence[str]] | None = None,
            progress_fn=None) -> pd.DataFrame:
    """Fit each model on the same training cells and score it on the held-out ones.

    Parameters
    ----------
    data : a store, store path or response array (int8 with -1 missing, or float with NaN).
    models : ``"1pl,2pl,mirt-comp:2"``, a list of such tokens, or ``ModelChoice`` values.
    holdout : share of the observed cells held out, in (0, 1).
    seed : picks the held-out cells and the posterior draws (the fits use ``settings.seed``).
    prior : ``population``, ``vague`` or ``hierarchical`` for every model; None (default):
        each model's own (``engine.models.default_prior``).
    num_draws : joint posterior draws the predictive distribution averages over.
    q_matrix : ``(q, skill_names)`` for ``name:q`` tokens, rows in the data's item order.
    progress_fn : called as ``progress_fn(label, row)`` after each model.

    Returns
    -------
    One row per model (columns ``COLUMNS``), best held-out log-likelihood first;
    ``attrs["settings"]`` records how the comparison was made.

    Raises
    ------
    SettingsError, ModelError : a bad token, holdout share, or a model that cannot read
        the data's response kind (checked before anything is fitted).

    Examples
    --------
    >>> table = compare("nlu.zarr", "1pl,2pl,mirt-comp:2", holdout=0.1, seed=0)  # doctest: +SKIP
    """
    from engine.api import constant_columns, fit, load_responses, resolve_model

    _check_fraction(holdout)
    if num_draws < 1:
        raise SettingsError(f"--draws {num_draws}: need at least one posterior draw")
    if not isinstance(models, str) and models and all(isinstance(m, ModelChoice) for m in models):
        choices = list(models)
    else:
        choices = parse_models(models, q_matrix=q_matrix)
    y, _, _, info = load_responses(data)
    kind = info["kind"]
    priors = {c.label: resolve_prior(c.name, prior) for c in choices}
    for c in choices:  # every model reads this kind and fits this shape, before any fit
        resolve_model(c.name, {"prior": priors[c.label], **c.options}, None, kind, y.shape)
    train, s_idx, i_idx = split_holdout(y, holdout, seed)
    binary = kind == "binary"
    # Items every training response answers alike are fitted as unobserved by every model
    # (engine.fit): no model has anything to predict their held-out cells with, so those
    # cells are not scored (their count is reported), as on a 10-system leaderboard where
    # they were half the held-out cells and every model scored them as coin flips.
    aside = constant_columns(train)[i_idx] if binary else np.zeros(len(i_idx), bool)
    if aside.all():
        raise SettingsError(f"--holdout {holdout}: every held-out cell falls on an item whose "
                            f"training responses are all alike, which no model fits; hold out "
                            f"a larger share")
    set_aside, s_idx, i_idx = int(aside.sum()), s_idx[~aside], i_idx[~aside]
    y_out = y[s_idx, i_idx].astype(np.float64)
    rows = []
    for k, c in enumerate(choices):
        t0 = time.perf_counter()
        res = fit(train, model=c.name, settings=settings, prior=priors[c.label],
                  model_options=c.options)
        wall = time.perf_counter() - t0
        log_pred, p1 = predictive(res.spec, res.guide, s_idx, i_idx, y_out, num_subjects=y.shape[0],
                                  num_items=y.shape[1], num_draws=num_draws,
                                  rng_key=jax.random.fold_in(jax.random.PRNGKey(seed), k),
                                  binary=binary, sampled=res.draws)
        factor = res.extra.get("ability_factor") or {}
        row = {"model": c.label, **predictive_metrics(log_pred, y_out, p1), "elbo": float(res.elbo),
               "num_params": _num_params(res.spec, res.guide), "passes": res.num_passes,
               "converged": bool(res.converged), "fit_method": _FIT_METHODS.get(
                   factor.get("method"), factor.get("method")), "wall_s": wall,
               "num_train": int(res.num_observed), "num_heldout": int(len(y_out)),
               "num_heldout_set_aside": set_aside,
               # a default fit whose quadrature route gave up: the row is the mean-field fit's
               "fit_note": factor.get("quadrature_not_converged", "")}
        rows.append(row)
        if progress_fn is not None:
            progress_fn(c.label, row)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table = table.sort_values("heldout_loglik", ascending=False, kind="stable").reset_index(drop=True)
    table.attrs["settings"] = {
        "models": [c.label for c in choices], "model_options": {c.label: c.options for c in choices},
        "holdout": holdout, "seed": seed, "prior": prior, "priors": priors, "num_draws": num_draws,
        "kind": kind,
        "shape": list(y.shape), "store": info.get("store"), "checksum": info.get("checksum"),
        "fit_settings": replace(settings, progress=False).to_dict()}
    return table


def write_comparison(table: pd.DataFrame, out: str | Path) -> tuple[Path, Path]:
    """Write ``compare.parquet`` and ``compare.json`` (the settings) into ``out``, each
    atomically (a temporary file in the same directory, then a rename)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    parquet, settings = out / "compare.parquet", out / "compare.json"
    atomic_write(parquet, lambda p: pd.DataFrame(table).to_parquet(p, index=False))
    meta = {**table.attrs.get("settings", {}), "ranking": table["model"].tolist()}
    atomic_write(settings, lambda p: p.write_text(json.dumps(meta, indent=2, default=str)))
    return parquet, settings


def format_comparison(table: pd.DataFrame) -> str:
    """The comparison as a fixed-width text table."""
    show = table.drop(columns=[c for c in ("num_train", "num_heldout", "num_heldout_set_aside",
                                           "fit_note") if c in table])
    show = show.dropna(axis=1, how="all")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        return show.to_string(index=False, float_format=lambda v: f"{v:.4g}")
