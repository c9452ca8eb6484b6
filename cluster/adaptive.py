"""Adaptive item selection replayed as trials (seed 002, section 4.4), on the runner.

Each trial holds out a random share of a run's subjects and replays each of them item by item
under every selection strategy (``engine.readout.adaptive``); the ranking of the held-out
subjects after n items is compared with the full fit's by Kendall's tau. Many trials give each
strategy's tau against the number of items with bands.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cluster.io import write_json_atomic, write_parquet_atomic, write_plot_atomic
from cluster.resume import check_or_record, responses_checksum, trial_record
from cluster.runner import run_trials, session_for
from cluster.settings import RunnerSettings
from cluster.trials import TrialSpec, trial_seed
from engine.readout.adaptive import (AdaptiveTrialSpec, TrialData, adaptive_trial, load_trial_data,
                                     num_heldout, summarize_trials)

__all__ = ["run_adaptive", "adaptive_batch", "AdaptiveContext", "AdaptiveOutput", "plot_adaptive"]


@dataclass(frozen=True)
class AdaptiveContext:
    """The run's item bank and responses, loaded once, and the trial settings."""

    spec: AdaptiveTrialSpec
    data: TrialData


def adaptive_batch(ctx: AdaptiveContext, trials: list[TrialSpec]) -> list[dict]:
    """Rows of each trial (one per strategy and item count), trial ``t`` seeded by ``t.seed``."""
    return [row for t in trials
            for row in adaptive_trial(dataclasses.replace(ctx.spec, seed=t.seed), ctx.data)]


@dataclass
class AdaptiveOutput:
    path: Path
    trials: pd.DataFrame
    summary: pd.DataFrame


def plot_adaptive(summary: pd.DataFrame, path: Path) -> None:
    """Kendall tau to the full ranking against items administered, per strategy, 90% bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for strategy, m in summary.groupby("strategy"):
        m = m.sort_values("num_items")
        ax.plot(m["num_items"], m["tau_mean"], marker="o", label=strategy)
        ax.fill_between(m["num_items"], m["tau_q05"], m["tau_q95"], alpha=0.15)
    ax.set_xscale("log")
    ax.set_xlabel("items administered")
    ax.set_ylabel("Kendall tau to the full ranking")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_plot_atomic(fig, path)
    plt.close(fig)


def _bank_checksum(data: TrialData) -> str:
    """Checksum of what the run contributes to every trial: its item curves on the ability
    grid and its subjects' abilities."""
    return responses_checksum(np.concatenate([data.log_p1.ravel(), data.log_p0.ravel(),
                                              data.full_ability.astype(np.float32).ravel()]))


def run_adaptive(run, out: str | Path, spec: AdaptiveTrialSpec, num_trials: int,
                 runner: RunnerSettings = RunnerSettings(), *, on_batch=None) -> AdaptiveOutput:
    """Run (or resume) ``num_trials`` adaptive-selection trials of ``spec`` (seeds derived from
    ``spec.seed``); writes ``adaptive.parquet``, ``summary.parquet``, ``adaptive.png`` and
    ``adaptive.json`` under ``out``."""
    out = Path(out)
    t0 = time.perf_counter()
    data = load_trial_data(run, spec.store)
    num_heldout(spec.holdout_fraction, data.responses.shape[0])  # a share too small: before writing
    # The run and store are recorded by content (paths may be spelt differently on a rerun).
    record = trial_record("adaptive", spec, None, data.responses, num_trials=num_trials,
                          item_bank=_bank_checksum(data))
    record["settings"] = {k: v for k, v in record["settings"].items() if k not in ("run", "store")}
    check_or_record(out, record, ("adaptive.parquet",), write=False)
    with session_for(runner):  # Ray's processes start before JAX's threads
        check_or_record(out, record, ("adaptive.parquet",))
        trials = [TrialSpec(0, i, trial_seed(spec.seed, 2, i)) for i in range(num_trials)]
        rows = run_trials(adaptive_batch, AdaptiveContext(spec, data), trials,
                          out / "adaptive.parquet", runner, desc="adaptive", on_batch=on_batch)
    summary = summarize_trials(rows)
    write_parquet_atomic(summary, out / "summary.parquet")
    plot_adaptive(summary, out / "adaptive.png")
    write_json_atomic(out / "adaptive.json", {
        "spec": spec.to_dict(), "num_trials": num_trials, "runner": runner.to_dict(),
        "seconds": time.perf_counter() - t0})
    return AdaptiveOutput(out, rows, summary)
