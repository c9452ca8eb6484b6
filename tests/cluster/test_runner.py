"""The trial runner in-process: batching, Parquet streaming, resume, exactly-once rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cluster.runner import batches, done_keys, interleave, run_trials
from cluster.settings import RunnerSettings, StabilitySettings, default_sizes, parse_sizes
from cluster.stability import plan
from cluster.trials import TrialSpec, kendall, stability_batch, trial_seed
from engine.errors import SettingsError

INPROCESS = RunnerSettings(backend="inprocess", batch_size=2, progress=False)


def test_batches_hold_one_group_and_cover_every_trial_once():
    trials = [TrialSpec(g, i, trial_seed(0, g, i)) for g in (10, 30) for i in range(5)]
    got = batches(trials[::-1], 2)
    assert all(len({t.group for t in b}) == 1 and len(b) <= 2 for b in got)
    flat = [t.key for b in got for t in b]
    assert sorted(flat) == sorted(t.key for t in trials) and len(flat) == len(set(flat))
    assert len(got) == 6  # 5 trials per group in batches of 2 -> 3 + 3
    order = [b[0].group for b in interleave(got)]
    assert order == [10, 30, 10, 30, 10, 30] and sorted(map(id, interleave(got))) == sorted(map(id, got))


def test_trial_seeds_are_distinct_and_reproducible():
    seeds = {trial_seed(0, g, i) for g in range(20) for i in range(50)}
    assert len(seeds) == 1000
    assert trial_seed(7, 25, 3) == trial_seed(7, 25, 3) != trial_seed(8, 25, 3)


def test_sizes_default_doubling_to_half_and_validation():
    assert default_sizes(11873) == (25, 50, 100, 200, 400, 800, 1600, 3200, 5936)
    assert parse_sizes("100, 25,50") == (25, 50, 100)
    with pytest.raises(SettingsError, match="--sizes"):
        parse_sizes("25,x")
    with pytest.raises(SettingsError, match="half the items"):
        StabilitySettings(sizes=(25, 80)).resolved_sizes(120)
    with pytest.raises(SettingsError, match="--model"):
        StabilitySettings(model="9pl")
    with pytest.raises(SettingsError, match="--batch-size"):
        RunnerSettings(batch_size=0)


def test_stability_rows_two_per_trial_with_valid_taus(stability_ctx, tmp_path):
    trials = plan(StabilitySettings(sizes=(10, 30), trials_per_size=4), 120)
    df = run_trials(stability_batch, stability_ctx, trials, tmp_path / "s.parquet", INPROCESS)
    assert len(df) == 2 * len(trials)
    assert set(df["method"]) == {"irt", "accuracy"}
    assert df[["tau_between", "tau_full"]].apply(lambda c: c.between(-1, 1)).all().all()
    # A bigger sample ranks closer to the full data, for both methods.
    mean = df.groupby(["size", "method"])["tau_full"].mean().unstack()
    assert (mean.loc[30] > mean.loc[10]).all()
    # The accuracy taus are recomputable from the sampled items alone.
    y = stability_ctx.fit.y
    t = trials[0]
    perm = np.random.default_rng(t.seed).permutation(y.shape[1])
    acc = [np.where(y[:, s] >= 0, y[:, s], 0).mean(axis=1) for s in (perm[:10], perm[10:20])]
    row = df[(df.trial_group == 10) & (df.trial_index == 0) & (df.method == "accuracy")].iloc[0]
    assert row.tau_between == pytest.approx(kendall(acc[0], acc[1]))


def test_interrupted_run_resumes_without_redoing_finished_trials(stability_ctx, tmp_path):
    trials = plan(StabilitySettings(sizes=(10, 30), trials_per_size=4), 120)
    out = tmp_path / "s.parquet"
    reference = run_trials(stability_batch, stability_ctx, trials, tmp_path / "ref.parquet", INPROCESS)

    def interrupt(n_done):
        if n_done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_trials(stability_batch, stability_ctx, trials, out, INPROCESS, on_batch=interrupt)
    first_two = interleave(batches(trials, 2))[:2]
    assert done_keys(out) == {t.key for b in first_two for t in b} and not out.exists()
    calls = []
    resumed = run_trials(stability_batch, stability_ctx, trials, out, INPROCESS,
                         on_batch=calls.append)
    assert len(calls) == len(batches(trials, 2)) - 2
    pd.testing.assert_frame_equal(resumed, reference)
    # A finished run resumed again does nothing.
    again = []
    run_trials(stability_batch, stability_ctx, trials, out, INPROCESS, on_batch=again.append)
    assert again == []


def test_foreign_parquet_at_out_is_a_clear_error(tmp_path):
    from engine.errors import IRTError

    out = tmp_path / "s.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(out)
    with pytest.raises(IRTError, match="not written by the trial runner"):
        done_keys(out)


def test_cli_bad_input_exits_2_with_the_fix(tmp_path, capsys):
    from engine.cli import main

    y = np.random.default_rng(0).integers(0, 2, (6, 40)).astype(np.int8)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(40)])
    df.insert(0, "subject", [f"s{i}" for i in range(6)])
    df.to_csv(tmp_path / "w.csv", index=False)
    assert main(["ingest", str(tmp_path / "w.csv"), "--out", str(tmp_path / "store")]) == 0
    capsys.readouterr()
    cases = [
        (["stability", str(tmp_path / "store"), "--out", str(tmp_path / "o"), "--sizes", "25"],
         "half the items (20 of 40)"),
        (["stability", str(tmp_path / "store"), "--out", str(tmp_path / "o"), "--sizes", "a,b"],
         "comma-separated whole numbers"),
        (["stability", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--sizes", "5"],
         "nope"),
        (["dimensions", str(tmp_path / "store"), "--out", str(tmp_path / "d"), "--shuffles", "1"],
         "--shuffles must be >= 2"),
        (["dimensions", str(tmp_path / "store"), "--out", str(tmp_path / "o"), "--memory-budget",
          "1K"], "dimensions holds the whole 6 x 40 matrix in memory, about 18.8 KiB"),
        (["bootstrap", str(tmp_path / "store"), "--out", str(tmp_path / "b"), "--model", "5pl"],
         "--model '5pl'"),
        (["stability", str(tmp_path / "store"), "--out", str(tmp_path / "o"), "--batch-size", "0"],
         "argument --batch-size: must be >= 1"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "o").exists()  # nothing written for a rejected command


def test_loopback_only_keeps_127_0_0_1_when_ray_was_imported_first():
    """Ray reads its loopback switch when first imported; joining 127.0.0.1 after another module
    imported Ray must still dial 127.0.0.1, not the machine's network address (a test cluster
    joined that way waited on an address nothing listened on)."""
    import os
    import subprocess
    import sys

    code = ("import ray\n"
            "from ray._private.services import canonicalize_bootstrap_address as c\n"
            "from cluster.runner import loopback_only\n"
            "loopback_only()\n"
            "print(c('127.0.0.1:6379'), c('localhost:6379'))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["127.0.0.1:6379", "127.0.0.1:6379"]


def test_stability_difference_needs_two_trials_for_its_interval_and_p_value():
    """One trial per size: the bootstrap of the IRT-minus-accuracy difference has nothing to
    resample (it read p = 0.000, "significant", every time); NaN instead. Two or more trials
    keep an interval around the mean and a p-value in [0, 1]."""
    from cluster.stability import summarize_stability

    rows = pd.DataFrame({"size": [5, 5, 5, 5, 10, 10], "trial": [0, 0, 1, 1, 0, 0],
                         "method": ["irt", "accuracy"] * 3,
                         "tau_between": [0.30, 0.40, 0.50, 0.45, 0.60, 0.70],
                         "tau_full": [0.5] * 6, "converged": [True] * 6})
    summary = summarize_stability(rows, bootstrap=500).set_index(["size", "method"])
    one = summary.loc[(10, "irt")]
    assert one["diff_mean"] == pytest.approx(-0.1)
    assert np.isnan(one["diff_q05"]) and np.isnan(one["diff_q95"]) and np.isnan(one["diff_p_value"])
    two = summary.loc[(5, "irt")]
    assert two["diff_q05"] <= two["diff_mean"] <= two["diff_q95"]
    assert 0.0 < two["diff_p_value"] <= 1.0
    # a difference far outside every resample's spread: p is 1 / (B + 1), never 0
    far = rows.assign(tau_between=[0.9, 0.1, 0.91, 0.1, 0.6, 0.7])
    p = summarize_stability(far, bootstrap=500).set_index(["size", "method"]).loc[
        (5, "irt"), "diff_p_value"]
    assert p == pytest.approx(1 / 501)
