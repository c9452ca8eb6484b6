"""Confirmatory multidimensional IRT on the real NLU matrix (Vania et al. 2021), end to end
through the command line: the item-to-task-format and item-to-dataset tables become
Q-matrices, ``mirt-comp --q-matrix`` fits them, and per-skill leaderboards read the result."""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.run import load_run

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[2].parent / "shared" / "data"
NLU = DATA / "nlu"
pytestmark = pytest.mark.skipif(not NLU.exists(), reason=f"NLU data not found at {NLU}")

# one data set per task format, for the per-data-set Q-matrix in the default suite
DATASETS = ("mnli", "squad_v2", "hellaswag", "cosmosqa")


def _stratified(per_dataset: int, datasets=None) -> pd.DataFrame:
    """Up to ``per_dataset`` random items of each data set (seeded), in item order."""
    items = pd.read_parquet(NLU / "items.parquet")
    if datasets is not None:
        items = items[items["dataset"].isin(datasets)]
    shuffled = items.sample(frac=1.0, random_state=0)
    return shuffled[shuffled.groupby("dataset").cumcount() < per_dataset].sort_values("item_id")


def _ingest(items: pd.DataFrame, tmp: Path) -> tuple[Path, np.ndarray, list[str]]:
    """A store of the chosen items (ids = the source column names) and its 0/1 matrix."""
    wide = pd.read_parquet(NLU / "responses_items_x_subjects.parquet").set_index("item_id")
    subjects = pd.read_parquet(NLU / "subjects.parquet")["subject"].tolist()
    part = wide.loc[items["item_id"]]
    y = part[subjects].to_numpy().T.astype(np.int8)
    df = pd.DataFrame(y, columns=part["item"].tolist())
    df.insert(0, "subject", subjects)
    df.to_csv(tmp / "responses.csv", index=False)
    assert main(["ingest", str(tmp / "responses.csv"), "--out", str(tmp / "store")]) == 0
    return tmp / "store", y, subjects


def _q_matrix(items: pd.DataFrame, column: str, path: Path) -> pd.DataFrame:
    """One-hot items x skills table of ``column``, written as the CLI's Q-matrix CSV."""
    q = pd.get_dummies(items.set_index("item")[column]).astype(int)
    q.rename_axis("item").reset_index().to_csv(path, index=False)
    return q


