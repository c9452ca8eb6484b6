"""Run directories: fit.json, the variational parameters, subject and item tables."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import jax
import numpy as np

from engine import runfiles
from engine.atomic import plain_mode
from engine.errors import RunExistsError, SettingsError
from engine.infer.fit import FitResult
from engine.infer.guide import GuideState
from engine.models.registry import get_model
from engine.models.spec import ModelSpec
from engine.readout.expected import score_draws, score_summary
from engine.readout.posterior import draw_posterior, result_columns
from engine.readout.quantile_draws import quantile_draws
from engine.readout.ranking import identical_subjects, pairwise_beats, rank_stats

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["save_run", "load_run", "Run", "PAIRWISE_MAX_SUBJECTS", "store_candidates",
           "ranking_draws", "posterior_tables"]

PAIRWISE_MAX_SUBJECTS = 2000
# the item draws a quadrature fit averaged its abilities over, saved (ability_draws.npz) up to
# this size so that `score` averages new subjects over the same draws
ABILITY_DRAWS_MAX_BYTES = 16 << 20
FORMAT_VERSION = runfiles.FORMAT_VERSION  # 2: fit.json records every file's checksum


class Run:
    """A saved fit: its model, guide, tables and fit.json.

    ``subjects`` and ``items`` are pandas DataFrames. A run just written by :func:`save_run`
    holds its tables as NumPy columns and makes the DataFrames on first use, so a fit process
    that only writes the run never imports pandas."""

    def __init__(self, path: Path, spec: ModelSpec, guide: GuideState, info: dict,
                 subjects: pd.DataFrame | dict[str, np.ndarray],
                 items: pd.DataFrame | dict[str, np.ndarray],
                 quantile_functions: dict | None = None):
        self.path, self.spec, self.guide, self.info = path, spec, guide, info
        # a quadrature fit's scalar abilities: {block: (z (J,), each subject's posterior
        # quantiles at Phi(z) (J, S))}, read by the rank statistics of a scored leaderboard
        self.quantile_functions = quantile_functions or {}
        self._tables = {"subjects": subjects, "items": items}
        self._sampled: dict[str, np.ndarray] = {}  # sampler_draws, read

    def _table(self, name: str) -> pd.DataFrame:
        table = self._tables[name]
        if isinstance(table, dict):
            import pandas as pd

            table = self._tables[name] = pd.DataFrame(table)
        return table

    @property
    def subjects(self) -> pd.DataFrame:
        return self._table("subjects")

    @property
    def items(self) -> pd.DataFrame:
        return self._table("items")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, model={self.info.get('model')!r})"

    def pairwise(self, subjects: Sequence[str] | None = None) -> np.ndarray | None:
        """P(row subject beats column subject), ``(k, k)`` for ``subjects`` (ids of the
        subjects table, in that order; default every subject, at most
        ``PAIRWISE_MAX_SUBJECTS``), 0 on the diagonal and 0.5 between two subjects of one
        posterior (identical answer sheets). Counted from the draws the fit read its rank
        statistics from (:meth:`rank_draws`: the same seed, the same values), so a pair's
        probability is the same whichever subjects are asked for. Runs written before
        2026-12-07 kept the whole table in ``pairwise.npz``; it is read from there (checked
        against fit.json's checksum). None where the run has no rank draws (several skills
        without a score)."""
        ids = self.subjects["subject"].astype(str)
        if subjects is None:
            if len(ids) > PAIRWISE_MAX_SUBJECTS:
                raise SettingsError(
                    f"run {self.path} has {len(ids):,} subjects: the whole pairwise table "
                    f"(over {PAIRWISE_MAX_SUBJECTS:,}) is not counted; pass the subjects to "
                    f"compare, e.g. subjects={list(ids[:3])}")
            columns = np.arange(len(ids))
        else:
            position = {s: k for k, s in enumerate(ids)}
            unknown = [s for s in map(str, subjects) if s not in position]
            if unknown:
                raise SettingsError(f"{unknown[:5]}: not subjects of run {self.path}; e.g. "
                                    f"{', '.join(ids[:3])}")
            columns = np.asarray([position[s] for s in map(str, subjects)], np.int64)
        if "pairwise.npz" in self.info.get("files", {}) or (
                "files" not in self.info and (self.path / "pairwise.npz").exists()):
            whole = runfiles.read_npz(self.path, self.info, "pairwise.npz")["p_beats"]
            return whole[np.ix_(columns, columns)]
        if not _ranks_subjects(self.spec):
            return None
        draws, groups = self.rank_draws()
        return pairwise_beats(draws, groups=groups, columns=columns)

    def rank_draws(self, num_draws: int | None = None, seed: int | None = None
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(draws, groups)``: joint draws ``(T, S)`` of what ranks the subjects, as the fit
        read its rank statistics (:func:`ranking_draws`), and the groups of subjects of one
        posterior. ``num_draws`` and ``seed`` default to the fit's (fit.json's
        ``readout``; a sampler's run: all its draws, and no seed), which give the run's own
        draws (a run of several skills without a score: draws of the ability vectors,
        ``(T, S, D)``)."""
        readout = self.info.get("readout") or {}
        sampled = self.sampler_draws("ability")
        if num_draws is None:
            num_draws = int(readout.get("num_draws", 1000)) if sampled is None else int(
                np.prod(sampled.shape[:2]))
        seed = int(readout.get("seed", 0)) if seed is None else seed
        return ranking_draws(self.spec, self.guide, self.quantile_functions, num_draws, seed,
                             sampled=sampled)

    def sheet_digests(self) -> np.ndarray | None:
        """Each subject's answer-sheet digest ``(S, 16)`` uint8 (``sheets.npz``,
        :func:`engine.rows.sheet_digests`), checked against fit.json's checksum; None where
        the run kept none (a fit streamed from a store larger than memory, or an older run)."""
        if "sheets.npz" not in self.info.get("files", {}):
            return None
        return runfiles.read_npz(self.path, self.info, "sheets.npz")["digest"]

    def ability_draws(self) -> dict[str, np.ndarray] | None:
        """The item draws a quadrature fit averaged its abilities over (``xs``, ``w``,
        ``grid``, ``log_base``; ``ability_draws.npz``), checked against fit.json's checksum;
        None where the run saved none."""
        if "ability_draws.npz" not in self.info.get("files", {}):
            return None
        return runfiles.read_npz(self.path, self.info, "ability_draws.npz")

    def subjects_redrawn(self, num_draws: int | None = None,
                         seed: int | None = None) -> pd.DataFrame:
        """The subjects table with the columns read from joint draws (rank statistics, and
        the expected score's summaries) read again from ``num_draws`` draws with ``seed``,
        as the fit read them (:func:`ranking_draws`). None: the fit's (fit.json's
        ``readout``; a sampler's run: all its draws), which give the run's own table. A
        sampler's run reads at most ``num_draws`` of its own draws, and no seed. Every
        other column is the table's."""
        readout = self.info.get("readout") or {}
        draws, groups = self.rank_draws(num_draws, seed)
        top_k = int(readout.get("top_k", 3))
        table = self.subjects.copy()
        for k, v in _drawn_columns(self.spec, draws, top_k, groups).items():
            table[k] = v
        return table

    def sampler_draws(self, name: str) -> np.ndarray | None:
        """Block ``name``'s draws as a sampler drew them (``draws.nc``, NUTS), ``(chains,
        draws, subjects or items, ...)``, checked against fit.json's checksum; subjects with
        identical sheets are drawn apart (the tables read them pooled). None where the run
        has none, or where its draws.nc holds them pooled (NUTS runs written before
        fit.json's ``readout.draws_nc`` said "as sampled": twins tie in every draw there)."""
        if (self.info.get("readout") or {}).get("draws_nc") != "as sampled":
            return None
        if name in self._sampled:  # read once a command (leaderboard --by group: per skill)
            return self._sampled[name]
        owner = self.spec.param(name).owner
        size = {"subject": self.info["data"]["num_subjects"],
                "item": self.info["data"]["num_items"]}.get(owner)
        self._sampled[name] = runfiles.read_netcdf_posterior(
            self.path, self.info, "draws.nc", name, (owner if size is not None else None, size))
        return self._sampled[name]


