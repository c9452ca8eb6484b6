"""How many skills does a benchmark measure (seed 000, section 11.4), with shuffles as trials.

Parallel analysis permutes each item's column independently (never rows) many times; the
shuffles run as trials on the runner (Ray by default), each task computing a batch of spectra
through the subject-by-subject Gram matrix. The one-skill fit's residual eigenvalues, tested
against data simulated from that fit, give the lower bound; parallel analysis the upper bound
(``engine.readout.dimensions.suggest_n_factors``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cluster.io import write_json_atomic, write_parquet_atomic
from cluster.resume import check_model_fits, check_or_record, trial_record
from cluster.runner import run_trials, session_for
from cluster.settings import DimensionsSettings, RunnerSettings
from cluster.trials import ShuffleContext, TrialSpec, shuffle_batch, trial_seed
from engine.api import default_memory_budget, fit, load_responses
from engine.errors import SettingsError
from engine.infer.settings import FitSettings
from engine.models.registry import get_model, resolve_prior
from engine.readout.dimensions import (check_residual_model, correlation_eigenvalues,
                                       count_above, dimensions_table,
                                       envelope, fitted_probabilities, residual_eigenvalues,
                                       residual_null_eigenvalues, residual_steps, scree_plot,
                                       suggest_n_factors)

__all__ = ["run_dimensions", "DimensionsOutput", "shuffled_spectra", "check_dimensions_memory",
           "DIMENSIONS_CELL_BYTES"]

# The analysis holds the whole matrix, in float64 several times over (standardized responses,
# the one-skill fit's probabilities, residuals, simulated data sets). Measured: peak RSS over a
# started JAX, 2PL, 4000 x 500 and 8000 x 500: 418 and 564 MB, 73 bytes per added cell.
DIMENSIONS_CELL_BYTES = 80


@dataclass
class DimensionsOutput:
    path: Path
    table: pd.DataFrame
    summary: dict


def check_dimensions_memory(data, memory_budget: int | None = None):
    """Refuse, before any response is read, a store whose matrix is over ``memory_budget``
    (default: the fit's default budget) at ``DIMENSIONS_CELL_BYTES`` per cell; returns
    ``data`` (a path or URL opened as a :class:`Store`).

    Parallel analysis permutes every item's column over all subjects, and the residual
    analysis needs every subject's fitted probabilities, so unlike a fit the analysis does not
    stream.
    """
    from engine.data.formats.validate import size_text as size
    from engine.data.store import Store, open_store

    if isinstance(data, (str, Path)):
        data = open_store(data)
    if not isinstance(data, Store):
        return data  # already in memory
    budget = memory_budget or default_memory_budget()
    cells = data.num_subjects * data.num_items
    need = cells * DIMENSIONS_CELL_BYTES
    if need > budget:
        raise SettingsError(
            f"{data.path}: dimensions holds the whole {data.num_subjects:,} x "
            f"{data.num_items:,} matrix in memory, about {size(need)} "
            f"(~{DIMENSIONS_CELL_BYTES} bytes per cell), over the memory budget of "
            f"{size(budget)}; raise --memory-budget if the machine has the memory, or run it on "
            "a sample of the subjects (the shuffles permute whole columns, so it cannot stream)")
    return data


def shuffled_spectra(rows: pd.DataFrame, k: int) -> np.ndarray:
    """Shuffle rows (shuffle, index, eigenvalue) -> ``(shuffles, k)`` array."""
    wide = rows.pivot(index="shuffle", columns="index", values="eigenvalue").sort_index()
    return wide.reindex(columns=range(1, k + 1)).to_numpy(np.float64)


def run_dimensions(data, out: str | Path, settings: DimensionsSettings = DimensionsSettings(),
                   runner: RunnerSettings = RunnerSettings(), fit_settings: FitSettings = FitSettings(),
                   *, on_batch=None) -> DimensionsOutput:
    """Run (or resume) a dimensionality analysis of ``data`` (a store, path or binary array).

    Writes ``shuffles.parquet`` (one row per shuffle and eigenvalue), ``eigenvalues.parquet``
    (index, observed, residual, envelope_mean, envelope_q95, residual null), ``summary.json``
    (``n_factors`` and the reading behind it) and ``scree.png`` under ``out``.
    """
    out = Path(out)
    seconds = {}
    t0 = time.perf_counter()
    data = check_dimensions_memory(data, fit_settings.memory_budget)
    y, _, _, info = load_responses(data)
    record = trial_record("dimensions", settings, None, y)
    check_model_fits(settings.model, settings.prior, y, info.get("kind"))
    check_residual_model(get_model(settings.model,
                                   prior=resolve_prior(settings.model, settings.prior)))
    check_or_record(out, record, ("shuffles.parquet",), write=False)
    with session_for(runner):  # Ray's processes start before JAX's threads
        check_or_record(out, record, ("shuffles.parquet",))
        k = min(settings.num_eigenvalues, *y.shape)
        observed = correlation_eigenvalues(y, k=k)
        seconds["observed"] = time.perf_counter() - t0

        t = time.perf_counter()
        trials = [TrialSpec(0, i, trial_seed(settings.seed, 0, i))
                  for i in range(settings.shuffles)]
        rows = run_trials(shuffle_batch, ShuffleContext(y, k), trials, out / "shuffles.parquet",
                          runner, desc="shuffles", on_batch=on_batch)
        env_mean, env_q95 = envelope(shuffled_spectra(rows, k))
        seconds["shuffles"] = time.perf_counter() - t

        t = time.perf_counter()
        full = fit(y, settings.model, fit_settings, prior=settings.prior)
        p = fitted_probabilities(full)
        residual = residual_eigenvalues(y, p, k=k)
        seconds["one_skill_fit"] = time.perf_counter() - t

        t = time.perf_counter()
        null_seeds = [trial_seed(settings.seed, 1, i) for i in range(settings.residual_simulations)]
        null = envelope(residual_null_eigenvalues(p, null_seeds, k=k, observed=y >= 0))
        upper = max(count_above(observed, env_q95), 1)
        steps = residual_steps(y, p, null_seeds, max_skills=upper)
        n_factors, reading = suggest_n_factors(observed, residual, env_mean, env_q95,
                                               residual_envelope=null, steps=steps)
        seconds["residual_tests"] = time.perf_counter() - t

    table = dimensions_table(observed, residual, env_mean, env_q95, residual_envelope=null)
    write_parquet_atomic(table, out / "eigenvalues.parquet")
    scree_plot(table, out / "scree.png", n_factors=n_factors)
    summary = {
        "n_factors": int(n_factors), "reading": reading["text"], "details": reading,
        "shape": [int(s) for s in y.shape], "shuffles": settings.shuffles,
        "settings": settings.to_dict(), "runner": runner.to_dict(), "data": info,
        "one_skill_fit": {"model": settings.model, "passes": full.num_passes,
                          "converged": full.converged},
        "seconds": {**seconds, "total": time.perf_counter() - t0},
    }
    write_json_atomic(out / "summary.json", summary)
    return DimensionsOutput(out, table, summary)
