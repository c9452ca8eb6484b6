"""End to end on real continuous data: WMT MQM scores through ingest, Beta-IRT and Gamma-IRT.

MQM scores lie in [-25, 0] (0 = no error found). Beta-IRT reads unit scores ``1 + score/25``
(exact 1 for error-free segments, exact 0 at the -25 cap); Gamma-IRT reads the errors
``-score`` (exact 0 for error-free segments). Both transforms are done here, in pandas; the
engine detects the kind, keeps every value as given (no clipping) and the models choose
their inflation from the exact boundary values.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from engine.api import make_source
from engine.cli import main
from engine.data import StreamingSource, open_store
from engine.infer.settings import FitSettings
from engine.readout.leaderboard import leaderboard
from engine.run import load_run

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[2].parent / "shared" / "data"
MQM = DATA / "mt_mqm" / "mqm_avg_seg_scores_long.parquet"
needs_data = pytest.mark.skipif(not MQM.exists(), reason=f"MQM data not found at {MQM}")


@pytest.fixture(scope="module")
def mqm():
    """newstest2020 zh-en: 10 systems x 2,000 segments, complete (8% exact zeros)."""
    d = pd.read_parquet(MQM)
    block = d[(d.test_set == "newstest2020") & (d.lang_pair == "zh-en")]
    return pd.DataFrame({"subject": block.system.astype(str),
                         "item": "newstest2020/zh-en/" + block.seg_id.astype(str),
                         "score": block.mqm_avg_score.astype(np.float64)})


def _ingest(frame: pd.DataFrame, response: pd.Series, tmp: Path, name: str):
    long = pd.DataFrame({"subject": frame.subject, "item": frame.item, "response": response})
    src = tmp / f"{name}.parquet"
    long.to_parquet(src)
    assert main(["ingest", str(src), "--out", str(tmp / f"{name}.zarr")]) == 0
    return long, open_store(tmp / f"{name}.zarr", verify=True)


def _fit(store, model: str, run: Path, *extra: str):
    assert main(["fit", str(store.path), "--model", model, "--out", str(run), "--quiet",
                 "--draws", "200", *extra]) == 0
    return load_run(run), json.loads((run / "fit.json").read_text())


def _abilities(run, long: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    mean = long.groupby("subject").response.mean()
    ability = run.subjects.set_index("subject").ability_mean.loc[mean.index]
    return ability, mean


def _check_score_ranking(run, mean: pd.Series, name: str, floor: float, **shares: pd.Series) -> None:
    """Issue 17: the leaderboard ranks by the expected score averaged over the segments,
    which agrees with the mean MQM score; each system's boundary probability is reported."""
    sub = run.subjects.set_index("subject").loc[mean.index]
    assert run.info["readout"]["rank_by"] == "expected score"
    assert (sub.score_q05 <= sub.score_mean).all() and (sub.score_mean <= sub.score_q95).all()
    for column, share in shares.items():  # P(error-free) per system against its observed share
        fitted = sub[column.removeprefix("share_") + "_mean"]  # at an item of offset 0
        r = np.corrcoef(fitted, share.loc[mean.index])[0, 1]
        print(f"MQM {name}: r(fitted {fitted.name}, observed share) {r:.3f}")
        assert r > 0.9, (column, r)
    tau = kendalltau(sub.score_mean, mean)[0]
    board = leaderboard(run.subjects)
    assert list(board.subject) == list(sub.score_mean.sort_values(ascending=False, kind="stable").index)
    tau_ability = kendalltau(sub.ability_mean, mean)[0]
    print(f"MQM {name}: tau(expected score, mean MQM score) {tau:.3f}, by ability {tau_ability:.3f}")
    assert tau >= floor and tau >= tau_ability


