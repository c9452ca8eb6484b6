"""Resuming a trial command: only into trials of the same settings, and kill -9 safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cluster.bootstrap import run_bootstrap
from cluster.resume import RECORD, check_or_record, differences, responses_checksum
from cluster.settings import BootstrapSettings, RunnerSettings, StabilitySettings
from cluster.stability import run_stability
from engine.errors import SettingsError
from tests.cluster.conftest import simulate_2pl

REPO = Path(__file__).resolve().parents[2]
INPROCESS = RunnerSettings(backend="inprocess", batch_size=2, progress=False)
SMALL = StabilitySettings(sizes=(10,), trials_per_size=2, passes=6, bootstrap=50)


def test_checksum_changes_with_any_cell_shape_or_dtype():
    y = simulate_2pl(6, 5, seed=1)
    flipped = y.copy()
    flipped[3, 2] = 1 - flipped[3, 2]
    sums = {responses_checksum(y), responses_checksum(flipped), responses_checksum(y.reshape(5, 6)),
            responses_checksum(y.astype(np.int16))}
    assert len(sums) == 4
    assert responses_checksum(y.copy()) == responses_checksum(y)


def test_differences_name_each_changed_setting():
    old = {"settings": {"seed": 0, "model": "2pl", "passes": 6}, "responses": "sha256:a"}
    new = {"settings": {"seed": 1, "model": "2pl", "passes": 6}, "responses": "sha256:b"}
    assert differences(old, new) == ["responses: sha256:a -> sha256:b", "settings.seed: 0 -> 1"]
    assert differences(old, old) == []


def test_record_written_once_and_trials_without_record_refused(tmp_path):
    check_or_record(tmp_path / "a", {"x": 1}, ("t.parquet",), write=False)
    assert not (tmp_path / "a").exists()  # a check alone leaves nothing behind
    check_or_record(tmp_path / "a", {"x": (1, 2)}, ("t.parquet",))
    assert json.loads((tmp_path / "a" / RECORD).read_text()) == {"x": [1, 2]}
    check_or_record(tmp_path / "a", {"x": (1, 2)}, ("t.parquet",))  # same: resumes
    (tmp_path / "b").mkdir()
    pd.DataFrame({"trial_group": [0], "trial_index": [0]}).to_parquet(tmp_path / "b" / "t.parquet")
    with pytest.raises(SettingsError, match=r"holds trials \(t.parquet\) without a record"):
        check_or_record(tmp_path / "b", {"x": 1}, ("t.parquet",))


@pytest.mark.parametrize("settings, data_seed, named", [
    (SMALL.replace(seed=1), 3, "settings.seed: 0 -> 1"),
    (SMALL.replace(model="1pl"), 3, "settings.model: 2pl -> 1pl"),
    (SMALL, 4, "responses: sha256:"),
])
def test_stability_refuses_to_resume_other_settings_or_data(tmp_path, settings, data_seed, named):
    y = simulate_2pl(24, 40, seed=3)
    out = tmp_path / "st"
    first = run_stability(y, out, SMALL, INPROCESS)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SettingsError, match=f"--out {out} holds trials run with other settings "
                                            rf"\(.*{named}"):
        run_stability(simulate_2pl(24, 40, seed=data_seed), out, settings, INPROCESS)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched
    # The same settings resume (nothing left to run) and give the same table.
    again = run_stability(y, out, SMALL, INPROCESS)
    pd.testing.assert_frame_equal(again.trials, first.trials)


def test_bootstrap_refuses_another_replicate_count(tmp_path):
    y = simulate_2pl(24, 40, seed=3)  # the stability tests' matrix: its full fit is compiled
    settings = BootstrapSettings(replicates=2, passes=4)
    run_bootstrap(y, tmp_path, settings, INPROCESS)
    with pytest.raises(SettingsError, match=r"settings.replicates: 2 -> 3"):
        run_bootstrap(y, tmp_path, settings.replace(replicates=3), INPROCESS)
    # A setting that only shapes the intervals (level) does not block a resume.
    run_bootstrap(y, tmp_path, settings.replace(level=0.8), INPROCESS)


def test_kill_9_then_rerun_equals_an_uninterrupted_run(tmp_path):
    from engine.data import ingest

    y = simulate_2pl(24, 60, seed=7)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(y.shape[1])])
    df.insert(0, "subject", [f"s{i}" for i in range(y.shape[0])])
    df.to_csv(tmp_path / "wide.csv", index=False)
    store = ingest(tmp_path / "wide.csv", tmp_path / "store").path
    out = tmp_path / "st"
    args = [sys.executable, "-m", "engine.cli", "stability", str(store), "--out", str(out),
            "--sizes", "10", "--trials-per-size", "4", "--batch-size", "1", "--passes", "6",
            "--backend", "inprocess", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parts = out / ".stability.parquet.parts"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if parts.is_dir() and len(list(parts.glob("part-*.parquet"))) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the command finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(parts.glob("part-*.parquet")))
    assert 2 <= done < 4 and not (out / "stability.parquet").exists()
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    # The uninterrupted reference, in this process, with the settings the command builds.
    ref = run_stability(store, tmp_path / "ref", StabilitySettings(
        sizes=(10,), trials_per_size=4, passes=6), INPROCESS.replace(batch_size=1))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "stability.parquet"), ref.trials)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "summary.parquet"), ref.summary)


def test_a_model_that_cannot_fit_the_data_leaves_out_unwritten(tmp_path):
    """The model is built for the data before anything is written: a failed start leaves no
    ``trials.json`` behind to refuse the corrected rerun as other settings."""
    from cluster.dimensions import run_dimensions
    from cluster.settings import DimensionsSettings
    from engine.errors import IRTError

    y = simulate_2pl(30, 20, seed=2)
    runs = [(run_stability, StabilitySettings(sizes=(10,), trials_per_size=2, passes=6,
                                              bootstrap=50, model="beta")),
            (run_bootstrap, BootstrapSettings(replicates=2, passes=3, model="beta")),
            (run_dimensions, DimensionsSettings(shuffles=2, model="beta"))]
    for run, settings in runs:
        out = tmp_path / run.__name__
        with pytest.raises(IRTError, match=r"all 600 observed responses are exactly 0 or 1"):
            run(y, out, settings, INPROCESS)
        assert not out.exists(), run.__name__
    run_stability(y, tmp_path / "run_stability", SMALL, INPROCESS)  # the corrected rerun
    assert (tmp_path / "run_stability" / "stability.parquet").exists()
    # a matrix held in memory is read by its values, as its fit reads it: 0/1 scores of a
    # store declared unit fit the 2PL
    from cluster.resume import check_model_fits

    check_model_fits("2pl", None, y.astype(np.float32), "unit")
    # the multi-skill models, which need --dims, are refused by name up front
    with pytest.raises(SettingsError, match=r"--model 'mirt-comp' \(trials rank subjects by one "
                                            r"ability\): choose one of 1pl, 2pl, .*gamma"):
        DimensionsSettings(model="mirt-comp")
