"""End to end through the command line, on real matrices from ../shared/data."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.run import load_run

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"shared data not found at {DATA}")

SUBJECT_COLUMNS = {"subject", "ability_mean", "ability_sd", "ability_q05", "ability_q95", "accuracy",
                   "n_responses", "rank_mean", "rank_q05", "rank_q95", "p_top1"}
ITEM_COLUMNS = {"item", "difficulty_mean", "difficulty_sd", "discrimination_mean", "discrimination_sd",
                "mean_response", "n_responses"}


@needs_data
def test_ingest_fit_leaderboard_on_lsat7(tmp_path, capsys):
    store, run = tmp_path / "lsat7.zarr", tmp_path / "run"
    assert main(["ingest", str(DATA / "demo" / "lsat7.csv"), "--out", str(store)]) == 0
    assert main(["fit", str(store), "--model", "2pl", "--out", str(run), "--quiet"]) == 0
    assert main(["leaderboard", str(run), "--top-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "converged" in out and "rank" in out
    r = load_run(run)
    assert SUBJECT_COLUMNS <= set(r.subjects.columns)
    assert ITEM_COLUMNS <= set(r.items.columns)
    info = json.loads((run / "fit.json").read_text())
    for key in ("model", "spec", "settings", "elbo_trace", "timings", "versions", "data"):
        assert key in info
    assert info["data"]["checksum"]
    # Item means of LSAT section 7 (Bock & Lieberman 1970) and their IRT ordering:
    # the easiest item has the lowest difficulty.
    np.testing.assert_allclose(r.items["mean_response"], [0.828, 0.658, 0.772, 0.606, 0.843], atol=1e-3)
    assert np.argmin(r.items["difficulty_mean"]) in (0, 4)
    assert r.pairwise().shape == (1000, 1000)
    # A higher raw score never gets a lower ability posterior mean (monotone in 2PL up to
    # discrimination weighting; check at the extremes).
    s = r.subjects
    assert s.loc[s.accuracy == 1.0, "ability_mean"].min() > s.loc[s.accuracy == 0.0, "ability_mean"].max()


@needs_data
def test_fit_on_real_nlu_slice(tmp_path):
    wide = pd.read_parquet(DATA / "nlu" / "responses_items_x_subjects.parquet")
    subjects = [c for c in wide.columns if c not in ("item_id", "item", "dataset")]
    part = wide.iloc[:3000]
    df = pd.DataFrame(part[subjects].to_numpy().T, columns=part["item"].tolist())
    df.insert(0, "subject", subjects)
    src = tmp_path / "nlu.csv"
    df.to_csv(src, index=False)
    assert main(["ingest", str(src), "--out", str(tmp_path / "s")]) == 0
    assert main(["fit", str(tmp_path / "s"), "--model", "1pl", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0
    r = load_run(tmp_path / "r")
    # ability orders subjects like accuracy on a complete matrix under 1PL
    rho = pd.Series(r.subjects.ability_mean).corr(r.subjects.accuracy, method="spearman")
    assert rho > 0.99


def test_bad_input_exits_nonzero_with_named_file(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("subject,q1,q2\nA,1,0\nB,0.7x,1\n")
    assert main(["ingest", str(bad), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "0.7x" in err
    assert not (tmp_path / "s").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.csv"]


def test_missing_store_and_run(tmp_path, capsys):
    assert main(["fit", str(tmp_path / "nope"), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "irt-engine ingest" in capsys.readouterr().err
    assert main(["leaderboard", str(tmp_path / "nope")]) == 2
    assert "fit.json" in capsys.readouterr().err


def _tiny_store(tmp_path):
    y = tmp_path / "y.csv"
    y.write_text("subject,a,b,c\ns1,1,0,1\ns2,0,1,1\ns3,0,0,1\ns4,1,1,0\n")
    assert main(["ingest", str(y), "--out", str(tmp_path / "s")]) == 0
    return tmp_path / "s"


@pytest.mark.parametrize("option,message", [(["--model", "5pl"], "5pl"),
                                            (["--mc-draws", "-1"], "argument --mc-draws: must be >= 0")])
def test_bad_fit_option_is_a_clear_error(tmp_path, capsys, option, message):
    store = _tiny_store(tmp_path)
    assert main(["fit", str(store), *option, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_mc_draws_flag_reaches_the_fit(tmp_path):
    store = _tiny_store(tmp_path)
    for flag, expected in ((["--mc-draws", "3"], 3), ([], 16)):  # 12 cells: automatic = 16
        run = tmp_path / f"r{expected}"
        assert main(["fit", str(store), *flag, "--model", "1pl", "--max-passes", "12",
                     "--ability-factor", "gaussian", "--out", str(run), "--quiet"]) == 0
        info = json.loads((run / "fit.json").read_text())
        assert info["mc_draws_per_step"] == expected
        assert info["settings"]["mc_draws"] == (expected if flag else 0)


def test_run_dir_not_overwritten_without_flag(tmp_path, capsys):
    store = _tiny_store(tmp_path)
    # the fit of test_mc_draws_flag_reaches_the_fit: its programs are already compiled
    args = ["fit", str(store), "--model", "1pl", "--out", str(tmp_path / "r"), "--quiet",
            "--max-passes", "12", "--ability-factor", "gaussian"]
    assert main(args) == 0
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.tmp")]


def test_the_cli_keeps_compiled_programs_between_runs(tmp_path):
    """A second identical command loads its programs from the compilation cache."""
    rng = np.random.default_rng(0)
    y = (rng.random((30, 40)) < 0.6).astype(int)
    pd.DataFrame(y, index=[f"s{i}" for i in range(30)],
                 columns=[f"i{j}" for j in range(40)]).rename_axis("subject").to_csv(tmp_path / "w.csv")
    cache = tmp_path / "cache"
    env = {**os.environ, "IRT_ENGINE_COMPILATION_CACHE": "1",
           "JAX_COMPILATION_CACHE_DIR": str(cache)}
    cli = [sys.executable, "-m", "engine.cli"]
    subprocess.run(cli + ["ingest", str(tmp_path / "w.csv"), "--out", str(tmp_path / "s.zarr")],
                   env=env, check=True, capture_output=True)
    traces = []
    for k in range(2):
        subprocess.run(cli + ["fit", str(tmp_path / "s.zarr"), "--model", "1pl", "--out",
                              str(tmp_path / f"run{k}"), "--quiet"], env=env, check=True,
                       capture_output=True)
        trace = json.loads((tmp_path / f"run{k}" / "fit.json").read_text())["elbo_trace"]
        traces.append([r["elbo"] for r in trace])
        assert any(p.is_file() for p in cache.rglob("*"))  # programs were written
    assert traces[0] == traces[1]  # same seed, same fit, whether compiled or loaded


def test_a_reader_that_leaves_early_stops_the_command_quietly(tmp_path):
    """``irt-engine leaderboard run | head -1``: the closed pipe is no error message (1,000
    subjects: more than a pipe's 64 KiB buffer, so the command writes after ``head`` left)."""
    rng = np.random.default_rng(1)
    y = (rng.random((1000, 12)) < 0.6).astype(int)
    pd.DataFrame(y, index=[f"s{i}" for i in range(1000)],
                 columns=[f"i{j}" for j in range(12)]).rename_axis("subject").to_csv(tmp_path / "w.csv")
    assert main(["ingest", str(tmp_path / "w.csv"), "--out", str(tmp_path / "s.zarr")]) == 0
    assert main(["fit", str(tmp_path / "s.zarr"), "--model", "1pl", "--out", str(tmp_path / "run"),
                 "--quiet"]) == 0
    done = subprocess.run(f"{sys.executable} -m engine.cli leaderboard {tmp_path / 'run'} | head -1",
                          shell=True, capture_output=True, text=True, check=True)
    assert done.stdout.startswith("rank") and done.stdout.count("\n") == 1
    assert done.stderr == ""


def test_a_broken_pipe_that_is_not_standard_output_is_an_error(tmp_path, monkeypatch, capsys):
    """Only a closed standard output stops quietly: a broken pipe elsewhere (a socket, a
    child process) is reported in one line and exits 2."""
    import engine.cli as cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_leaderboard", broken)
    assert main(["leaderboard", str(tmp_path / "run")]) == 2
    assert "error: Broken pipe" in capsys.readouterr().err


def _readme_commands() -> list[str]:
    """Every ``irt-engine ...`` line in the README's code blocks, comments cut, a synopsis's
    ``[--option value]`` groups opened and ``,...`` dropped."""
    import re

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = [line.strip() for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
             for line in block.splitlines()]
    return [re.sub(r"\s+#.*$", "", line).replace("[", "").replace("]", "").replace(",...", "")
            for line in lines if line.startswith("irt-engine ")]


def test_every_command_the_readme_shows_parses():
    """The README's commands name subcommands and options the parser has, with values it
    takes (``subset --ability -1,2`` was refused by argparse before its value was joined on)."""
    import shlex

    from engine.cli import _join_signed_ranges, build_parser

    commands = _readme_commands()
    assert len(commands) >= 30 and any(c.startswith("irt-engine subset") for c in commands)
    for command in commands:
        try:
            build_parser().parse_args(_join_signed_ranges(shlex.split(command)[1:]))
        except SystemExit as exit_:
            pytest.fail(f"README: {command!r} does not parse (exit {exit_.code})")
