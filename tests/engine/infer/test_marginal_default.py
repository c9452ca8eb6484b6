"""The default fit's choice between integrated (quadrature) and mean-field abilities."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.api import fit
from engine.infer.settings import FitSettings


def _short_test(seed=0, s=300, n=10):
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=s), rng.normal(size=n)
    return (rng.random((s, n)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(np.int8)


def test_default_integrates_abilities_on_a_short_test():
    res = fit(_short_test(), "2pl")
    factor = res.extra["ability_factor"]
    assert factor["requested"] == "auto" and factor["method"] == "quadrature"
    assert factor["items_per_subject"] == 10 and "gaussian_because" not in factor


def test_the_quadrature_fit_reports_each_pass_and_max_passes_bounds_it():
    """The default fit's mode search calls ``progress_fn`` after every pass (the command
    line's progress bar), and ``max_passes`` (``--max-passes``, which the command line names
    as the remedy for an unconverged fit) bounds it as it bounds the mean-field fit: the
    quadrature fit used to run its own 500 whatever was asked."""
    seen = []
    res = fit(_short_test(), "2pl", FitSettings(seed=0, progress=False),
              progress_fn=lambda i, row: seen.append((i, row["elbo"])))
    assert res.extra["ability_factor"]["method"] == "quadrature" and res.num_passes > 3
    assert seen == [(i, row["elbo"]) for i, row in enumerate(res.trace)]
    capped = fit(_short_test(), "2pl", FitSettings(seed=0, progress=False, max_passes=3,
                                                   min_passes=1, ability_factor="quadrature"))
    assert capped.num_passes == 3 and not capped.extra["quadrature"]["mode_converged"]
    assert [r["elbo"] for r in capped.trace] == [r["elbo"] for r in res.trace[:3]]


def test_the_fit_seed_sets_the_quadrature_fits_monte_carlo_draws():
    """``FitSettings.seed`` is the quadrature fit's one source of randomness, as it is the
    mean-field fit's: the same seed gives the same read-out to the bit, another seed other
    importance draws (before, every seed drew the same ones, so a refit could not show their
    Monte Carlo error), the same mode search, and reported means within that error of each
    other. A negative seed is taken as the mean-field fit takes it."""
    from engine.readout.posterior import result_columns

    y = _short_test()
    runs = {seed: fit(y, "2pl", FitSettings(seed=seed, progress=False)) for seed in (0, 1, -1)}
    again = fit(y, "2pl", FitSettings(seed=0, progress=False))

    def used_ess(res):  # the effective draws of the round (or pool) the moments came from
        record = res.extra["quadrature"]["item_moments"]
        assert record["method"] == "importance"
        pooled = record.get("pooled", {})
        return (pooled["effective_draws"] if pooled.get("used")
                else record["rounds"][record["used_round"] - 1]["effective_draws"])

    ess = {seed: used_ess(res) for seed, res in runs.items()}
    tables = {seed: result_columns(res, "item") for seed, res in runs.items()}
    for block in ("difficulty", "discrimination"):
        np.testing.assert_array_equal(result_columns(again, "item")[f"{block}_mean"],
                                      tables[0][f"{block}_mean"])
        for other in (1, -1):
            first, second = (np.asarray(tables[s][f"{block}_mean"], np.float64) for s in (0, other))
            sd = np.asarray(tables[0][f"{block}_sd"], np.float64)  # the reported marginal sd
            assert not np.array_equal(first, second)
            # 5 Monte Carlo sds of the difference of two self-normalised estimates
            assert (np.abs(first - second) < 5 * sd * np.sqrt(1 / ess[0] + 1 / ess[other])).all()
    for other in (1, -1):  # the mode search draws nothing: the same passes, the same objective
        assert [row["elbo"] for row in runs[other].trace] == [row["elbo"] for row in runs[0].trace]
        assert (runs[other].extra["quadrature"]["log_marginal_posterior"]
                == runs[0].extra["quadrature"]["log_marginal_posterior"])


def test_variational_settings_keep_the_mean_field_fit():
    for settings in (FitSettings(optimizer="newton"), FitSettings(mc_draws=4)):
        factor = fit(_short_test(), "2pl", settings).extra["ability_factor"]
        assert factor["method"] == "gaussian"
        assert factor["gaussian_because"] == ["variational settings were given (optimizer or "
                                              "Monte Carlo draws)"]


def test_long_rows_and_other_models_stay_mean_field():
    long = fit(_short_test(s=20, n=40), "2pl", FitSettings(quadrature_max_items=30))
    assert long.extra["ability_factor"]["method"] == "gaussian"
    assert "gaussian_because" not in long.extra["ability_factor"]  # read from the data
    multi = fit(_short_test(), "mirt-comp", model_options={"dims": 2})
    assert multi.extra["ability_factor"]["method"] == "gaussian"
    assert "not binary with one scalar ability" in multi.extra["ability_factor"]["gaussian_because"][0]


def test_large_matrices_stay_mean_field():
    y = _short_test()  # 300 x 10, every cell observed
    small = fit(y, "2pl", FitSettings(quadrature_max_cells=3000)).extra["ability_factor"]
    assert small["method"] == "quadrature" and small["observed_cells"] == 3000
    large = fit(y, "2pl", FitSettings(quadrature_max_cells=2999)).extra["ability_factor"]
    assert large["method"] == "gaussian" and large["max_observed_cells"] == 2999
    assert FitSettings().quadrature_max_cells == 500_000


def test_auto_falls_back_to_mean_field_when_quadrature_does_not_converge(monkeypatch, tmp_path,
                                                                        capsys):
    """``auto`` runs the mean-field fit where the quadrature fit ends unconverged (2PL on 19
    classifiers x 501 OpenML instances: 500 iterations, discriminations in the hundreds),
    and fit.json says so, with the seconds the quadrature fit took; the leaderboard says it
    under the table, as no other line of it would; an explicit ``quadrature`` keeps its own
    result. The quadrature fit is held to two iterations here so that it cannot converge."""
    from dataclasses import replace

    import engine.api
    from engine.api import fit
    from engine.infer.marginal import MarginalSettings, fit_marginal_result
    from engine.infer.settings import FitSettings

    def two_iterations(spec, y, fit_settings, settings=MarginalSettings(), aside=None, **kw):
        return fit_marginal_result(spec, y, fit_settings, replace(settings, max_iter=2, sampler_chains=0), aside)

    monkeypatch.setattr(engine.api, "fit_marginal_result", two_iterations)
    y = _two_iteration_data()
    # 1,000 observed cells, one more than NUTS's fallback bound (sampled: the next test)
    res = fit(y, "2pl", settings=FitSettings(seed=0, progress=False, nuts_fallback_max_cells=999))
    record = res.extra["ability_factor"]
    assert record["method"] == "gaussian" and "2 iterations" in record["quadrature_not_converged"]
    assert record["quadrature_wall_s"] > 0
    assert res.converged and res.extra.get("source") != "quadrature"
    from engine.cli import main
    from engine.run import save_run

    save_run(res, tmp_path / "run")
    assert main(["leaderboard", str(tmp_path / "run")]) == 0
    board = capsys.readouterr().out.splitlines()
    assert board[-1].startswith("note: the quadrature fit (abilities integrated out) did not "
                                f"converge in {record['quadrature_wall_s']:.1f} s; these are "
                                "the mean-field fit's intervals")
    shared = board[-3].startswith("rank: ")  # identical sheets share a rank: its legend
    assert board[-2].startswith("tie: ") and len(board) == 2 + 100 + 2 + shared  # no other note
    forced = fit(y, "2pl", settings=FitSettings(seed=0, progress=False, ability_factor="quadrature"))
    assert forced.extra["ability_factor"]["method"] == "quadrature" and not forced.converged


def _two_iteration_data():
    rng = np.random.default_rng(0)
    theta, b = rng.normal(size=100), rng.normal(size=10)
    return (rng.random((100, 10)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(np.int8)


def test_auto_samples_a_small_matrix_with_nuts_when_quadrature_does_not_converge(
        monkeypatch, tmp_path, capsys):
    """Within ``nuts_fallback_max_cells`` (here exactly at it) ``auto`` samples the exact
    posterior with NUTS where the quadrature fit ends unconverged, rather than fitting the
    mean-field posterior, whose intervals are too narrow on small leaderboards: the result
    is ``fit_nuts``'s at the same seed, to the bit, and fit.json, the fit command and the
    leaderboard say which ran and why."""
    from dataclasses import replace

    import engine.api
    from engine.api import fit_nuts
    from engine.cli import main
    from engine.infer.marginal import MarginalSettings, fit_marginal_result
    from engine.infer.nuts import NutsSettings
    from engine.runfiles import read_info

    def two_iterations(spec, y, fit_settings, settings=MarginalSettings(), aside=None, **kw):
        return fit_marginal_result(spec, y, fit_settings, replace(settings, max_iter=2, sampler_chains=0), aside)

    monkeypatch.setattr(engine.api, "fit_marginal_result", two_iterations)
    y = _two_iteration_data()
    res = fit(y, "2pl", settings=FitSettings(seed=3, progress=False,
                                             nuts_fallback_max_cells=1000))
    record = res.extra["ability_factor"]
    assert record["method"] == "nuts" and record["quadrature_wall_s"] > 0
    d = res.extra["diagnostics"]
    assert record["quadrature_not_converged"] == (  # the item sampler is off here
        f"2 iterations; sampled from there, not kept: sampler_chains is 0; NUTS sampled the "
        f"posterior instead (4 chains x 1000 draws, R-hat "
        f"{d['rhat_max']:.3f}" + ("" if res.converged else f" > {d['max_rhat']}: not converged")
        + ")")
    assert res.converged == (d["rhat_max"] <= d["max_rhat"])
    reference = fit_nuts(y, "2pl", NutsSettings(seed=3, extend=1))
    for name, draws in reference.draws.items():
        np.testing.assert_array_equal(res.draws[name], draws)
    rows = [",".join(["subject"] + [f"i{j}" for j in range(y.shape[1])])]
    rows += [",".join([f"s{i}"] + [str(v) for v in row]) for i, row in enumerate(y)]
    (tmp_path / "y.csv").write_text("\n".join(rows) + "\n")  # through the command line
    assert main(["ingest", str(tmp_path / "y.csv"), "--out", str(tmp_path / "st")]) == 0
    capsys.readouterr()
    assert main(["fit", str(tmp_path / "st"), "--model", "2pl", "--seed", "3",
                 "--out", str(tmp_path / "run")]) == 0
    said = capsys.readouterr()
    assert "2pl NUTS " in said.out and "4 chains x 1000 draws" in said.out
    # the sampler shows nothing while it runs: a line says what runs before it starts
    assert ("the quadrature fit did not converge (2 iterations; sampled from there, not kept: "
            "sampler_chains is 0); sampling the posterior with NUTS instead: 4 chains x (500 "
            "warm-up + 1000 draws) over ") in said.err
    info = read_info(tmp_path / "run")
    assert info["method"] == "nuts" and info["ability_factor"]["method"] == "nuts"
    assert info["readout"]["item_intervals"] == "posterior draws (NUTS)"
    assert (tmp_path / "run" / "draws.nc").is_file()
    assert main(["leaderboard", str(tmp_path / "run")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes[0].startswith("note: the quadrature fit (abilities integrated out) did not "
                               "converge in ") and "NUTS sampled the posterior instead" in notes[0]


def test_auto_samples_a_board_of_few_subjects_with_nuts_first_where_asked():
    """With ``nuts_first_subjects`` a board with fewer subjects (and within
    ``nuts_fallback_max_cells``) is sampled by NUTS where ``auto`` would take the quadrature
    fit: ``fit_nuts``'s result at the same seed, to the bit, with fit.json's
    ``ability_factor`` saying why. At as many subjects as the bound, above the cell bound,
    at the default (30) or with 0, the quadrature fit runs."""
    from engine.api import fit_nuts
    from engine.errors import SettingsError
    from engine.infer.nuts import NutsSettings

    y = _two_iteration_data()  # 100 x 10
    res = fit(y, "2pl", FitSettings(seed=3, nuts_first_subjects=101))
    record = res.extra["ability_factor"]
    assert record["method"] == "nuts"
    assert record["nuts_first"] == "100 subjects, fewer than nuts_first_subjects (101)"
    assert res.extra["compile"]["programs"] >= 0 and "quadrature" not in res.extra
    reference = fit_nuts(y, "2pl", NutsSettings(seed=3, extend=1))
    for name, draws in reference.draws.items():
        np.testing.assert_array_equal(res.draws[name], draws)
    for settings in (FitSettings(nuts_first_subjects=100),  # the other side of the switch
                     FitSettings(nuts_first_subjects=101, nuts_fallback_max_cells=999),
                     FitSettings(), FitSettings(nuts_first_subjects=0)):
        other = fit(y, "2pl", settings)
        assert other.extra["ability_factor"]["method"] == "quadrature"
        assert "nuts_first" not in other.extra["ability_factor"]
    with pytest.raises(SettingsError, match="nuts_first_subjects must be >= 0"):
        FitSettings(nuts_first_subjects=-1)


OPENML = (Path(__file__).resolve().parents[3].parent / "shared" / "data" / "openml_classifiers"
          / "responses_items_x_subjects.parquet")


@pytest.mark.skipif(not OPENML.exists(), reason=f"shared data not found at {OPENML}")
def test_a_quadrature_fit_that_makes_no_progress_stops_at_its_best_pass(monkeypatch):
    """The 2PL on 19 classifiers x 501 Bioresponse instances: the quadrature fit's objective
    peaks near pass 20, then fell by hundreds of nats as discriminations ran off (500
    passes, 88 s before the guard); with the globals' gradient made the Laplace objective's
    it wandered within about 10 nats; with the items' EM step halved as a whole until the
    objective does not fall, it rises by ever smaller amounts (with four halvings every step
    was refused from pass 26 on). It stops
    once it has made no progress for ``divergence_patience`` passes, keeps the best pass's
    values, is not converged, and ``auto`` falls back to the mean-field fit saying why.
    ``auto`` runs the same (seeded, deterministic) quadrature fit as the forced one: it is
    run once and handed to both."""
    import pandas as pd

    import engine.infer.marginal as marginal
    from engine.infer.marginal import MarginalSettings

    runs, real = {}, marginal.fit_marginal

    def fit_marginal_once(spec, y, settings=MarginalSettings(), aside=None, progress_fn=None):
        assert aside is None
        # a tighter guard than the default (30 passes, 0.1 nats): where this fit creeps
        # after its peak depends on float rounding (the order of XLA's sums, the route its
        # item terms take): with the default guard it stopped at pass 89-182 or crept on by
        # tenths of a nat to pass 500 (the items' terms through the linear predictor, two
        # threads); it gains no nat in any ten passes after its peak
        settings = replace(settings, divergence_patience=10, flat_progress=1.0)
        key = (spec.name, np.asarray(y).tobytes(), np.asarray(y).shape, settings)
        if key not in runs:
            runs[key] = real(spec, y, settings, aside, progress_fn)
        return runs[key]

    monkeypatch.setattr(marginal, "fit_marginal", fit_marginal_once)
    df = pd.read_parquet(OPENML)
    y = df[df["dataset"] == "Bioresponse"].iloc[:, 3:].to_numpy().T.astype(np.int8)
    # one memory budget for both fits: by default it is half the memory free at the time,
    # and the settings it caps (full_cov_max) then differ between two fits on a busy machine
    budget = 4 << 30
    forced = fit(y, "2pl", FitSettings(seed=0, progress=False, ability_factor="quadrature",
                                       memory_budget=budget))
    diverged = forced.extra["quadrature"]["diverged"]
    patience = 10
    assert not forced.converged and diverged is not None
    assert diverged["at_pass"] - diverged["last_progress_pass"] >= patience
    assert diverged["best_pass"] >= diverged["last_progress_pass"]
    # (whether items are left without an sd where it stops depends on the path as well: 2-3
    # of them on one thread, none on two)
    # with the whole step halved up to ten times it creeps on by fractions of a nat and stops
    # at pass 100-280 (no progress from pass 70-250 on; the float rounding of XLA's threads
    # decides which; 212 under a floor that capped every indefinite information; 105 with its
    # programs optimised from pass 21, 465 with them optimised throughout); since a pass
    # counts as progress only where it gains MarginalSettings.flat_progress (0.1 nats) while
    # an item has no sd, at pass 182 (259 before, on the same machine)
    assert forced.num_passes == diverged["at_pass"] - 1 < 500  # short of max_iter's 500
    # the first passes' objective leaves out the items' volumes (``volume_from_pass``)
    assert [row["items_volume"] for row in forced.trace[:4]] == [False] * 3 + [True]
    elbos = [row["elbo"] for row in forced.trace if row["items_volume"]]
    # the pass that stopped evaluated its objective, took no step and left no trace row:
    # still creeping up, it can be the best
    assert diverged["best_objective"] == max(elbos + [diverged["objective"]])
    # the items' and the hyper-parameters' EM steps are kept only where the objective does
    # not fall: before, single passes lost 25-135 nats here (pass 27: -5,899.7 -> -6,034.4),
    # and with the hyper-parameters' step checked, up to 10; now only the nodes' re-adaptation
    # between passes moves it (0.001 here)
    drops = -np.diff(elbos)
    assert drops.max() < 0.1
    # the mean-field fallback (NUTS, within nuts_fallback_max_cells, is its own test)
    auto = fit(y, "2pl", FitSettings(seed=0, progress=False, nuts_fallback_max_cells=0,
                                     memory_budget=budget)).extra["ability_factor"]
    assert len(runs) == 1  # the same quadrature fit: same model, data and settings
    assert auto["method"] == "gaussian"
    assert auto["quadrature_not_converged"].startswith(
        f"no progress from iteration {diverged['last_progress_pass']} on")
    # a stalled mode search is sampled from its best pass where the sampler applies; here it
    # does not (19 patterns: no shared ability grid), and the message says so
    assert forced.extra["quadrature"]["item_moments"]["sampler"]["started_at"]
    assert "sampled from there, not kept: no shared ability grid" in auto[
        "quadrature_not_converged"]


def test_a_mode_search_out_of_iterations_is_sampled_from_its_last_pass():
    """A quadrature fit that used all of ``max_iter`` without converging (NLU mutual, 18 x
    443, 2PL: EM steps still gaining 0.02-0.03 nats a pass at pass 500) was read at its
    Laplace approximation, not converged, and ``auto`` fell back to the mean-field fit; now
    its items' posterior is sampled from the last pass, as a stalled search's is from its
    best, and where the chains mix the fit is kept. Two passes here, against NUTS."""
    from engine.api import fit_nuts
    from engine.infer.marginal import MarginalSettings, fit_marginal_result
    from engine.models import get_model

    y = _two_iteration_data()
    res = fit_marginal_result(get_model("2pl", prior="population"), y, FitSettings(),
                              MarginalSettings(max_iter=2))
    record = res.extra["quadrature"]
    assert not record["mode_converged"] and record["item_moments"]["method"] == "sampled"
    sampler = record["item_moments"]["sampler"]
    assert sampler["started_at"] == ("the last pass (2) of a mode search that had not "
                                     "converged in max_iter passes")
    assert res.converged == (sampler["rhat_max"] <= MarginalSettings().sampler_rhat_max)
    assert res.converged  # measured: R-hat 1.018
    ref = fit_nuts(y, "2pl")
    for block in ("ability", "difficulty", "discrimination"):
        ref_sd = np.exp(np.asarray(ref.guide.log_scale[block], np.float64))
        z = np.abs(np.asarray(res.guide.loc[block]) - np.asarray(ref.guide.loc[block])) / ref_sd
        assert z.max() < 0.25, (block, z.max())  # measured 0.05-0.08
    ratio = np.exp(np.asarray(res.guide.log_scale["ability"], np.float64)) / np.exp(
        np.asarray(ref.guide.log_scale["ability"], np.float64))
    assert 0.8 < ratio.min() and ratio.max() < 1.25


def test_the_command_line_sets_nuts_first_subjects_and_refuses_a_negative_count(capsys):
    """``fit --nuts-first-subjects S`` reaches the fit's settings (default 30, 0 turns NUTS-first
    off); a negative count is refused by the parser, naming the flag."""
    from engine.cli import _settings, build_parser

    parser = build_parser()
    default = _settings(parser.parse_args(["fit", "st", "--out", "r"])).nuts_first_subjects
    assert default == FitSettings.nuts_first_subjects == 30  # the parser's and the library's
    fit_help = next(a for a in parser._subparsers._group_actions[0].choices["fit"]._actions
                    if "--nuts-first-subjects" in a.option_strings).help
    assert f"up to {FitSettings.nuts_fallback_max_cells:,} observed cells" in fit_help
    assert f"default {FitSettings.nuts_first_subjects};" in fit_help
    args = parser.parse_args(["fit", "st", "--out", "r", "--nuts-first-subjects", "0"])
    assert _settings(args).nuts_first_subjects == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["fit", "st", "--out", "r", "--nuts-first-subjects", "-1"])
    assert "--nuts-first-subjects" in capsys.readouterr().err
