"""Ranking stability (seed 002, section 4.3.1 and appendix D), run as trials.

For each sample size, many trials draw two disjoint item samples, rank subjects on each by IRT
ability (a warm-started refit) and by accuracy, and record Kendall's tau between the samples and
from each sample to the full data. The per-size difference in tau (IRT minus accuracy) gets a
bootstrap interval and a two-sided p-value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cluster.io import write_json_atomic, write_parquet_atomic, write_plot_atomic
from cluster.resume import check_model_fits, check_or_record, trial_record
from cluster.runner import run_trials, session_for
from cluster.settings import RunnerSettings, StabilitySettings
from cluster.trials import (FitContext, StabilityContext, TrialSpec, ability_of, stability_batch,
                            subject_accuracy, trial_fit_settings, trial_seed)
from cluster.columns import StoreColumns, trial_responses
from engine.api import fit
from engine.infer.settings import FitSettings

__all__ = ["run_stability", "summarize_stability", "plot_stability", "StabilityOutput", "plan"]


@dataclass
class StabilityOutput:
    """The paths written and the tables they hold."""

    path: Path
    trials: pd.DataFrame
    summary: pd.DataFrame


def plan(settings: StabilitySettings, num_items: int) -> list[TrialSpec]:
    """Every trial of a stability run: ``trials_per_size`` per size, seeded independently."""
    return [TrialSpec(k, t, trial_seed(settings.seed, k, t))
            for k in settings.resolved_sizes(num_items) for t in range(settings.trials_per_size)]


def _bootstrap_diff(diff: np.ndarray, num: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Percentile interval (5%, 95%) of the mean difference and its two-sided p-value, from
    trials resampled with replacement; the null distribution is the bootstrap centred at zero
    (seed 002, appendix D.2). Under two trials there is no spread to resample (one trial's
    bootstrap is that trial every time, and read p = 0): NaN. The p-value is at least
    ``1 / (num + 1)``."""
    if diff.size < 2:
        return np.nan, np.nan, np.nan
    boot = diff[rng.integers(0, diff.size, (num, diff.size))].mean(axis=1)
    observed = diff.mean()
    # (k + 1) / (B + 1) (Davison & Hinkley 1997, 4.4): the observed difference counts among
    # the resampled ones, so p is never 0 (5 trials had printed 0.000 from 2,000 resamples)
    k = int(np.sum(np.abs(boot - boot.mean()) >= abs(observed)))
    p = (k + 1) / (num + 1)
    lo, hi = np.quantile(boot, [0.05, 0.95])
    return float(lo), float(hi), p