def _versions() -> dict:
    """The versions the run was made with (installed metadata: no package imported for it)."""
    from engine.versions import installed

    return {"irt-engine": installed("irt-engine"), "python": platform.python_version(),
            "jax": jax.__version__, "optax": installed("optax"), "dask": installed("dask"),
            "zarr": installed("zarr"), "numpy": np.__version__}


def _store_location(data: dict, out: Path) -> dict:
    """The store recorded two ways: absolute, and relative to the run directory, so the
    run is read from any working directory and still finds a store moved along with it."""
    if not data.get("store") or "://" in str(data["store"]):  # none, or a URL: kept as given
        return dict(data)
    store = Path(data["store"]).resolve()
    return data | {"store": str(store), "store_from_run": os.path.relpath(store, out.resolve())}


def store_candidates(run: "Run") -> list[Path]:
    """Where a run's store may be, in the order tried: beside the run as it was at fit time
    (the run and store moved together), the absolute path recorded, and for runs written
    before the relative path was recorded, the path as recorded (relative to the directory
    the fit ran in)."""
    data = run.info.get("data", {})
    out = []
    if data.get("store_from_run"):
        out.append(run.path / data["store_from_run"])
    if data.get("store"):
        from engine.data.remote import as_location

        out.append(as_location(data["store"]))  # a local path, or the URL of a remote store
    return list(dict.fromkeys(out))


