"""Overconfidence, ECE and the joint response-and-confidence model on simulated data."""

import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.errors import DataFormatError
from engine.readout.calibration import (calibration_report, expected_calibration_error, fit_confidence_model,
                                        load_confidences)
from engine.readout.items import expected_probabilities

from _item_runs import fit_run

OVER = 20  # the first 20 subjects are overconfident (confidence temperature 2.5)


def _simulate(seed=5, S=80, N=150, phi=30.0):
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=S), rng.normal(size=N)
    x = theta[:, None] - b
    gamma = np.where(np.arange(S) < OVER, 2.5, 1.0)
    p = 1 / (1 + np.exp(-x))
    m = 1 / (1 + np.exp(-gamma[:, None] * x))
    y = (rng.random((S, N)) < p).astype(np.int8)
    return y, rng.beta(phi * m, phi * (1 - m)), p, b


def test_ece_matches_a_direct_count():
    prob = np.array([[0.05, 0.15, 0.12, 0.95, 0.91]])
    y = np.array([[0, 1, -1, 1, 0]])
    # bins: [0,.1): .05 vs 0; [.1,.2): .15 vs 1; [.9,1]: (.95+.91)/2 vs 1/2 -- n = 4
    expect = (abs(0 - 0.05) + abs(1 - 0.15) + abs(1 - 1.86)) / 4
    assert expected_calibration_error(prob, y)[0] == pytest.approx(expect)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    y, conf, p, b = _simulate()
    tmp = tmp_path_factory.mktemp("calib")
    run = fit_run(tmp, y, "1pl")
    return run, y, conf, p, b, tmp


def test_overconfidence_is_zero_for_calibrated_subjects(simulated):
    run, y, conf, p, b, _ = simulated
    p_irt = expected_probabilities(run, np.arange(len(y)))
    rep = calibration_report(p_irt, y, conf, run.subjects["subject"], run.items["item"])
    s = rep["subjects"]
    calibrated = s.iloc[OVER:]
    print(s.groupby(np.arange(len(s)) < OVER)[["mean_overconfidence", "ece_before", "ece_after", "gamma"]].mean())
    # measured: calibrated mean overconfidence .004 (sd of subject means ~.02), gamma 1.03
    assert abs(calibrated["mean_overconfidence"].mean()) < 0.02
    assert abs(np.nanmean((p_irt - conf)[OVER:])) < 0.02
    # with the true probability the overconfidence is zero in expectation: a check of the sign
    assert abs(np.mean(p[OVER:] - conf[OVER:])) < 0.01
    # the joint model finds the temperatures and the item difficulties
    assert s["gamma"].iloc[:OVER].mean() == pytest.approx(2.5, rel=0.15)
    assert calibrated["gamma"].mean() == pytest.approx(1.0, abs=0.1)
    assert np.corrcoef(rep["items"]["joint_difficulty"], b)[0, 1] > 0.98
    assert rep["joint"]["phi"] == pytest.approx(30, rel=0.2)
    # calibration helps the overconfident and leaves the calibrated alone (measured .163 -> .093; .086 -> .084)
    over = s.iloc[:OVER]
    assert over["ece_after"].mean() < 0.7 * over["ece_before"].mean()
    assert calibrated["ece_after"].mean() < calibrated["ece_before"].mean() + 0.01


