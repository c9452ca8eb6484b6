"""How many skills: Gram-path eigenvalues, column shuffles, and the known-D recovery."""

from itertools import permutations

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
from scipy.stats import chisquare

from engine.api import fit
from engine.errors import DataFormatError, ModelError, SettingsError
from engine.infer.fit import FitResult
from engine.infer.guide import GuideState
from engine.infer.settings import FitSettings
from engine.models.registry import get_model
from engine.readout.dimensions import (
    ResidualStep,
    correlation_eigenvalues,
    count_above,
    dimensions_table,
    envelope,
    extra_skill_probabilities,
    fitted_probabilities,
    residual_eigenvalues,
    residual_null_eigenvalues,
    residual_steps,
    scree_plot,
    shuffle_columns,
    shuffle_eigenvalues,
    standardized_residuals,
    suggest_n_factors,
)


def simulate_mirt(num_subjects, num_items, num_skills, *, seed, rho=0.4, diff_sd=1.5):
    """Compensatory M2PL with simple structure: item n measures skill n % D only."""
    rng = np.random.default_rng(seed)
    cov = np.full((num_skills, num_skills), rho) + (1 - rho) * np.eye(num_skills)
    theta = rng.multivariate_normal(np.zeros(num_skills), cov, size=num_subjects)
    skill = np.arange(num_items) % num_skills
    a = rng.uniform(0.8, 2.0, size=num_items)
    b = rng.normal(0.0, diff_sd, size=num_items)
    p = 1.0 / (1.0 + np.exp(-a * (theta[:, skill] - b)))
    return (rng.random(p.shape) < p).astype(np.int8)


def binary(shape, seed, missing=0.0):
    rng = np.random.default_rng(seed)
    y = (rng.random(shape) < rng.uniform(0.2, 0.8, size=shape[1])).astype(np.int8)
    y[rng.random(shape) < missing] = -1
    return y


def pairwise_correlation(y):
    """Independent N x N reference: item standardised over its observed cells, products summed
    over subjects who answered both, normalised by each item's own count."""
    S, N = y.shape
    obs = y >= 0
    z = np.zeros((S, N))
    for j in range(N):
        v = y[obs[:, j], j].astype(float)
        z[obs[:, j], j] = (v - v.mean()) / v.std()
    R = np.empty((N, N))
    for j in range(N):
        for k in range(N):
            R[j, k] = (z[:, j] * z[:, k]).sum() / np.sqrt(obs[:, j].sum() * obs[:, k].sum())
    return R


# ---------------------------------------------------------------- eigenvalues


@pytest.mark.parametrize("shape", [(12, 40), (60, 10)])
def test_gram_path_equals_direct_n_by_n_eigendecomposition(shape):
    y = binary(shape, seed=1)
    direct = scipy.linalg.eigh(np.corrcoef(y.T), eigvals_only=True)[::-1]
    got = correlation_eigenvalues(y, k=shape[1])
    np.testing.assert_allclose(got, np.clip(direct, 0, None), atol=1e-9)
    assert got.sum() == pytest.approx(shape[1])  # trace of a correlation matrix


def test_missing_cells_match_pairwise_reference():
    y = binary((15, 30), seed=2, missing=0.15)
    direct = np.linalg.eigvalsh(pairwise_correlation(y))[::-1]
    np.testing.assert_allclose(correlation_eigenvalues(y, k=30), np.clip(direct, 0, None), atol=1e-9)


def test_constant_items_are_left_out():
    y = binary((20, 25), seed=3)
    with_constant = np.concatenate([y, np.ones((20, 2), np.int8), np.zeros((20, 1), np.int8)], axis=1)
    np.testing.assert_allclose(correlation_eigenvalues(with_constant), correlation_eigenvalues(y))


