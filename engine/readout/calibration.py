"""Calibration read-outs (seed 004 section 3.1 and appendix A.3).

Given each subject's confidence on each item (its maximum softmax probability), a
matrix of the responses' shape and ids:

* ``overconfidence[s, i] = P_irt(y = 1) - confidence`` (seed 004 eq. 3): the fitted
  model's probability of a correct response minus the subject's own confidence.
  Negative values mean the subject claims more than the model grants it; values far
  from zero on an item point at a label error.
* Expected calibration error per subject, before (raw confidences against the observed
  responses) and after the joint response-and-confidence model of A.3:
  ``y ~ Bernoulli(sigmoid(theta_s - b_i))`` and ``c ~ Beta(phi m, phi (1 - m))`` with
  ``m = sigmoid(gamma_s (theta_s - b_i))``. A subject's ``gamma_s`` is its confidence
  temperature (``> 1``: overconfident); its calibrated confidence is
  ``sigmoid(logit(c) / gamma_s)``, which needs no label. The joint model is fitted by
  maximum a posteriori (scipy's L-BFGS-B on one jitted objective and gradient).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jax.scipy.special import gammaln
from scipy.optimize import minimize

from engine.data.formats.validate import cell_text, read_header, where_row
from engine.errors import DataFormatError
from engine.host import to_device

__all__ = ["load_confidences", "overconfidence", "expected_calibration_error", "fit_confidence_model",
           "calibrated_confidence", "calibration_report"]

_CLIP = 1e-4  # confidences of exactly 0 or 1 (rounded softmax) are moved inside (0, 1)


def load_confidences(path: str | Path, subjects, items) -> np.ndarray:
    """Read a wide confidence table aligned to ``subjects`` x ``items`` (NaN = missing).

    The file (CSV or Parquet) has one row per subject: its first column holds the
    subject ids, the others are named by item id and hold confidences in [0, 1] or are
    empty. Rows and columns may come in any order; every id must be a run id.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such confidence file; give a wide CSV or Parquet "
                              f"table (subject column, then one column per item)")
    try:  # CSV cells as text: ids as written ("01" stays "01"; an empty id stays empty)
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, dtype=object)
    except Exception as err:
        raise DataFormatError(f"{path}: cannot read as {'Parquet' if path.suffix == '.parquet' else 'CSV'} "
                              f"({err})") from err
    if df.shape[1] < 2:
        raise DataFormatError(f"{path}: needs a subject column and at least one item column")
    header = [str(c) for c in read_header(path)]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:  # pandas renames a repeated CSV column "V 1" to "V 1.1"
        raise DataFormatError(f"{path}: column(s) {repeated[:5]} appear more than once in the "
                              f"header; give each item one column")
    missing_id = np.flatnonzero(pd.isna(df.iloc[:, 0]).to_numpy())
    if missing_id.size:
        raise DataFormatError(f"{where_row(path, int(missing_id[0]))}, column {df.columns[0]!r}: no "
                              f"subject id ({missing_id.size} row(s)); give every row its subject")
    ids = df.iloc[:, 0].astype(str).to_numpy()
    s_index = {str(s): k for k, s in enumerate(subjects)}
    i_index = {str(i): k for k, i in enumerate(items)}
    bad_rows = [(r, s) for r, s in enumerate(ids) if s not in s_index]
    if bad_rows:
        r, s = bad_rows[0]
        raise DataFormatError(f"{where_row(path, r)}, column {df.columns[0]!r}: subject {s!r} is "
                              f"not in the run ({len(bad_rows)} unknown); use the run's subject ids")
    if len(set(ids)) != len(ids):
        second = int(np.flatnonzero(pd.Series(ids).duplicated().to_numpy())[0])
        first = int(np.flatnonzero(ids == ids[second])[0])
        raise DataFormatError(f"{where_row(path, second)}: subject {ids[second]!r} appears twice "
                              f"(first at {where_row(path, first).removeprefix(f'{path} ')}); "
                              "give one row per subject")
    cols = [str(c) for c in df.columns[1:]]
    unknown = [c for c in cols if c not in i_index]
    if unknown:
        raise DataFormatError(f"{path} column(s) {unknown[:5]}: not items of the run "
                              f"({len(unknown)} unknown); name columns by the run's item ids")
    values = df.iloc[:, 1:].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    raw = df.iloc[:, 1:].to_numpy()
    bad = (np.isnan(values) & pd.notna(raw)) | (values < 0) | (values > 1)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        shown = raw[r, c] if isinstance(raw[r, c], str) and np.isfinite(values[r, c]) else \
            cell_text(raw[r, c])  # a CSV number as written, text quoted
        raise DataFormatError(f"{where_row(path, r)}, column {cols[c]!r}: got {shown}; expected "
                              f"a confidence in [0, 1] or empty")
    if not np.isfinite(values).any():
        raise DataFormatError(f"{path}: holds no confidences ({len(df)} row(s), every cell empty); "
                              f"give confidences in [0, 1]")
    out = np.full((len(s_index), len(i_index)), np.nan)
    out[np.ix_([s_index[s] for s in ids], [i_index[c] for c in cols])] = values
    return out


