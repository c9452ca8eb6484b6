"""Command line: parse, build settings, call the library, print. Thin by design."""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys
import tempfile
import time
import warnings
from importlib import resources
from pathlib import Path

from engine.compile_cache import use_compilation_cache
from engine.errors import IRTError, SettingsError
from engine.terminal import EscapedStream, escape_controls

__all__ = ["main", "run", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the option, what was wrong, and where help is."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _count(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def _real(low: float, high: float, *, closed_low: bool = False, closed_high: bool = False):
    """An argparse type: a finite number in (low, high), ends included where said."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = (value >= low if closed_low else value > low) and \
            (value <= high if closed_high else value < high)
        if not ok or value != value:
            lo, hi = "[" if closed_low else "(", "]" if closed_high else ")"
            raise argparse.ArgumentTypeError(f"must be a finite number in {lo}{low:g}, {high:g}{hi}, "
                                             f"got {text}")
        return value
    parse.__name__ = "number"
    return parse


_POSITIVE, _NONNEGATIVE = _count(1), _count(0)
_TOL = _real(0.0, float("inf"))
_SHARE = _real(0.0, 1.0)
_PROBABILITY = _real(0.0, 1.0, closed_low=True, closed_high=True)


def _settings(args):
    from engine.infer.settings import FitSettings, parse_bytes

    budget = getattr(args, "memory_budget", None)
    # the command line sets no min_passes: a --max-passes under its default lowers it too
    min_passes = min(FitSettings.min_passes, args.max_passes)
    return FitSettings(optimizer=args.optimizer, max_passes=args.max_passes, tol=args.tol,
                       min_passes=min_passes,
                       seed=args.seed, num_devices=args.devices, progress=not args.quiet,
                       checkpoint_every=getattr(args, "checkpoint_every", 0),
                       mc_draws=getattr(args, "mc_draws", 0),
                       ability_factor=getattr(args, "ability_factor", "auto"),
                       nuts_first_subjects=getattr(args, "nuts_first_subjects",
                                                   FitSettings.nuts_first_subjects),
                       memory_budget=parse_bytes(budget) if budget is not None else None)


def _progress(enabled: bool, max_passes: int):
    if not enabled:
        return None, None
    from tqdm import tqdm

    bars = []

    def update(i, record):
        if not bars:
            bars.append(tqdm(total=max_passes, desc="fit", unit="pass", leave=False, file=sys.stderr))
        bar = bars[0]
        bar.update(1)
        bar.set_postfix(elbo=f"{record['elbo_smooth']:.6g}")

    return update, bars


def _long_columns(text: str | None) -> dict[str, str] | None:
    """``--columns subject=A,item=B,response=C`` as a dict (checked by ``ingest``)."""
    if text is None:
        return None
    out = {}
    for part in text.split(","):
        role, eq, name = part.partition("=")
        if not eq or not role.strip():
            raise SettingsError(f"--columns {text}: {part!r} is not ROLE=NAME; e.g. --columns "
                                f"subject=system,item=seg_id,response=score")
        if role.strip() in out:
            raise SettingsError(f"--columns {text}: {role.strip()} is named twice")
        out[role.strip()] = name
    return out


def cmd_ingest(args) -> int:
    from engine.atomic import exclusive_lock
    from engine.data import ingest

    from engine.infer.settings import parse_bytes

    budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
    with exclusive_lock(Path(args.out)):  # one writer; a killed one's spill and temp removed
        store = ingest(args.inputs, args.out, fmt=args.format, overwrite=args.overwrite,
                       layout=args.layout, memory_budget=budget, kind=args.kind,
                       id_column=args.id_column, metric=args.metric, keep=args.keep,
                       filters=args.filter, columns=_long_columns(args.columns))
    if args.format is None and args.columns is None:  # --columns: long, not detected
        print(f"detected format {store.meta.get('input_format')}")
    print(f"wrote {store.path}: {store.num_subjects} subjects x {store.num_items} items, "
          f"{store.num_observed} observed ({store.density:.1%}), kind {store.kind}, "
          f"layout {store.layout}")
    for note in store.notes:
        print(f"note: {note}")
    return 0


def _check_run_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to fit into a finished run or an unfinished one's checkpoint unless told to."""
    from engine.errors import RunExistsError
    from engine.infer.checkpoint import has_checkpoint, remove_leftovers

    if out.is_symlink():
        raise RunExistsError(f"--out {out} is a symlink; irt-engine neither writes through nor "
                             f"replaces one: give the real directory or another --out")
    if not out.exists():
        return
    if not out.is_dir():
        raise RunExistsError(f"--out {out} is a file, not a directory; choose another --out")
    remove_leftovers(out)  # a killed checkpoint write's temporary files (the fit holds the lock)
    is_run = (out / "fit.json").is_file() or has_checkpoint(out)
    if overwrite and not is_run and any(out.iterdir()):
        raise RunExistsError(f"--out {out} is not a run directory (no fit.json or checkpoint.json), so "
                             f"--overwrite will not remove it; choose another --out")
    if overwrite:
        return
    if (out / "fit.json").exists():
        raise RunExistsError(f"run directory {out} holds a finished run; pass --overwrite to "
                             f"replace it or choose another --out")
    if has_checkpoint(out) and not resume:
        raise RunExistsError(f"run directory {out} holds the checkpoint of an unfinished fit; "
                             f"pass --resume to continue it, or --overwrite to start over")
    if not has_checkpoint(out) and any(out.iterdir()):
        raise RunExistsError(f"{out} exists and is not a run directory; choose another --out")


def _fit_and_save(store_path, out, args) -> "object":
    from engine.api import fit
    from engine.infer.checkpoint import Checkpointer, has_checkpoint
    from engine.run import save_run

    settings = _settings(args)
    options = _skill_options(store_path, args)
    out, resume = Path(out), getattr(args, "resume", False)
    _check_run_dir(out, resume, args.overwrite)
    if args.overwrite and not resume:
        Checkpointer(out, 0, {}).clear()
    if resume and not has_checkpoint(out):
        print(f"note: --resume found no checkpoint in {out}; the fit starts from pass 0",
              file=sys.stderr)
    update, bar = _progress(settings.progress, settings.max_passes)
    try:
        res = fit(store_path, model=args.model, settings=settings, prior=args.prior,
                  signed_discrimination=args.signed_discrimination, progress_fn=update,
                  model_options=options,
                  checkpoint_dir=out if settings.checkpoint_every else None, resume=resume,
                  on_checkpoint=getattr(args, "on_checkpoint", None))  # a URL --out: uploads
    finally:
        for bar in bar or []:
            bar.close()
    # The run directory holds at most this fit's checkpoint now: replace it with the run.
    run = save_run(res, out, num_draws=args.draws, top_k=args.top_k, seed=args.seed,
                   overwrite=True)
    if "diagnostics" in res.extra:  # auto's fallback on a small matrix: NUTS's draws
        print(_nuts_status(args.model, res, "fit --method nuts --warmup/--samples"))
    else:
        status = "converged" if res.converged else "NOT converged (raise --max-passes)"
        print(f"{args.model} fit {status} in {res.num_passes} passes, {res.wall_time_s:.1f} s "
              f"({res.num_observed * res.num_passes / res.wall_time_s:.3g} cells/s); ELBO "
              f"{res.elbo:.6g}")
    inflation = res.extra["model_options"].get("inflation")
    if inflation not in (None, "none"):
        print(f"exact boundary values {res.extra['data'].get('boundary')}: fitted with "
              f"{inflation} inflation (recorded in fit.json)")
    print(f"wrote {run.path}")
    _print_fit_notes(run)  # e.g. auto's mean-field fallback
    return run


def _print_fit_notes(run) -> None:
    """What the leaderboard will say about how ``run`` was fitted, on stderr (not its
    convergence: the fit command's own line says that)."""
    from engine.readout.leaderboard import fit_notes

    for note in fit_notes(run.info, convergence=False):
        print(note, file=sys.stderr)


def _skill_options(store_path, args) -> dict:
    """``--dims`` / ``--q-matrix`` as model options (Q rows matched to the store's item ids)."""
    options = {}
    if getattr(args, "inflation_owner", None):
        options["inflation_owner"] = args.inflation_owner
    if getattr(args, "dims", None) is not None:
        options["dims"] = args.dims
    if getattr(args, "q_matrix", None):
        from engine.data.store import open_store
        from engine.models.multidim import read_q_matrix

        items = [str(i) for i in open_store(store_path).items]
        q, skills = read_q_matrix(args.q_matrix, items=items)
        options.update(q_matrix=q.tolist(), skills=skills)
    if getattr(args, "q_matrix_from", None):
        from engine.data.formats import q_matrix_from
        from engine.data.store import open_store

        if getattr(args, "q_matrix", None):
            raise SettingsError("give --q-matrix or --q-matrix-from, not both")
        q, skills = q_matrix_from(open_store(store_path), args.q_matrix_from)
        options.update(q_matrix=q.tolist(), skills=skills)
    return options


# fit options one --method reads and the other does not: given to the other, an error
_NUTS_ONLY = ("chains", "warmup", "samples", "extend", "target_accept", "low_rank")
_VI_ONLY = ("optimizer", "max_passes", "tol", "mc_draws", "ability_factor",
            "nuts_first_subjects", "checkpoint_every", "devices")


def _check_method_options(args) -> None:
    """Refuse options the chosen ``--method`` does not read (they had been ignored without a
    word: ``--method nuts --max-passes 3`` sampled as usual), by their value differing from
    the default."""
    defaults = getattr(args, "method_defaults", None) or {}
    method = getattr(args, "method", "vi")
    other = "vi" if method == "nuts" else "nuts"
    unused = _VI_ONLY if method == "nuts" else _NUTS_ONLY
    given = ["--" + d.replace("_", "-") for d in unused
             if d in defaults and getattr(args, d, defaults[d]) != defaults[d]]
    if given:
        raise SettingsError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to "
                            f"--method {other} only, and this fit is --method {method}; drop "
                            f"{'it' if len(given) == 1 else 'them'} or fit with --method {other}")