def test_residual_eigenvalues_equal_correlation_of_standardised_residuals():
    rng = np.random.default_rng(4)
    y = binary((40, 15), seed=4)
    p = rng.uniform(0.05, 0.95, size=y.shape)
    r = (y - p) / np.sqrt(p * (1 - p))
    direct = np.linalg.eigvalsh(np.corrcoef(r.T))[::-1]
    np.testing.assert_allclose(residual_eigenvalues(y, p), direct, atol=1e-9)
    np.testing.assert_allclose(standardized_residuals(y, p), r)


def test_residual_null_is_the_residual_spectrum_of_simulated_data():
    rng = np.random.default_rng(5)
    p = rng.uniform(0.1, 0.9, size=(30, 20))
    observed = rng.random(p.shape) > 0.1
    null = residual_null_eigenvalues(p, [7, 8], k=6, observed=observed)
    for row, seed in zip(null, [7, 8]):
        y_sim = (np.random.default_rng(seed).random(p.shape) < p).astype(np.int8)
        y_sim[~observed] = -1
        np.testing.assert_allclose(row, residual_eigenvalues(y_sim, p, k=6), atol=1e-9)


# ---------------------------------------------------------------- shuffles


@pytest.mark.parametrize("missing", [0.0, 0.2])
def test_shuffle_keeps_every_column_multiset(missing):
    y = binary((37, 200), seed=5, missing=missing)
    sh = shuffle_columns(y, seed=11)
    assert sh.dtype == y.dtype and sh.shape == y.shape
    np.testing.assert_array_equal(np.sort(sh, axis=0), np.sort(y, axis=0))
    np.testing.assert_array_equal((sh == 1).sum(axis=0), (y == 1).sum(axis=0))
    assert not np.array_equal(sh, y)


def test_columns_are_permuted_independently():
    # 400 copies of one column: rows (whole response patterns) moved together would keep
    # every pair of columns identical; independent permutations agree at chance level.
    col = binary((50, 1), seed=6)
    sh = shuffle_columns(np.repeat(col, 400, axis=1), seed=0)
    p1 = col.mean()
    agree = (sh[:, :-1] == sh[:, 1:]).mean()
    assert agree == pytest.approx(p1**2 + (1 - p1) ** 2, abs=0.02)


@pytest.mark.parametrize("column", [[1, 1, 0, 0], [1, 0, -1]])
def test_each_arrangement_is_equally_likely(column):
    y = np.repeat(np.array(column, np.int8)[:, None], 6000, axis=1)
    sh = shuffle_columns(y, seed=3)
    arrangements = sorted(set(permutations(column)))
    index = {a: i for i, a in enumerate(arrangements)}
    counts = np.bincount([index[tuple(c)] for c in sh.T.tolist()], minlength=len(arrangements))
    assert counts.sum() == 6000  # every column is an arrangement of the original multiset
    assert chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("shape", [(30, 120), (60, 12)])
def test_fast_kernel_equals_eigenvalues_of_the_shuffled_matrix(shape):
    y = binary(shape, seed=7, missing=0.1)
    fast = shuffle_eigenvalues(y, [4, 5], k=10)
    for row, seed in zip(fast, [4, 5]):
        np.testing.assert_allclose(row, correlation_eigenvalues(shuffle_columns(y, seed), k=10),
                                   rtol=1e-4)


def test_many_levels_use_the_argsort_shuffle():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(25, 60))
    x[rng.random(x.shape) < 0.1] = np.nan
    sh = shuffle_columns(x, seed=1)
    for j in range(x.shape[1]):
        np.testing.assert_array_equal(np.sort(sh[:, j]), np.sort(x[:, j]))  # NaN sorts last
    np.testing.assert_allclose(shuffle_eigenvalues(x, [1], k=8)[0],
                               correlation_eigenvalues(shuffle_columns(x, 1), k=8), rtol=1e-4)


