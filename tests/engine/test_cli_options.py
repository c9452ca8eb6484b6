"""Options are validated where they are parsed: one line naming the option, exit 2."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

from engine.cli import main


@pytest.mark.parametrize("argv, option", [
    (["fit", "s", "--out", "r", "--top-k", "0"], "--top-k"),
    (["fit", "s", "--out", "r", "--top-k", "-2"], "--top-k"),
    (["fit", "s", "--out", "r", "--tol", "nan"], "--tol"),
    (["fit", "s", "--out", "r", "--tol", "0"], "--tol"),
    (["fit", "s", "--out", "r", "--tol", "inf"], "--tol"),
    (["fit", "s", "--out", "r", "--max-passes", "0"], "--max-passes"),
    (["fit", "s", "--out", "r", "--devices", "0"], "--devices"),
    (["fit", "s", "--out", "r", "--draws", "ten"], "--draws"),
    (["fit", "s", "--out", "r", "--mc-draws", "-1"], "--mc-draws"),
    (["compare", "s", "--models", "1pl", "--holdout", "1"], "--holdout"),
    (["leaderboard", "r", "--threshold", "1.5"], "--threshold"),
    (["leaderboard", "r", "--top-k", "0"], "--top-k"),
    (["bootstrap", "s", "--out", "o", "--replicates", "0"], "--replicates"),
    (["items", "r", "--top", "0"], "--top"),
])
def test_bad_option_is_one_line_naming_it(argv, option, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {option}" in err and "--help" in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_max_passes_under_the_default_minimum_is_taken(tmp_path, capsys):
    """``--max-passes 3`` fits three passes: the command line sets no ``min_passes``, whose
    default (10) once made it an error naming a setting the user could not change."""
    csv = tmp_path / "r.csv"
    rows = [f"s{i}," + ",".join(str(int((i * 7 + j * 3) % 5 < 3)) for j in range(6))
            for i in range(40)]
    csv.write_text("subject," + ",".join(f"i{j}" for j in range(6)) + "\n" + "\n".join(rows) + "\n")
    assert main(["ingest", str(csv), "--out", str(tmp_path / "s.zarr")]) == 0
    assert main(["fit", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run"), "--quiet",
                 "--ability-factor", "gaussian", "--max-passes", "3"]) == 0
    assert "in 3 passes" in capsys.readouterr().out


def test_devices_above_those_present_is_a_clear_error(tmp_path):
    from engine.errors import SettingsError
    from engine.infer.parallel import num_local_devices

    with pytest.raises(SettingsError, match="--devices 99: only"):
        num_local_devices(99)


def test_a_platform_the_machine_lacks_is_a_clear_error(tmp_path):
    """JAX_PLATFORMS naming a backend that cannot start (cuda on this CPU-only machine, or a
    made-up name): one line naming the variable and the fix, exit 2, no run written."""
    csv = tmp_path / "r.csv"
    csv.write_text("subject,a,b,c\ns1,1,0,1\ns2,0,1,1\ns3,1,1,0\n")
    assert main(["ingest", str(csv), "--out", str(tmp_path / "s.zarr")]) == 0
    platform = "cuda" if not os.path.exists("/dev/nvidia0") else "no-such-platform"
    env = {**os.environ, "JAX_PLATFORMS": platform}
    out = subprocess.run([sys.executable, "-m", "engine.cli", "fit", str(tmp_path / "s.zarr"),
                          "--out", str(tmp_path / "run")], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 2, out.stderr
    assert f"JAX_PLATFORMS='{platform}'" in out.stderr and "unset JAX_PLATFORMS" in out.stderr
    assert out.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_help_and_version_import_no_numerics():
    """--help and --version load neither JAX, Dask, SciPy, Ray nor matplotlib."""
    code = ("import sys, contextlib, io\n"
            "from engine.cli import main\n"
            "for argv in (['--help'], ['--version']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "        assert main(argv) == 0\n"
            "    assert 'irt-engine' in out.getvalue()\n"
            "print(repr(out.getvalue()))\n"
            "heavy = [m for m in ('jax', 'dask', 'scipy', 'ray', 'matplotlib', 'pandas', 'zarr')"
            " if m in sys.modules]\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, heavy = out.stdout.strip().splitlines()
    assert heavy == "[]"
    # looked up when asked for, not while the parser is built for every command
    assert version == repr(f"irt-engine {importlib.metadata.version('irt-engine')}\n")


def test_environment_failure_is_one_line_with_the_fix(tmp_path, capsys):
    """An output path under a regular file: the OS error, the path and what to do."""
    csv = tmp_path / "r.csv"
    csv.write_text("subject,a,b\ns1,1,0\ns2,0,1\n")
    (tmp_path / "file").write_text("")
    assert main(["ingest", str(csv), "--out", str(tmp_path / "file" / "store")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "irt-engine ingest: error:" in err and str(tmp_path / "file") in err


def test_internal_error_is_one_line_pointing_at_the_traceback(tmp_path, capsys, monkeypatch):
    import engine.cli as cli

    def broken(args):
        raise ZeroDivisionError("planted bug")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["leaderboard"].set_defaults(func=broken)
    assert main(["leaderboard", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (ZeroDivisionError: planted bug)" in err
    log = err.split("the traceback is in ")[1].split(";")[0]
    try:
        assert "Traceback" in open(log).read() and "planted bug" in open(log).read()
    finally:
        os.unlink(log)
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "leaderboard", str(tmp_path)])


def test_an_in_memory_fit_never_imports_dask_array():
    """Dask's array module (about a second to import) only for stores that stream."""
    code = ("import sys, numpy as np\n"
            "import engine\n"
            "y = (np.random.default_rng(0).random((30, 6)) < 0.5).astype(np.int8)\n"
            "engine.fit(y, model='1pl')\n"
            "print('dask.array' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_command_exits_without_teardown_and_loses_nothing(tmp_path):
    """``irt-engine`` (``engine.cli.run``) ends the process without freeing the interpreter:
    a piped read-out arrives whole, exit handlers run, exit codes are kept, and a
    non-daemon thread still running is waited for as the interpreter would."""
    csv = tmp_path / "r.csv"
    rows = [f"s{i}," + ",".join(str((i * 7 + j * 3) % 5 % 2) for j in range(6))
            for i in range(300)]
    csv.write_text("subject," + ",".join(f"q{j}" for j in range(6)) + "\n" + "\n".join(rows))
    store, run = tmp_path / "s.zarr", tmp_path / "run"

    def command(*argv, prelude=""):
        code = f"import sys\n{prelude}\nfrom engine.cli import run\nrun({list(argv)!r})\n"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    marker = tmp_path / "handler-ran"
    out = command("ingest", str(csv), "--out", str(store), prelude=(
        f"import atexit, pathlib; atexit.register(pathlib.Path({str(marker)!r}).touch)"))
    assert out.returncode == 0 and "300 subjects x 6 items" in out.stdout, out.stderr
    assert marker.exists()  # exit handlers ran
    assert command("fit", str(store), "--out", str(run), "--model", "1pl").returncode == 0
    board = command("leaderboard", str(run))
    assert board.returncode == 0, board.stderr
    assert len([line for line in board.stdout.splitlines() if line.strip()[:1].isdigit()]) == 300
    missing = command("fit", str(tmp_path / "nothing"), "--out", str(tmp_path / "r2"))
    assert missing.returncode == 2 and "no such response store" in missing.stderr
    waited = command("--version", prelude=(
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done', flush=True)))"
        ".start()"))
    assert waited.returncode == 0 and waited.stdout.rstrip().endswith("thread done")
