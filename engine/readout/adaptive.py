"""Adaptive item selection trials (seed 002 section 4.4).

A trial holds out a random share of subjects, replays each one's observed responses
item by item in the order a strategy chooses, updates the held-out subject's ability
posterior after every item, and reports the Kendall tau of the held-out subjects'
ranking after ``n`` items to their ranking by the full fit, for each ``n`` in
``checkpoints``. The trial is a pure function of its spec (and the loaded data): the
same seed gives the same rows, in process or on a Ray worker.

The per-item ability update is the exact posterior of a scalar ability on a grid
(the model's prior times the likelihood of the items answered so far, items at their
posterior locations), i.e. the expected-a-posteriori estimate of computerised adaptive
testing; one update costs one pass over the grid, so a trial of thousands of steps takes
well under a second. Item parameters are the run's, fitted on every subject: the
held-out subjects' responses informed them, a small leak when items pool many subjects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from engine.errors import SettingsError
from engine.infer.guide import constrained_means
from engine.readout.items import STRATEGIES, ItemBank, item_bank, load_run_responses, next_item, \
    strategy_scores

__all__ = ["AdaptiveTrialSpec", "TrialData", "load_trial_data", "adaptive_trial", "num_heldout",
           "simulate_adaptive", "summarize_trials", "TRIAL_GRID"]

TRIAL_GRID = np.linspace(-6.0, 6.0, 121)


@dataclass(frozen=True)
class AdaptiveTrialSpec:
    """One adaptive-selection trial.

    run : run directory; store : its response store (default: the one in fit.json).
    strategies : selection rules compared on the same held-out subjects.
    checkpoints : numbers of items administered at which the ranking is scored.
    holdout_fraction : share of subjects held out (at least 2).
    pool_size : candidate items drawn at random per trial (None = every item).
    seed : the trial's one source of randomness.
    """

    run: str
    store: str | None = None
    strategies: tuple[str, ...] = STRATEGIES
    checkpoints: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100)
    holdout_fraction: float = 0.2
    pool_size: int | None = None
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "strategies", tuple(self.strategies))
        object.__setattr__(self, "checkpoints", tuple(sorted({int(c) for c in self.checkpoints})))
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            raise SettingsError(f"strategies {list(self.strategies)} (--strategies): use some of "
                                f"{','.join(STRATEGIES)}, comma-separated")
        if not self.checkpoints or self.checkpoints[0] < 1:
            raise SettingsError(f"checkpoints {self.checkpoints} (--checkpoints): need item counts "
                                f">= 1, comma-separated, e.g. 1,2,5,10")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise SettingsError(f"holdout_fraction {self.holdout_fraction} (--holdout): need a share "
                                f"in (0, 1)")
        if self.pool_size is not None and self.pool_size < 1:
            raise SettingsError(f"pool_size {self.pool_size} (--pool-size): need >= 1 or None")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return d | {"strategies": list(self.strategies), "checkpoints": list(self.checkpoints)}

    @classmethod
    def from_dict(cls, d: dict) -> "AdaptiveTrialSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        if set(d) - known:
            raise SettingsError(f"unknown adaptive trial settings {sorted(set(d) - known)}")
        return cls(**d)


class TrialData(NamedTuple):
    """What every trial on one run shares: load once, pass to many trials."""

    bank: ItemBank
    responses: np.ndarray  # int8 (S, N), -1 missing
    full_ability: np.ndarray  # (S,) the full fit's ability means
    log_prior: np.ndarray  # (G,) ability prior on TRIAL_GRID
    log_p1: np.ndarray  # (G, N) log P(y=1 | grid ability)
    log_p0: np.ndarray  # (G, N)
    info: np.ndarray  # (G, N) Fisher information


def load_trial_data(run, store: str | Path | None = None) -> TrialData:
    """Load a run's item bank and responses and tabulate the model on ``TRIAL_GRID``."""
    from engine.run import Run, load_run

    run = run if isinstance(run, Run) else load_run(run)
    bank = item_bank(run.spec, run.guide)
    y = load_run_responses(run, store)
    means = constrained_means(run.spec, run.guide)
    env = {p.name: means[p.name] for p in run.spec.params if p.owner == "global"}
    log_prior = np.asarray(run.spec.param("ability").prior.log_prob(TRIAL_GRID, env), np.float64)
    p = np.clip(bank.prob(TRIAL_GRID), 1e-7, 1 - 1e-7)
    return TrialData(bank, y, run.subjects["ability_mean"].to_numpy(), log_prior - log_prior.max(),
                     np.log(p).astype(np.float32), np.log1p(-p).astype(np.float32),
                     bank.information(TRIAL_GRID).astype(np.float32))


def _restrict(data: TrialData, pool: np.ndarray) -> TrialData:
    """The trial data on a pool of items only."""
    return data._replace(bank=data.bank.subset(pool), responses=data.responses[:, pool],
                         log_p1=data.log_p1[:, pool], log_p0=data.log_p0[:, pool], info=data.info[:, pool])