def _subject_table(res: FitResult, draws: np.ndarray | None, top_k: int,
                   groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    ex = res.extra
    cols = {"subject": np.asarray(ex["subjects"])} | result_columns(res, "subject")
    cols["accuracy"] = np.asarray(ex["stats"]["subject_mean"])
    cols["n_responses"] = np.asarray(ex["stats"]["subject_n"])
    if draws is not None:
        cols |= _drawn_columns(res.spec, draws, top_k, groups)
    return cols


def _drawn_columns(spec: ModelSpec, draws: np.ndarray, top_k: int,
                   groups: np.ndarray | None) -> dict[str, np.ndarray]:
    """The subjects table's columns read from joint draws (:func:`ranking_draws`): the
    rank statistics, and the expected score's summaries where the model has one."""
    cols = {k: np.asarray(v) for k, v in score_summary(draws, groups).items()
            } if spec.score is not None else {}
    return cols | {k: np.asarray(v) for k, v in rank_stats(draws, top_k, groups).items()}


def _ranks_subjects(spec: ModelSpec) -> bool:
    """Whether one number orders ``spec``'s subjects (a scalar ability, or an expected
    score): several skills without a score have no rank draws and no P(beats)."""
    return spec.score is not None or spec.param("ability").shape == ()


def _rank_draws_and_groups(res: FitResult, num_draws: int, seed: int):
    """Joint draws ``(T, S)`` of what ranks the subjects (ability, or the expected score) and
    the groups of subjects whose posteriors are the same (:func:`identical_subjects`; None:
    none), or ``(None, None)``. Twins are drawn independently, their statistics pooled."""
    ability = res.spec.param("ability")
    if res.draws and ability.shape == () and res.spec.score is None:  # NUTS
        pooled = np.asarray(res.draws["ability"]).reshape((-1, res.num_subjects))
        idata = res.extra.get("idata")  # the draws as sampled: twins drawn apart
        joint = pooled if idata is None else np.asarray(
            idata.posterior["ability"].values).reshape((-1, res.num_subjects))
        return joint, identical_subjects(pooled.T)
    if not _ranks_subjects(res.spec):
        return None, None
    return ranking_draws(res.spec, res.guide, res.quantile_functions, num_draws, seed)


def ranking_draws(spec: ModelSpec, guide: GuideState, quantile_functions: dict,
                  num_draws: int, seed: int, *, sampled: np.ndarray | None = None,
                  by_score: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Joint draws ``(T, S[, D])`` from which a board ranks the subjects, as a fit's
    rank statistics are read, and the groups of subjects whose posteriors are the same
    (:func:`identical_subjects`): where the model has an expected score and ``by_score``,
    draws of it; else a sampler's own draws (``sampled``, ``(chains, draws, S, ...)``: at
    most ``num_draws`` of them, evenly spaced over the chains); else each subject's exact
    posterior where the fit kept its quantile function; else the posterior factors'
    Gaussian. Twins are drawn independently."""
    ability = spec.param("ability")
    factors = [a for p in spec.by_owner("subject")
               for a in (guide.loc[p.name], guide.log_scale[p.name])]
    groups = identical_subjects(*factors)
    if by_score and spec.score is not None:  # ability alone does not order subjects
        return score_draws(spec, guide, num_draws, rng_key=seed), groups
    if sampled is not None:
        flat = sampled.reshape((-1,) + sampled.shape[2:])
        keep = np.unique(np.linspace(0, len(flat) - 1, min(num_draws, len(flat))
                                     ).round().astype(np.int64))
        return flat[keep], groups
    if ability.name in quantile_functions:  # each subject's exact posterior
        z, values = quantile_functions[ability.name]
        return (quantile_draws(guide.loc[ability.name], np.exp(guide.log_scale[ability.name]),
                               num_draws, seed, z, values), groups)
    return draw_posterior(spec, guide, num_draws, rng_key=seed,
                          names=("ability",))["ability"], groups


def _item_table(res: FitResult) -> dict[str, np.ndarray]:
    ex = res.extra
    cols = {"item": np.asarray(ex["items"])} | result_columns(res, "item")
    cols["mean_response"] = np.asarray(ex["stats"]["item_mean"])
    # every observed response the same: fitted as unobserved (engine.api._constant_items)
    cols["constant_response"] = np.isin(cols["mean_response"], (0.0, 1.0)) & \
        bool(ex.get("data", {}).get("constant_items"))
    cols["n_responses"] = np.asarray(ex["stats"]["item_n"])
    return cols


def posterior_tables(res: FitResult, *, num_draws: int = 1000, top_k: int = 3,
                     seed: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(subjects, items)``: the tables :func:`save_run` writes (``subjects.parquet``,
    ``items.parquet``) without writing them: posterior means, sds and 90% intervals as the
    fit read them out (quadrature, the item sampler, NUTS draws), rank statistics from
    ``num_draws`` draws with ``seed`` (default the fit's)."""
    from engine.data.arrow import arrow_table

    draws, groups = _rank_draws_and_groups(res, num_draws, _fit_seed(res, seed))
    as_frame = lambda t: t if not isinstance(t, dict) else arrow_table(t).to_pandas()
    return as_frame(_subject_table(res, draws, top_k, groups)), as_frame(_item_table(res))


def _fit_seed(res: FitResult, seed: int | None) -> int:
    """``seed``, by default the fit's own (``res.settings.seed``), as ``fit --seed`` reads."""
    return int(getattr(getattr(res, "settings", None), "seed", 0) or 0) if seed is None else seed


def save_run(res: FitResult, out: str | Path, *, num_draws: int = 1000, top_k: int = 3,
             seed: int | None = None, overwrite: bool = False) -> Run:
    """Write a run directory atomically (temporary directory, then rename).

    ``seed`` draws the rank statistics; by default the fit's own (``res.settings.seed``),
    as ``irt-engine fit --seed`` does, so the library and the command write one table."""
    out = Path(out)
    seed = _fit_seed(res, seed)
    if out.exists() and not overwrite:
        raise RunExistsError(f"run directory {out} exists; pass --overwrite (overwrite=True in "
                             f"the library) or choose another --out")
    ability = res.spec.param("ability")
    draws, groups = _rank_draws_and_groups(res, num_draws, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        plain_mode(tmp)  # mkdtemp makes 0700
        subjects, items = _subject_table(res, draws, top_k, groups), _item_table(res)
        runfiles.write_table(subjects, tmp / "subjects.parquet")
        runfiles.write_table(items, tmp / "items.parquet")
        guide = GuideState({k: np.asarray(v) for k, v in res.guide.loc.items()},
                           {k: np.asarray(v) for k, v in res.guide.log_scale.items()})
        arrays = {f"loc/{k}": v for k, v in guide.loc.items()}
        arrays |= {f"log_scale/{k}": v for k, v in guide.log_scale.items()}
        for k, (z, values) in res.quantile_functions.items():  # (J,) scores, (J, S) quantiles
            arrays |= {f"quantile_z/{k}": np.asarray(z), f"quantile/{k}": np.asarray(values)}
        np.savez(tmp / "guide.npz", **arrays)
        if res.extra.get("idata") is not None:  # ArviZ InferenceData of a sampler's draws
            res.extra["idata"].to_netcdf(str(tmp / "draws.nc"))
        score_abilities = _save_ability_draws(res, tmp)
        if res.extra.get("sheet_digests") is not None:  # for score: the sheets already read
            runfiles.write_npz(tmp / "sheets.npz", digest=np.asarray(res.extra["sheet_digests"]))
        info = {
            "format_version": FORMAT_VERSION,
            "model": res.extra["model"],
            "model_options": res.extra["model_options"],
            "spec": res.spec.to_dict(),
            "settings": res.settings.to_dict(),
            "frozen": list(res.frozen),
            "data": _store_location(res.extra["data"], out) | {
                "num_subjects": res.num_subjects, "num_items": res.num_items,
                "num_observed": res.num_observed},
            "converged": res.converged,
            "num_passes": res.num_passes,
            "num_devices": res.num_devices,
            "mc_draws_per_step": res.extra.get("mc_draws"),
            # gaussian (mean-field) or quadrature abilities, and why (engine.infer.marginal)
            "ability_factor": res.extra.get("ability_factor"),
            **({"quadrature": res.extra["quadrature"]} if "quadrature" in res.extra else {}),
            **res.extra.get("diagnostics", {"method": "vi"}),  # NUTS: R-hat, ESS, divergences
            "timings": {"wall_s": res.wall_time_s, "first_pass_with_compile_s": res.compile_time_s,
                        # JAX tracing, lowering and XLA compilation (or cache loads), apart
                        **({"compile": res.extra["compile"]} if "compile" in res.extra else {}),
                        # passes over the data; a sampler makes none (None)
                        "cells_per_s": res.num_observed * res.num_passes / max(res.wall_time_s, 1e-9)
                        if res.num_passes else None},
            "elbo_trace": res.trace,
            # the draws the rank statistics read (a sampler's run ranked by ability: all of
            # its own)
            "readout": {"num_draws": num_draws if draws is None else int(np.shape(draws)[0]),
                        "top_k": top_k, "seed": seed,
                        "rank_by": "ability" if res.spec.score is None else "expected score",
                        "rank_draws": _rank_draws(res, ability.name, draws is not None),
                        # draws.nc: the draws as sampled (before 2026-12-06 it held them
                        # pooled, identical sheets tied in every draw: read no board from it)
                        **({"draws_nc": "as sampled"} if res.extra.get("idata") is not None
                           else {}),
                        "score_abilities": score_abilities,
                        "ability_intervals": "posterior draws (NUTS)" if res.draws else
                        res.extra.get("quadrature", {}).get("item_moments", {}).get(
                            "ability_intervals", "the posterior mean +- 1.645 sd"),
                        "item_intervals": "posterior draws (NUTS)" if res.draws else
                        _quadrature_intervals(res.extra["quadrature"])
                        if "quadrature" in res.extra else
                        "within-item marginal (linear response)" if res.cross else "mean-field"},
            "versions": _versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        info = runfiles.seal(tmp, info)  # fit.json last: every file's size and SHA-256, its own
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # what was just written, without reading it back (load_run(out) returns the same Run)
    return Run(out, res.spec, guide, info, subjects, items, dict(res.quantile_functions))


def _save_ability_draws(res: FitResult, tmp: Path) -> str | None:
    """Write ``ability_draws.npz`` (the item draws a quadrature fit averaged its abilities
    over) where it has them and they are small enough; how `score` will read new subjects'
    abilities (None: a model `score` does not grid)."""
    if res.extra.get("ability_draws") is None:
        return None if "quadrature" not in res.extra else (
            "the mean-field factor given the item factors (this fit kept no item draws to "
            "average over: adaptive nodes, or items set aside)")
    found, pattern_of_subject, seed = res.extra["ability_draws"]
    arrays = found.arrays() | {"pattern_of_subject": np.asarray(pattern_of_subject, np.int32),
                               "seed": np.asarray(seed, np.int64)}
    size = sum(a.nbytes for a in arrays.values())
    if size > ABILITY_DRAWS_MAX_BYTES:
        return (f"the mean-field factor given the item factors (the fit's item draws, "
                f"{size / 2 ** 20:.0f} MiB, were not saved)")
    runfiles.write_npz(tmp / "ability_draws.npz", **arrays)
    return (f"exact: each new answer sheet's posterior averaged over the fit's "
            f"{len(arrays['w'])} item draws (ability_draws.npz), as this run's subjects' were")


def _rank_draws(res: FitResult, ability: str, drawn: bool) -> str | None:
    """What the rank statistics (and :meth:`Run.pairwise`) were read from, for fit.json
    (None: no rank draws, e.g. vector abilities without a score)."""
    if not drawn:
        return None
    if res.spec.score is not None:
        return "draws of the expected score from the posterior factors"
    if res.draws:
        return "posterior draws (NUTS)"
    if ability in res.quantile_functions:
        z = res.quantile_functions[ability][0]
        return (f"each subject's exact posterior: normal draws mapped through its quantile "
                f"function at {len(z)} normal scores ({min(z):g} to {max(z):g})")
    return "the posterior mean + sd x N(0, 1)"


def _quadrature_intervals(record: dict) -> str:
    """How a quadrature fit's item intervals were obtained, from its fit.json record."""
    method = record.get("item_moments", {}).get("method")
    if method == "importance":
        ends = record["item_moments"].get("intervals", "")
        return ("marginal posterior (importance sampling of the items, abilities integrated); "
                + ("the weighted draws' 5% and 95% quantiles" if ends.startswith("weighted")
                   else f"the posterior mean +- 1.645 sd ({ends})" if ends
                   else "the posterior mean +- 1.645 sd"))
    if method == "sampled":
        unmixed = len(record["item_moments"]["sampler"].get("not_mixed", []))
        return ("marginal posterior (the items sampled, abilities drawn on a grid)"
                + (f"; {unmixed} item values' chains did not mix (items.parquet's "
                   "*_rhat columns; fit.json "
                   "quadrature.item_moments.sampler.not_mixed)" if unmixed else ""))
    return "marginal (Louis information at the marginal mode)"


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``. An existing ``out`` (a finished run, or the
    fit's checkpoint) is first renamed aside and removed only once the new run is in
    place, so a process killed at any moment leaves the old directory or the new one
    (at worst the old one under ``.NAME.old-*`` beside it), never an emptied one."""
    if out.is_symlink():
        raise RunExistsError(f"--out {out} is a symlink; irt-engine does not replace one: give the "
                             f"real directory or another --out")
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old)  # onto the empty directory just made
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def load_run(path: str | Path) -> Run:
    """Reload a run directory written by ``save_run``, every file read through
    ``engine.runfiles`` (checked against fit.json's checksums; a damaged or missing file is
    a ``RunDamagedError`` naming it). A URL (s3://, gs://, file://) is read from a private
    local copy (``engine.data.remote.fetch_run``)."""
    from engine.data.remote import fetch_run

    path = fetch_run(path)
    info = runfiles.read_info(path)
    runfiles.check_present(path, info)
    spec = get_model(info["model"], **info["model_options"])
    z = runfiles.read_npz(path, info, "guide.npz")
    loc = {k.split("/", 1)[1]: v for k, v in z.items() if k.startswith("loc/")}
    log_scale = {k.split("/", 1)[1]: v for k, v in z.items() if k.startswith("log_scale/")}
    quantiles = {k.split("/", 1)[1]: (z[f"quantile_z/{k.split('/', 1)[1]}"], v)
                 for k, v in z.items() if k.startswith("quantile/")}
    return Run(path, spec, GuideState(loc, log_scale), info,
               runfiles.read_table(path, info, "subjects.parquet"),
               runfiles.read_table(path, info, "items.parquet"), quantiles)

