"""Item groups from evaluation logs: kept in the store, a Q-matrix for fit, boards by group.

Logs are Every Eval Ever instance lines (see ``test_every_eval_ever.py`` for the schema's
source); the two evaluations measure two simulated skills, so the per-group leaderboards of
one confirmatory fit must follow each skill's simulated abilities.
"""

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit
from scipy.stats import spearmanr

from engine.cli import main
from engine.data import ingest, open_store
from engine.data.formats import q_matrix_from
from engine.errors import SettingsError
from test_every_eval_ever import eee_line


def test_groups_in_store_q_matrix_and_boards_by_group(tmp_path, capsys):
    rng = np.random.default_rng(7)
    num_models, per_group = 24, 50
    theta = rng.normal(size=(num_models, 2)) * 1.5
    lines = []
    for g, ev in enumerate(("mmlu", "gsm8k")):
        b = rng.normal(size=per_group)
        y = rng.random((num_models, per_group)) < expit(theta[:, [g]] - b)
        lines += [eee_line(f"m{s}", ev, f"q{k}", float(y[s, k]))
                  for s in range(num_models) for k in range(per_group)]
    (tmp_path / "logs.jsonl").write_text("\n".join(lines) + "\n")

    store = ingest(tmp_path / "logs.jsonl", tmp_path / "s.zarr")
    groups = store.meta["item_groups"]
    assert [i.split("/")[0] for i in store.items] == groups
    q, names = q_matrix_from(open_store(tmp_path / "s.zarr"), "group")
    assert names == ["mmlu", "gsm8k"] and q.sum(axis=0).tolist() == [per_group, per_group]
    np.testing.assert_array_equal(q[:, 1], [g == "gsm8k" for g in groups])

    assert main(["fit", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run"), "--model",
                 "mirt-comp", "--q-matrix-from", "group", "--quiet", "--max-passes", "60",
                 "--draws", "200"]) == 0
    subjects = pd.read_parquet(tmp_path / "run" / "subjects.parquet")
    order = [int(s[1:]) for s in subjects["subject"]]
    for g, name in enumerate(names):
        rho = spearmanr(subjects[f"ability_{name}_mean"], theta[order, g]).statistic
        assert rho > 0.8, (name, rho)
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path / "run"), "--by", "group", "--draws", "200"]) == 0
    out = capsys.readouterr().out
    assert "== mmlu ==" in out and "== gsm8k ==" in out
    best = {g: f"m{int(np.argmax(theta[:, g]))}" for g in range(2)}
    boards = out.split("== gsm8k ==")
    assert best[0] in boards[0] and best[1] in boards[1]


def test_q_matrix_from_needs_groups(tmp_path, capsys):
    (tmp_path / "w.csv").write_text("subject,a,b\ns1,1,0\ns2,0,1\n")
    ingest(tmp_path / "w.csv", tmp_path / "s.zarr")
    with pytest.raises(SettingsError, match="has no item groups"):
        q_matrix_from(open_store(tmp_path / "s.zarr"), "group")
    with pytest.raises(SettingsError, match="item columns are group"):
        q_matrix_from(open_store(tmp_path / "s.zarr"), "subject")
    assert main(["fit", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run"), "--model",
                 "mirt-comp", "--q-matrix-from", "group", "--quiet"]) == 2
    assert "has no item groups" in capsys.readouterr().err
