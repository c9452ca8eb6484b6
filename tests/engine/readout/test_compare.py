"""Model comparison on held-out cells: scores against direct computations, model choice on
simulated data, and the command line."""

import json

import jax
import numpy as np
import pandas as pd
import pytest
from scipy.special import expit, logsumexp
from scipy.stats import bernoulli, beta, mannwhitneyu

from engine.cli import main
from engine.data import ingest
from engine.errors import ModelError, SettingsError
from engine.infer.guide import GuideState
from engine.infer.settings import FitSettings
from engine.models.registry import get_model
from engine.readout.compare import (COLUMNS, compare, heldout_loglik_draws, macro_f1, parse_models,
                                    predictive, predictive_metrics, roc_auc, split_holdout)
from engine.readout.posterior import draw_posterior


def _noncomp_data(num_subjects, num_items, seed):
    """Two independent skills; a third of the items need the first, a third the second, a
    third both (the product of per-skill sigmoids)."""
    rng = np.random.default_rng(seed)
    th = rng.normal(size=(num_subjects, 2))
    third = num_items // 3
    q = np.zeros((num_items, 2))
    q[:third, 0], q[third:2 * third, 1], q[2 * third:] = 1, 1, 1
    alpha = 2.0 * np.exp(0.25 * rng.normal(size=(num_items, 2))) * q
    b = rng.normal(-0.5, 1.0, size=(num_items, 2))
    p = np.prod(np.where(q > 0, expit(alpha * (th[:, None, :] - b)), 1.0), axis=-1)
    return (rng.random(p.shape) < p).astype(np.int8), q


def _rasch_data(num_subjects, num_items, seed):
    rng = np.random.default_rng(seed)
    th, b = rng.normal(0, 1.5, num_subjects), rng.normal(0, 1, num_items)
    return (rng.random((num_subjects, num_items)) < expit(th[:, None] - b)).astype(np.int8)


def test_split_holdout_is_seeded_and_only_takes_observed_cells():
    y = _rasch_data(30, 40, 0)
    y[0, :10] = -1
    train, s, i = split_holdout(y, 0.2, seed=3)
    observed = int((y >= 0).sum())
    assert len(s) == round(0.2 * observed)
    assert (y[s, i] >= 0).all() and (train[s, i] == -1).all()
    assert int((train >= 0).sum()) == observed - len(s)
    again = split_holdout(y, 0.2, seed=3)
    np.testing.assert_array_equal(again[1], s)
    assert not np.array_equal(split_holdout(y, 0.2, seed=4)[1], s)
    f = np.where(y >= 0, y, np.nan).astype(np.float32)  # continuous data: NaN held out
    assert np.isnan(split_holdout(f, 0.2, seed=3)[0][s, i]).all()
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(SettingsError, match="--holdout"):
            split_holdout(y, bad, seed=0)


def test_heldout_loglik_and_predictive_match_scipy_bernoulli():
    rng = np.random.default_rng(0)
    S, N, K = 7, 9, 5
    spec = get_model("2pl")
    loc = {p.name: rng.normal(0, 0.5, p.full_shape(S, N)).astype(np.float32) for p in spec.params}
    log_scale = {k: np.full(v.shape, -1.0, np.float32) for k, v in loc.items()}
    guide = GuideState(loc, log_scale)
    s, i = np.array([0, 3, 6, 6, 2]), np.array([8, 0, 4, 1, 1])
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    key = jax.random.PRNGKey(7)
    names = tuple(p.name for p in spec.likelihood_params)
    draws = draw_posterior(spec, guide, K, rng_key=key, names=names)
    p = expit(draws["discrimination"][:, i] * (draws["ability"][:, s] - draws["difficulty"][:, i]))
    direct = bernoulli.logpmf(y[None, :], p)  # (K, cells)
    ll = heldout_loglik_draws(spec, draws, s, i, y, num_subjects=S, num_items=N)
    np.testing.assert_allclose(ll, direct, rtol=1e-5, atol=1e-5)
    log_pred, p1 = predictive(spec, guide, s, i, y, num_subjects=S, num_items=N, num_draws=K,
                              rng_key=key, binary=True)
    # the log of the mean probability over draws, not the probability at the mean
    np.testing.assert_allclose(log_pred, np.log(np.mean(np.exp(direct), axis=0)), rtol=1e-5)
    np.testing.assert_allclose(p1, p.mean(axis=0), rtol=1e-5)
    plug_in = bernoulli.logpmf(y, expit(np.exp(loc["discrimination"][i]) *
                                        (loc["ability"][s] - loc["difficulty"][i])))
    assert np.abs(log_pred - plug_in).max() > 1e-3
    # a sampler's own draws (chains, samples, ...), as NUTS keeps them, replace the guide's:
    # 2 chains x 6 samples, 4 of them evenly spaced (the 1st, 5th, 8th and 12th)
    chains = {k: rng.normal(0, 0.5, (2, 6) + v.shape[1:]).astype(np.float32)
              for k, v in draws.items()}
    chains["discrimination"] = np.exp(chains["discrimination"])
    log_pred, p1 = predictive(spec, guide, s, i, y, num_subjects=S, num_items=N, num_draws=4,
                              rng_key=key, binary=True, sampled=chains)
    kept = {k: v.reshape((12,) + v.shape[2:])[[0, 4, 7, 11]] for k, v in chains.items()}
    p = expit(kept["discrimination"][:, i] * (kept["ability"][:, s] - kept["difficulty"][:, i]))
    np.testing.assert_allclose(log_pred, np.log(np.mean(bernoulli.pmf(y[None, :], p), axis=0)),
                               rtol=1e-5)
    np.testing.assert_allclose(p1, p.mean(axis=0), rtol=1e-5)