def _fit_and_check(store: Path, y: np.ndarray, subjects: list, q: pd.DataFrame, q_path: Path,
                   out: Path, capsys) -> dict[str, float]:
    """Fit ``mirt-comp`` on the Q-matrix through the CLI and check the run's outputs; returns
    each skill's correlation of ability with the subjects' accuracy on that skill's items."""
    assert main(["fit", str(store), "--model", "mirt-comp", "--q-matrix", str(q_path), "--out", str(out),
                 "--quiet", "--draws", "200"]) == 0
    capsys.readouterr()
    run = load_run(out)
    skills = list(q.columns)
    # skills named by the Q-matrix's columns, in the spec, fit.json and the output tables
    assert list(run.spec.skills) == skills
    info = json.loads((out / "fit.json").read_text())
    assert info["model_options"]["skills"] == skills
    assert run.subjects["subject"].tolist() == subjects
    for s in skills:
        assert {f"ability_{s}_mean", f"ability_{s}_q05", f"ability_{s}_q95"} <= set(run.subjects.columns)
        assert f"discrimination_{s}_mean" in run.items.columns
    ability = run.subjects[[f"ability_{s}_mean" for s in skills]].to_numpy()
    assert np.isfinite(ability).all() and np.isfinite(run.subjects.filter(like="_sd").to_numpy()).all()

    # the fitted skill mask is the Q-matrix (rows in the store's item order)
    qv = q.loc[run.items["item"]].to_numpy(np.float32)
    mask = run.spec.constant_values(*y.shape)["skill_mask"]
    np.testing.assert_array_equal(mask, qv)
    # loadings are reported as zero where Q is 0 (their effective value) and moving the
    # underlying parameters there leaves every cell's likelihood unchanged
    a = run.items[[f"discrimination_{s}_mean" for s in skills]].to_numpy()
    assert (a[qv == 0] == 0).all() and (a[qv > 0] > 0).all()
    params = {"ability": jnp.asarray(ability)[:, None, :],
              "difficulty": jnp.asarray(run.items["difficulty_mean"].to_numpy())[None, :],
              "skill_mask": jnp.asarray(mask)[None]}
    yy = jnp.asarray(y, jnp.float32)
    base = run.spec.loglik({**params, "discrimination": jnp.asarray(a)[None]}, yy, jnp.ones_like(yy))
    moved = np.where(qv == 0, 50.0, a)
    again = run.spec.loglik({**params, "discrimination": jnp.asarray(moved)[None]}, yy, jnp.ones_like(yy))
    np.testing.assert_array_equal(np.asarray(base), np.asarray(again))
    assert np.isfinite(np.asarray(base)).all()

    # a per-skill leaderboard for every skill, led by a subject near the top of that skill
    for s in skills:
        assert main(["leaderboard", str(out), "--rank", f"skill={s}", "--top-k", "3", "--draws", "200"]) == 0
        text = capsys.readouterr().out
        assert text.startswith("skill leaderboard") and f"{s}_mean" in text
        leader = text.splitlines()[2].split()[1]
        top = run.subjects.nlargest(5, f"ability_{s}_mean")["subject"].tolist()
        assert leader in top

    # each skill's ability tracks the subjects' accuracy on that skill's items
    corr = {}
    for d, s in enumerate(skills):
        acc = y[:, qv[:, d] > 0].mean(axis=1)
        corr[s] = float(np.corrcoef(acc, ability[:, d])[0, 1])
    print({k: round(v, 3) for k, v in corr.items()})
    return corr


def test_task_format_q_matrix_on_a_stratified_nlu_sample(tmp_path, capsys):
    items = _stratified(100)  # 2,730 items over the 29 data sets and 4 task formats
    store, y, subjects = _ingest(items, tmp_path)
    q = _q_matrix(items, "task_format", tmp_path / "q_format.csv")
    assert list(q.columns) == ["MC-par", "MC-sent", "classification", "span selection"]
    corr = _fit_and_check(store, y, subjects, q, tmp_path / "q_format.csv", tmp_path / "run", capsys)
    # measured: MC-par .98, MC-sent .98, classification .97, span selection .96
    assert min(corr.values()) > 0.9


def test_dataset_q_matrix_on_four_nlu_datasets(tmp_path, capsys):
    items = _stratified(60, DATASETS)  # 240 items
    store, y, subjects = _ingest(items, tmp_path)
    q = _q_matrix(items, "dataset", tmp_path / "q_dataset.csv")
    assert sorted(q.columns) == sorted(DATASETS)
    corr = _fit_and_check(store, y, subjects, q, tmp_path / "q_dataset.csv", tmp_path / "run", capsys)
    # measured: mnli .96, squad_v2 .84, hellaswag .98, cosmosqa .99
    assert min(corr.values()) > 0.7 and np.median(list(corr.values())) > 0.9


@pytest.mark.slow
def test_dataset_q_matrix_on_all_29_nlu_datasets(tmp_path, capsys):
    items = _stratified(40)  # 1,148 items, 29 skills: minutes (the per-cell cost grows with D)
    store, y, subjects = _ingest(items, tmp_path)
    q = _q_matrix(items, "dataset", tmp_path / "q_dataset.csv")
    assert q.shape[1] == 29
    corr = _fit_and_check(store, y, subjects, q, tmp_path / "q_dataset.csv", tmp_path / "run", capsys)
    # measured: median .95, lowest mctaco .75 (its 40 items are nearly all easy or all hard)
    assert np.median(list(corr.values())) > 0.9 and min(corr.values()) > 0.6