def test_shuffles_are_deterministic_per_seed():
    y = binary((20, 80), seed=9)
    a = shuffle_eigenvalues(y, [1, 2, 3], k=5)
    np.testing.assert_array_equal(a, shuffle_eigenvalues(y, [1, 2, 3], k=5))
    np.testing.assert_array_equal(a[1], shuffle_eigenvalues(y, [2], k=5)[0])
    assert not np.allclose(a[0], a[1])
    assert np.all(np.diff(a, axis=1) <= 1e-9)  # each row descending


def test_envelope_and_count_above():
    sh = np.random.default_rng(0).normal(size=(200, 4)) + [4, 3, 2, 1]
    mean, q95 = envelope(sh)
    np.testing.assert_allclose(q95, np.quantile(sh, 0.95, axis=0))
    np.testing.assert_allclose(mean, sh.mean(axis=0))
    assert count_above([9, 9, 0, 9], q95) == 2  # counting stops at the first one below
    assert count_above([9, 9, 9, 9], q95) == 4


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("fn", [correlation_eigenvalues, lambda y: shuffle_eigenvalues(y, [0]),
                                lambda y: shuffle_columns(y, 0)])
def test_bad_input_raises_data_format_error(fn):
    with pytest.raises(DataFormatError, match="2-D subjects x items"):
        fn(np.array([0, 1, 1], np.int8))
    with pytest.raises(DataFormatError, match="1 subject row"):
        fn(np.array([[0, 1, 1]], np.int8))
    y = binary((10, 5), seed=0)
    y[:, 3] = -1
    with pytest.raises(DataFormatError, match=r"item column\(s\) \[3\].*no observed responses"):
        fn(y)


def test_too_few_varying_items_and_bad_probabilities():
    y = np.ones((10, 4), np.int8)
    y[:5, 0] = 0
    with pytest.raises(DataFormatError, match="only 1 item column"):
        correlation_eigenvalues(y)
    with pytest.raises(DataFormatError, match="shape"):
        residual_eigenvalues(binary((10, 4), seed=0), np.full((10, 5), 0.5))
    with pytest.raises(SettingsError, match="k must be"):
        correlation_eigenvalues(binary((10, 4), seed=0), k=0)


# ---------------------------------------------------------------- reading


def test_suggest_caps_residual_count_by_parallel_analysis():
    env_mean, env_q95 = np.full(5, 2.0), np.full(5, 2.5)
    rm, rq = np.full(5, 2.0), np.full(5, 2.4)
    observed = np.array([20.0, 5.0, 3.0, 2.0, 1.0])  # parallel analysis: 3
    n, reading = suggest_n_factors(observed, [9, 2.1, 2, 2, 2], env_mean, env_q95,
                                   residual_envelope=(rm, rq))
    assert (n, reading["lower_bound"], reading["upper_bound"]) == (2, 2, 3)
    # above q95 but within min_excess of the null mean: noise, not a skill
    n, _ = suggest_n_factors(observed, [2.9, 2, 2, 2, 2], env_mean, env_q95, residual_envelope=(rm, rq))
    assert n == 1
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95, residual_envelope=(rm, rq))
    assert n == 3 and "capped" in reading["text"]
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95)
    assert n == 3 and reading["lower_bound"] is None
    steps = [ResidualStep(1, 9.0, 2.0, 2.4, True), ResidualStep(2, 2.4, 2.0, 2.4, False)]
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95,
                                   residual_envelope=(rm, rq), steps=steps)
    assert n == 2 and len(reading["residual_steps"]) == 2 and not reading["residual_steps_cut_short"]
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95, steps=steps[:1])
    assert n == 2 and reading["residual_steps_cut_short"] and "floor" in reading["text"]
    # Every step up to the bound found a skill: the bound ends the count, not the residuals.
    all_found = [ResidualStep(1, 9.0, 2.0, 2.4, True), ResidualStep(2, 9.0, 2.0, 2.4, True)]
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95, steps=all_found)
    assert n == 3 and reading["capped_at_upper_bound"] and not reading["residual_steps_cut_short"]
    assert "agree" not in reading["text"] and "is the bound" in reading["text"]
    # A step that found nothing ends the count at the bound: the two agree.
    ended = [ResidualStep(1, 9.0, 2.0, 2.4, True), ResidualStep(2, 9.0, 2.0, 2.4, True),
             ResidualStep(3, 2.4, 2.0, 2.4, False)]
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95, steps=ended)
    assert n == 3 and not reading["capped_at_upper_bound"] and "the two agree" in reading["text"]
    # a step over its null's 95th percentile but within min_excess of its mean: the reading
    # says why it is not a skill (summary.json had shown above: false with no word on it)
    near = [ResidualStep(1, 9.0, 2.0, 2.4, True), ResidualStep(2, 2.9, 2.0, 2.4, False)]
    n, reading = suggest_n_factors(observed, [9, 9, 9, 9, 9], env_mean, env_q95, steps=near)
    assert n == 2 and ("the residual step after 2 skill(s) is over its null's 95th percentile "
                       "(2.90 > 2.40) but within min_excess 1 of the null's mean (2.00)") in \
        reading["text"]
    assert "95th percentile" not in suggest_n_factors(observed, [9] * 5, env_mean, env_q95,
                                                      steps=ended)[1]["text"]