def test_heldout_loglik_of_a_skill_model_uses_its_q_matrix():
    rng = np.random.default_rng(1)
    S, N, K = 5, 6, 4
    q = np.array([[1, 0], [0, 1], [1, 1], [1, 0], [0, 1], [1, 1]], np.float32)
    spec = get_model("mirt-comp", q_matrix=q)
    draws = {"ability": rng.normal(size=(K, S, 2)), "difficulty": rng.normal(size=(K, N)),
             "discrimination": np.exp(rng.normal(size=(K, N, 2)))}
    s, i = np.repeat(np.arange(S), N), np.tile(np.arange(N), S)
    y = rng.integers(0, 2, S * N).astype(np.float64)
    z = np.sum(draws["discrimination"][:, i] * q[i] * draws["ability"][:, s], axis=-1) - draws["difficulty"][:, i]
    ll = heldout_loglik_draws(spec, draws, s, i, y, num_subjects=S, num_items=N)
    np.testing.assert_allclose(ll, bernoulli.logpmf(y, expit(z)), rtol=1e-4, atol=1e-5)


def test_roc_auc_is_the_mann_whitney_statistic_and_macro_f1():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 300)
    score = np.round(rng.normal(y * 0.8, 1.0), 1)  # rounded: ties between the classes
    u = mannwhitneyu(score[y == 1], score[y == 0]).statistic
    assert roc_auc(score, y) == pytest.approx(u / ((y == 1).sum() * (y == 0).sum()), rel=1e-12)
    assert roc_auc(np.ones(5), np.ones(5)) != roc_auc(np.ones(5), np.ones(5))  # NaN: one class
    pred = np.array([1, 1, 0, 0, 1], bool)
    truth = np.array([1, 0, 0, 0, 1])
    # class 1: tp 2, 3 predicted, 2 true -> 0.8; class 0: tp 2, 2 predicted, 3 true -> 0.8
    assert macro_f1(pred, truth) == pytest.approx(0.8)


def test_one_skill_fit_is_visibly_worse_on_noncompensatory_two_skill_data():
    y, q = _noncomp_data(80, 120, seed=0)
    # a fixed number of passes: the exploratory skills separate only after ~30 passes
    settings = FitSettings(seed=0, min_passes=40, max_passes=40)
    table = compare(y, "2pl,mirt-noncomp:2", holdout=0.15, seed=0, settings=settings)
    print(table.drop(columns=["num_train", "num_heldout"]).to_string())
    assert list(table.columns) == list(COLUMNS)
    row = table.set_index("model")
    margin = row.loc["mirt-noncomp:2", "heldout_loglik"] - row.loc["2pl", "heldout_loglik"]
    # measured: 67.2 nats over 1,440 held-out cells (-611.0 vs -678.2); AUC .883 vs .854
    assert table["model"].iloc[0] == "mirt-noncomp:2" and margin > 30
    assert row.loc["mirt-noncomp:2", "roc_auc"] > row.loc["2pl", "roc_auc"]
    assert (table["num_heldout"] == round(0.15 * y.size)).all()
    assert row.loc["mirt-noncomp:2", "num_params"] == 80 * 2 + 120 * 2 * 2
    for c in ("accuracy", "roc_auc", "macro_f1"):
        assert (table[c] > 0.6).all() and (table[c] < 1).all()
    assert (table["ece"] < 0.1).all() and (table["brier"] < 0.25).all()