@needs_data
def test_beta_on_mqm_unit_scores(mqm, tmp_path, capsys):
    unit = 1 + mqm.score / 25
    long, store = _ingest(mqm, unit, tmp_path, "unit")
    assert store.kind == "unit" and store.shape == (10, 2000)
    # nothing clipped: the store holds the transformed scores, exact 0s and 1s included
    y = store.load()
    assert y.min() == 0.0 and y.max() == 1.0
    np.testing.assert_array_equal(np.sort(y.ravel()), np.sort(unit.to_numpy(np.float32)))
    zeros, ones = int((unit == 0).sum()), int((unit == 1).sum())
    assert store.boundary["zeros"] == zeros == 60 and store.boundary["ones"] == ones == 1651
    run, info = _fit(store, "beta", tmp_path / "beta")
    # exact 0 (score -25) and 1 (no error) are point masses chosen from the data, on record,
    # each system with its own probabilities (the share of error-free segments separates them)
    assert info["model_options"]["inflation"] == "zero-one"
    assert info["model_options"]["inflation_owner"] == "both"  # per system, item offsets
    assert info["data"]["boundary"] == {"zeros": zeros, "ones": ones}
    assert "fitted with zero-one inflation" in capsys.readouterr().out
    ability, mean = _abilities(run, long)
    # measured tau 1.00 (library fits: per-subject masses 1.00 at seeds 0-2, with item offsets
    # 1.00 at seed 0; per-item masses ranked by ability had 1.00, 0.56 and 0.60 at seeds 0-2)
    _check_score_ranking(run, mean, "beta", 0.85,
                         share_one=(long.response == 1).groupby(long.subject).mean())
    assert np.isfinite(ability).all() and np.isfinite(run.subjects.ability_sd).all()
    # 16 draws per step (20,000 cells), every pass finite, stopped by the convergence rule
    assert info["mc_draws_per_step"] == 16 and info["converged"]
    assert not any("error" in t for t in info["elbo_trace"])
    # Ranking by ability against ranking by mean score (10 systems): measured tau 1.00 at
    # fit seed 0 and 0.56-0.60 at seeds 1-2 (library fits, 16 draws per step, converged in
    # 17-25 passes); 0.60 when one draw per step stopped at pass 10 by a noise estimate that
    # read the first passes as noise (all with per-item inflation, before issue 17). Against
    # the mean of the scores inside (0, 1), which is what the density sees, the same.
    tau = kendalltau(ability, mean)[0]
    inside = long[(long.response > 0) & (long.response < 1)].groupby("subject").response.mean()
    tau_inside = kendalltau(ability, inside.loc[mean.index])[0]
    print(f"MQM beta: tau(ability, mean score) {tau:.3f}, tau(ability, mean inside) "
          f"{tau_inside:.3f}")
    assert tau > 0.4 and tau_inside > 0.4


@needs_data
def test_gamma_on_mqm_errors_streamed(mqm, tmp_path, capsys):
    errors = -mqm.score
    long, store = _ingest(mqm, errors, tmp_path, "errors")
    assert store.kind == "nonnegative"
    assert not np.signbit(store.load()).any()  # -0.0 from -score is stored as 0.0
    zeros = int((errors == 0).sum())
    assert store.boundary["zeros"] == zeros == 1651
    # a tiny budget streams the store: the hurdle still comes from the store's boundary record
    assert isinstance(make_source(store, FitSettings(memory_budget=64 << 10)), StreamingSource)
    run, info = _fit(store, "gamma", tmp_path / "gamma", "--memory-budget", "64K")
    assert info["model_options"]["inflation"] == "zero"  # a hurdle for error-free segments
    assert info["model_options"]["inflation_owner"] == "both"  # per system, item offsets
    assert info["data"]["boundary"]["zeros"] == zeros
    assert "fitted with zero inflation" in capsys.readouterr().out
    ability, mean_error = _abilities(run, long)
    # The score is minus the expected error: the expected MQM score. Measured tau 0.911
    # (ability 0.822) with the model's own optimizer (Adam: the diagonal Newton step stalls
    # on Gamma-IRT's ridge, 0.822); the data's own ranking agrees with a segment bootstrap
    # of itself at tau 0.956 (median; 5% quantile 0.867). Issue 17 asks for 0.85.
    _check_score_ranking(run, -mean_error, "gamma", 0.85,
                         share_zero=(long.response == 0).groupby(long.subject).mean())
    assert np.isfinite(ability).all() and ((ability > 0) & (ability < 1)).all()
    assert info["converged"] and not any("error" in t for t in info["elbo_trace"])
    assert info["settings"]["optimizer"] == "adam"  # the model's own (ModelSpec.optimizer)
    # Higher Gamma-IRT ability means smaller expected errors. Measured tau(ability, -mean
    # error) 0.78 on these 10 systems (0.78-0.82 over fit seeds 0-2; 0.38 when the fit
    # stopped at pass 10, 9,000 nats short of its optimum).
    tau = kendalltau(ability, -mean_error)[0]
    print(f"MQM gamma: tau(ability, -mean error) {tau:.3f}")
    assert tau > 0.5