def cmd_fit(args) -> int:
    from engine.atomic import exclusive_lock
    from engine.data.remote import is_url, no_store

    _check_method_options(args)

    if not is_url(str(args.store)) and not Path(args.store).exists():
        raise no_store(args.store)  # at once, before the fit's imports (0.6 s)

    with exclusive_lock(Path(args.out)):  # a second fit into the same --out fails at once
        if getattr(args, "method", "vi") == "nuts":
            _nuts_and_save(args)
            return 0
        _fit_and_save(args.store, args.out, args)
    return 0


def _nuts_and_save(args) -> None:
    """``fit --method nuts``: the exact NUTS reference, written as the same run directory."""
    from engine.api import fit_nuts
    from engine.infer.nuts import NutsSettings
    from engine.infer.settings import parse_bytes
    from engine.run import save_run

    budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
    settings = NutsSettings(num_chains=args.chains, num_warmup=args.warmup,
                            num_samples=args.samples, seed=args.seed, memory_budget=budget,
                            low_rank=args.low_rank, extend=args.extend,
                            target_accept=args.target_accept)
    if args.resume:
        raise SettingsError("--resume applies to --method vi only; a NUTS run starts afresh")
    out = Path(args.out)
    _check_run_dir(out, False, args.overwrite)
    res = fit_nuts(args.store, model=args.model, settings=settings, prior=args.prior,
                   signed_discrimination=args.signed_discrimination,
                   model_options=_skill_options(args.store, args))
    # --draws: the rank draws of a model ranked by its expected score (drawn from the guide);
    # one ranked by ability reads all of the sampler's own draws
    run = save_run(res, out, num_draws=args.draws, top_k=args.top_k, seed=args.seed,
                   overwrite=args.overwrite)
    print(_nuts_status(args.model, res, "--warmup/--samples or --extend"))
    print(f"wrote {run.path} (draws in draws.nc, ArviZ)")
    _print_fit_notes(run)  # e.g. divergent transitions


def _nuts_status(model: str, res, remedy: str) -> str:
    """One line on a NUTS result: converged or not by the R-hat rule, ``remedy`` if not."""
    d = res.extra["diagnostics"]
    status = "converged" if res.converged else (
        f"NOT converged (R-hat {d['rhat_max']:.3f} > {d['max_rhat']}: raise {remedy})")
    return (f"{model} NUTS {status}: {d['num_chains']} chains x {d['num_samples']} draws in "
            f"{res.wall_time_s:.1f} s; min bulk ESS {d['ess_bulk_min']:.0f} "
            f"({d['ess_bulk_min_per_s']:.3g}/s), {d['divergences']} divergences" + (
                f"; posterior sds to within {100 * d['mcse_sd_rel_max']:.0f}% (Monte Carlo error; "
                f"raise --samples to narrow)" if math.isfinite(d["mcse_sd_rel_max"]) else ""))


def _scalar_subjects(run_dir):
    """A run's subjects table (column name -> array) and its fit.json when its ability is one
    number, read without JAX, pandas or the model (``None`` for vector abilities, which need
    the model's posterior draws)."""
    from engine import runfiles

    if "://" in str(run_dir):  # a URL: load_run fetches it
        return None
    path = Path(run_dir)
    info = runfiles.read_info(path)
    params = (info.get("spec") or {}).get("params") or []
    ability = next((p for p in params if p.get("name") == "ability"), None)
    if ability is None or list(ability.get("shape", [None])) != []:
        return None
    runfiles.check_present(path, info)
    from engine.readout.leaderboard import table_columns

    return table_columns(runfiles.read_table(path, info, "subjects.parquet", arrow=True)), info


def _print_board(board, info) -> None:
    """The leaderboard's table, then what its fit.json says a reader should know."""
    from engine.readout.leaderboard import fit_notes, format_leaderboard, response_kind

    print("\n".join([format_leaderboard(board, response_kind(info)), *fit_notes(info)]))