def test_heldout_loglik_of_unit_scores_matches_scipy_beta_with_boundary_masses():
    rng = np.random.default_rng(3)
    S, N, K = 6, 5, 4
    spec = get_model("beta", inflation="zero-one")
    draws = {"ability": rng.normal(size=(K, S)), "difficulty": rng.normal(size=(K, N)),
             "discrimination": np.exp(0.3 * rng.normal(size=(K, N))),
             "log_precision": rng.normal(1.0, 0.5, (K, N)),
             "zero": rng.uniform(0.05, 0.3, (K, N)), "one": rng.uniform(0.05, 0.3, (K, N))}
    s, i = np.repeat(np.arange(S), N), np.tile(np.arange(N), S)
    y = rng.uniform(0.01, 0.99, S * N)
    y[:4], y[4:8] = 0.0, 1.0  # exact boundary scores go to the point masses
    eta = draws["discrimination"][:, i] * draws["ability"][:, s] - draws["difficulty"][:, i]
    o, z, one = draws["log_precision"][:, i], draws["zero"][:, i], draws["one"][:, i]
    inside = np.log1p(-z) + np.log1p(-one) + beta.logpdf(np.clip(y, 1e-9, 1 - 1e-9),
                                                          np.exp(0.5 * (eta + o)), np.exp(0.5 * (o - eta)))
    direct = np.where(y == 0, np.log(z), np.where(y == 1, np.log1p(-z) + np.log(one), inside))
    ll = heldout_loglik_draws(spec, draws, s, i, y, num_subjects=S, num_items=N)
    np.testing.assert_allclose(ll, direct, rtol=1e-4, atol=1e-4)
    # continuous cells get the log predictive density and no classification scores
    m = predictive_metrics(logsumexp(ll, axis=0) - np.log(K), y, None)
    assert m["heldout_loglik"] == pytest.approx(np.sum(logsumexp(direct, axis=0) - np.log(K)), rel=1e-5)
    assert all(np.isnan(m[k]) for k in ("accuracy", "roc_auc", "macro_f1", "ece", "brier"))


def test_parse_models_tokens_and_errors():
    got = parse_models("1pl, mirt-comp:3,irt-vec:q", q_matrix=(np.eye(2), ["a", "b"]))
    assert [(c.label, c.name) for c in got] == [("1pl", "1pl"), ("mirt-comp:3", "mirt-comp"),
                                               ("irt-vec:q", "irt-vec")]
    assert got[1].options == {"dims": 3} and got[2].options["skills"] == ["a", "b"]
    with pytest.raises(ModelError, match="unknown model 'rasch' in 'rasch'"):
        parse_models("1pl,rasch")
    with pytest.raises(SettingsError, match="'mirt-comp:two' has a bad skill count"):
        parse_models("mirt-comp:two")
    with pytest.raises(SettingsError, match="pass --q-matrix"):
        parse_models("mirt-comp:q")
    with pytest.raises(SettingsError, match="'2pl' appears twice"):
        parse_models("2pl,1pl,2pl")
    with pytest.raises(ModelError, match="mirt-noncomp needs dims"):
        parse_models("mirt-noncomp")


def test_model_option_tokens_put_per_item_and_per_subject_inflation_side_by_side():
    got = parse_models("beta,beta:inflation_owner=item,gamma:inflation_owner=subject:s0=2.5")
    assert [(c.label, c.name, c.options) for c in got] == [
        ("beta", "beta", {}), ("beta:inflation_owner=item", "beta", {"inflation_owner": "item"}),
        ("gamma:inflation_owner=subject:s0=2.5", "gamma", {"inflation_owner": "subject", "s0": 2.5})]
    with pytest.raises(SettingsError, match="'beta:inflation_owner=' has a bad option"):
        parse_models("beta:inflation_owner=")
    with pytest.raises(ModelError, match="unknown inflation_owner 'row'"):
        parse_models("beta:inflation_owner=row")
    with pytest.raises(ModelError, match="'2pl'.*unexpected keyword.*inflation_owner"):
        parse_models("2pl:inflation_owner=item")