def test_calibration_command_and_bad_confidence_file(simulated, capsys):
    run, y, conf, *_, tmp = simulated
    df = pd.DataFrame(conf, columns=run.items["item"])
    df.insert(0, "subject", run.subjects["subject"])
    good = tmp / "conf.csv"
    df.sample(frac=1.0, random_state=0).to_csv(good, index=False)  # row order does not matter
    np.testing.assert_allclose(load_confidences(good, run.subjects["subject"], run.items["item"]), conf)
    assert main(["calibration", str(run.path), str(good), "--top", "3", "--out", str(tmp / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert "ece_before" in out and "most extreme" in out
    assert len(pd.read_csv(tmp / "c.csv")) == len(y)
    df.iloc[4, 7] = 1.7
    df.to_csv(tmp / "bad.csv", index=False)
    assert main(["calibration", str(run.path), str(tmp / "bad.csv")]) == 2
    err = capsys.readouterr().err
    assert "bad.csv line 6" in err and repr(str(df.columns[7])) in err and "[0, 1]" in err
    assert "got 1.7;" in err  # the value as written, not NumPy's repr of it
    df.to_parquet(tmp / "bad.parquet", index=False)  # Parquet: the row index, as ingest says
    with pytest.raises(DataFormatError, match=r"bad\.parquet row index 4, column .*: got 1\.7;"):
        load_confidences(tmp / "bad.parquet", run.subjects["subject"], run.items["item"])
    df.iloc[4, 7] = 0.5
    pd.concat([df, df.iloc[[2]]]).to_csv(tmp / "twice.csv", index=False)
    with pytest.raises(DataFormatError, match=rf"twice\.csv line {len(df) + 2}: subject "
                                              rf"'{df.iloc[2, 0]}' appears twice \(first at line 4\)"):
        load_confidences(tmp / "twice.csv", run.subjects["subject"], run.items["item"])
    with pytest.raises(DataFormatError, match="not items of the run"):
        load_confidences(tmp / "c.csv", run.subjects["subject"], run.items["item"])


def _corner(run, conf, rows: int, cols: int, path):
    """The confidences of the first ``rows`` subjects and ``cols`` items, written to ``path``."""
    part = pd.DataFrame(conf[:rows, :cols], columns=run.items["item"][:cols])
    part.insert(0, "subject", run.subjects["subject"][:rows].to_numpy())
    part.to_csv(path, index=False)
    return path


def test_partial_confidences_read_only_their_cells(simulated, capsys):
    """Confidences for 10 subjects and 5 items: every other subject reads NaN (its gamma was
    the prior's 1.000, read as perfectly calibrated), and accuracy is over the cells with a
    confidence, as the ECE is (it was over every response)."""
    run, y, conf, *_, tmp = simulated
    subjects, items = run.subjects["subject"], run.items["item"]
    loaded = load_confidences(_corner(run, conf, 10, 5, tmp / "part.csv"), subjects, items)
    p_irt = expected_probabilities(run, np.arange(len(y)))
    rep = calibration_report(p_irt, y, loaded, subjects, items)
    s = rep["subjects"]
    assert s["gamma"].iloc[10:].isna().all() and s["gamma"].iloc[:10].notna().all()
    assert (s["n_confidences"].iloc[:10] == 5).all() and (s["n_confidences"].iloc[10:] == 0).all()
    np.testing.assert_allclose(s["accuracy"].iloc[:10], y[:10, :5].mean(axis=1))
    assert s["accuracy"].iloc[10:].isna().all()
    it = rep["items"]
    np.testing.assert_allclose(it["mean_response"].iloc[:5], y[:10, :5].mean(axis=0))
    assert it["mean_response"].iloc[5:].isna().all()


def test_confidence_files_without_confidences_ids_or_with_repeated_columns(simulated):
    run, y, conf, *_, tmp = simulated
    subjects, items = run.subjects["subject"], run.items["item"]
    (tmp / "header.csv").write_text("subject," + ",".join(items[:3]) + "\n")
    with pytest.raises(DataFormatError, match=r"header\.csv: holds no confidences \(0 row"):
        load_confidences(tmp / "header.csv", subjects, items)
    first = str(items.iloc[0])
    (tmp / "twice.csv").write_text(f"subject,{first},{first}\n{subjects.iloc[0]},0.5,0.6\n")
    with pytest.raises(DataFormatError, match=rf"twice\.csv: column\(s\) \['{first}'\] appear more "
                                              r"than once in the header"):
        load_confidences(tmp / "twice.csv", subjects, items)
    (tmp / "noid.csv").write_text(f"subject,{first}\n{subjects.iloc[0]},0.5\n,0.6\n")
    with pytest.raises(DataFormatError, match=r"noid\.csv line 3, column 'subject': no subject id "
                                              r"\(1 row\(s\)\)"):
        load_confidences(tmp / "noid.csv", subjects, items)


def test_a_gzipped_confidence_file_reads(simulated):
    run, y, conf, *_, tmp = simulated
    subjects, items = run.subjects["subject"], run.items["item"]
    got = load_confidences(_corner(run, conf, 4, 3, tmp / "conf.csv.gz"), subjects, items)
    np.testing.assert_allclose(got[:4, :3], conf[:4, :3])