def cmd_leaderboard(args) -> int:
    from engine.readout.leaderboard import leaderboard

    # --draws or --seed: the board's draws read again (a scalar board's rank statistics
    # are otherwise the fit's, as subjects.parquet holds them)
    redraw = args.draws is not None or args.seed is not None
    if getattr(args, "by", None) is None and args.rank is None and not redraw:
        scalar = _scalar_subjects(args.run)  # the everyday board: no JAX to import
        if scalar is not None:
            _print_board(leaderboard(scalar[0], args.top_k), scalar[1])
            return 0
    from engine.run import load_run

    run = load_run(args.run)
    vector = run.spec.param("ability").shape != ()
    if getattr(args, "by", None) is not None:
        if args.by != "group":
            raise SettingsError(f"--by {args.by}: the one per-group board is --by group")
        if args.rank is not None:
            raise SettingsError("--by group gives one board per group, each ranked by its own "
                                "skill: drop --rank")
        if not vector:
            raise SettingsError(f"--by group: run {run.path} has one ability for all items "
                                f"(model {run.info.get('model')}); per-group boards need a run "
                                f"fitted with fit --q-matrix-from group")
        for skill in run.spec.skills:
            print(f"== {skill} ==")
            args.rank = f"skill={skill}"
            _vector_leaderboard(run, args)
        return 0
    if args.rank is None and not vector:
        table = run.subjects_redrawn(args.draws, args.seed) if redraw else run.subjects
        _print_board(leaderboard(table, args.top_k), run.info)
        return 0
    return _vector_leaderboard(run, args)


def _vector_leaderboard(run, args) -> int:
    from engine.readout.leaderboard import fit_notes  # what the scalar board says, too
    from engine.readout.vector_rank import format_vector_board, run_vector_board

    board = run_vector_board(run, args.rank, threshold=args.threshold, num_draws=args.draws,
                             seed=args.seed)
    print("\n".join([format_vector_board(board, args.top_k), *fit_notes(run.info)]))
    return 0


def cmd_demo(args) -> int:
    from engine.data import ingest
    from engine.readout.leaderboard import leaderboard

    t0 = time.perf_counter()
    data = resources.files("engine") / "demo_data" / "wmt20_ende_mqm_errorfree.csv"
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="irt-demo-"))
    print("irt-engine demo: WMT20 English-German MT systems x segments, 1 = no MQM error found")
    print("data: google/wmt-mqm-human-evaluation (Apache-2.0), Freitag et al. TACL 2021\n")
    with resources.as_file(data) as path:
        store = ingest(path, out / "store", overwrite=True)
    print(f"ingested {store.num_subjects} systems x {store.num_items} segments -> {store.path}")
    args.overwrite = True
    run = _fit_and_save(store.path, out / "run", args)
    print()
    _print_board(leaderboard(run.subjects, args.top_k_rows), run.info)
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f} s; run directory {run.path}")
    return 0


# --- item analysis and evaluation design -----------------------------------------------

def _check_table_out(out) -> None:
    """Refuse a table ``--out`` that cannot be written before any work: a name other than
    .csv or .parquet, an existing folder, or a folder path through a file. An existing
    file is replaced (atomically) when the table is written."""
    if out is None:
        return
    out = Path(out)
    if out.suffix not in (".csv", ".parquet"):
        raise SettingsError(f"--out {out}: use a .csv or .parquet file name")
    if out.is_dir():
        raise SettingsError(f"--out {out}: a folder; give a .csv or .parquet file name")
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise SettingsError(f"--out {out}: {parent} is a file, not a folder; choose another path")


def _write_table(df, out) -> None:
    """Write a table to ``out`` (.csv or .parquet) atomically."""
    from engine.atomic import atomic_write

    out = Path(out)
    _check_table_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: df.to_csv(tmp, index=False) if out.suffix == ".csv"
                 else df.to_parquet(tmp, index=False))
    print(f"wrote {out}")


def _ability_range(text: str | None):
    if text is None:
        return None
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise SettingsError(f"--ability {text!r}: expected LO,HI, e.g. --ability -1,2") from None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise SettingsError(f"--ability {text!r}: expected two finite abilities LO,HI, e.g. "
                            f"--ability -1,2")
    return lo, hi