def overconfidence(p_correct: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """Per-cell ``P_irt(correct) - confidence`` (NaN where the confidence is missing)."""
    return p_correct - confidence


def expected_calibration_error(prob: np.ndarray, y: np.ndarray, num_bins: int = 10) -> np.ndarray:
    """Per-row ECE: ``sum_b (n_b / n) |accuracy_b - mean confidence_b|`` over equal-width
    bins of ``prob``; cells with a missing response or probability are skipped."""
    ok = (y >= 0) & np.isfinite(prob)
    b = np.clip((np.nan_to_num(prob) * num_bins).astype(int), 0, num_bins - 1)
    n = ok.sum(axis=1)
    err = np.zeros(prob.shape[0])
    for k in range(num_bins):
        m = ok & (b == k)
        nk = m.sum(axis=1)
        acc = np.where(m, y, 0).sum(axis=1)
        conf = np.where(m, prob, 0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            err += np.where(nk > 0, np.abs(acc - conf) / np.maximum(n, 1), 0.0)
    return np.where(n > 0, err, np.nan)


def _neg_log_joint(x, y, c, ym, cm):
    theta, b, log_gamma, log_phi = x["theta"], x["b"], x["log_gamma"], x["log_phi"]
    z = theta[:, None] - b[None, :]
    ll_y = y * jax.nn.log_sigmoid(z) + (1 - y) * jax.nn.log_sigmoid(-z)
    m = jax.nn.sigmoid(jnp.exp(log_gamma)[:, None] * z)
    phi = jnp.exp(log_phi)
    a, bb = phi * m + 1e-6, phi * (1 - m) + 1e-6
    ll_c = gammaln(a + bb) - gammaln(a) - gammaln(bb) + (a - 1) * jnp.log(c) + (bb - 1) * jnp.log1p(-c)
    prior = (0.5 * jnp.sum(theta ** 2) + 0.5 * jnp.sum(b ** 2) / 100.0 + 0.5 * jnp.sum(log_gamma ** 2)
             + 0.5 * (log_phi - jnp.log(10.0)) ** 2 / 4.0)
    return -(jnp.sum(ym * ll_y) + jnp.sum(cm * ll_c)) + prior


def fit_confidence_model(y: np.ndarray, confidence: np.ndarray, *, max_iter: int = 300,
                         tol: float = 1e-6) -> dict[str, np.ndarray]:
    """MAP fit of the joint response-and-confidence model (module docstring).

    Priors: ``theta ~ N(0, 1)``, ``b ~ N(0, 10^2)``, ``log gamma ~ N(0, 1)``,
    ``log phi ~ N(log 10, 2^2)``. Returns ``theta`` (S,), ``difficulty`` (N,), ``gamma``
    (S,), ``phi`` (scalar) and ``converged``.
    """
    S, N = y.shape
    ym = to_device(y >= 0, np.float32)
    cm = to_device(np.isfinite(confidence), np.float32)
    yy = to_device(np.where(y >= 0, y, 0), np.float32)
    cc = to_device(np.clip(np.nan_to_num(confidence, nan=0.5), _CLIP, 1 - _CLIP), np.float32)
    sizes = {"theta": S, "b": N, "log_gamma": S, "log_phi": 1}
    cuts = np.cumsum([0] + list(sizes.values()))

    def unflatten(v):
        d = {k: v[cuts[i]:cuts[i + 1]] for i, k in enumerate(sizes)}
        d["log_phi"] = d["log_phi"][0]
        return d

    objective = jax.jit(jax.value_and_grad(
        lambda v: _neg_log_joint(unflatten(v), yy, cc, ym, cm) / max(S * N, 1)))

    def fun(v):
        value, grad = objective(to_device(v, np.float32))
        return float(value), np.asarray(grad, np.float64)

    start = np.zeros(cuts[-1])
    start[-1] = np.log(10.0)
    res = minimize(fun, start, jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "ftol": tol, "gtol": 1e-7})
    x = unflatten(to_device(res.x, np.float32))
    converged = bool(res.success)
    return {"theta": np.asarray(x["theta"]), "difficulty": np.asarray(x["b"]),
            "gamma": np.exp(np.asarray(x["log_gamma"])), "phi": float(np.exp(x["log_phi"])),
            "converged": converged}


def calibrated_confidence(confidence: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``sigmoid(logit(c) / gamma_s)``: a subject's confidences at its fitted temperature."""
    c = np.clip(confidence, _CLIP, 1 - _CLIP)
    return 1.0 / (1.0 + np.exp(-np.log(c / (1 - c)) / gamma[:, None]))


def calibration_report(p_irt: np.ndarray, y: np.ndarray, confidence: np.ndarray, subjects, items, *,
                       top: int = 10) -> dict[str, pd.DataFrame]:
    """Subject and item tables of overconfidence and calibration.

    Returns ``{"subjects": ..., "items": ..., "extreme_items": ...}``: per subject the mean
    overconfidence, ECE before and after the joint model and its ``gamma``; per item the
    mean overconfidence over subjects; the ``top`` items with the most extreme mean. Every
    column reads the cells holding both a response and a confidence (``n_confidences``);
    a subject without any has NaN, never the prior's ``gamma``.
    """
    over = overconfidence(p_irt, confidence)
    joint = fit_confidence_model(y, confidence)
    after = calibrated_confidence(confidence, joint["gamma"])
    after[~np.isfinite(confidence)] = np.nan
    # every column reads the cells with both a response and a confidence, as the ECEs do
    scored = (y >= 0) & np.isfinite(confidence)
    right = np.where(scored, y, 0)
    n_subject, n_item = scored.sum(1), scored.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row without confidences: NaN
        subj = pd.DataFrame({
            "subject": np.asarray(subjects, dtype=object),
            "n_confidences": n_subject,
            "mean_overconfidence": np.nanmean(np.where(scored, over, np.nan), axis=1),
            "mean_confidence": np.nanmean(np.where(scored, confidence, np.nan), axis=1),
            "accuracy": np.where(n_subject > 0, right.sum(1) / np.maximum(n_subject, 1), np.nan),
            "ece_before": expected_calibration_error(confidence, y),
            "ece_after": expected_calibration_error(after, y),
            "ece_irt": expected_calibration_error(np.where(np.isfinite(confidence), p_irt, np.nan), y),
            # a subject without confidences has only the prior's gamma: not a reading
            "gamma": np.where(n_subject > 0, joint["gamma"], np.nan),
        })
        item = pd.DataFrame({
            "item": np.asarray(items, dtype=object),
            "n_confidences": n_item,
            "mean_overconfidence": np.nanmean(np.where(scored, over, np.nan), axis=0),
            "sd_overconfidence": np.nanstd(np.where(scored, over, np.nan), axis=0),
            "mean_confidence": np.nanmean(np.where(scored, confidence, np.nan), axis=0),
            "mean_response": np.where(n_item > 0, right.sum(0) / np.maximum(n_item, 1), np.nan),
            "joint_difficulty": joint["difficulty"],
        })
    extreme = item.reindex(item["mean_overconfidence"].abs().sort_values(ascending=False).index).head(top)
    return {"subjects": subj, "items": item, "extreme_items": extreme.reset_index(drop=True),
            "joint": joint}