def test_heldout_loglik_with_per_subject_hurdle_matches_scipy_gamma():
    from scipy.stats import gamma

    rng = np.random.default_rng(5)
    S, N, K = 4, 6, 3
    spec = get_model("gamma", inflation="zero", inflation_owner="subject")
    draws = {"ability": rng.uniform(0.2, 0.8, (K, S)), "difficulty": rng.uniform(0.2, 0.8, (K, N)),
             "discrimination": rng.normal(1.0, 0.3, (K, N)), "scale": np.exp(rng.normal(0, 0.5, (K, N))),
             "zero": rng.uniform(0.05, 0.6, (K, S))}
    s, i = np.repeat(np.arange(S), N), np.tile(np.arange(N), S)
    y = rng.gamma(1.0, 1.0, S * N)
    y[::5] = 0.0
    t, d, a = draws["ability"][:, s], draws["difficulty"][:, i], draws["discrimination"][:, i]
    shape, rate, z = draws["scale"][:, i] * (d / t) ** a, ((1 - d) / (1 - t)) ** a, draws["zero"][:, s]
    direct = np.where(y == 0, np.log(z), np.log1p(-z) + gamma.logpdf(np.where(y > 0, y, 1.0), shape,
                                                                      scale=1 / rate))
    ll = heldout_loglik_draws(spec, draws, s, i, y, num_subjects=S, num_items=N)
    np.testing.assert_allclose(ll, direct, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    y = _rasch_data(60, 80, seed=1)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(80)])
    df.insert(0, "subject", [f"m{s}" for s in range(60)])
    path = tmp_path_factory.mktemp("cmp") / "r.csv"
    df.to_csv(path, index=False)
    return ingest(path, path.parent / "store.zarr").path


