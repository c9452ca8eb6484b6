"""Score new subjects against a run's frozen item parameters.

Only the new subjects' abilities are fitted; every item and global factor of the run is
held fixed, so the abilities land on the run's scale, ready for its leaderboard.

An answer sheet the run has already read (the same response in every cell, missing ones
included: the digests of ``sheets.npz``) takes the run's read-out of it, whatever the
method: a submission scored again lands where it stands on the run's leaderboard.

Two methods, the same target (the mean-field factor of each ability given the frozen
items):

- ``grid`` (models with one scalar ability and binary responses): the exact
  coordinate-ascent update on an ability grid, one pass over the responses
  (:mod:`engine.infer.conditional`).
- ``fit``: the ordinary fit (``engine.api.fit``) started from the run's posterior with the
  item and global blocks frozen; any model.

``auto`` picks ``grid`` where it applies.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from engine.api import fit, response_stats
from engine.data.kinds import READS, check_kind
from engine.data.store import KINDS, Store, open_store
from engine.errors import DataFormatError, SettingsError
from engine.infer.conditional import GridSettings, conditional_abilities, conditional_applies
from engine.infer.fit import FitResult
from engine.infer.guide import GuideState
from engine.infer.settings import FitSettings
from engine.readout.posterior import result_columns
from engine.readout.quantile_draws import quantile_draws
from engine.readout.ranking import identical_subjects, rank_stats
from engine.run import Run, load_run
from engine.rows import sheet_digests

__all__ = ["score", "score_responses", "read_new_responses", "place_on_leaderboard", "METHODS"]

METHODS = ("auto", "grid", "fit")


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


def _run_settings(run: Run) -> FitSettings:
    """The fit settings a frozen refit against ``run`` takes: the run's own; for a run NUTS
    sampled (``fit --method nuts``, or ``auto``'s fallback on a small matrix), whose
    settings are the sampler's, the defaults with its seed and memory budget."""
    saved = run.info["settings"]
    if run.info.get("method") == "nuts":
        return FitSettings(seed=saved.get("seed", 0), memory_budget=saved.get("memory_budget"))
    return FitSettings.from_dict(saved).replace(progress=False)


def _grid_result(run: Run, y: np.ndarray, item_idx, grid: GridSettings) -> FitResult:
    """The grid update packaged as a frozen fit's result: one pass over ``y``."""
    t0 = time.perf_counter()
    subject_guide, info = conditional_abilities(run.spec, run.guide, y, item_idx=item_idx,
                                                settings=grid)
    init, frozen = _frozen_init(run, item_idx)
    guide = GuideState({**init.loc, **subject_guide.loc}, {**init.log_scale, **subject_guide.log_scale})
    wall = time.perf_counter() - t0
    trace = [{"pass": 1, "elbo": float(np.sum(info["log_normalizer"])), "seconds": wall}]
    trace[0]["elbo_smooth"] = trace[0]["elbo"]
    settings = _run_settings(run)
    return FitResult(run.spec, guide, settings, trace, True, wall, 0.0, y.shape[0], y.shape[1],
                     int((y >= 0).sum()), 1, tuple(sorted(frozen)),
                     {"method": "grid", "grid": list(info["grid"]), "widened": info["widened"],
                      "elbo_note": "sum over subjects of log normalisers (item terms excluded)"})


def _exact_result(run: Run, y: np.ndarray, item_idx, grid: GridSettings) -> FitResult | None:
    """New subjects' abilities as the run's own were read, where the run saved its item
    draws (a quadrature fit, ``ability_draws.npz``); None where it did not.

    Each distinct answer sheet the run has (all its items, the same unanswered ones) takes
    the run's own ability, interval and quantile function, to the bit (and ties with the
    run's subjects of that sheet on the leaderboard). Any other sheet: its exact posterior,
    the grid weights averaged over those draws, its mean and sd over all of them and its
    quantile function as the run's were computed (``AbilityDraws``, with the fit's seed).
    A sheet whose posterior the run's grid does not hold (mass at its ends) or resolve
    (an sd under its spacing: more answers than any of the run's sheets) takes the
    mean-field factor given the run's item factors instead, with a Gaussian interval;
    ``extra["abilities"]`` counts each kind."""
    saved = run.ability_draws()
    if saved is None:
        return None
    from engine.infer.ability_quantiles import INTERVAL_ROWS, PROBABILITIES, Z_NODES, AbilityDraws
    from engine.rows import identical_rows

    t0 = time.perf_counter()
    (ability,) = run.spec.by_owner("subject")
    z = np.asarray(Z_NODES)
    responses = np.where(np.isnan(y), -1, y).astype(np.int8) if np.issubdtype(
        y.dtype, np.floating) else y.astype(np.int8)
    first, inverse, _ = identical_rows(responses)
    sheets = responses[first]
    loc, log_scale = np.empty(len(sheets)), np.empty(len(sheets))
    table = np.empty((len(z), len(sheets)))
    known = np.full(len(sheets), -1)  # the run subject whose sheet each one is
    if item_idx is None and "pattern_of_subject" in saved and ability.name in run.quantile_functions:
        subject_of = {}
        for s, u in enumerate(saved["pattern_of_subject"]):
            subject_of.setdefault(int(u), s)
        where = {saved["patterns"][u].tobytes(): s for u, s in subject_of.items()}
        known = np.array([where.get(sheet.tobytes(), -1) for sheet in sheets], np.int64)
    at = known[known >= 0]
    loc[known >= 0] = run.guide.loc[ability.name][at]  # float32 values: back to the bit
    log_scale[known >= 0] = run.guide.log_scale[ability.name][at]
    if at.size:
        table[:, known >= 0] = run.quantile_functions[ability.name][1][:, at]
    new = np.flatnonzero(known < 0)
    unresolved = np.zeros(0, np.int64)
    if new.size:
        xs = saved["xs"] if item_idx is None else saved["xs"][:, np.asarray(item_idx)]
        draws = AbilityDraws.of(saved | {"xs": xs}, sheets[new])
        mean, sd, edge = draws.moments(run.spec)
        spacing = float(saved["grid"][1] - saved["grid"][0])
        ok = np.isfinite(mean) & (sd >= spacing) & (edge < 1e-6)
        loc[new], log_scale[new] = mean, np.log(sd)
        if ok.any():
            seed = int(saved["seed"]) if "seed" in saved else int(
                run.info["settings"].get("seed", 0)) % 2 ** 32  # the fit's
            table[:, new[ok]] = draws.quantiles(run.spec, mean, sd, seed, PROBABILITIES)[:, ok]
        unresolved = new[~ok]
        if unresolved.size:  # the mean-field factor given the run's items, a Gaussian
            mf = _grid_result(run, y[first[unresolved]], item_idx, grid).guide
            loc[unresolved] = mf.loc[ability.name]
            log_scale[unresolved] = mf.log_scale[ability.name]
            table[:, unresolved] = loc[unresolved] + np.exp(log_scale[unresolved]) * z[:, None]
    init, frozen = _frozen_init(run, item_idx)
    guide = GuideState({**init.loc, ability.name: loc[inverse].astype(np.float32)},
                       {**init.log_scale, ability.name: log_scale[inverse].astype(np.float32)})
    ends = table[list(INTERVAL_ROWS)]
    ends[:, unresolved] = np.nan  # the Gaussian's
    wall = time.perf_counter() - t0
    how = (f"exact: {len(sheets)} answer sheet(s): {int((known >= 0).sum())} of the run's, "
           f"read as the run read them; {new.size - unresolved.size} averaged over the run's "
           f"{len(saved['w'])} item draws as the run's were; {unresolved.size} beyond the "
           f"run's ability grid (the mean-field factor given its item factors)")
    trace = [{"pass": 1, "elbo": float("nan"), "elbo_smooth": float("nan"), "seconds": wall}]
    return FitResult(run.spec, guide, _run_settings(run), trace, True, wall, 0.0, y.shape[0],
                     y.shape[1], int((y >= 0).sum()), 1, tuple(sorted(frozen)),
                     {"method": "grid", "abilities": how, "elbo_note": "not computed"},
                     intervals={ability.name: ends[:, inverse].astype(np.float32)},
                     quantile_functions={ability.name: (z, table[:, inverse].astype(np.float32))})


def score_responses(run: Run | str | Path, y: np.ndarray, *, item_idx: np.ndarray | None = None,
                    settings: FitSettings | None = None, method: str = "auto",
                    grid: GridSettings = GridSettings()) -> FitResult:
    """Fit only the abilities of the rows of ``y`` with the run's items frozen.

    Parameters
    ----------
    y : int8 ``(s, n)`` responses, -1 missing; column ``j`` is run item ``item_idx[j]``
        (all run items in order when ``item_idx`` is None).
    settings : the frozen fit's settings (``method="fit"``); default the run's.
    method : ``auto`` (``grid`` where the model allows it, else ``fit``), ``grid`` or ``fit``.
        ``grid`` against a run that saved its item draws (a quadrature fit:
        ``ability_draws.npz``) reads each new answer sheet's exact posterior over those
        draws, as the run's own subjects were read (``extra["abilities"]`` says which).

    Returns
    -------
    A ``FitResult`` whose item blocks equal the run's; ``extra["method"]`` says which
    method ran.
    """
    run = _run(run)
    n_run = len(run.items)
    expect = n_run if item_idx is None else len(item_idx)
    if y.ndim != 2 or y.shape[1] != expect:
        raise DataFormatError(f"new responses have shape {y.shape}; expected (subjects, {expect}) "
                              f"columns matching the run's items")
    check_kind(np.asarray(y), _run_kind(run), "new responses")  # a 2 or a 0.5 never becomes 0/1
    if method not in METHODS:
        raise SettingsError(f"score method {method!r} is unknown; use one of {', '.join(METHODS)}")
    applies = conditional_applies(run.spec)
    if method == "grid" and not applies:
        raise SettingsError(f"score method 'grid' needs one scalar ability and binary responses; "
                            f"model {run.info['model']!r} has not: use --method fit")
    y = np.asarray(y)
    y = y if np.issubdtype(y.dtype, np.floating) else y.astype(np.int8)  # float: continuous kinds
    twins = _run_twins(run, y) if item_idx is None else None  # sheets the run has read
    if twins is None or not (twins >= 0).any():
        return _score(run, y, item_idx, settings, method, applies, grid)
    rest = np.flatnonzero(twins < 0)  # only the others are scored (a run's sheet whose
    # responses are all at the boundary may not be fittable anew, and need not be)
    part = _score(run, y[rest], item_idx, settings, method, applies, grid) if rest.size else None
    return _with_run_readouts(run, y, twins, part)


def _score(run: Run, y: np.ndarray, item_idx, settings, method: str, applies: bool,
           grid: GridSettings) -> FitResult:
    """:func:`score_responses`' result by ``method``, before the sheets the run has read take
    the run's read-outs."""
    if "constant_response" in run.items and run.items["constant_response"].any():
        # items the run fitted as unobserved (prior only) are not evidence here either
        aside = run.items["constant_response"].to_numpy(bool)
        aside = aside if item_idx is None else aside[item_idx]
        y = y.copy()
        y[:, aside] = np.nan if np.issubdtype(y.dtype, np.floating) else -1
    if method in ("grid", "auto") and applies:
        exact = _exact_result(run, y, item_idx, grid)
        if exact is not None:
            return exact
        res = _grid_result(run, y, item_idx, grid)
        res.extra["abilities"] = ("the mean-field factor given the run's item factors (the "
                                  "run saved no item draws)")
        return res
    if settings is None:
        settings = _run_settings(run)
    init, frozen = _frozen_init(run, item_idx)
    options = dict(run.info["model_options"])
    prior = options.pop("prior", "vague")
    signed = options.pop("signed_discrimination", False)
    res = fit(y, model=run.info["model"], settings=settings, prior=prior,
              signed_discrimination=signed, model_options=options, init=init, frozen=frozen)
    res.extra["method"] = "fit"
    return res


def _run_twins(run: Run, y: np.ndarray) -> np.ndarray | None:
    """For each row of ``y`` (all the run's items), the run subject with the same answer
    sheet in every cell (``sheets.npz``; the first such subject), or -1; None where the run
    kept no digests."""
    digests = run.sheet_digests()
    if digests is None or len(digests) != len(run.subjects):
        return None
    where = {}
    for s, d in enumerate(digests):
        where.setdefault(d.tobytes(), s)
    new = sheet_digests(y, _run_kind(run))
    return np.array([where.get(d.tobytes(), -1) for d in new], np.int64)


def _with_run_readouts(run: Run, y: np.ndarray, twins: np.ndarray,
                       part: FitResult | None) -> FitResult:
    """The result for all rows of ``y``: those whose answer sheet the run has (``twins``
    >= 0: that run subject) take the run's factors of every subject block and, for a scalar
    ability, the run's interval and quantile function; the others (``twins`` < 0) are
    ``part``'s rows in order (None: there are none). One sheet, one read-out, whichever
    way the others were scored; :func:`score`'s table takes the run's columns for them too.
    ``extra["run_twins"]`` keeps ``twins``; ``extra["abilities"]`` says how many."""
    rows, at, rest = np.flatnonzero(twins >= 0), twins[twins >= 0], np.flatnonzero(twins < 0)
    n = len(twins)
    if part is None:  # every sheet the run's: the run's items, no fit
        init, frozen = _frozen_init(run, None)
        part = FitResult(run.spec, init, _run_settings(run), [], True, 0.0, 0.0, 0, y.shape[1],
                         0, 1, tuple(sorted(frozen)), {"method": "the run's read-outs"})
    loc, log_scale = dict(part.guide.loc), dict(part.guide.log_scale)
    for p in run.spec.by_owner("subject"):
        for mine, theirs in ((loc, run.guide.loc), (log_scale, run.guide.log_scale)):
            full = np.zeros((n,) + np.shape(theirs[p.name])[1:], np.float32)
            if rest.size:
                full[rest] = mine[p.name]
            full[rows] = theirs[p.name][at]
            mine[p.name] = full
    intervals, tables = dict(part.intervals), dict(part.quantile_functions)
    for p in run.spec.by_owner("subject"):  # each scalar block's interval
        ends = np.full((2, n), np.nan, np.float32)  # NaN: the Gaussian's (summary_columns)
        if p.name in intervals:
            ends[:, rest] = intervals[p.name]
        columns = [f"{p.name}_q05", f"{p.name}_q95"]
        if p.shape == () and set(columns) <= set(run.subjects.columns):
            # the run's reported interval, on the unconstrained scale intervals are kept on
            ends[:, rows] = p.unconstrain(run.subjects[columns].to_numpy().T[:, at])
        if p.name in intervals or not np.isnan(ends).all():
            intervals[p.name] = ends
    ability = next((p for p in run.spec.by_owner("subject") if p.name == "ability"), None)
    if ability is not None and ability.shape == ():
        if ability.name in run.quantile_functions:
            z, table = run.quantile_functions[ability.name]
            full = (loc[ability.name][None, :].astype(np.float64) + np.exp(
                log_scale[ability.name].astype(np.float64))[None, :] * np.asarray(z)[:, None])
            if ability.name in tables:  # the scored rows' own, the others Gaussian
                full[:, rest] = tables[ability.name][1]
            full[:, rows] = table[:, at]
            tables[ability.name] = (z, full.astype(np.float32))
    note = f"{rows.size} of {n} answer sheet(s) the run's own: read as the run read them"
    extra = dict(part.extra) | {"run_twins": twins, "abilities": "; ".join(
        x for x in (part.extra.get("abilities"), note) if x)}
    return dataclasses.replace(part, guide=GuideState(loc, log_scale), num_subjects=n,
                               num_observed=int((np.nan_to_num(y, nan=-1) >= 0).sum()),
                               intervals=intervals, quantile_functions=tables, extra=extra)


def read_new_responses(run: Run, responses: str | Path | Store) -> tuple[np.ndarray, np.ndarray]:
    """New subjects' responses aligned to the run's items: ``(y (s, N), subject ids)``.

    ``responses`` is a store or any file ``irt-engine ingest`` reads. Items the run does not
    know are an error; run items the file lacks are missing.
    """
    kind = _run_kind(run)
    if isinstance(responses, Store) or Path(responses).is_dir():
        store = responses if isinstance(responses, Store) else open_store(responses)
        if store.kind not in READS[kind]:
            raise DataFormatError(f"{store.path}: {store.kind} responses, but run {run.path} was "
                                  f"fitted to {kind} responses; score it with a run of that kind")
        y_new, subjects, items = store.load(), store.subjects, store.items
    else:
        from engine.data import ingest

        with tempfile.TemporaryDirectory(prefix="irt-score-") as tmp:
            try:
                store = ingest(responses, Path(tmp) / "store", kind=kind)  # values checked there
            except DataFormatError as err:  # ingest's fix names its --kind, which score lacks
                text = str(err)
                if ", or ingest with another --kind" in text:
                    text = (text.split(", or ingest with another --kind")[0] +
                            f"; run {run.path} was fitted to {kind} responses, so new ones "
                            f"are read as {kind}")
                    raise DataFormatError(text) from None
                raise
            y_new, subjects, items = store.load(), store.subjects, store.items
    items = [str(s) for s in items.tolist()]
    index = {str(s): j for j, s in enumerate(run.items["item"].astype(str))}
    unknown = [i for i in items if i not in index]
    if unknown:
        raise DataFormatError(f"{responses}: column(s) {unknown[:5]} are not items of run {run.path} "
                              f"({len(unknown)} unknown); score needs the run's item ids as columns")
    spec = KINDS[kind]
    y = np.full((y_new.shape[0], len(index)), spec.fill, spec.dtype)
    if y_new.dtype != y.dtype:  # a binary store (int8, -1 missing) scored by a float run
        y_new = np.where(y_new < 0, np.nan, y_new).astype(y.dtype)
    y[:, [index[i] for i in items]] = y_new
    return y, np.asarray([str(s) for s in subjects.tolist()], dtype=object)


def _run_kind(run: Run) -> str:
    """The response kind the run was fitted to (binary for runs that predate kinds)."""
    return (run.info.get("data") or {}).get("kind") or "binary"


def place_on_leaderboard(run: Run, new: pd.DataFrame, new_guide: GuideState, *, num_draws: int = 1000,
                         top_k: int = 3, seed: int = 0,
                         new_quantiles: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """The run's subjects and the scored ones in one table with joint rank statistics.

    Rank intervals come from joint draws of the run's and the new abilities (independent
    across subjects); ``new`` marks the scored rows. The run's subjects are drawn from their
    exact posteriors where the run has them (a quadrature fit's quantile functions), as its
    own rank statistics were; the scored subjects from theirs, ``new_quantiles`` ``(z,
    values (J, s))``, where given, else from their Gaussian factors.
    """
    old = run.subjects[["subject", "ability_mean", "ability_sd", "ability_q05", "ability_q95",
                        "accuracy", "n_responses"]].copy()
    old["new"] = False
    board = pd.concat([old, new.assign(new=True)[old.columns]], ignore_index=True)
    # Independent abilities: drawn directly (numpy, no compiled program per shape) and
    # mapped through the block's transform; subjects of one posterior (identical answer
    # sheets, a scored one beside the run's) drawn apart, their rank statistics pooled.
    ability = run.spec.by_owner("subject")[0]
    new_loc = np.asarray(new_guide.loc[ability.name])
    new_scale = np.exp(np.asarray(new_guide.log_scale[ability.name]))  # as the run's: a new
    # factor equal to a run's, bit for bit, is in its group
    loc = np.concatenate([np.asarray(run.guide.loc[ability.name]), new_loc])
    scale = np.concatenate([np.exp(np.asarray(run.guide.log_scale[ability.name])), new_scale])
    z = values = None
    if ability.name in run.quantile_functions:  # the new subjects' own tables, or their
        z, old_values = run.quantile_functions[ability.name]  # Gaussians as tables
        new_values = (new_quantiles[1] if new_quantiles is not None else new_loc.astype(
            np.float64) + new_scale.astype(np.float64) * np.asarray(z)[:, None])
        values = np.concatenate([old_values, new_values], axis=1)
    draws = np.asarray(ability.constrain(quantile_draws(loc, scale, num_draws, seed, z, values)))
    groups = identical_subjects(loc, scale)
    for k, v in rank_stats(draws, top_k, groups).items():
        board[k] = v
    return board


def _read_frame(run: Run, frame) -> tuple[np.ndarray, np.ndarray]:
    """A DataFrame of new sheets (index: their ids, columns: item ids) read as its Parquet
    file would be, through the same checks; errors name "the DataFrame", not the file."""
    with tempfile.TemporaryDirectory(prefix="irt-score-frame-") as tmp:
        path = Path(tmp) / "new.parquet"
        frame = frame.set_axis([str(c) for c in frame.columns], axis=1)
        frame = frame.set_axis([str(i) for i in frame.index], axis=0)
        frame.rename_axis(str(frame.index.name or "subject")).to_parquet(path)
        try:
            return read_new_responses(run, path)
        except DataFormatError as err:
            raise DataFormatError(str(err).replace(str(path), "the DataFrame")) from None


def score(run: Run | str | Path, responses, *, settings: FitSettings | None = None,
          num_draws: int = 1000, top_k: int | None = None, seed: int = 0,
          method: str = "auto") -> tuple[pd.DataFrame, FitResult]:
    """Score new subjects and place them on the run's leaderboard.

    ``top_k`` (P(top-k) on the combined board) is by default the run's own (fit.json's
    ``readout.top_k``), so the board reads as the run's leaderboard does.

    Returns
    -------
    ``(board, result)``: the combined subject table (``new`` marks scored subjects,
    rank statistics over everyone) and the frozen fit.

    Examples
    --------
    >>> board, res = score("runs/nlu", "new_models.csv")  # doctest: +SKIP
    """
    run = _run(run)
    if top_k is None:
        top_k = int((run.info.get("readout") or {}).get("top_k") or 3)
    if any(p.shape != () for p in run.spec.by_owner("subject")):
        raise SettingsError(f"run {run.path} has vector abilities (model {run.info['model']!r}); "
                            f"score places scalar abilities on a leaderboard: score a scalar-ability "
                            f"run, or refit with the new subjects")
    on_board = set(run.subjects["subject"].astype(str))
    if isinstance(responses, np.ndarray):  # named new0, new1, ... (new_0, ... where the run
        prefix = "new"  # has such names)
        while any(f"{prefix}{i}" in on_board for i in range(responses.shape[0])):
            prefix += "_"
        y, ids = responses, np.asarray([f"{prefix}{i}" for i in range(responses.shape[0])],
                                       dtype=object)
    elif type(responses).__module__.startswith("pandas") and hasattr(responses, "columns"):
        y, ids = _read_frame(run, responses)
    elif isinstance(responses, (str, Path)) or type(responses).__name__ == "Store":
        y, ids = read_new_responses(run, responses)
    else:
        raise SettingsError(f"responses: a file path, a pandas DataFrame (index: subject ids, "
                            f"columns: item ids) or a numpy array in the run's item order; got "
                            f"{type(responses).__name__}")
    taken = [s for s in ids if str(s) in on_board]
    if taken:  # two rows of one name on the combined board, told apart only by `new`
        source = "the DataFrame" if not isinstance(responses, (str, Path)) else responses
        raise DataFormatError(
            f"{source}: subject id(s) {taken[:5]}{' ...' if len(taken) > 5 else ''} "
            f"({len(taken)} of {len(ids)}) already on run {run.path}'s leaderboard; give the "
            f"new subjects ids of their own (e.g. 'NAME-v2'), or refit with them to replace "
            f"the run's")
    res = score_responses(run, y, settings=settings, method=method)
    table = pd.DataFrame(result_columns(res, "subject"))  # exact intervals where computed
    twins = res.extra.get("run_twins")
    if twins is not None and (twins >= 0).any():  # sheets the run has read: its numbers, as
        mine, theirs = np.flatnonzero(twins >= 0), twins[twins >= 0]  # subjects.parquet has
        for col in table.columns.intersection(run.subjects.columns):  # them (NUTS: its draws')
            table.loc[mine, col] = run.subjects[col].to_numpy()[theirs]
    stats = response_stats(y)
    table.insert(0, "subject", ids)
    table["accuracy"] = stats["subject_mean"]
    table["n_responses"] = stats["subject_n"]
    subject_guide = GuideState({"ability": res.guide.loc["ability"]},
                               {"ability": res.guide.log_scale["ability"]})
    board = place_on_leaderboard(run, table, subject_guide, num_draws=num_draws, top_k=top_k,
                                 seed=seed, new_quantiles=res.quantile_functions.get("ability"))
    return board, res
