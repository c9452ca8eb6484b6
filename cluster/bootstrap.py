"""Bootstrap intervals of abilities and ranks beside the variational ones.

Each replicate resamples the items with replacement and refits the model (warm-started from the
full fit, batched with ``jax.vmap``); the spread of the refitted abilities and ranks across
replicates gives intervals that do not rest on the mean-field posterior, so a user sees where the
two agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from cluster.io import write_json_atomic, write_parquet_atomic
from cluster.resume import check_model_fits, check_or_record, trial_record
from cluster.runner import run_trials, session_for
from cluster.settings import BootstrapSettings, RunnerSettings
from cluster.trials import FitContext, TrialSpec, bootstrap_batch, trial_fit_settings, trial_seed
from cluster.columns import StoreColumns, trial_responses
from engine.api import fit
from engine.infer.settings import FitSettings
from engine.readout.posterior import draw_posterior
from engine.readout.ranking import identical_subjects, pooled_statistics, ranks_from_draws

__all__ = ["run_bootstrap", "bootstrap_intervals", "BootstrapOutput"]


@dataclass
class BootstrapOutput:
    path: Path
    replicates: pd.DataFrame
    intervals: pd.DataFrame


def bootstrap_intervals(replicates: pd.DataFrame, variational: pd.DataFrame,
                        level: float = 0.9, groups: np.ndarray | None = None) -> pd.DataFrame:
    """Per subject: bootstrap and variational intervals of ability and rank side by side.

    ``variational`` has one row per subject (in subject order) with columns ``ability_mean``,
    ``ability_lo``, ``ability_hi``, ``rank_lo``, ``rank_hi``. ``ability_overlap`` is the length of
    the intersection of the two ability intervals over the length of their union (1 = same).
    ``groups`` (of the sheets' digests; where the full fit holds the matrix in memory and
    pools twins): subjects with identical answer sheets, which every replicate resamples alike, read from all their replicate rows
    together, alike to the bit, as the variational columns read them (a replicate's refit
    gives twins Monte Carlo jitter and ties them in some order: on LSAT7 the 308 perfect
    sheets' lower rank ends ran 2-153). (Equal posteriors are not enough: under the 1PL two
    different sheets of one score have one posterior, and resampled items part them.)
    """
    a = (1.0 - level) / 2.0
    if groups is not None:  # every member's rows under its group's first member
        groups = np.asarray(groups).reshape(-1)
        first = pd.Series(np.arange(groups.size)).groupby(groups).transform("min").to_numpy()
        replicates = replicates.assign(subject=first[replicates["subject"].to_numpy()])
    g = replicates.groupby("subject")
    boot = pd.DataFrame({
        "boot_ability_mean": g["ability"].mean(),
        "boot_ability_lo": g["ability"].quantile(a), "boot_ability_hi": g["ability"].quantile(1 - a),
        "boot_rank_lo": g["rank"].quantile(a), "boot_rank_hi": g["rank"].quantile(1 - a),
    })
    boot = boot.reset_index(drop=True) if groups is None else boot.loc[first].reset_index(drop=True)
    out = pd.concat([variational.reset_index(drop=True), boot], axis=1)
    inter = (np.minimum(out["ability_hi"], out["boot_ability_hi"])
             - np.maximum(out["ability_lo"], out["boot_ability_lo"])).clip(lower=0)
    union = (np.maximum(out["ability_hi"], out["boot_ability_hi"])
             - np.minimum(out["ability_lo"], out["boot_ability_lo"]))
    out["ability_overlap"] = inter / union.where(union > 0)
    out["sd_ratio"] = ((out["boot_ability_hi"] - out["boot_ability_lo"])
                       / (out["ability_hi"] - out["ability_lo"]))
    return out


def _sheet_groups(full) -> np.ndarray | None:
    """Groups of subjects with identical answer sheets, from the full fit's sheet digests
    (16 bytes a subject); None where it kept none (a store read per trial, whose full fit
    does not pool twins either) or every sheet is its own."""
    digests = full.extra.get("sheet_digests")
    return None if digests is None else identical_subjects(np.asarray(digests))


def _subject_ids(data, full) -> np.ndarray:
    """The subjects' ids in the data's order: a store's own (an in-memory fit of its matrix
    numbers them 0, 1, ...), else the fit's."""
    from engine.data.store import Store, open_store

    if isinstance(data, (str, Path)):
        data = open_store(data)
    if isinstance(data, Store):
        return np.asarray([str(s) for s in data.subjects.tolist()], dtype=object)
    return np.asarray(full.extra["subjects"])