def test_cli_compare_on_rasch_data_ties_1pl_and_2pl_beating_a_subject_blind_model(store, tmp_path,
                                                                                  capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(store), "--models", "1pl,2pl", "--holdout", "0.2", "--seed", "1",
                 "--out", str(out), "--quiet", "--draws", "100"]) == 0
    text = capsys.readouterr().out
    assert "960 cells held out" in text and "heldout_loglik" in text
    table = pd.read_parquet(out / "compare.parquet")
    assert list(table.columns) == list(COLUMNS) and set(table["model"]) == {"1pl", "2pl"}
    assert table["heldout_loglik"].is_monotonic_decreasing
    meta = json.loads((out / "compare.json").read_text())
    assert meta["seed"] == 1 and meta["holdout"] == 0.2 and meta["num_draws"] == 100
    assert meta["kind"] == "binary" and meta["ranking"] == table["model"].tolist() and meta["checksum"]
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.parquet"]
    # the wrong model: each item's training mean (Laplace-smoothed), blind to the subject
    y = _rasch_data(60, 80, seed=1)
    train, s, i = split_holdout(y, 0.2, seed=1)
    seen = train >= 0
    p_item = (np.where(seen, train, 0).sum(0) + 1) / (seen.sum(0) + 2)
    blind = bernoulli.logpmf(y[s, i], p_item[i]).mean()
    r = table.set_index("model")["heldout_loglik_per_cell"]
    with capsys.disabled():
        print(text, "item means", blind)
    # measured: 1pl -.534, 2pl -.538, item means -.647 per cell
    assert abs(r["1pl"] - r["2pl"]) < 0.02
    assert min(r["1pl"], r["2pl"]) > blind + 0.07
    # the same command again refuses to overwrite
    assert main(["compare", str(store), "--models", "1pl", "--out", str(out), "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_a_model_whose_quadrature_fit_gave_up_is_named_under_the_table(store, tmp_path, capsys,
                                                                       monkeypatch):
    """On NLU rte (18 x 139, 10% held out) the 2PL's quadrature fit ran 500 passes (41 s),
    did not converge, and its row scored the mean-field fit without a word. Here the
    quadrature fit's pass limit is lowered to 3 so that it gives up the same way: the table
    names each row's fit (NUTS's here: 3,840 training cells are within
    ``nuts_fallback_max_cells``), the command says which row fell back and why, and the
    report puts that under its table, not in a column."""
    from functools import partial

    import engine.api
    from engine.infer.marginal import MarginalSettings
    from engine.readout.report import _compare_section

    monkeypatch.setattr(engine.api, "fit_marginal_result",
                        partial(engine.api.fit_marginal_result, settings=MarginalSettings(max_iter=3, sampler_chains=0)))
    out = tmp_path / "cmp"
    assert main(["compare", str(store), "--models", "1pl", "--holdout", "0.2", "--out", str(out),
                 "--quiet", "--draws", "50"]) == 0
    text = capsys.readouterr().out
    table = pd.read_parquet(out / "compare.parquet")
    row = table.iloc[0]
    assert row["fit_method"] == "nuts" and row["fit_note"].startswith(
        "3 iterations; NUTS sampled the posterior instead (4 chains x 1000 draws, R-hat ")
    assert ("note: 1pl: the quadrature fit (abilities integrated out) did not converge (" +
            row["fit_note"] + "); its row scores the NUTS fit") in text
    assert "fit_note" not in text and "nuts" in text.split("note:")[0]  # the column, shown
    page = _compare_section(out)
    assert "fit_note" not in page and "1pl: the quadrature fit" in page
    monkeypatch.undo()  # the default pass limit: the quadrature fit converges, nothing to say
    assert main(["compare", str(store), "--models", "1pl", "--holdout", "0.2", "--out", str(out),
                 "--quiet", "--draws", "50", "--overwrite"]) == 0
    text = capsys.readouterr().out
    row = pd.read_parquet(out / "compare.parquet").iloc[0]
    assert row["fit_method"] == "quadrature" and row["fit_note"] == "" and "note:" not in text


@pytest.mark.parametrize("argv, message", [
    (["--models", "1pl,2pk"], "unknown model '2pk' in '2pk'"),
    (["--models", "mirt-comp:0"], "'mirt-comp:0' has a bad skill count '0'"),
    (["--models", "1pl", "--holdout", "1.5"], "argument --holdout: must be a finite number in (0, 1)"),
    (["--models", "mirt-comp:q"], "pass --q-matrix"),
    (["--models", "mirt-comp:q", "--q-matrix", "{q}"], "no row for item 'q79'"),
])
def test_cli_compare_bad_input_exits_2_and_writes_nothing(store, tmp_path, capsys, argv, message):
    q = tmp_path / "q.csv"  # skills for 79 of the 80 items
    pd.DataFrame({"item": [f"q{j}" for j in range(79)], "a": 1, "b": 0}).to_csv(q, index=False)
    argv = [str(q) if a == "{q}" else a for a in argv]
    out = tmp_path / "cmp"
    assert main(["compare", str(store), "--out", str(out), "--quiet", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_compare_missing_store(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.zarr"), "--models", "1pl", "--quiet"]) == 2
    assert "no such response store" in capsys.readouterr().err


def test_heldout_cells_of_items_no_model_fits_are_counted_not_scored():
    from engine.api import constant_columns
    from engine.readout.compare import split_holdout

    rng = np.random.default_rng(5)
    theta, b = rng.normal(size=(12, 1)), rng.normal(size=(1, 150))
    informative = (rng.random((12, 150)) < 1 / (1 + np.exp(-(theta - b)))).astype(np.int8)
    y = np.concatenate([informative, np.zeros((12, 100), np.int8)], axis=1)  # 100 all wrong
    table = compare(y, "1pl", holdout=0.1, seed=3, settings=FitSettings(seed=0))
    train, _, items = split_holdout(y, 0.1, seed=3)
    aside = constant_columns(train)[items]
    row = table.iloc[0]
    assert row["num_heldout_set_aside"] == aside.sum() >= (items >= 150).sum() > 0
    assert row["num_heldout"] == len(items) - aside.sum()
    assert row["num_heldout"] + row["num_heldout_set_aside"] == round(0.1 * y.size)
    # scored on items the model fitted, the predictive is informative
    assert row["roc_auc"] > 0.7

    # a split whose every held-out cell lands on such an item is a clear error
    small = np.array([[0, 1, 1], [0, 0, 1], [0, 1, 0], [0, 0, 0]], np.int8)
    def all_aside(s):
        train, _, items = split_holdout(small, 0.1, s)
        return constant_columns(train)[items].all()

    seed = next(s for s in range(200) if all_aside(s))
    with pytest.raises(SettingsError, match="hold out a larger share"):
        compare(small, "1pl", holdout=0.1, seed=seed)