def cmd_items(args) -> int:
    import pandas as pd

    from engine.readout.items import (SET_ASIDE_NOTE, choose_subjects, expected_probabilities,
                                      load_run_responses, quartile_table, review_items)
    from engine.run import load_run

    _check_table_out(args.out)  # before any work
    run = load_run(args.run)
    y = load_run_responses(run, args.store)
    chosen = choose_subjects(run, y, args.subjects.split(",") if args.subjects else None)
    table = review_items(run, y, top=None if args.out else args.top, num_subjects=args.num_subjects,
                         include_set_aside=bool(args.out))
    show = ["item", "review_score", "flagged", "reversal_z"] + \
        [c for c in ("p_negative_discrimination", "p_low_feasibility") if c in table] + \
        [c for c in ("difficulty_mean", "discrimination_mean", "feasibility_mean") if c in table] + \
        ["mean_response", "expected_mean", "residual_corr", "residual_z"]
    info = table.attrs
    aside = info["set_aside"]
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 80):
        print(f"items ranked for review ({info['num_informative']} informative of {len(run.items)}); "
              f"{info['num_flagged']} flagged: review score > {info['threshold']:.2f}, which an item "
              f"that works passes at most {1 - info['threshold']:.0%} of the time")
        print(table.head(args.top)[show].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if aside:
            print(f"\nset aside, not ranked ({SET_ASIDE_NOTE}): {len(aside)} item(s): "
                  f"{', '.join(aside[:10])}{', ...' if len(aside) > 10 else ''}")
        print("\nsubjects disagreeing most with the model on those items:")
        for r in table.head(args.top).itertuples():
            print(f"  {r.item}: {r.disagreeing}")
        quart = quartile_table(run.items, run.subjects, y, chosen, expected_probabilities(run, chosen))
        print(f"\naccuracy by difficulty and discrimination quartile ({quart.attrs['num_items']} items, "
              f"{quart.attrs['excluded_negative_discrimination']} with negative discrimination left out):")
        print(quart.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        _write_table(table, args.out)
    return 0


def cmd_score(args) -> int:
    from engine.readout.leaderboard import format_leaderboard, leaderboard
    from engine.score import score

    _check_table_out(args.out)  # before any work
    t0 = time.perf_counter()
    board, res = score(args.run, args.responses, num_draws=args.draws, seed=args.seed,
                       method=args.method)
    lb = leaderboard(board)
    new = lb[lb["new"]]
    exact = str(res.extra.get("abilities", "")).startswith("exact")
    twins = res.extra.get("run_twins")
    known = 0 if twins is None else int((twins >= 0).sum())
    how = ("every sheet the run's own: the run's read-outs" if known == len(new) else
           "each sheet's exact posterior over the run's item draws" if exact else
           "grid update, 1 pass" if res.extra.get("method") == "grid" else
           f"frozen fit, {res.num_passes} passes, {'converged' if res.converged else 'NOT converged'}")
    if 0 < known < len(new):
        how += f"; {known} sheet(s) the run's own: the run's read-outs"
    print(f"scored {len(new)} new subject(s) against frozen items in {time.perf_counter() - t0:.1f} s "
          f"({how})")
    print(format_leaderboard(lb if args.all else new, res.spec.kind))
    if args.out:
        _write_table(lb, args.out)
    return 0


def cmd_subset(args) -> int:
    import numpy as np

    from engine.readout.items import item_bank, load_run_responses
    from engine.readout.subset import evaluate_subsets, select_informative, target_grid
    from engine.run import load_run

    _check_table_out(args.out)  # before any work
    run = load_run(args.run)
    y = load_run_responses(run, args.store)
    bank = item_bank(run.spec, run.guide)
    grid = target_grid(run.subjects["ability_mean"].to_numpy(), _ability_range(args.ability))
    chosen = select_informative(bank, args.size, grid)
    subsets = {"informative": chosen}
    if "discrimination" in bank.params:
        subsets["top_discrimination"] = np.argsort(-bank.params["discrimination"], kind="stable")[:args.size]
    ev = evaluate_subsets(run, y, subsets, num_random=args.random, seed=args.seed)
    info = bank.subset(chosen).information(grid).sum(axis=1)
    items = run.items.iloc[chosen].reset_index(drop=True)
    print(f"{args.size} items maximising test information over abilities "
          f"{grid.min():+.2f}..{grid.max():+.2f} (test information {info.min():.2f}..{info.max():.2f}):")
    cols = ["item"] + [c for c in ("difficulty_mean", "discrimination_mean") if c in items]
    print(items[cols].to_string(float_format=lambda v: f"{v:.3f}"))
    print("\nKendall tau of the ranking on the subset (items frozen) to the full ranking:")
    print(ev.summary().to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        _write_table(items.assign(selection_order=range(1, len(items) + 1)), args.out)
    return 0


def cmd_calibration(args) -> int:
    import numpy as np
    import pandas as pd

    from engine.readout.calibration import calibration_report, load_confidences
    from engine.readout.items import expected_probabilities, load_run_responses
    from engine.run import load_run

    _check_table_out(args.out)  # before any work
    run = load_run(args.run)
    y = load_run_responses(run, args.store)
    subjects, items = run.subjects["subject"].astype(str), run.items["item"].astype(str)
    conf = load_confidences(args.confidences, subjects, items)
    p = expected_probabilities(run, np.arange(len(subjects)))
    rep = calibration_report(p, y, conf, subjects, items, top=args.top)
    fmt = lambda v: f"{v:.3f}"
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print("per subject: overconfidence = P_irt(correct) - confidence (negative: claims too much);")
        print("ECE before (raw confidence), after (joint response-and-confidence model), of the IRT probability")
        print(rep["subjects"].to_string(index=False, float_format=fmt))
        print(f"\nitems with the most extreme mean overconfidence (of {len(items)}):")
        print(rep["extreme_items"].to_string(index=False, float_format=fmt))
    if not rep["joint"]["converged"]:
        print("warning: the joint confidence model did not converge")
    if args.out:
        _write_table(rep["subjects"], args.out)
    return 0


def cmd_report(args) -> int:
    from engine.errors import StoreNotFoundError
    from engine.readout.items import item_readouts_unavailable, load_run_responses
    from engine.readout.report import check_report_paths, write_report
    from engine.run import load_run

    check_report_paths(args.out, args.compare, args.stability, args.dimensions)  # before reading
    run = load_run(args.run)
    y = None
    if item_readouts_unavailable(run.spec) is None:  # the responses feed the item flags only
        try:
            y = load_run_responses(run, args.store)
        except StoreNotFoundError as err:
            if args.store:
                raise
            print(f"note: no item flags in the report ({err})", file=sys.stderr)
    written = write_report(run, args.out, y, items=args.items.split(",") if args.items else None,
                           stability=args.stability, dimensions=args.dimensions, compare=args.compare)
    print(f"wrote {written.pop('html')} and {len(written)} PNGs beside it")
    return 0


def cmd_compare(args) -> int:
    from engine.errors import RunExistsError
    from engine.readout.compare import compare, format_comparison, parse_models, write_comparison
    from engine.readout.leaderboard import fallback_notes

    q = None
    if args.q_matrix:
        from engine.data.store import open_store
        from engine.models.multidim import read_q_matrix

        q = read_q_matrix(args.q_matrix, items=[str(i) for i in open_store(args.store).items])
    models = parse_models(args.models, q_matrix=q)  # a bad token fails before any fit
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SettingsError(f"--out {args.out}: a file; compare writes a folder (compare.parquet "
                            f"and compare.json): choose a folder path")
    if args.out and (Path(args.out) / "compare.parquet").exists() and not args.overwrite:
        raise RunExistsError(f"{Path(args.out) / 'compare.parquet'} exists; pass --overwrite or "
                             f"choose another --out")
    settings = _settings(args)

    def report(label, row):
        if settings.progress:
            print(f"  {label}: held-out log-likelihood {row['heldout_loglik']:.6g} "
                  f"({row['passes']} passes, {row['wall_s']:.1f} s)", file=sys.stderr)

    table = compare(args.store, models, holdout=args.holdout, seed=args.seed, settings=settings,
                    prior=args.prior, num_draws=args.draws, q_matrix=q, progress_fn=report)
    s = table.attrs["settings"]
    aside = table["num_heldout_set_aside"].iloc[0]
    unscored = (f"; {aside} more not scored: their items' training responses are all alike, "
                f"which no model fits") if aside else ""
    print(f"{len(table)} models fitted on {s['shape'][0]} x {s['shape'][1]} ({s['kind']}) with "
          f"{table['num_heldout'].iloc[0]} cells held out ({args.holdout:g}, seed {args.seed}"
          f"{unscored}); best held-out log-likelihood first:")
    print(format_comparison(table))
    for note in fallback_notes(table):
        print(f"note: {note}")
    if args.out:
        parquet, meta = write_comparison(table, args.out)
        print(f"wrote {parquet} and {meta}")
    return 0


def _runner(args):
    from cluster.settings import RunnerSettings

    return RunnerSettings(backend=args.backend, address=args.address, batch_size=args.batch_size,
                          max_in_flight=args.max_in_flight, max_retries=args.max_retries,
                          num_cpus=args.num_cpus, progress=not args.quiet,
                          verbose=args.verbose)


def cmd_stability(args) -> int:
    from cluster.settings import StabilitySettings, parse_sizes
    from cluster.stability import run_stability

    settings = StabilitySettings(
        sizes=parse_sizes(args.sizes) if args.sizes else None, trials_per_size=args.trials_per_size,
        model=args.model, prior=args.prior, passes=args.passes, bootstrap=args.bootstrap,
        seed=args.seed)
    res = run_stability(args.store, args.out, settings, _runner(args), _trial_fit_settings(args))
    cols = ["size", "method", "trials", "tau_between_mean", "tau_full_mean", "diff_mean",
            "diff_p_value"]
    print(res.summary[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    irt = res.summary[res.summary["method"] == "irt"]
    _unconverged_note((irt["converged_share"] * irt["trials"]).sum(), irt["trials"].sum(),
                      "IRT trials", settings.passes)
    print(f"wrote {res.path / 'stability.parquet'}, summary.parquet, stability.png")
    return 0


def _unconverged_note(converged: float, total: int, what: str, passes: int) -> None:
    """A note where refits stopped at ``--passes`` before converging: their abilities lean
    towards the full fit each starts from."""
    left = int(round(total - converged))
    if left:
        print(f"note: {left} of {int(total)} {what} stopped at --passes {passes} before "
              f"converging (each starts from the full fit, so an unconverged one leans towards "
              f"it); raise --passes to let them converge")


def cmd_bootstrap(args) -> int:
    from cluster.bootstrap import run_bootstrap
    from cluster.settings import BootstrapSettings

    settings = BootstrapSettings(replicates=args.replicates, model=args.model, prior=args.prior,
                                 passes=args.passes, seed=args.seed)
    res = run_bootstrap(args.store, args.out, settings, _runner(args), _trial_fit_settings(args))
    print(res.intervals.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    per_replicate = res.replicates.groupby("replicate")["converged"].all()
    _unconverged_note(per_replicate.sum(), len(per_replicate), "replicates", settings.passes)
    print(f"wrote {res.path / 'bootstrap.parquet'}, intervals.parquet")
    return 0


def cmd_dimensions(args) -> int:
    from cluster.dimensions import run_dimensions
    from cluster.settings import DimensionsSettings

    settings = DimensionsSettings(shuffles=args.shuffles, model=args.model, prior=args.prior,
                                  num_eigenvalues=args.num_eigenvalues,
                                  residual_simulations=args.residual_simulations, seed=args.seed)
    res = run_dimensions(args.store, args.out, settings, _runner(args), _trial_fit_settings(args))
    print(res.table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"suggested number of skills: {res.summary['n_factors']} ({res.summary['reading']})")
    print(f"wrote {res.path / 'eigenvalues.parquet'}, summary.json, scree.png")
    return 0


def cmd_adaptive(args) -> int:
    from cluster.adaptive import run_adaptive
    from engine.readout.adaptive import AdaptiveTrialSpec

    if args.trials < 1:
        raise SettingsError(f"--trials must be >= 1, got {args.trials}")
    try:
        checkpoints = tuple(int(c) for c in args.checkpoints.split(","))
    except ValueError:
        raise SettingsError(f"--checkpoints {args.checkpoints!r}: give whole numbers, e.g. 1,5,10")
    spec = AdaptiveTrialSpec(run=str(args.run), store=args.store,
                             strategies=tuple(args.strategies.split(",")), checkpoints=checkpoints,
                             holdout_fraction=args.holdout, pool_size=args.pool_size, seed=args.seed)
    res = run_adaptive(args.run, args.out, spec, args.trials, _runner(args))
    print(res.summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {res.path / 'adaptive.parquet'}, summary.parquet, adaptive.png")
    return 0


def cmd_submit(args) -> int:
    from cluster.submit import submit

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    return submit(command, address=args.address, working_dir=args.working_dir, python=args.python,
                  verbose=args.verbose)


def _runner_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None,
                   help="join this Ray cluster (default: start a local Ray on 127.0.0.1)")
    p.add_argument("--backend", default="ray", choices=["ray", "inprocess"])
    p.add_argument("--batch-size", type=_POSITIVE, default=8, help="trials fitted together per task")
    p.add_argument("--max-in-flight", type=_POSITIVE, default=None, help="tasks running at once")
    p.add_argument("--max-retries", type=_NONNEGATIVE, default=3, help="resubmissions of a failed task")
    p.add_argument("--num-cpus", type=_POSITIVE, default=None, help="CPUs of the local Ray")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="show Ray's own log lines")


def _trial_fit_settings(args):
    """Fit settings of a trial command: its seed, and its memory budget (over it, trials read
    the items they sample from the store instead of receiving the whole matrix)."""
    from engine.infer.settings import FitSettings, parse_bytes

    budget = getattr(args, "memory_budget", None)
    return FitSettings(seed=args.seed, memory_budget=parse_bytes(budget) if budget else None)


def _prior_option(p: argparse.ArgumentParser) -> None:
    """``--prior``, the same for every command that fits (None: the model's own)."""
    p.add_argument("--prior", default=None, choices=["population", "vague", "hierarchical"],
                   help="default: the model's own, population for 1pl-4pl and feas "
                        "(abilities N(0, 1) set the scale; items pooled; asymptotes Beta), "
                        "vague for the others; vague and hierarchical are seed 003's")


def _trial_model_options(p: argparse.ArgumentParser, binary_only: bool = False) -> None:
    p.add_argument("store", help="response store: a path or an s3://, gs://, file:// URL")
    p.add_argument("--out", required=True, help="directory for the results (resumes if "
                   "present); a URL is written locally and uploaded at the end")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="memory for the responses, e.g. 512M (default: half the available "
                        "memory); over it, stability and bootstrap trials read the items they "
                        "sample from the store, and dimensions refuses before reading")
    p.add_argument("--model", default="2pl",
                   help="a one-ability binary model: 1pl, 2pl, 3pl, 4pl or feas (the residual "
                        "eigenvalues read its P(correct))" if binary_only else
                        "a one-ability model: 1pl, 2pl, 3pl, 4pl or feas (binary), beta, "
                        "beta-1pl or beta3 (scores in [0, 1]), gamma (errors >= 0)")
    _prior_option(p)


def _fit_options(p: argparse.ArgumentParser, model_default: str = "2pl") -> None:
    p.add_argument("--model", default=model_default,
                   help="1pl, 2pl, 3pl, 4pl, feas, beta, beta-1pl, gamma, beta3, mirt-comp, "
                        "mirt-noncomp or irt-vec")
    _prior_option(p)
    p.add_argument("--signed-discrimination", action="store_true",
                   help="allow negative discrimination (flags annotation errors)")
    p.add_argument("--optimizer", default="auto", choices=["auto", "newton", "adam"],
                   help="auto (default): the model's own (adam for gamma, else newton); "
                        "naming the other is refused")
    p.add_argument("--max-passes", type=_POSITIVE, default=500,
                   help="most passes over the data (the quadrature fit's EM iterations)")
    p.add_argument("--tol", type=_TOL, default=1e-4,
                   help="relative ELBO change to stop at (the mean-field fit; the quadrature "
                        "fit stops on its own test, fit.json's quadrature.mode_converged)")
    p.add_argument("--seed", type=int, default=0,
                   help="every random draw of the fit: the mean-field fit's Monte Carlo draws, "
                        "the quadrature fit's importance and sampler draws, the rank draws; "
                        "refit with another to see their Monte Carlo error")
    p.add_argument("--devices", type=_POSITIVE, default=None, help="local devices to use (default all)")
    p.add_argument("--draws", type=_POSITIVE, default=1000, help="joint posterior draws for ranks")
    p.add_argument("--mc-draws", type=_NONNEGATIVE, default=0, metavar="K",
                   help="Monte Carlo draws of the posterior averaged per step (default 0: "
                        "automatic, up to 16 below a million observed cells)")
    p.add_argument("--top-k", type=_POSITIVE, default=3, help="k of the P(top-k) column")
    p.add_argument("--ability-factor", default="auto",
                   choices=["auto", "gaussian", "quadrature"],
                   help="quadrature: abilities integrated out (binary 1PL-4PL/feas, "
                        "population or vague priors), items at their marginal mode; "
                        "gaussian: mean-field; auto (default): quadrature where it applies, "
                        "up to 1,000 responses per subject and 500,000 observed cells "
                        "(fit.json records which)")
    p.add_argument("--nuts-first-subjects", type=_NONNEGATIVE, default=30, metavar="S",
                   help="auto: sample a board of fewer subjects with NUTS (the exact "
                        "posterior) where the quadrature fit would run, up to 12,000 observed "
                        "cells (default 30; 0: never)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--dims", type=_POSITIVE, default=None, help="skills D of mirt-comp/mirt-noncomp/irt-vec")
    p.add_argument("--inflation-owner", default=None, choices=["both", "subject", "item"],
                   help="beta/gamma/beta3: whose probability of an exact boundary value "
                        "(default both: per subject with item offsets; item was the only "
                        "choice before)")
    p.add_argument("--q-matrix", default=None,
                   help="items x skills CSV (item id column, one 0/1 column per skill): confirmatory")
    p.add_argument("--q-matrix-from", default=None, metavar="COLUMN",
                   help="the confirmatory Q-matrix from the store's item column (group: each "
                        "item's evaluation or task, from evaluation logs), one skill per group")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="memory for the responses, e.g. 512M or 4G (default: half the available "
                        "memory); larger stores are streamed from disk")


def _add_item_commands(sub) -> None:
    p = sub.add_parser("items", help="items ranked for review (annotation errors) + quartile table")
    p.add_argument("run")
    p.add_argument("--store", default=None, help="response store (default: the run's)")
    p.add_argument("--top", type=_POSITIVE, default=20, help="items to show")
    p.add_argument("--num-subjects", type=_POSITIVE, default=3, help="disagreeing subjects per item")
    p.add_argument("--subjects", default=None, help="comma-separated subjects for the quartile table")
    p.add_argument("--out", default=None, help="write every item's flags to this .csv/.parquet "
                   "(ranked items first, then the set-aside ones, unscored)")
    p.set_defaults(func=cmd_items)

    p = sub.add_parser("score", help="score new subjects against a run's frozen items")
    p.add_argument("run")
    p.add_argument("responses", help="a store or response file with the run's item ids")
    p.add_argument("--all", action="store_true", help="print the whole leaderboard, not only new rows")
    p.add_argument("--draws", type=_POSITIVE, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the combined leaderboard (.csv/.parquet)")
    p.add_argument("--method", choices=("auto", "grid", "fit"), default="auto",
                   help="grid: exact ability update on a grid, one pass (scalar ability, binary "
                        "responses); fit: the frozen variational fit (any model); auto: grid "
                        "where it applies")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("subset", help="K items maximising test information; ranking agreement")
    p.add_argument("run")
    p.add_argument("--size", type=_POSITIVE, required=True, help="K, the number of items")
    p.add_argument("--ability", default=None, help="LO,HI target ability range (default: the subjects')")
    p.add_argument("--random", type=_POSITIVE, default=20, help="random subsets for the baseline")
    p.add_argument("--store", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the chosen items (.csv/.parquet)")
    p.set_defaults(func=cmd_subset)

    p = sub.add_parser("calibration", help="overconfidence and ECE from a confidence matrix")
    p.add_argument("run")
    p.add_argument("confidences", help="wide CSV/Parquet: subject column, one column per item, values in [0, 1]")
    p.add_argument("--store", default=None)
    p.add_argument("--top", type=_POSITIVE, default=10, help="extreme items to show")
    p.add_argument("--out", default=None, help="write the per-subject table (.csv/.parquet)")
    p.set_defaults(func=cmd_calibration)

    p = sub.add_parser("report", help="one static HTML page (+ PNGs) of a run")
    p.add_argument("run")
    p.add_argument("--out", required=True, help="the .html file; PNGs are written beside it")
    p.add_argument("--store", default=None)
    p.add_argument("--items", default=None, help="comma-separated items whose curves to draw")
    p.add_argument("--stability", default=None, help="directory with stability.parquet / summary.parquet")
    p.add_argument("--dimensions", default=None, help="directory with eigenvalues.parquet / summary.json")
    p.add_argument("--compare", default=None, help="directory written by irt-engine compare (compare.parquet)")
    p.set_defaults(func=cmd_report)


def _version() -> str:
    from engine.versions import installed

    return installed("irt-engine") or "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked for
    (``importlib.metadata``: 0.02-0.04 s of every other command)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show the program's version number and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"irt-engine {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="irt-engine", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks and warnings (also IRT_ENGINE_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="response files -> zarr store")
    p.add_argument("inputs", nargs="+", help="wide/long CSV or Parquet, py-irt jsonl, or a folder; "
                   "or evaluation logs (Every Eval Ever, lm-eval, HELM, Inspect) or their folder")
    p.add_argument("--out", required=True)
    p.add_argument("--format", default=None, choices=["wide", "long", "jsonl", "every-eval-ever",
                                                      "lm-eval", "helm", "inspect"],
                   help="input format; detected when left out (and printed)")
    p.add_argument("--metric", default=None, metavar="NAME[,NAME...]",
                   help="evaluation logs: the per-sample metric to read (lm-eval: acc, "
                        "acc_norm, exact_match, ...; every-eval-ever: score or is_correct; "
                        "helm: a stat name, default exact_match; inspect: a scorer name); "
                        "several are tried in order")
    p.add_argument("--filter", default=None, metavar="NAME[,NAME...]",
                   help="lm-eval logs: in a task scored under several filters (gsm8k), the "
                        "one(s) to keep (e.g. strict-match); by default each filter's scoring "
                        "of a document is its own item")
    p.add_argument("--keep", choices=["first", "latest", "mean"], default=None,
                   help="evaluation logs: a model evaluated twice on a sample keeps its first "
                        "or latest run, or the mean; by default that is an error")
    p.add_argument("--kind", choices=["binary", "unit", "nonnegative"], default=None,
                   help="response kind: binary (0/1), unit (scores in [0, 1]) or nonnegative "
                        "(errors >= 0); default: the smallest kind holding every value")
    p.add_argument("--layout", choices=["auto", "dense", "sparse"], default="auto",
                   help="dense matrix or sparse (subject, item, response) observations; auto "
                        "picks sparse below 10%% observed")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="memory for buffering long input, and the most a wide or jsonl table "
                        "may take (default half the available memory), e.g. 512M or 4G")
    p.add_argument("--id-column", default=None, metavar="NAME",
                   help="wide input: the column holding subject ids, or 'none' when every "
                        "column is an item; needed when the first column holds numbers")
    p.add_argument("--columns", default=None, metavar="ROLE=NAME[,...]",
                   help="long input whose columns are not named subject, item and response: "
                        "the ones that hold them, e.g. subject=system,item=seg_id,"
                        "response=score (implies --format long)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("fit", help="fit an IRT model to a store")
    p.add_argument("store")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted fit from the checkpoint in --out")
    p.add_argument("--checkpoint-every", type=_NONNEGATIVE, default=10, metavar="PASSES",
                   help="checkpoint into --out every this many passes (0 = never)")
    p.add_argument("--method", choices=("vi", "nuts"), default="vi",
                   help="vi: the variational fit (any size); nuts: exact NUTS draws (blackjax), "
                        "the reference, for matrices that fit in memory")
    p.add_argument("--chains", type=int, default=4, help="NUTS chains (R-hat needs >= 2)")
    p.add_argument("--warmup", type=int, default=500, help="NUTS adaptation steps per chain")
    p.add_argument("--samples", type=int, default=1000, help="NUTS draws kept per chain")
    p.add_argument("--extend", type=int, default=0,
                   help="NUTS: up to this many rounds of --samples more draws per chain, "
                        "continued from where the chains stopped, while an R-hat exceeds 1.01")
    p.add_argument("--target-accept", type=float, default=0.8, metavar="P",
                   help="NUTS: the acceptance rate the step size is adapted to, in (0, 1); "
                        "raise it (e.g. 0.95) where transitions diverge: smaller steps, more "
                        "of them a draw (OpenML kc2: 466 -> 47 divergences in 8,000 draws for "
                        "3x the time)")
    p.add_argument("--low-rank", type=int, default=0, metavar="K",
                   help="NUTS: adapt a diagonal plus up to K directions of mass matrix (0 = "
                        "diagonal): for many items, where all abilities and difficulties "
                        "shift together (200 x 400: 4x the bulk ESS for 1.3x the CPU)")
    _fit_options(p)
    p.set_defaults(func=cmd_fit, method_defaults={
        dest: p.get_default(dest) for dest in (*_NUTS_ONLY, *_VI_ONLY)})

    p = sub.add_parser("leaderboard", help="print a run's leaderboard")
    p.add_argument("run")
    p.add_argument("--top-k", type=_POSITIVE, default=None, help="show the first K rows")
    p.add_argument("--rank", default=None,
                   help="vector abilities: pareto | weights=W1,W2,... | lexicographic | dominance | "
                        "skill=NAME (default pareto for multi-skill runs)")
    p.add_argument("--by", default=None, metavar="COLUMN",
                   help="one leaderboard per item group (--by group) from a run fitted with "
                        "fit --q-matrix-from group")
    p.add_argument("--threshold", type=_PROBABILITY, default=0.9,
                   help="posterior mass for --rank dominance to count (ties below it)")
    p.add_argument("--draws", type=_POSITIVE, default=None,
                   help="joint posterior draws the rank statistics are read from (a NUTS "
                        "run: at most this many of its own); on a one-ability board, given "
                        "with or without --seed, they are drawn again instead of read from "
                        "the fit's table (default: the fit's; multi-skill boards 1000)")
    p.add_argument("--seed", type=int, default=None,
                   help="the draws' seed (default: the fit's; multi-skill boards 0)")
    p.set_defaults(func=cmd_leaderboard)

    p = sub.add_parser("demo", help="ingest + fit + leaderboard on bundled data")
    p.add_argument("--out", default=None, help="directory for the store and run")
    p.add_argument("--rows", dest="top_k_rows", type=_POSITIVE, default=None)
    _fit_options(p, model_default="1pl")  # seed 003: 1PL when subjects number in the tens
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("compare", help="held-out log-likelihood, accuracy, AUC and calibration "
                       "of several models")
    p.add_argument("store")
    p.add_argument("--models", required=True,
                   help="comma-separated models; NAME:D for D skills, NAME:q for --q-matrix's "
                        "skills, NAME:KEY=VALUE for a model option, e.g. 1pl,2pl,feas,mirt-comp:2 "
                        "or beta,beta:inflation_owner=item")
    p.add_argument("--holdout", type=_SHARE, default=0.1, help="share of observed cells held out")
    p.add_argument("--out", default=None, help="directory for compare.parquet and compare.json")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--q-matrix", default=None, help="items x skills CSV for NAME:q models")
    _prior_option(p)
    p.add_argument("--optimizer", default="auto", choices=["auto", "newton", "adam"],
                   help="auto (default): the model's own (adam for gamma, else newton); "
                        "naming the other is refused")
    p.add_argument("--max-passes", type=_POSITIVE, default=500)
    p.add_argument("--tol", type=_TOL, default=1e-4, help="relative ELBO change to stop at")
    p.add_argument("--seed", type=int, default=0, help="held-out cells, fits and draws")
    p.add_argument("--devices", type=_POSITIVE, default=None, help="local devices to use (default all)")
    p.add_argument("--draws", type=_POSITIVE, default=200, help="posterior draws of the predictive")
    p.add_argument("--mc-draws", type=_NONNEGATIVE, default=0, metavar="K",
                   help="Monte Carlo draws averaged per fit step (default 0: automatic)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("stability", help="ranking stability over item samples (Ray trials)")
    _trial_model_options(p)
    p.add_argument("--sizes", default=None, help="item sample sizes, e.g. 25,50,100 "
                   "(default: 25, 50, 100, ... doubling, up to half the items)")
    p.add_argument("--trials-per-size", type=_POSITIVE, default=10)
    p.add_argument("--passes", type=_POSITIVE, default=20, help="refit passes per trial (warm start)")
    p.add_argument("--bootstrap", type=_POSITIVE, default=2000, help="resamples for the tau difference")
    _runner_options(p)
    p.set_defaults(func=cmd_stability)

    p = sub.add_parser("bootstrap", help="bootstrap intervals of abilities and ranks (Ray trials)")
    _trial_model_options(p)
    p.add_argument("--replicates", type=_POSITIVE, default=200)
    p.add_argument("--passes", type=_POSITIVE, default=20, help="refit passes per replicate")
    _runner_options(p)
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("dimensions", help="how many skills: parallel analysis + residuals (Ray)")
    _trial_model_options(p, binary_only=True)
    p.add_argument("--shuffles", type=_POSITIVE, default=200)
    p.add_argument("--num-eigenvalues", type=_POSITIVE, default=20)
    p.add_argument("--residual-simulations", type=_POSITIVE, default=60,
                   help="data sets simulated from the one-skill fit for the residual test")
    _runner_options(p)
    p.set_defaults(func=cmd_dimensions)

    p = sub.add_parser("adaptive", help="replay held-out subjects under adaptive item selection "
                       "(Ray trials)")
    p.add_argument("run", help="a run directory from `fit`")
    p.add_argument("--out", required=True, help="directory for the results (resumes if present)")
    p.add_argument("--store", default=None, help="the run's store (default: from fit.json)")
    p.add_argument("--trials", type=_POSITIVE, default=100)
    p.add_argument("--strategies", default="fisher,discrimination,disc_diff,difficulty,random")
    p.add_argument("--checkpoints", default="1,2,5,10,20,50,100", help="item counts scored")
    p.add_argument("--holdout", type=_SHARE, default=0.2, help="share of subjects held out")
    p.add_argument("--pool-size", type=_POSITIVE, default=None, help="candidate items per trial")
    _runner_options(p)
    p.set_defaults(func=cmd_adaptive)

    p = sub.add_parser("submit", help="run an irt-engine command as a Ray job on a cluster")
    p.add_argument("--address", required=True, help="the cluster's job server, e.g. "
                   "http://127.0.0.1:8265")
    p.add_argument("--working-dir", default=None,
                   help="ship this whole folder as the job's working directory (default: only "
                        "the relative inputs the command names); dot-files, credentials and "
                        "links leading out of it are never shipped")
    p.add_argument("--python", default="python", help="interpreter on the cluster that has "
                   "irt-engine's dependencies (default: python on the cluster's PATH)")
    p.add_argument("--verbose", action="store_true", help="show Ray's own log lines")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- irt-engine COMMAND ...")
    p.set_defaults(func=cmd_submit)
    _add_item_commands(sub)
    return parser


# options whose value is a LO,HI range that may start with a minus sign: argparse reads
# ``--ability -1,2`` as two options (``-1,2`` is not a number to it), so the value is joined on
_RANGE_OPTIONS = ("--ability",)


def _join_signed_ranges(argv: list[str]) -> list[str]:
    """``argv`` with ``--ability -1,2`` written ``--ability=-1,2``."""
    out, i = [], 0
    while i < len(argv):
        if (argv[i] in _RANGE_OPTIONS and i + 1 < len(argv)
                and re.match(r"-[\d.]", argv[i + 1])):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(_join_signed_ranges(
            sys.argv[1:] if argv is None else list(argv)))
    except SystemExit as done:  # --help, --version, or a one-line option error (exit 2)
        return done.code if isinstance(done.code, int) else 2
    try:
        use_compilation_cache()  # a bad IRT_ENGINE_COMPILATION_CACHE_MAX_SIZE: one line, exit 2
        stdout, sys.stdout = sys.stdout, EscapedStream(sys.stdout)
        try:
            with warnings.catch_warnings():
                if not _debug(args):  # a user reads Python's warning text as a failure
                    warnings.simplefilter("ignore")
                from engine.data.remote import url_outputs

                with url_outputs(args):  # --out s3://...: written locally, uploaded at the end
                    return args.func(args)
        finally:
            sys.stdout = stdout
    except IRTError as err:
        print(escape_controls(f"irt-engine {args.command}: error: {err}"), file=sys.stderr)
        return 2
    except OSError as err:  # the environment: a full disk, permissions, a path too long
        if isinstance(err, BrokenPipeError) and _reader_left():  # ``| head``: stop quietly
            return 141
        if _debug(args):
            raise
        print(escape_controls(f"irt-engine {args.command}: error: {_os_error(err)}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"irt-engine {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, not the user's input: one line and the traceback's file
        if _debug(args):
            raise
        where = _save_traceback()
        print(escape_controls(f"irt-engine {args.command}: internal error ({type(err).__name__}: "
                              f"{err}); the traceback is in {where}; rerun with --debug to show it, "
                              f"and please report it"), file=sys.stderr)
        return 3


_OS_FIXES = {errno.ENOSPC: "free some disk space (the last complete checkpoint and any earlier "
                           "run are kept) and run again",
             errno.EDQUOT: "free some space in your quota and run again",
             errno.EACCES: "check the permissions of that path or choose another",
             errno.EPERM: "check the permissions of that path or choose another",
             errno.EROFS: "the file system is read-only: choose another path",
             errno.ENAMETOOLONG: "the path is too long: choose a shorter one",
             errno.ENOTDIR: "a part of that path is a file, not a directory: choose another path",
             errno.ENOENT: "check that the path exists",
             errno.EEXIST: "a file is in the way of that path: choose another"}


def _reader_left() -> bool:
    """True where standard output is a pipe whose reader has gone (``irt-engine ... | head``);
    output then goes to /dev/null so that the exit's flush raises nothing. A broken pipe
    elsewhere (a socket, a child process) is not this, and is reported as an error."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(event & select.POLLERR for _, event in poller.poll(0))
        if gone:
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        return gone
    except (AttributeError, OSError, ValueError):  # no file descriptor (captured) or no poll
        return False


def _os_error(err: OSError) -> str:
    what = err.strerror or str(err)
    where = f" ({err.filename})" if err.filename else ""
    fix = _OS_FIXES.get(err.errno, "check the path and the machine's resources")
    return f"{what}{where}; {fix}"


def _debug(args) -> bool:
    return bool(getattr(args, "debug", False) or os.environ.get("IRT_ENGINE_DEBUG"))


def _save_traceback() -> str:
    import traceback

    fd, path = tempfile.mkstemp(prefix="irt-engine-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exc(file=f)
    return path


# OpenBLAS's own settings, and OpenMP's, which it reads where its own are not set
BLAS_THREAD_SETTINGS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_blas_thread(environ=os.environ) -> None:
    """Set OpenBLAS (NumPy's and SciPy's) to one thread, unless the user set its threads.

    Takes effect only before NumPy is first imported. A fit's matrix products are small
    (a 26,880 x 32 Gram matrix, joint information of a few hundred parameters): a second
    thread's hand-offs cost more than it computes, about 10% of an `ability` fit alone and
    1.9x beside a second fit on a two-core machine, and JAX runs the rest on its own
    threads. The products are bit-identical on one thread; LAPACK's factorizations round
    differently than on two."""
    if not any(name in environ for name in BLAS_THREAD_SETTINGS):
        environ["OPENBLAS_NUM_THREADS"] = "1"


def run(argv: list[str] | None = None) -> None:
    """The ``irt-engine`` command: :func:`main`, then the process ends without tearing the
    interpreter down. Everything a command writes is complete and closed when :func:`main`
    returns; what is left is freeing every module and JAX's runtime, 0.2-0.25 s of an LSAT7
    fit process's 1.6 s. The exit handlers still run (``atexit``: logging, Ray, temporary
    folders), and the usual exit is taken where another non-daemon thread is still alive
    (the interpreter would wait for it), where a profiler or tracer is on (``python -m
    cProfile``, coverage: they write after the program returns), or where the handlers' hook
    is not there."""
    import atexit
    import threading

    one_blas_thread()
    code = main(argv)
    code = 0 if code is None else code
    others = [t for t in threading.enumerate()
              if t is not threading.current_thread() and not t.daemon and t.is_alive()]
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    watched = sys.getprofile() is not None or sys.gettrace() is not None
    if others or watched or run_handlers is None:
        sys.exit(code)
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left, or a closed stream: nothing to add
            pass
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    run()