def _replay(data: TrialData, subject: int, strategy: str, checkpoints: tuple[int, ...],
            rng: np.random.Generator) -> list[float]:
    """Ability estimates (posterior means) of one subject after each checkpoint's items."""
    y = data.responses[subject]
    info, log_p1, log_p0 = data.info, data.log_p1, data.log_p0
    available = y >= 0
    fixed = strategy_scores(data.bank, strategy, rng_key=rng)
    # a fixed priority is one ordering of the items, walked past the unanswered ones
    queue = iter(j for j in np.argsort(-fixed, kind="stable") if available[j]) if fixed is not None else None
    log_post = data.log_prior.copy()
    estimates, given = [], 0

    def post_mean(lp):
        w = np.exp(lp - lp.max())
        return float(np.sum(TRIAL_GRID * w) / np.sum(w))

    for target in checkpoints:
        while given < target:
            if queue is not None:
                j = next(queue, None)
                if j is None:
                    break
            else:
                if not available.any():
                    break
                g = int(np.argmin(np.abs(TRIAL_GRID - post_mean(log_post))))
                j = next_item(available, info[g], None)
            available[j] = False
            log_post = log_post + (log_p1[:, j] if y[j] == 1 else log_p0[:, j])
            given += 1
        estimates.append(post_mean(log_post))
    return estimates


def num_heldout(fraction: float, num_subjects: int) -> int:
    """How many of ``num_subjects`` a trial replays: ``fraction`` of them, rounded.

    A held-out ranking needs at least 2 subjects; a share that rounds below that is a
    settings error naming a share that works (it was silently raised to 2).
    """
    num_out = int(round(fraction * num_subjects))
    if num_subjects < 2:
        raise SettingsError(f"the run has {num_subjects} subject(s); a held-out ranking needs at least 2")
    if num_out < 2:  # a share below 1 that rounds to 2 (1.5 / S rounds up to 2 exactly)
        works = 2.0 / num_subjects if num_subjects > 2 else 1.5 / num_subjects
        raise SettingsError(f"--holdout {fraction:g} holds out {num_out} of the run's {num_subjects} "
                            f"subjects; a held-out ranking needs at least 2: pass --holdout "
                            f"{works:.2g} or more")
    return num_out


def adaptive_trial(spec: AdaptiveTrialSpec | dict, data: TrialData | None = None) -> list[dict]:
    """Run one trial; returns one row per (strategy, checkpoint).

    Row keys: ``seed``, ``strategy``, ``num_items``, ``kendall_tau`` (held-out ranking
    after ``num_items`` items vs. the full fit's), ``rmse`` (ability error to the full
    fit), ``num_heldout``. Pass ``data`` (from ``load_trial_data``) to share the loaded
    run between trials; otherwise it is loaded from ``spec.run``.
    """
    spec = spec if isinstance(spec, AdaptiveTrialSpec) else AdaptiveTrialSpec.from_dict(spec)
    data = data if data is not None else load_trial_data(spec.run, spec.store)
    S, N = data.responses.shape
    rng = np.random.default_rng(spec.seed)
    num_out = num_heldout(spec.holdout_fraction, S)
    heldout = np.sort(rng.permutation(S)[:num_out])
    if spec.pool_size:
        data = _restrict(data, np.sort(rng.choice(N, size=min(spec.pool_size, N), replace=False)))
    truth = data.full_ability[heldout]
    # no more items than the bank (or pool) holds: a checkpoint past it is the whole bank
    checkpoints = tuple(sorted({min(c, data.responses.shape[1]) for c in spec.checkpoints}))
    rows = []
    for strategy in spec.strategies:
        sub_rng = np.random.default_rng([spec.seed, STRATEGIES.index(strategy)])
        est = np.array([_replay(data, s, strategy, checkpoints, sub_rng) for s in heldout])
        for c, n in enumerate(checkpoints):
            tau = kendalltau(est[:, c], truth).statistic
            rows.append({"seed": spec.seed, "strategy": strategy, "num_items": n,
                         "kendall_tau": float(tau) if np.isfinite(tau) else 0.0,
                         "rmse": float(np.sqrt(np.mean((est[:, c] - truth) ** 2))),
                         "num_heldout": int(num_out)})
    return rows


def simulate_adaptive(spec: AdaptiveTrialSpec, num_trials: int, data: TrialData | None = None) -> pd.DataFrame:
    """Run ``num_trials`` trials in process (seeds ``spec.seed + t``) and summarise tau per
    strategy and number of items: mean with a 5-95% band across trials."""
    data = data if data is not None else load_trial_data(spec.run, spec.store)
    rows = [r for t in range(num_trials)
            for r in adaptive_trial(dataclasses.replace(spec, seed=spec.seed + t), data)]
    return summarize_trials(pd.DataFrame(rows))


def summarize_trials(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean Kendall tau and its 5-95% band across trials, per strategy and item count."""
    g = rows.groupby(["strategy", "num_items"])["kendall_tau"]
    return pd.DataFrame({"tau_mean": g.mean(), "tau_q05": g.quantile(0.05), "tau_q95": g.quantile(0.95),
                         "num_trials": g.size()}).reset_index()
