"""Tests for engine.models.logistic: every loglik against scipy, extremes, symmetries, errors."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, log_expit

from engine.errors import IRTError, ModelError
from engine.models import MODELS, bernoulli_loglik, get_model
from engine.models.spec import TRANSFORMS

NAMES = ["1pl", "2pl", "3pl", "4pl", "feas"]
VARIANTS = [(n, {}) for n in NAMES] + [
    (n, {"signed_discrimination": True}) for n in ["2pl", "3pl", "4pl", "feas"]
] + [(n, {"prior": "hierarchical"}) for n in NAMES]

# Per-item grids: (difficulty, discrimination, guessing, feasibility); abilities per subject.
ABILITY = np.array([-6.0, -3.0, -1.0, 0.0, 0.5, 2.0, 6.0], np.float32)
DIFFICULTY = np.array([-6.0, -1.5, 0.0, 0.7, 6.0], np.float32)
DISCRIMINATION = np.array([0.05, 0.5, 1.0, 2.5], np.float32)  # |a (t - b)| up to 30
GUESSING = np.array([1e-4, 0.2, 0.5, 0.9], np.float32)
FEASIBILITY = np.array([1e-4, 0.3, 0.8, 1 - 1e-4], np.float32)


def _p_correct(name, t, b, a, c, d):
    """P(y = 1) written out per model in float64, independent of the engine."""
    t, b, a, c, d = (np.asarray(v, np.float64) for v in (t, b, a, c, d))
    if name == "1pl":
        return expit(t - b)
    s = expit(a * (t - b))
    return {"2pl": s, "3pl": c + (1 - c) * s, "4pl": c + (d - c) * s, "feas": d * s}[name]


def _q_incorrect(name, t, b, a, c, d):
    """P(y = 0), computed directly (not as 1 - p) so it stays accurate where p is ~1."""
    t, b, a, c, d = (np.asarray(v, np.float64) for v in (t, b, a, c, d))
    if name == "1pl":
        return expit(b - t)
    s, r = expit(a * (t - b)), expit(-a * (t - b))
    return {"2pl": r, "3pl": (1 - c) * r, "4pl": (1 - c) * r + (1 - d) * s,
            "feas": (1 - d) * s + r}[name]


def _reference(name, t, b, a, c, d, y):
    p = _p_correct(name, t, b, a, c, d)
    q = _q_incorrect(name, t, b, a, c, d)
    # logpmf(0, p) == logpmf(1, q); using q keeps float64 accuracy at extreme logits.
    return np.where(y == 1, stats.bernoulli.logpmf(1, p), stats.bernoulli.logpmf(1, q))


def _item_grid():
    cols = np.array(list(itertools.product(DIFFICULTY, DISCRIMINATION, GUESSING, FEASIBILITY)),
                    np.float32)
    return cols.T  # (4, n)


def _params(spec, t, b, a, c, d):
    """Constrained params broadcast as the engine passes them: subjects (s,1), items (1,n)."""
    values = {"ability": t[:, None], "difficulty": b[None, :], "discrimination": a[None, :],
              "guessing": c[None, :], "feasibility": d[None, :]}
    return {p.name: jnp.asarray(values[p.name]) for p in spec.likelihood_params}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("y_value", [0, 1])
def test_loglik_matches_scipy_bernoulli(name, y_value):
    spec = get_model(name)
    b, a, c, d = _item_grid()
    t = ABILITY
    y = np.full((t.size, b.size), y_value, np.float32)
    got = np.asarray(spec.loglik(_params(spec, t, b, a, c, d), jnp.asarray(y), jnp.ones_like(y)))
    assert got.shape == (t.size, b.size)
    want = _reference(name, t[:, None], b, a, c, d, y)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", NAMES)
def test_loglik_per_cell_scalars(name):
    """The engine also calls loglik with every block a per-cell scalar (for derivatives)."""
    spec = get_model(name)
    b, a, c, d = _item_grid()
    rng = np.random.default_rng(0)
    k = 50
    cols = rng.integers(0, b.size, k)
    t = rng.choice(ABILITY, k)
    y = rng.integers(0, 2, k).astype(np.float32)
    for i in range(k):
        j = cols[i]
        values = {"ability": t[i], "difficulty": b[j], "discrimination": a[j], "guessing": c[j],
                  "feasibility": d[j]}
        params = {p.name: jnp.float32(values[p.name]) for p in spec.likelihood_params}
        got = spec.loglik(params, jnp.float32(y[i]), jnp.float32(1.0))
        assert np.shape(got) == ()
        want = _reference(name, t[i], b[j], a[j], c[j], d[j], y[i])
        np.testing.assert_allclose(float(got), want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", NAMES)
def test_loglik_finite_at_extreme_logits(name):
    """|a (t - b)| far beyond float32 sigmoid saturation and asymptotes at exactly 0 and 1."""
    spec = get_model(name)
    t = np.array([-200.0, -40.0, 0.0, 40.0, 200.0], np.float32)
    b = np.array([-200.0, 0.0, 200.0, 0.0, 0.0], np.float32)
    a = np.array([1.0, 5.0, 1.0, 1e-8, 50.0], np.float32)
    c = np.array([0.0, 1e-9, 0.5, 1.0, 0.0], np.float32)
    d = np.array([1.0, 1.0 - 1e-9, 0.5, 0.0, 1.0], np.float32)
    for y_value in (0.0, 1.0):
        y = jnp.full((t.size, b.size), y_value, jnp.float32)
        params = _params(spec, t, b, a, c, d)
        out = np.asarray(spec.loglik(params, y, jnp.ones_like(y)))
        assert np.isfinite(out).all(), out
        assert (out <= 0).all()
        grads = jax.grad(lambda p: spec.loglik(p, y, jnp.ones_like(y)).sum())(params)
        for key, g in grads.items():
            assert np.isfinite(np.asarray(g)).all(), key


def _cell_reference(name, z, c, d, y):
    """log P(y) of an asymptote model and its gradient and Hessian in ``(z, [c], [d])``, by
    hand in float64: ``P = alpha sigmoid(-z) + beta sigmoid(z)`` with ``(alpha, beta)`` =
    ``(c, d)`` for y = 1 and ``(1 - c, 1 - d)`` for y = 0 (c = 0, d = 1 where absent)."""
    s, r = expit(z), expit(-z)
    sign = 1.0 if y == 1 else -1.0
    alpha = (c if y == 1 else 1 - c) if name != "feas" else (0.0 if y == 1 else 1.0)
    beta = (d if y == 1 else 1 - d) if name != "3pl" else (1.0 if y == 1 else 0.0)
    p = alpha * r + beta * s
    names = ["z"] + (["c"] if name != "feas" else []) + (["d"] if name != "3pl" else [])
    dp = {"z": (beta - alpha) * s * r, "c": sign * r, "d": sign * s}
    d2p = {("z", "z"): (beta - alpha) * s * r * (r - s), ("z", "c"): -sign * s * r,
           ("z", "d"): sign * s * r}
    g = np.array([dp[n] for n in names]) / p
    h = np.array([[d2p.get((a, b), d2p.get((b, a), 0.0)) for b in names] for a in names]) / p
    return np.log(p), g, h - np.outer(g, g)


@pytest.mark.parametrize("name", ["3pl", "4pl", "feas"])
def test_cell_derivatives_match_a_float64_reference(name):
    """The cell's value, gradient and forward-over-forward Hessian in float32, as the linear
    predictor's terms take them, against the float64 derivatives by hand, z = 0 included
    (where softplus's rule once returned its raw code as its value: a Hessian entry of 0
    there, not -0.44, see test_special)."""
    def cell(q, y):
        rest = iter(q[1:])
        return bernoulli_loglik(q[0], y, lower=next(rest) if name != "feas" else None,
                                upper=next(rest) if name != "3pl" else None)

    terms = jax.jit(lambda q, y: (cell(q, y), jax.jacfwd(cell)(q, y),
                                  jax.jacfwd(jax.jacfwd(cell))(q, y)))
    zs = np.array([-30.0, -12.0, -5.0, -1.0, 0.0, 0.5, 3.0, 8.0, 15.0, 30.0], np.float32)
    for z, c, d, y in itertools.product(zs, GUESSING[:3], FEASIBILITY[1:], (0, 1)):
        q = [z] + ([c] if name != "feas" else []) + ([d] if name != "3pl" else [])
        got = terms(jnp.asarray(q, jnp.float32), jnp.float32(y))
        want = _cell_reference(name, float(z), float(c), float(d), y)
        value, grad, hess = (np.asarray(v, np.float64) for v in got)
        assert abs(value - want[0]) <= 1e-5 * abs(want[0]) + 2e-7, (z, c, d, y)
        for a, b in ((grad, want[1]), (hess, want[2])):
            scale = max(1.0, np.abs(b).max())
            assert (np.abs(a - b) <= 1e-5 * np.abs(b) + 1e-6 * scale).all(), (z, c, d, y, a, b)


def test_loglik_saturated_logit_is_exact():
    """Without asymptotes the log-likelihood is the exact log-sigmoid, not a clipped one."""
    z = np.array([-30.0, -10.0, 10.0, 30.0], np.float32)
    for y in (0.0, 1.0):
        got = np.asarray(bernoulli_loglik(jnp.asarray(z), jnp.full(4, y)))
        want = log_expit(np.where(y == 1.0, z, -z).astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_probabilities_sum_to_one():
    """exp(loglik(y=1)) + exp(loglik(y=0)) == 1 for every model and parameter cell."""
    b, a, c, d = _item_grid()
    for name in NAMES:
        spec = get_model(name)
        params = _params(spec, ABILITY, b, a, c, d)
        ones = jnp.ones((ABILITY.size, b.size))
        total = np.exp(spec.loglik(params, ones, ones)) + np.exp(spec.loglik(params, 0 * ones, ones))
        np.testing.assert_allclose(np.asarray(total), 1.0, atol=1e-5)


def _unconstrained(spec, rng, num_subjects=6, num_items=8):
    x = {}
    for p in spec.likelihood_params:
        shape = (num_subjects, 1) if p.owner == "subject" else (1, num_items)
        x[p.name] = rng.normal(p.init, 0.8, size=shape).astype(np.float32)
    return x


def _total_loglik(spec, x, y):
    params = {p.name: TRANSFORMS[p.transform](jnp.asarray(x[p.name])) for p in spec.likelihood_params}
    return float(jnp.sum(spec.loglik(params, y, jnp.ones_like(y))))


@pytest.mark.parametrize("name,options", VARIANTS)
def test_symmetries_leave_loglik_unchanged(name, options):
    spec = get_model(name, **options)
    expected = {"shift"} | ({"scale"} if name != "1pl" else set())
    assert {s.name for s in spec.symmetries} == expected
    rng = np.random.default_rng(1)
    x = _unconstrained(spec, rng)
    y = jnp.asarray(rng.integers(0, 2, size=(6, 8)), jnp.float32)
    base = _total_loglik(spec, x, y)
    for sym in spec.symmetries:
        for t in (-0.7, 0.3, 1.2):
            moved = dict(x)
            for block, m, v in sym.moves:
                assert block in x, f"symmetry {sym.name} moves unknown block {block}"
                moved[block] = x[block] * np.exp(t * m) + t * v
            assert any(not np.allclose(moved[k], x[k]) for k in x)
            np.testing.assert_allclose(_total_loglik(spec, moved, y), base, rtol=2e-6)
    # The test can fail: shifting ability alone does change the likelihood.
    shifted = dict(x, ability=x["ability"] + 2.0)
    assert abs(_total_loglik(spec, shifted, y) - base) > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_model_params_and_transforms(name):
    spec = get_model(name, prior="vague")
    has = {"discrimination": name != "1pl", "guessing": name in ("3pl", "4pl"),
           "feasibility": name in ("4pl", "feas")}
    expected = ["ability", "difficulty"] + [k for k, v in has.items() if v]
    assert list(spec.names) == expected
    assert spec.param("ability").owner == "subject"
    assert all(spec.param(n).owner == "item" for n in expected[1:])
    if has["discrimination"]:
        assert spec.param("discrimination").transform == "exp"
        signed = get_model(name, signed_discrimination=True).param("discrimination")
        assert signed.transform == "identity" and signed.init == 1.0
    for n in ("guessing", "feasibility"):
        if has[n]:
            assert spec.param(n).transform == "sigmoid"
    assert set(NAMES) <= set(MODELS)


def test_hierarchical_adds_global_hyperparameters():
    spec = get_model("2pl", prior="hierarchical")
    glob = {p.name for p in spec.by_owner("global")}
    assert glob == {f"{k}_{b}" for k in ("mu", "u") for b in ("ability", "difficulty", "discrimination")}
    assert {p.name for p in spec.likelihood_params} == {"ability", "difficulty", "discrimination"}


def test_unknown_model_name():
    with pytest.raises(ModelError, match=r"unknown model 'irt5'.*1pl.*2pl.*3pl.*4pl.*feas"):
        get_model("irt5")


def test_signed_discrimination_needs_discrimination():
    with pytest.raises(ModelError, match=r"signed-discrimination.*'1pl'"):
        get_model("1pl", signed_discrimination=True)


def test_unknown_prior_family():
    for name in ("2pl", "beta", "irt-vec"):
        with pytest.raises(ModelError, match=r"unknown prior family 'flat'; use one of vague, "
                                             r"hierarchical, population"):
            get_model(name, prior="flat", **({"dims": 2} if name == "irt-vec" else {}))


def test_population_prior_pools_items_not_subjects():
    """``population``: the ability keeps N(0, 1), which sets the scale; each item block
    pools through its own learned location and precision."""
    spec = get_model("2pl", prior="population")
    (ability,) = spec.by_owner("subject")
    assert ability.prior.to_dict() == {"family": "normal", "loc": 0.0, "variance": 1.0}
    assert not ability.prior.references()
    for block in ("difficulty", "discrimination"):
        item = next(p for p in spec.params if p.name == block)
        assert item.prior.references() == (f"mu_{block}", f"u_{block}")
    assert {p.name for p in spec.by_owner("global")} == {
        "mu_difficulty", "u_difficulty", "mu_discrimination", "u_discrimination"}
    assert all(not p.in_likelihood for p in spec.by_owner("global"))


def test_symmetries_carry_the_pooled_hyper_parameters():
    """A scale move of pooled items moves their location the same way and their log
    precision by -2 t m; the move then leaves each pooled block's prior density plus its
    entropy unchanged, draw by draw (only the abilities' N(0, 1) and the hyper-priors move)."""
    spec = get_model("2pl", prior="population")
    shift, scale = (s.with_hypers(spec.params) for s in spec.symmetries)
    assert dict((n, (m, v)) for n, m, v in shift.moves) == {
        "ability": (0.0, 1.0), "difficulty": (0.0, 1.0), "mu_difficulty": (0.0, 1.0)}
    assert dict((n, (m, v)) for n, m, v in scale.moves) == {
        "ability": (1.0, 0.0), "difficulty": (1.0, 0.0), "discrimination": (0.0, -1.0),
        "mu_difficulty": (1.0, 0.0), "u_difficulty": (0.0, -2.0), "mu_discrimination": (0.0, -1.0)}
    rng = np.random.default_rng(0)
    z = {p.name: rng.normal(size=p.full_shape(3, 7)) for p in spec.params}
    moves = {n: (m, v) for n, m, v in scale.moves}

    def pooled(t):  # the item blocks' prior at the moved values, plus their entropy shift
        x = {n: z[n] * np.exp(t * moves[n][0]) + t * moves[n][1] if n in moves else z[n]
             for n in z}
        env = {p.name: p.constrain(x[p.name]) for p in spec.by_owner("global")}
        total = 0.0
        for p in spec.by_owner("item"):
            total += float(np.sum(p.prior.log_prob(x[p.name], env)))
            total += t * moves[p.name][0] * x[p.name].size
        return total

    for t in (-0.3, 0.2, 0.7):
        assert pooled(t) == pytest.approx(pooled(0.0), rel=1e-5)
    # without pooling nothing is added
    vague = get_model("2pl", prior="vague")
    assert all(s.with_hypers(vague.params) == s for s in vague.symmetries)


def test_model_error_is_irt_error_and_value_error():
    with pytest.raises(IRTError):
        get_model("nope")
    with pytest.raises(ValueError):
        get_model("nope")


def test_1pl_starts_from_the_logits_of_mean_responses():
    """PROX start: near the truth before any pass, missing cells ignored; 2PL keeps zeros."""
    rng = np.random.default_rng(4)
    theta, b = rng.normal(size=300), rng.normal(size=200)
    y = (rng.random((300, 200)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(np.int8)
    y[rng.random(y.shape) < 0.2] = -1
    start = get_model("1pl").initial(y)
    assert start["ability"].shape == (300,) and start["difficulty"].shape == (200,)
    assert np.corrcoef(start["ability"], theta)[0, 1] > 0.9
    assert np.corrcoef(start["difficulty"], b)[0, 1] > 0.9
    assert abs(float(start["ability"].mean())) < 1e-5  # centred, as the N(0, 1) prior is
    assert get_model("2pl").initial is None


def test_signed_models_start_discrimination_on_the_side_of_the_data():
    """The signed start: +1 or -1 by the sign of each item's correlation with the rest
    score, missing cells ignored; for every signed model, and only for signed ones."""
    rng = np.random.default_rng(5)
    theta, b = rng.normal(size=300), rng.normal(size=200)
    a = np.where(rng.random(200) < 0.2, -1.0, 1.0) * np.exp(0.3 * rng.normal(size=200))
    y = (rng.random((300, 200)) < 1 / (1 + np.exp(-a * (theta[:, None] - b)))).astype(np.int8)
    y[rng.random(y.shape) < 0.2] = -1
    for name in ("2pl", "3pl", "4pl", "feas"):
        start = get_model(name, signed_discrimination=True).initial(y)
        assert set(start) == {"discrimination"} and start["discrimination"].dtype == np.float32
        assert np.mean(np.sign(start["discrimination"]) == np.sign(a)) > 0.97
        assert get_model(name).initial is None


def test_signed_start_matches_a_direct_rest_score_covariance():
    """The start's covariance, from vector-matrix products, against a per-item loop over
    subjects with two or more responses (a subject with one response has no rest score)."""
    from engine.models.logistic import _sign_start

    rng = np.random.default_rng(6)
    y = (rng.random((40, 30)) < 0.5).astype(np.int8)
    y[rng.random(y.shape) < 0.3] = -1
    y[0, :] = -1
    y[0, 3] = 1  # one response only: left out
    got = _sign_start(y)["discrimination"]
    for j in range(y.shape[1]):
        rows = [s for s in range(y.shape[0]) if y[s, j] >= 0 and (y[s] >= 0).sum() >= 2]
        yj = np.array([y[s, j] for s in rows], float)
        rest = np.array([(y[s][y[s] >= 0].sum() - y[s, j]) / ((y[s] >= 0).sum() - 1) for s in rows])
        cov = np.sum((yj - yj.mean()) * (rest - rest.mean()))
        assert got[j] == (-1.0 if cov < 0 else 1.0), (j, cov)


def test_model_declares_loglik_or_linear_and_linear_sets_loglik():
    from engine.errors import ModelError
    from engine.models.spec import ModelSpec

    spec = get_model("2pl")
    assert spec.linear is not None and spec.loglik == spec.linear.loglik
    assert spec.replace(description="x").loglik == spec.linear.loglik
    other = dataclasses.replace(spec.linear, cell=lambda eta, extras, y, mask: y * eta)
    assert spec.replace(linear=other).loglik == other.loglik  # loglik follows a new linear
    with pytest.raises(ModelError, match="loglik or linear, not both"):
        ModelSpec(name="m", kind="binary", params=spec.params, linear=spec.linear,
                  loglik=lambda params, y, mask: y)
    with pytest.raises(ModelError, match="declare loglik or linear"):
        ModelSpec(name="m", kind="binary", params=spec.params)