def test_table_and_scree_plot(tmp_path):
    t = dimensions_table([5.0, 2.0, 1.0], [1.5, 1.2], [1.4, 1.2, 1.1], [1.6, 1.3, 1.2],
                         residual_envelope=([1.1, 1.0], [1.3, 1.2]))
    assert list(t.columns[:5]) == ["index", "observed", "residual", "envelope_mean", "envelope_q95"]
    assert t["index"].tolist() == [1, 2, 3] and np.isnan(t["residual"].iloc[2])
    t.to_parquet(tmp_path / "eigenvalues.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "eigenvalues.parquet"), t)
    scree_plot(t, tmp_path / "scree.png", n_factors=1)
    assert (tmp_path / "scree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eigenvalues.parquet", "scree.png"]
    with pytest.raises(DataFormatError, match="lacks column"):
        scree_plot(t.drop(columns="residual"), tmp_path / "x.png")


# ---------------------------------------------------------------- with the real engine


@pytest.fixture(scope="module")
def known_d_fits():
    """2PL fits (the real engine, mean-field: the dimensions command's own fit is tested
    through Ray in ``tests/cluster``) to simulated data with 1, 2 and 3 skills."""
    out = {}
    for d in (1, 2, 3):
        y = simulate_mirt(300, 150, d, seed=10 + d)
        res = fit(y, model="2pl", settings=FitSettings(seed=0, ability_factor="gaussian"))
        out[d] = (y, res)
    return out


def test_fitted_probabilities_match_the_2pl_formula(known_d_fits):
    y, res = known_d_fits[1]
    m = res.means()
    expected = 1 / (1 + np.exp(-m["discrimination"] * (m["ability"][:, None] - m["difficulty"])))
    np.testing.assert_allclose(fitted_probabilities(res), expected, atol=2e-6)
    np.testing.assert_allclose(fitted_probabilities(res, max_cells=1000), expected, atol=2e-6)


def posterior_at_random(spec, S, N, seed):
    """A FitResult of ``spec`` whose posterior locations are random draws (no fitting)."""
    rng = np.random.default_rng(seed)
    shapes = {p.name: p.full_shape(S, N) for p in spec.params}
    loc = {k: rng.normal(0, 0.7, size=v) for k, v in shapes.items()}
    guide = GuideState(loc, {k: np.zeros(v) for k, v in shapes.items()})
    return FitResult(spec, guide, FitSettings(), [], True, 0.0, 0.0, S, N, S * N, 1)


@pytest.mark.parametrize("model", ["1pl", "3pl", "4pl"])
def test_fitted_probabilities_follow_the_model_spec(model):
    # Any logistic ModelSpec, no branching on its name: P = c + (d - c) sigmoid(a (theta - b)).
    res = posterior_at_random(get_model(model), 7, 9, seed=13)
    m = res.means()
    a = m.get("discrimination", np.ones(9))
    c, d = m.get("guessing", np.zeros(9)), m.get("feasibility", np.ones(9))
    expected = c + (d - c) / (1 + np.exp(-a * (m["ability"][:, None] - m["difficulty"])))
    np.testing.assert_allclose(fitted_probabilities(res), expected, rtol=1e-5)


def test_fitted_probabilities_need_a_binary_model():
    res = posterior_at_random(get_model("2pl").replace(kind="continuous"), 4, 5, seed=0)
    with pytest.raises(ModelError, match="binary"):
        fitted_probabilities(res)


@pytest.mark.parametrize("num_skills", [1, 2, 3])
def test_known_number_of_skills_is_found(known_d_fits, num_skills):
    y, res = known_d_fits[num_skills]
    observed = correlation_eigenvalues(y, k=10)
    env_mean, env_q95 = envelope(shuffle_eigenvalues(y, range(60), k=10))
    p = fitted_probabilities(res)
    residual = residual_eigenvalues(y, p, k=10)
    null = envelope(residual_null_eigenvalues(p, range(60), k=10))
    upper = max(count_above(observed, env_q95), 1)
    assert upper >= num_skills  # parallel analysis is an upper bound
    steps = residual_steps(y, p, range(60), max_skills=upper)
    n, reading = suggest_n_factors(observed, residual, env_mean, env_q95,
                                   residual_envelope=null, steps=steps)
    assert n == num_skills, reading
    # Without the logit-scale steps, the one-skill residual spectrum reads the same here.
    assert suggest_n_factors(observed, residual, env_mean, env_q95, residual_envelope=null)[0] == num_skills


def test_extra_skill_removes_the_missed_skill(known_d_fits):
    y, res = known_d_fits[2]
    p = fitted_probabilities(res)
    before = residual_eigenvalues(y, p, k=1)[0]
    after = residual_eigenvalues(y, extra_skill_probabilities(y, p, 1), k=1)[0]
    noise_q95 = envelope(residual_null_eigenvalues(p, range(40), k=1))[1][0]
    assert before > 2 * noise_q95 and after < noise_q95


@pytest.mark.slow
def test_logit_scale_steps_ignore_the_curvature_of_a_missed_skill():
    # Widely spread difficulties, weakly correlated skills: after a one-skill fit the missed
    # skill leaves a second, curvature-driven residual eigenvalue above the one-skill null's
    # 95th percentile, so the plain reading at q95 alone (min_excess=0) says 3 skills. With
    # the skill added on the logit scale nothing is left: the sequential test finds 2, with
    # or without the min_excess margin.
    y = simulate_mirt(500, 300, 2, seed=1000, rho=0.3, diff_sd=2.0)
    p = fitted_probabilities(fit(y, model="2pl", settings=FitSettings(seed=0)))
    observed, residual = correlation_eigenvalues(y, k=8), residual_eigenvalues(y, p, k=8)
    env_mean, env_q95 = envelope(shuffle_eigenvalues(y, range(100), k=8))
    null = envelope(residual_null_eigenvalues(p, range(60), k=8))
    upper = count_above(observed, env_q95)
    assert upper >= 3  # parallel analysis over-counts (difficulty factors)
    plain, _ = suggest_n_factors(observed, residual, env_mean, env_q95, residual_envelope=null,
                                 min_excess=0.0)
    assert plain == 3 and residual[1] > null[1][1]
    steps = residual_steps(y, p, range(60), max_skills=upper, min_excess=0.0)
    for margin in (0.0, 1.0):
        n, reading = suggest_n_factors(observed, residual, env_mean, env_q95,
                                       residual_envelope=null, steps=steps, min_excess=margin)
        assert n == 2, reading