def _variational(full, level: float, seed: int, subjects: np.ndarray) -> pd.DataFrame:
    # every subject drawn apart; subjects of one posterior (identical sheets) read from
    # their draws and ranks pooled, alike to the bit
    draws = draw_posterior(full.spec, full.guide, 2000, rng_key=jax.random.PRNGKey(seed),
                           names=("ability",))["ability"]
    groups = identical_subjects(full.guide.loc["ability"], full.guide.log_scale["ability"])
    a = (1.0 - level) / 2.0

    def summary(values, name):
        return pooled_statistics(values, groups, {
            f"{name}_mean": lambda v: v.mean(axis=0),
            f"{name}_lo": lambda v: np.quantile(v, a, axis=0),
            f"{name}_hi": lambda v: np.quantile(v, 1 - a, axis=0)})

    return pd.DataFrame({"subject": subjects, **summary(draws, "ability"),
                         **summary(ranks_from_draws(draws), "rank")})


def run_bootstrap(data, out: str | Path, settings: BootstrapSettings = BootstrapSettings(),
                  runner: RunnerSettings = RunnerSettings(), fit_settings: FitSettings = FitSettings(),
                  *, on_batch=None) -> BootstrapOutput:
    """Run (or resume) bootstrap replicates; writes ``bootstrap.parquet`` (replicate x subject
    rows), ``intervals.parquet`` and ``bootstrap.json`` under ``out``."""
    out = Path(out)
    t0 = time.perf_counter()
    fit_settings = trial_fit_settings(fit_settings)
    y, info = trial_responses(data, fit_settings.memory_budget)  # over the budget: by reference
    in_memory = not isinstance(y, StoreColumns)
    record = trial_record("bootstrap", settings, fit_settings, y if in_memory else None,
                          **({} if in_memory else {"responses": info["checksum"]}))
    check_model_fits(settings.model, settings.prior, y, info.get("kind"))
    check_or_record(out, record, ("bootstrap.parquet",), write=False)
    with session_for(runner):  # Ray's processes start before JAX's threads
        check_or_record(out, record, ("bootstrap.parquet",))
        full = fit(y if in_memory else y.location, settings.model, fit_settings,  # streams
                   prior=settings.prior)
        options = tuple(sorted(full.extra["model_options"].items()))
        # Each replicate takes the full fit's Monte Carlo draws per step (a replicate has the full
        # matrix's shape): with one draw, the 10 x 1,418 demo's 2PL replicates carried Monte Carlo
        # jitter that widened the bootstrap sds (median ratio to the variational sd 1.38 -> 1.20
        # vague, 1.54 -> 1.20 hierarchical; BENCHMARKS.md).
        trial_settings = fit_settings.replace(mc_draws=full.extra["mc_draws"])
        ctx = FitContext(y, settings.model, options, full.guide, trial_settings, settings.passes)
        trials = [TrialSpec(0, r, trial_seed(settings.seed, 0, r))
                  for r in range(settings.replicates)]
        rows = run_trials(bootstrap_batch, ctx, trials, out / "bootstrap.parquet", runner,
                          desc="bootstrap", on_batch=on_batch)
    intervals = bootstrap_intervals(rows, _variational(full, settings.level, settings.seed,
                                                       _subject_ids(data, full)),
                                    settings.level, _sheet_groups(full))
    write_parquet_atomic(intervals, out / "intervals.parquet")
    write_json_atomic(out / "bootstrap.json", {
        "settings": settings.to_dict(), "runner": runner.to_dict(), "data": info,
        "fit_settings": fit_settings.to_dict(), "mc_draws_per_step": trial_settings.mc_draws,
        "seconds": time.perf_counter() - t0,
        "median_ability_overlap": float(intervals["ability_overlap"].median()),
        "median_sd_ratio": float(intervals["sd_ratio"].median()),
    })
    return BootstrapOutput(out, rows, intervals)
