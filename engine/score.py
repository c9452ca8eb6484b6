"""Score new subjects against a run's frozen item parameters.

Scoring is the ordinary fit (``engine.api.fit``) started from the run's posterior with
every item and global block frozen: only the new subjects' abilities move, so it takes
seconds where a refit of the whole matrix takes minutes, and the abilities land on the
run's scale, ready to be placed on its leaderboard.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from engine.api import fit, response_stats
from engine.data.store import Store, open_store
from engine.errors import DataFormatError
from engine.infer.fit import FitResult
from engine.infer.guide import GuideState
from engine.infer.settings import FitSettings
from engine.readout.posterior import draw_posterior, summarize
from engine.readout.ranking import rank_stats
from engine.run import Run, load_run

__all__ = ["score", "score_responses", "read_new_responses", "place_on_leaderboard"]


def _run(run: Run | str | Path) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def _frozen_init(run: Run, item_idx: np.ndarray | None) -> tuple[GuideState, frozenset]:
    """The run's item and global blocks (restricted to ``item_idx``) as a frozen start."""
    loc, log_scale, frozen = {}, {}, set()
    for p in run.spec.params:
        if p.owner == "subject":
            continue
        a, s = np.asarray(run.guide.loc[p.name]), np.asarray(run.guide.log_scale[p.name])
        if p.owner == "item" and item_idx is not None:
            a, s = a[item_idx], s[item_idx]
        loc[p.name], log_scale[p.name] = a, s
        frozen.add(p.name)
    return GuideState(loc, log_scale), frozenset(frozen)


def score_responses(run: Run | str | Path, y: np.ndarray, *, item_idx: np.ndarray | None = None,
                    settings: FitSettings | None = None) -> FitResult:
    """Fit only the abilities of the rows of ``y`` with the run's items frozen.

    Parameters
    ----------
    y : int8 ``(s, n)`` responses, -1 missing; column ``j`` is run item ``item_idx[j]``
        (all run items in order when ``item_idx`` is None).
    settings : defaults to the run's fit settings.

    Returns
    -------
    The ``FitResult`` of the frozen fit (its item blocks equal the run's).
    """
    run = _run(run)
    n_run = len(run.items)
    expect = n_run if item_idx is None else len(item_idx)
    if y.ndim != 2 or y.shape[1] != expect:
        raise DataFormatError(f"new responses have shape {y.shape}; expected (subjects, {expect}) "
                              f"columns matching the run's items")
    if settings is None:
        settings = FitSettings.from_dict(run.info["settings"]).replace(progress=False)
    init, frozen = _frozen_init(run, item_idx)
    options = dict(run.info["model_options"])
    prior = options.pop("prior", "vague")
    signed = options.pop("signed_discrimination", False)
    return fit(np.asarray(y, np.int8), model=run.info["model"], settings=settings, prior=prior,
               signed_discrimination=signed, model_options=options, init=init, frozen=frozen)


def read_new_responses(run: Run, responses: str | Path | Store) -> tuple[np.ndarray, np.ndarray]:
    """New subjects' responses aligned to the run's items: ``(y (s, N), subject ids)``.

    ``responses`` is a store or any file ``irt-engine ingest`` reads. Items the run does not
    know are an error; run items the file lacks are missing.
    """
    if isinstance(responses, Store) or Path(responses).is_dir():
        store = responses if isinstance(responses, Store) else open_store(responses)
        y_new, subjects, items = store.load(), store.subjects, store.items
    else:
        from engine.data import ingest

        with tempfile.TemporaryDirectory(prefix="irt-score-") as tmp:
            store = ingest(responses, Path(tmp) / "store")
            y_new, subjects, items = store.load(), store.subjects, store.items
    items = [str(s) for s in items.tolist()]
    index = {str(s): j for j, s in enumerate(run.items["item"].astype(str))}
    unknown = [i for i in items if i not in index]
    if unknown:
        raise DataFormatError(f"{responses}: column(s) {unknown[:5]} are not items of run {run.path} "
                              f"({len(unknown)} unknown); score needs the run's item ids as columns")
    y = np.full((y_new.shape[0], len(index)), -1, np.int8)
    y[:, [index[i] for i in items]] = y_new
    return y, np.asarray([str(s) for s in subjects.tolist()], dtype=object)


def place_on_leaderboard(run: Run, new: pd.DataFrame, new_guide: GuideState, *, num_draws: int = 1000,
                         top_k: int = 3, seed: int = 0) -> pd.DataFrame:
    """The run's subjects and the scored ones in one table with joint rank statistics.

    Rank intervals come from joint draws of the run's and the new abilities (independent
    under the mean-field guides); ``new`` marks the scored rows.
    """
    old = run.subjects[["subject", "ability_mean", "ability_sd", "ability_q05", "ability_q95",
                        "accuracy", "n_responses"]].copy()
    old["new"] = False
    board = pd.concat([old, new.assign(new=True)[old.columns]], ignore_index=True)
    key_old, key_new = jax.random.split(jax.random.PRNGKey(seed))
    d_old = draw_posterior(run.spec, run.guide, num_draws, rng_key=key_old, names=("ability",))["ability"]
    d_new = draw_posterior(run.spec, new_guide, num_draws, rng_key=key_new, names=("ability",))["ability"]
    for k, v in rank_stats(np.concatenate([d_old, d_new], axis=1), top_k).items():
        board[k] = v
    return board


def score(run: Run | str | Path, responses, *, settings: FitSettings | None = None,
          num_draws: int = 1000, top_k: int = 3, seed: int = 0) -> tuple[pd.DataFrame, FitResult]:
    """Score new subjects and place them on the run's leaderboard.

    Returns
    -------
    ``(board, result)``: the combined subject table (``new`` marks scored subjects,
    rank statistics over everyone) and the frozen fit.

    Examples
    --------
    >>> board, res = score("runs/nlu", "new_models.csv")  # doctest: +SKIP
    """
    run = _run(run)
    if isinstance(responses, np.ndarray):
        y, ids = responses, np.asarray([f"new{i}" for i in range(responses.shape[0])], dtype=object)
    else:
        y, ids = read_new_responses(run, responses)
    res = score_responses(run, y, settings=settings)
    table = summarize(run.spec, res.guide, "subject")
    stats = response_stats(y)
    table.insert(0, "subject", ids)
    table["accuracy"] = stats["subject_mean"]
    table["n_responses"] = stats["subject_n"]
    subject_guide = GuideState({"ability": res.guide.loc["ability"]},
                               {"ability": res.guide.log_scale["ability"]})
    board = place_on_leaderboard(run, table, subject_guide, num_draws=num_draws, top_k=top_k, seed=seed)
    return board, res