def summarize_stability(trials: pd.DataFrame, bootstrap: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per (size, method): tau means, spreads and 90% bands; plus the per-size
    IRT-minus-accuracy difference in tau between samples with its bootstrap interval and p."""
    rng = np.random.default_rng(seed)
    rows = []
    for size, part in trials.groupby("size", sort=True):
        wide = part.pivot(index="trial", columns="method", values="tau_between")
        diff = (wide["irt"] - wide["accuracy"]).dropna().to_numpy()
        lo, hi, p = _bootstrap_diff(diff, bootstrap, rng)
        for method, m in part.groupby("method", sort=True):
            q = lambda col, a: float(np.nanquantile(m[col], a))
            rows.append({
                "size": int(size), "method": method, "trials": len(m),
                "tau_between_mean": float(m["tau_between"].mean()),
                "tau_between_sd": float(m["tau_between"].std(ddof=1)) if len(m) > 1 else np.nan,
                "tau_between_q05": q("tau_between", 0.05), "tau_between_q95": q("tau_between", 0.95),
                "tau_full_mean": float(m["tau_full"].mean()),
                "tau_full_q05": q("tau_full", 0.05), "tau_full_q95": q("tau_full", 0.95),
                "converged_share": float(m["converged"].mean()),
                "diff_mean": float(diff.mean()) if diff.size else np.nan,
                "diff_q05": lo, "diff_q95": hi, "diff_p_value": p,
            })
    return pd.DataFrame(rows)


def plot_stability(summary: pd.DataFrame, path: Path) -> None:
    """Tau against sample size for both methods with 90% bands (seed 002, figure 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from engine.readout.report import log_size_axis

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    panels = (("tau_between", "sample to sample"), ("tau_full", "sample to full data"))
    labels = {"irt": "IRT ability", "accuracy": "accuracy"}
    for ax, (col, title) in zip(axes, panels):
        for method, m in summary.groupby("method"):
            m = m.sort_values("size")
            ax.plot(m["size"], m[f"{col}_mean"], marker="o", label=labels.get(method, method))
            ax.fill_between(m["size"], m[f"{col}_q05"], m[f"{col}_q95"], alpha=0.2)
        log_size_axis(ax, summary["size"])  # the sizes as ticks
        ax.set_xlabel("item sample size")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Kendall rank correlation")
    axes[0].legend()
    fig.tight_layout()
    write_plot_atomic(fig, path)
    plt.close(fig)


def run_stability(data, out: str | Path, settings: StabilitySettings = StabilitySettings(),
                  runner: RunnerSettings = RunnerSettings(), fit_settings: FitSettings = FitSettings(),
                  *, on_batch=None) -> StabilityOutput:
    """Run (or resume) a ranking-stability analysis of ``data`` (a store, path or array).

    Writes ``stability.parquet`` (two rows per trial), ``summary.parquet``, ``stability.png``
    and ``stability.json`` (settings, timings) under ``out``.
    """
    out = Path(out)
    t0 = time.perf_counter()
    fit_settings = trial_fit_settings(fit_settings)
    y, info = trial_responses(data, fit_settings.memory_budget)  # over the budget: by reference
    in_memory = not isinstance(y, StoreColumns)
    trials = plan(settings, y.shape[1])  # validates the sizes before anything is written
    record = trial_record("stability", settings, fit_settings, y if in_memory else None,
                          sizes=settings.resolved_sizes(y.shape[1]),
                          **({} if in_memory else {"responses": info["checksum"]}))
    check_model_fits(settings.model, settings.prior, y, info.get("kind"))
    check_or_record(out, record, ("stability.parquet",), write=False)
    with session_for(runner):  # Ray's processes start before JAX's threads
        check_or_record(out, record, ("stability.parquet",))
        full = fit(y if in_memory else y.location, settings.model, fit_settings,  # streams
                   prior=settings.prior)
        options = tuple(sorted(full.extra["model_options"].items()))
        accuracy = subject_accuracy(y) if in_memory else full.extra["stats"]["subject_mean"]
        ctx = StabilityContext(
            FitContext(y, settings.model, options, full.guide, fit_settings, settings.passes),
            full_ability=ability_of(full.spec, full.guide.loc), full_accuracy=accuracy)
        t_fit = time.perf_counter() - t0
        rows = run_trials(stability_batch, ctx, trials, out / "stability.parquet", runner,
                          desc="stability", on_batch=on_batch)
    t_trials = time.perf_counter() - t0 - t_fit
    summary = summarize_stability(rows, settings.bootstrap, settings.seed)
    write_parquet_atomic(summary, out / "summary.parquet")
    plot_stability(summary, out / "stability.png")
    write_json_atomic(out / "stability.json", {
        "settings": settings.to_dict(), "runner": {**runner.to_dict(), "address": runner.address},
        "fit_settings": fit_settings.to_dict(), "data": info, "num_subjects": int(y.shape[0]),
        "num_items": int(y.shape[1]), "num_trials": len(trials),
        "full_fit": {"passes": full.num_passes, "converged": full.converged, "elbo": full.elbo},
        "seconds": {"full_fit": t_fit, "trials": t_trials},
    })
    return StabilityOutput(out, rows, summary)
