"""NUTS reference: exact posteriors (closed form, quadrature), R-hat refusal, run directory."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from engine.api import fit_nuts
from engine.cli import main
from engine.errors import ModelError, SettingsError
from engine.infer.nuts import NutsDraws, NutsSettings, diagnostics, nuts_fit_result, to_inference_data
from engine.models.priors import normal
from engine.models.registry import MODELS, get_model
from engine.models.spec import ModelSpec, ParamSpec
from engine.run import load_run, save_run

FAST = NutsSettings(num_chains=4, num_warmup=200, num_samples=500, seed=0)


def _normal_model() -> ModelSpec:
    """``theta_s ~ N(0, 1)``, ``y_sn ~ N(theta_s + 5, 1)``: a conjugate posterior per subject
    (responses stay positive: the engine reads negative cells as missing)."""
    return ModelSpec(name="conjugate-normal", kind="unit",
                     params=(ParamSpec("ability", "subject", normal(0.0, 1.0)),),
                     loglik=lambda p, y, m: stats_norm_logpdf(y, p["ability"] + 5.0))


def stats_norm_logpdf(y, mu):
    return -0.5 * (y - mu) ** 2 - 0.5 * jnp.log(2.0 * jnp.pi)


def test_conjugate_normal_matches_closed_form():
    rng = np.random.default_rng(1)
    y = (rng.normal(size=(6, 8)) + np.linspace(-2, 2, 6)[:, None] + 5.0).astype(np.float32)
    assert (y > 0).all()
    y[0, :5] = np.nan  # missing cells carry no likelihood
    y[3, 1::2] = np.nan
    res = nuts_fit_result(_normal_model(), y, FAST)
    observed = ~np.isnan(y)
    precision = 1.0 + observed.sum(axis=1)  # N(0, 1) prior, unit noise
    mean = np.where(observed, y - 5.0, 0).sum(axis=1) / precision
    sd = 1.0 / np.sqrt(precision)
    draws = res.draws["ability"].reshape(-1, 6)
    np.testing.assert_allclose(draws.mean(axis=0), mean, atol=0.15 * sd.max())
    np.testing.assert_allclose(draws.std(axis=0), sd, rtol=0.15)
    d = res.extra["diagnostics"]

    assert d["converged"] and d["rhat_max"] <= 1.01 and d["divergences"] == 0
    assert d["blocks"]["ability"]["ess_bulk_min"] > 100


def _one_item_posterior(k: int, n: int):
    """1PL with one item: ``p(b | y)`` by scipy quadrature, each ability integrated out.

    ``g(b) = int sigmoid(t - b) N(t; 0, 1) dt`` is P(correct | b) for a subject drawn from
    the prior; with ``k`` of ``n`` correct, ``p(b | y) ~ N(b; 0, 1000) g^k (1 - g)^(n - k)``.
    Returns ``(E[b], sd[b], E[theta | correct], E[theta | wrong])``.
    """
    sig = lambda t, b: 1.0 / (1.0 + np.exp(-(t - b)))
    g = lambda b: integrate.quad(lambda t: sig(t, b) * stats.norm.pdf(t), -12, 12)[0]
    m1 = lambda b: integrate.quad(lambda t: t * sig(t, b) * stats.norm.pdf(t), -12, 12)[0]
    grid = np.linspace(-6, 6, 241)
    gb = np.array([g(b) for b in grid])
    logpost = stats.norm.logpdf(grid, 0, np.sqrt(1000)) + k * np.log(gb) + (n - k) * np.log1p(-gb)
    w = np.exp(logpost - logpost.max())
    w /= integrate.simpson(w, x=grid)
    eb = integrate.simpson(w * grid, x=grid)
    sdb = np.sqrt(integrate.simpson(w * (grid - eb) ** 2, x=grid))
    mb = np.array([m1(b) for b in grid])  # E[theta 1{correct} | b]; E[theta] = 0
    right = integrate.simpson(w * mb / gb, x=grid)
    wrong = integrate.simpson(w * (-mb) / (1.0 - gb), x=grid)
    return eb, sdb, right, wrong


@pytest.mark.parametrize("low_rank", [0, 4])
def test_one_item_1pl_matches_quadrature(low_rank):
    """NUTS against scipy quadrature, with the diagonal mass matrix and with the low-rank
    one (whose LAPACK calls keep its chains in one thread even where two are asked for:
    two at once hung)."""
    y = np.zeros((30, 1), np.int8)
    y[:21, 0] = 1
    eb, sdb, right, wrong = _one_item_posterior(21, 30)
    res = nuts_fit_result(get_model("1pl", prior="vague"), y,
                          FAST.replace(low_rank=low_rank, chain_threads=2))
    assert res.extra["diagnostics"]["chain_threads"] == (1 if low_rank else 2)
    b = res.draws["difficulty"].reshape(-1)
    theta = res.draws["ability"].reshape(-1, 30)
    assert abs(b.mean() - eb) < 0.1 * sdb and abs(b.std() / sdb - 1) < 0.1
    assert abs(theta[:, :21].mean() - right) < 0.05 and abs(theta[:, 21:].mean() - wrong) < 0.05
    assert res.extra["diagnostics"]["converged"]


def _draws(shift: float) -> NutsDraws:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 1000, 3)).astype(np.float32)
    x[0] += shift  # one chain stuck elsewhere
    z = np.zeros((4, 1000))
    return NutsDraws({"ability": x}, z.astype(bool), z + 0.8, z + 7, z, np.ones(4)), x


def test_rhat_refuses_chains_that_disagree():
    spec = _normal_model()
    for shift, converged in ((0.0, True), (1.0, False)):
        draws, x = _draws(shift)
        idata = to_inference_data(spec, {"ability": x}, draws)
        d = diagnostics(spec, idata, FAST, draws)
        assert d["converged"] is converged
        assert (d["rhat_max"] > 1.01) is not converged
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import arviz as az
        assert d["rhat_max"] == pytest.approx(float(az.rhat(idata)["ability"].max()))


def test_sd_error_is_reported_and_flags_a_heavy_tail():
    """``mcse_sd_rel_max``: the Monte Carlo error of each posterior sd over that sd. For
    4 x 1,000 independent normal draws it is about 1 / sqrt(2 x 4,000) = 0.011; for a
    Student-t with 3 degrees of freedom (infinite kurtosis) it is several times larger,
    though R-hat and ESS see nothing wrong with either."""
    spec = _normal_model()
    draws, x = _draws(0.0)
    d = diagnostics(spec, to_inference_data(spec, {"ability": x}, draws), FAST, draws)
    assert 0.008 < d["blocks"]["ability"]["mcse_sd_rel_max"] < 0.016
    assert d["mcse_sd_rel_max"] == d["blocks"]["ability"]["mcse_sd_rel_max"]
    t = np.random.default_rng(3).standard_t(3, size=x.shape).astype(np.float32)
    heavy = diagnostics(spec, to_inference_data(spec, {"ability": t}, draws), FAST, draws)
    assert heavy["converged"] and heavy["ess_bulk_min"] > 3000
    assert heavy["mcse_sd_rel_max"] > 3 * d["mcse_sd_rel_max"]


def test_bad_settings_are_clear_errors():
    with pytest.raises(SettingsError, match=r"num_chains=0 \(--chains\)"):
        NutsSettings(num_chains=0)
    with pytest.raises(SettingsError, match=r"num_samples=0 \(--samples\)"):
        NutsSettings(num_samples=0)
    with pytest.raises(SettingsError, match=r"num_warmup=-1"):
        NutsSettings(num_warmup=-1)
    with pytest.raises(SettingsError, match="target_accept"):
        NutsSettings(target_accept=1.5)
    empty = ModelSpec(name="no-blocks", kind="binary", params=(), loglik=lambda p, y, m: 0.0 * y)
    with pytest.raises(ModelError, match="no continuous parameters"):
        nuts_fit_result(empty, np.zeros((3, 2), np.int8), FAST)


def test_too_large_for_memory_names_size_and_alternative(tmp_path):
    y = np.zeros((200, 50), np.int8)
    with pytest.raises(SettingsError, match=r"200 x 50 responses \(10,000 cells.*--method vi"):
        fit_nuts(y, "2pl", FAST.replace(memory_budget=1 << 20))


def test_cli_nuts_writes_run_directory_arviz_reads(tmp_path, capsys):
    rng = np.random.default_rng(3)
    theta, b = rng.normal(size=40), rng.normal(size=6)
    y = (rng.random((40, 6)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(int)
    path = tmp_path / "r.csv"
    import pandas as pd
    pd.DataFrame(y, index=[f"s{i}" for i in range(40)],
                 columns=[f"q{j}" for j in range(6)]).rename_axis("subject").to_csv(path)
    store, out = tmp_path / "s.zarr", tmp_path / "run"
    assert main(["ingest", str(path), "--out", str(store)]) == 0
    bad = ["fit", str(store), "--out", str(out), "--method", "nuts", "--model", "1pl"]
    assert main(bad + ["--chains", "0"]) == 2 and not out.exists()
    assert main(bad + ["--samples", "0"]) == 2 and not out.exists()
    assert main(bad + ["--low-rank", "-1"]) == 2 and not out.exists()
    capsys.readouterr()
    assert main(bad + ["--target-accept", "1.5"]) == 2 and not out.exists()
    assert "target_accept=1.5 (--target-accept): must be in (0, 1)" in capsys.readouterr().err
    assert main(bad + ["--chains", "2", "--warmup", "200", "--samples", "300", "--quiet",
                       "--target-accept", "0.9"]) == 0
    info = json.loads((out / "fit.json").read_text())
    assert info["method"] == "nuts" and info["num_chains"] == 2 and info["num_samples"] == 300
    assert info["target_accept"] == 0.9 and info["transitions"] == 600
    # the sampler's coordinates: 40 subjects x 6 items, the blocks as they are; fewer than
    # 50 items, so no shrinkage is read, converged or not
    assert info["coordinates"] == {"standardised": [], "anchored": [], "shrinkage": {},
                                   "restarted_from": None}
    assert info["settings"]["standardise"] is None
    assert info["converged"] == (info["rhat_max"] <= 1.01)
    # the 1PL's default population priors: the difficulties pool through mu and u
    assert info["model_options"]["prior"] == "population"
    assert set(info["blocks"]) == {"ability", "difficulty", "mu_difficulty", "u_difficulty"}
    subjects = pd.read_parquet(out / "subjects.parquet")
    assert {"ability_mean", "ability_sd", "rank_mean", "p_top1"} <= set(subjects.columns)
    assert np.corrcoef(subjects["ability_mean"], theta)[0, 1] > 0.6
    pairwise = load_run(out).pairwise()
    assert pairwise.shape == (40, 40) and not (out / "pairwise.npz").exists()
    # leaderboard --seed / --draws: the fit's board again from all 600 draws (as the fit read
    # them; a default of 1,000 would have thinned a longer run), or from 200 of them
    again = load_run(out)
    pd.testing.assert_frame_equal(again.subjects_redrawn(), again.subjects)
    assert not np.allclose(again.subjects_redrawn(200)["rank_mean"], subjects["rank_mean"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz as az
    idata = az.from_netcdf(out / "draws.nc")
    ability = idata.posterior["ability"]
    assert ability.dims == ("chain", "draw", "subject") and ability.shape == (2, 300, 40)
    assert list(idata.posterior["subject"].values[:2]) == ["s0", "s1"]
    # draws.nc holds the draws as sampled; the table reads identical sheets pooled, so a
    # subject whose sheet nobody else gave reads its own draws exactly, as az.summary would
    _, row_group, row_count = np.unique(y, axis=0, return_inverse=True, return_counts=True)
    row_group = row_group.reshape(-1)
    alone = row_count[row_group] == 1
    assert 0 < alone.sum() < 40  # both kinds of subject
    np.testing.assert_allclose(ability.mean(("chain", "draw")).values[alone],
                               subjects["ability_mean"][alone], rtol=1e-4, atol=1e-5)
    for g in np.flatnonzero(row_count > 1):  # twins: one value, near their draws' average
        members = np.flatnonzero(row_group == g)
        assert subjects["ability_mean"][members].nunique() == 1
        assert subjects["ability_mean"][members[0]] == pytest.approx(
            float(ability.values[:, :, members].mean()), abs=0.1)
    # each value's diagnostics beside its summary, as az.summary gives them
    np.testing.assert_allclose(subjects["ability_rhat"][alone], az.rhat(idata, method="split")[
        "ability"].values[alone], rtol=1e-5)
    np.testing.assert_allclose(subjects["ability_ess"][alone], az.ess(idata, method="mean")[
        "ability"].values[alone], rtol=1e-4)
    from tests.engine.infer._arviz_reference import mcse_sd
    np.testing.assert_allclose(subjects["ability_mcse_sd"][alone], mcse_sd(az, idata.posterior)[
        "ability"].values[alone], rtol=1e-4)
    items = pd.read_parquet(out / "items.parquet")
    np.testing.assert_allclose(items["difficulty_rhat"], az.rhat(idata, method="split")[
        "difficulty"].values, rtol=1e-5)
    # pairwise from the draws themselves
    a = ability.values.reshape(-1, 40)
    assert pairwise[0, 1] == pytest.approx((a[:, 0] > a[:, 1]).mean(), abs=1e-6)
    assert info["readout"]["item_intervals"] == "posterior draws (NUTS)"  # not "mean-field"
    # new subjects scored against the sampled items, on the grid and by a frozen refit (the
    # run's settings are the sampler's: this failed with "unknown fit settings")
    new = tmp_path / "new.csv"
    pd.DataFrame(y[:2], index=["n0", "n1"], columns=[f"q{j}" for j in range(6)]).rename_axis(
        "subject").to_csv(new)
    for method in ("grid", "fit"):
        assert main(["score", str(out), str(new), "--method", method,
                     "--out", str(tmp_path / f"scored-{method}.csv")]) == 0
        scored = pd.read_csv(tmp_path / f"scored-{method}.csv").set_index("subject")
        # the same answers as s0 and s1: near their abilities (within a posterior sd)
        for new_id, old_id in (("n0", 0), ("n1", 1)):
            gap = abs(scored.loc[new_id, "ability_mean"] - subjects["ability_mean"][old_id])
            assert gap < subjects["ability_sd"][old_id], (method, new_id, gap)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_log_joint_likelihood_equals_the_fit_terms(model):
    """NUTS's whole-tile log-likelihood equals the per-cell value the variational fit sums,
    missing cells included, for every registered model."""
    from engine.api import resolve_model
    from engine.infer.elbo import make_block_terms, make_log_likelihood
    from engine.infer.guide import init_guide

    rng = np.random.default_rng(5)
    spec0 = get_model(model, **({"dims": 2} if "mirt" in model or model == "irt-vec" else {}))
    shape = (7, 5)
    if spec0.kind == "binary":
        y = (rng.random(shape) < 0.6).astype(np.int8)
        y[1, 2] = -1
    else:
        y = rng.uniform(0.05, 0.95, shape).astype(np.float32)
        if spec0.kind == "nonnegative":
            y = y * 3.0
        y[1, 2] = np.nan
    options = {"dims": 2} if "mirt" in model or model == "irt-vec" else {}
    spec, _ = resolve_model(model, options, y)
    guide = init_guide(spec, *shape)
    z = {k: jnp.asarray(v + rng.normal(0, 0.5, v.shape).astype(np.float32))
         for k, v in guide.loc.items()}
    rows, cols = jnp.arange(shape[0]), jnp.arange(shape[1])
    ours = make_log_likelihood(spec, *shape)(z, rows, cols, jnp.asarray(y))
    fit_terms = make_block_terms(spec, *shape, with_hessian=False, per_cell=True)
    assert float(ours) == pytest.approx(float(fit_terms(z, rows, cols, jnp.asarray(y)).value),
                                        rel=1e-5)
    # a linear predictor's derivative comes from its terms: gradient and Hessian equal
    # autodiff of the model's own loglik
    at = lambda f: lambda zz: f(zz, rows, cols, jnp.asarray(y))
    fast, plain = (at(make_log_likelihood(spec, *shape, per_cell=p)) for p in (False, True))
    for d in (jax.grad, jax.hessian):
        got, want = d(fast)(z), d(plain)(z)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_new_data_of_one_shape_reuses_the_compiled_sampler(monkeypatch):
    """The data is an argument of the compiled sampler: two matrices, one trace."""
    import engine.infer.nuts as nuts

    traces = []
    real = nuts.make_log_density

    def counting(*args):
        f = real(*args)

        def log_density(z, y):
            traces.append(1)  # runs only while jax traces
            return f(z, y)

        return log_density

    monkeypatch.setattr(nuts, "make_log_density", counting)
    settings = NutsSettings(num_chains=2, num_warmup=20, num_samples=10, seed=0)
    spec = get_model("1pl")
    sampler = nuts.make_sampler(spec, 12, 4, settings)
    rng = np.random.default_rng(0)
    y1, y2 = (rng.random((2, 12, 4)) < 0.5).astype(np.int8)
    d1, _ = nuts.sample_nuts(spec, y1, settings, sampler=sampler)
    first = len(traces)
    d2, t2 = nuts.sample_nuts(spec, y2, settings, sampler=sampler)
    assert first > 0 and len(traces) == first  # no new trace for the second matrix
    assert not np.allclose(d1.position["ability"], d2.position["ability"])
    # the same draws as a sampler compiled for y2 alone
    d3, _ = nuts.sample_nuts(spec, y2, settings)
    np.testing.assert_allclose(d2.position["ability"], d3.position["ability"], rtol=1e-5, atol=1e-5)


def test_chains_split_over_threads_draw_what_one_program_draws():
    """Chains run in host threads, a share each, give each chain the draws it gets when every
    chain runs in one program (up to float rounding); a split that does not divide the
    chains is refused."""
    from engine.infer import nuts

    spec = get_model("2pl")
    rng = np.random.default_rng(3)
    y = (rng.random((15, 6)) < 0.6).astype(np.int8)
    base = NutsSettings(num_chains=4, num_warmup=30, num_samples=20, seed=2)
    one, t1 = nuts.sample_nuts(spec, y, base.replace(chain_threads=1))
    two, t2 = nuts.sample_nuts(spec, y, base.replace(chain_threads=2))
    assert (t1["chain_threads"], t2["chain_threads"]) == (1, 2)
    assert nuts.chain_threads(base.replace(chain_threads=2)) == 2
    for name in one.position:
        np.testing.assert_allclose(two.position[name], one.position[name], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(two.num_steps, one.num_steps)
    assert two.step_size.shape == (4,)
    with pytest.raises(SettingsError, match="chain_threads=3: must divide num_chains=4"):
        base.replace(chain_threads=3)
    # the default: a divisor of the chains, never more threads than chains
    assert 4 % nuts.chain_threads(base) == 0 and nuts.chain_threads(base.replace(num_chains=1)) == 1


def test_identical_sheets_get_identical_read_outs(tmp_path):
    """Subjects with the same responses (missing cells included) share NUTS draws, so their
    ability and interval are equal, and so are their rank statistics and P(beats), pooled
    from their own draws; a different sheet is not."""
    rng = np.random.default_rng(7)
    y = (rng.random((14, 5)) < 0.6).astype(np.int8)
    y[1] = y[0]
    y[2] = y[0]
    y[5] = y[4]
    y[5, 3] = -1  # same answers but one missing: a different sheet
    y[6] = y[3]
    res = fit_nuts(y, "1pl", FAST.replace(num_chains=2, num_samples=300))
    _, counts = np.unique(y, axis=0, return_counts=True)
    assert res.extra["diagnostics"]["pooled_rows"] == counts[counts > 1].sum() >= 5
    a = res.draws["ability"]
    np.testing.assert_array_equal(a[..., 0], a[..., 1])
    np.testing.assert_array_equal(a[..., 0], a[..., 2])
    np.testing.assert_array_equal(a[..., 3], a[..., 6])
    assert not np.array_equal(a[..., 4], a[..., 5])
    save_run(res, tmp_path / "run")
    import pandas as pd
    table = pd.read_parquet(tmp_path / "run" / "subjects.parquet").drop(columns=["subject"],
                                                                        errors="ignore")
    for i, j in ((0, 1), (0, 2), (3, 6)):
        pd.testing.assert_series_equal(table.iloc[i], table.iloc[j], check_names=False)
    p = load_run(tmp_path / "run").pairwise()
    np.testing.assert_array_equal(p[0, 3:], p[1, 3:])
    # the ranks read each twin's own draws (as sampled): twins rank among each other
    assert p[0, 1] == p[1, 0] == 0.5
    assert table["p_top1"].sum() == pytest.approx(1.0)
    assert table["rank_mean"].sum() == pytest.approx(14 * 15 / 2)
    joint = res.extra["idata"].posterior["ability"].values.reshape(-1, 14)  # as sampled
    assert joint.shape == (600, 14) and not np.array_equal(joint[:, 0], joint[:, 1])


def _pooled_normal_model() -> ModelSpec:
    """Eight item means pooled through ``b_n ~ N(mu, 1/u)``, ``mu ~ N(0, 10^2)``,
    ``u ~ Gamma(1, 1)``, with ``y_sn ~ N(b_n + 5, 1)``: a funnel between the ``b`` and ``u``
    when each item has few responses, with a posterior on ``(mu, log u)`` that two-dimensional
    quadrature gives (each ``b`` integrates out in closed form)."""
    from engine.models.priors import log_gamma

    return ModelSpec(name="pooled-normal", kind="unit", params=(
        ParamSpec("mu", "global", normal(0.0, 100.0), in_likelihood=False),
        ParamSpec("u", "global", log_gamma(1.0, 1.0), transform="exp", in_likelihood=False),
        ParamSpec("difficulty", "item", normal("mu", precision="u"))),
        loglik=lambda p, y, m: stats_norm_logpdf(y, p["difficulty"] + 5.0))


def _pooled_posterior(ybar: np.ndarray, n: np.ndarray):
    """``E[mu]``, ``E[log u]``, ``sd[log u]`` and each ``E[b]`` by quadrature on a grid of
    ``(mu, log u)``: ``ybar_i ~ N(mu, 1/u + 1/n_i)`` with the ``b`` integrated out."""
    mu = np.linspace(-6, 6, 481)[:, None]
    lu = np.linspace(-7, 5, 481)[None, :]
    u = np.exp(lu)
    logp = stats.norm.logpdf(mu, 0, 10) + stats.gamma.logpdf(u, 1.0) + lu  # the log u Jacobian
    for yb, k in zip(ybar, n):
        logp = logp + stats.norm.logpdf(yb, mu, np.sqrt(1 / u + 1 / k))
    w = np.exp(logp - logp.max())
    w /= w.sum()
    e_lu = (w * lu).sum()
    b = [(w * (k * yb + u * mu) / (k + u)).sum() for yb, k in zip(ybar, n)]
    return (w * mu).sum(), e_lu, np.sqrt((w * (lu - e_lu) ** 2).sum()), np.array(b)


@pytest.mark.parametrize("noncentred", [True, False])
def test_pooled_blocks_match_quadrature(noncentred):
    """A pooled block sampled in standardised coordinates (the default) draws the model's
    own posterior, as the centred coordinates do: hyper-parameters and item means against
    two-dimensional quadrature."""
    from engine.infer.nuts import pooled_blocks

    spec = _pooled_normal_model()
    assert pooled_blocks(spec, 2, 8, 50) == {"difficulty": ("mu", "u")}
    assert pooled_blocks(spec, 2, 8, 8) == {}  # eight entries: not fewer than 8
    assert pooled_blocks(spec, 2, 8, None) == {"difficulty": ("mu", "u")}  # mu ~ N(0, 10^2): vague
    rng = np.random.default_rng(5)
    b = rng.normal(0.3, 0.4, size=8)
    y = (5.0 + b + rng.normal(size=(2, 8))).astype(np.float32)
    y[1, :5] = np.nan  # five items with one response
    n = (~np.isnan(y)).sum(axis=0)
    ybar = np.nanmean(y, axis=0) - 5.0
    e_mu, e_lu, sd_lu, e_b = _pooled_posterior(ybar, n)
    res = nuts_fit_result(spec, y, FAST.replace(noncentred_below=50 if noncentred else 0))
    d = res.extra["diagnostics"]
    lu = np.log(res.draws["u"].reshape(-1))
    assert d["converged"] and d["divergences"] == 0, d
    assert abs(res.draws["mu"].mean() - e_mu) < 0.1
    assert abs(lu.mean() - e_lu) < 0.15 * sd_lu and abs(lu.std() / sd_lu - 1) < 0.15
    np.testing.assert_allclose(res.draws["difficulty"].reshape(-1, 8).mean(axis=0), e_b, atol=0.06)


def test_default_standardises_only_few_entries_under_a_vague_location():
    """The default rule (``noncentred_below=None``): a pooled block is sampled standardised
    when it has fewer than 50 entries and its location's prior is vague (seed 003's
    hierarchical family), and an item block when fewer than 30 subjects answer; otherwise
    not under the population family's proper hyper-priors, where the blocks as they are
    sample faster (NutsSettings)."""
    from engine.infer.nuts import pooled_blocks

    both = {"difficulty": ("mu_difficulty", "u_difficulty"),
            "discrimination": ("mu_discrimination", "u_discrimination")}
    assert pooled_blocks(get_model("2pl", prior="hierarchical"), 1000, 5, None) == both
    assert pooled_blocks(get_model("2pl", prior="hierarchical"), 1000, 50, None) == {}
    assert pooled_blocks(get_model("2pl", prior="population"), 1000, 5, None) == {}
    assert pooled_blocks(get_model("2pl", prior="population"), 1000, 5, 50) == both
    assert pooled_blocks(get_model("2pl", prior="vague"), 1000, 5, None) == {}
    # fewer than 30 subjects: every pooled item block, each item's data weak against its pool
    assert pooled_blocks(get_model("2pl", prior="population"), 29, 500, None) == both
    assert pooled_blocks(get_model("2pl", prior="population"), 30, 500, None) == {}
    assert pooled_blocks(get_model("2pl", prior="population"), 29, 500, 0) == {}  # asked: none
    assert NutsSettings().noncentred_below is None
    from engine.infer.nuts import _vague_location
    from engine.models.priors import log_gamma

    for location, vague in ((normal(0.0, precision=0.001), True), (normal(0.0, precision=1.0), False),
                            (normal(0.0, 100.0), True), (normal(0.0, 9.0), False)):
        spec = ModelSpec(name="pooled", kind="unit", params=(
            ParamSpec("mu", "global", location, in_likelihood=False),
            ParamSpec("u", "global", log_gamma(1.0, 1.0), transform="exp", in_likelihood=False),
            ParamSpec("difficulty", "item", normal("mu", precision="u"))),
            loglik=lambda p, y, m: stats_norm_logpdf(y, p["difficulty"]))
        assert _vague_location(spec, "mu") is vague
    with pytest.raises(SettingsError, match="noncentred_below"):
        NutsSettings(noncentred_below=-1)


def test_anchored_coordinates_are_exact_and_take_up_the_declared_symmetries():
    """``anchor``: the blocks the 2PL's common shift and scale move are sampled relative to
    the abilities' mean and to the scale (read from the discriminations' pool location, a
    standardised block's too, else from the abilities' spread); a standardised block
    follows its moved globals. The map inverts, its log-Jacobian is the numerical
    Jacobian's, and moving the anchor alone along either symmetry moves the model's blocks
    along it: the likelihood's value stays."""
    import jax

    from engine.infer import nuts
    from engine.infer.elbo import make_log_likelihood

    spec = get_model("2pl", prior="population")
    coords = lambda s, **kw: nuts.sampler_coordinates(spec, s, 6, NutsSettings(**kw))
    big, small = coords(40, anchor="all"), coords(19, anchor="all")
    assert [(a.kind, a.anchor, a.moves) for a in big.anchored] == [  # the scale read from the
        ("value", "mu_discrimination", {  # log discriminations' pool location
            "ability": (1.0, 0.0), "difficulty": (1.0, 0.0), "discrimination": (0.0, -1.0),
            "mu_difficulty": (1.0, 0.0), "u_difficulty": (0.0, -2.0)}),
        ("mean", "ability", {"difficulty": (0.0, 1.0), "mu_difficulty": (0.0, 1.0)})]
    assert [(a.kind, a.anchor, sorted(a.moves)) for a in small.anchored] == [  # item blocks
        ("value", "mu_discrimination", ["ability", "mu_difficulty", "u_difficulty"]),  # standardised:
        ("mean", "ability", ["mu_difficulty"])]  # the same location, the items following it
    assert [a.kind for a in coords(40, anchor="translations").anchored] == ["mean"]
    assert coords(40, anchor="none").anchored == ()
    # no pool location: the scale read from the abilities' spread
    vague, hier = get_model("2pl", prior="vague"), get_model("2pl", prior="hierarchical")
    spread = nuts.sampler_coordinates(vague, 40, 6, NutsSettings(anchor="all"))
    assert [(a.kind, a.anchor, sorted(a.moves)) for a in spread.anchored] == [
        ("log_sd", "ability", ["difficulty", "discrimination"]), ("mean", "ability", ["difficulty"])]
    # the abilities standardised too (seed 003's hierarchical family): no shift anchor; the
    # scale from the discriminations' location moves the abilities' globals
    pooled = nuts.sampler_coordinates(hier, 19, 6, NutsSettings(anchor="all"))
    assert [(a.kind, a.anchor, sorted(a.moves)) for a in pooled.anchored] == [
        ("value", "mu_discrimination", ["mu_ability", "mu_difficulty", "u_ability", "u_difficulty"])]
    # the default: the shift alone where the item blocks are standardised (fewer than 30
    # subjects, at any item count); else both at 50 items or more; else neither
    at = lambda s, n: [a.kind for a in nuts.sampler_coordinates(spec, s, n,
                                                                NutsSettings()).anchored]
    assert at(40, 6) == at(1000, 49) == [] and at(30, 50) == ["value", "mean"]
    assert at(29, 500) == at(19, 6) == ["mean"]
    assert [sorted(a.moves) for a in nuts.sampler_coordinates(spec, 19, 157, NutsSettings())
            .anchored] == [["mu_difficulty"]]  # the difficulties follow their moved location
    # items standardised for another reason (a vague location; noncentred_below): neither
    # by default; asked for, the scale is read from the standardised block's location
    assert "difficulty" in nuts.pooled_blocks(hier, 1000, 5, None)
    assert nuts.sampler_coordinates(hier, 1000, 5, NutsSettings()).anchored == ()
    assert nuts.sampler_coordinates(spec, 40, 60, NutsSettings(noncentred_below=100)).anchored == ()
    asked = nuts.sampler_coordinates(spec, 50, 1000, NutsSettings(noncentred_below=1001,
                                                                   anchor="all"))
    assert nuts.coordinates_summary(asked) == {
        "standardised": ["difficulty", "discrimination"],
        "anchored": [{"anchor": "mu_discrimination", "kind": "value",
                      "moves": ["ability", "mu_difficulty", "u_difficulty"]},
                     {"anchor": "ability", "kind": "mean", "moves": ["mu_difficulty"]}]}
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.integers(0, 2, (40, 6)), jnp.float32)
    for model, s, c in ((spec, 40, big), (spec, 19, small), (vague, 40, spread), (hier, 19, pooled)):
        z = {p.name: jnp.asarray(rng.normal(size=p.full_shape(s, 6)), jnp.float32)
             for p in model.params}
        x, log_jac = nuts._centre(model, c, z)
        back = nuts._standardise(model, c, x)
        for k in z:
            np.testing.assert_allclose(back[k], z[k], atol=1e-5)
        names = sorted(z)
        flat = lambda d: jnp.concatenate([jnp.ravel(d[k]) for k in names])
        cut = np.cumsum([z[k].size for k in names])[:-1]
        unflat = lambda v: {k: part.reshape(z[k].shape)
                            for k, part in zip(names, jnp.split(v, cut))}
        jac = jax.jacfwd(lambda v: flat(nuts._centre(model, c, unflat(v))[0]))(flat(z))
        np.testing.assert_allclose(float(log_jac), float(jnp.linalg.slogdet(jac)[1]), atol=1e-3)
        loglik = make_log_likelihood(model, s, 6)
        whole = slice(None)
        at = lambda zz: float(loglik(nuts._centre(model, c, zz)[0], whole, whole, y[:s]))
        # the abilities' first coordinate is sqrt(n) times their mean (reflected,
        # `_mean_first`): the shift moves it alone; the scale moves the log discriminations'
        # location alone where it is read from there, else all the abilities
        kinds = [a.kind for a in c.anchored]
        first = jnp.zeros(s).at[0].set(0.5 * np.sqrt(s))
        scale = ({"mu_discrimination": z["mu_discrimination"] + 0.3} if "value" in kinds
                 else {"ability": z["ability"] * 1.7})
        for moved in [scale] + ([{"ability": z["ability"] + first}] if "mean" in kinds else []):
            np.testing.assert_allclose(at({**z, **moved}), at(z), rtol=1e-5)
        for moved in ("ability", "discrimination"):  # not a symmetry
            assert abs(at({**z, moved: z[moved] + 0.5}) - at(z)) > 1e-3
        if "mean" in kinds:
            mean = lambda zz: float(jnp.mean(nuts._centre(model, c, zz)[0]["ability"]))
            factor = float(jnp.exp(-z["mu_discrimination"])) if "value" in kinds else 1.0
            np.testing.assert_allclose(mean({**z, "ability": z["ability"] + first}),
                                       mean(z) + 0.5 * factor, atol=1e-5)
    with pytest.raises(SettingsError, match="anchor="):
        NutsSettings(anchor="scale")
    # a scale is read from the abilities' spread, which is 0 at an unjittered start: refused
    # where the resolved anchor takes up a scale, and only there
    key = jax.random.PRNGKey(0)
    wide = np.asarray(rng.integers(0, 2, (30, 50)), np.float32)
    few = np.asarray(y)[:19]
    with pytest.raises(SettingsError, match="init_jitter=0 with anchor='all', which at 6 items"):
        nuts._initial_positions(vague, np.asarray(y), NutsSettings(init_jitter=0.0, anchor="all"),
                                key)
    for settings, data in ((NutsSettings(init_jitter=0.0), np.asarray(y)),  # default: none
                           (NutsSettings(init_jitter=0.0), wide),  # the scale from a location
                           (NutsSettings(init_jitter=0.0, anchor="all"), few),  # a standardised one's
                           (NutsSettings(init_jitter=0.0, anchor="translations"), wide)):
        start = nuts._initial_positions(spec, data, settings, key)
        assert all(np.isfinite(np.asarray(v)).all() for v in start.values())
        model = nuts._centre(spec, nuts.sampler_coordinates(spec, *data.shape, settings),
                             start)[0]
        assert float(jnp.ptp(model["ability"][0])) == 0.0  # no jitter: all at one value


def test_nuts_samples_constant_items_with_their_data_under_pooled_priors_only():
    """Under pooled priors NUTS samples every item with its data (the exact posterior, in
    which items answered alike widen their pool); under fixed vague priors it sets them
    aside as the default fit does, since their values would run far out."""
    from engine.api import nuts_responses, response_stats

    y = np.random.default_rng(0).integers(0, 2, (30, 6)).astype(np.int8)
    y[:, 1], y[:, 4] = 1, 0
    y[::3, 1] = -1
    for model in ("1pl", "2pl"):
        assert nuts_responses(y, response_stats(y), "binary",
                              get_model(model, prior="population")) is y
        aside = nuts_responses(y, response_stats(y), "binary", get_model(model, prior="vague"))
        assert (aside[:, [1, 4]] == -1).all()
        np.testing.assert_array_equal(np.delete(aside, [1, 4], 1), np.delete(y, [1, 4], 1))


def test_extend_draws_on_from_where_the_chains_stopped_while_rhat_is_over_the_bound():
    """``extend``: while an R-hat exceeds ``max_rhat`` the chains draw ``num_samples`` more
    each, from their last state with their adapted step size and metric. The first round's
    draws are the unextended run's, to the bit; the draws after it still sample the exact
    posterior (conjugate normal, closed form); a run that converges is not extended; the
    memory estimate counts the extra draws; a negative count is refused, naming the flag."""
    from engine.infer import nuts

    rng = np.random.default_rng(1)
    y = (rng.normal(size=(6, 8)) + np.linspace(-2, 2, 6)[:, None] + 5.0).astype(np.float32)
    spec = _normal_model()
    settings = NutsSettings(num_chains=4, num_warmup=200, num_samples=300, seed=0,
                            chain_threads=2, max_rhat=1.0)  # never met: every round runs
    once = nuts_fit_result(spec, y, settings)
    more = nuts_fit_result(spec, y, settings.replace(extend=2))
    d = more.extra["diagnostics"]
    assert (d["extended"], d["num_samples"]) == (2, 900) and not more.converged
    assert more.draws["ability"].shape == (4, 900, 6)
    np.testing.assert_array_equal(more.draws["ability"][:, :300], once.draws["ability"])
    assert once.extra["diagnostics"]["extended"] == 0
    assert more.extra["idata"].posterior.sizes["draw"] == 900
    later = more.draws["ability"][:, 300:].reshape(-1, 6)
    precision = 1.0 + y.shape[1]
    sd = 1.0 / np.sqrt(precision)
    np.testing.assert_allclose(later.mean(axis=0), (y - 5.0).sum(axis=1) / precision,
                               atol=0.15 * sd)
    np.testing.assert_allclose(later.std(axis=0), sd, rtol=0.15)
    # round 1 is continue_nuts from the first round's last states, to the bit; round 2
    # reuses round 1's compiled program (no compile) and gives the fit's last draws
    first = nuts.sample_nuts(spec, y, settings)[0]
    steps, t1 = nuts.continue_nuts(spec, y, settings, first, 1, 2)
    np.testing.assert_array_equal(steps.position["ability"], more.draws["ability"][:, 300:600])
    then, t2 = nuts.continue_nuts(spec, y, settings, nuts.join_draws(first, steps), 2, 2,
                                  program=t1["program"])
    assert t2["program"] is t1["program"] and t2["compile_s"] < t1["compile_s"]
    np.testing.assert_array_equal(then.position["ability"], more.draws["ability"][:, 600:])
    converged = nuts_fit_result(spec, y, settings.replace(max_rhat=1.05, extend=3))
    assert converged.converged and converged.extra["diagnostics"]["extended"] == 0
    base = nuts.nuts_memory_bytes(spec, 6, 8, settings)
    assert nuts.nuts_memory_bytes(spec, 6, 8, settings.replace(extend=1)) > base
    with pytest.raises(SettingsError, match=r"extend=-1 \(--extend\): must be an integer >= 0"):
        settings.replace(extend=-1)


def _simulated_2pl(num_subjects: int, num_items: int, seed: int, log_a=(0.0, 0.3)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=num_subjects), rng.normal(size=num_items)
    a = np.exp(rng.normal(*log_a, size=num_items))
    p = 1.0 / (1.0 + np.exp(-a * (theta[:, None] - b)))
    return (rng.random(p.shape) < p).astype(np.int8)


def test_unconverged_run_of_items_near_their_prior_restarts_standardised(tmp_path):
    """The default rule's second look, read from the draws: at 30 subjects or more and 50
    items or more, a run with its items as they are that does not converge samples again
    from the start with every pooled item block standardised where an item block's mean
    shrinkage ``E[u] Var(x_i)`` (within chains) is over 0.5, and not where the data decide
    the items. The added rounds go on in the new coordinates; fit.json's coordinates record
    the shrinkages, the first run and the coordinates sampled, and its settings name the
    blocks; the draws are those of the standardised settings asked for directly, to the
    bit."""
    from engine.infer import nuts

    spec = get_model("2pl", prior="population")
    never = NutsSettings(num_chains=2, num_warmup=150, num_samples=150, seed=0, max_rhat=1.0)
    weak = _simulated_2pl(30, 50, seed=1)  # each discrimination seen by 30 subjects
    res = fit_nuts(weak, "2pl", never.replace(extend=1))
    d = res.extra["diagnostics"]
    coords = d["coordinates"]
    both = ("difficulty", "discrimination")
    assert coords["shrinkage"]["discrimination"] > 0.5 > coords["shrinkage"]["difficulty"]
    assert res.settings.standardise == both and coords["standardised"] == list(both)
    assert [a["kind"] for a in coords["anchored"]] == ["value", "mean"]
    first = coords["restarted_from"]
    assert first["coordinates"]["standardised"] == [] and first["rhat_max"] > 1.0
    assert first["shrinkage_over"] == {"discrimination": coords["shrinkage"]["discrimination"]}
    assert first["shrinkage_threshold"] == nuts.SHRINKAGE_RESTART
    assert d["extended"] == 1 and d["num_samples"] == 300  # a round added after the restart
    asked = nuts_fit_result(spec, weak, never.replace(standardise=both))
    for name, draws in asked.draws.items():
        np.testing.assert_array_equal(res.draws[name][:, :150], draws)
    assert asked.extra["diagnostics"]["coordinates"]["restarted_from"] is None
    save_run(res, tmp_path / "run")
    info = json.loads((tmp_path / "run" / "fit.json").read_text())
    assert info["coordinates"]["restarted_from"]["coordinates"]["standardised"] == []
    assert NutsSettings.from_dict(info["settings"]).standardise == both
    # items decided by their data (100 subjects, log discriminations spread with sd 1:
    # measured shrinkage 0.17 against 0.84 above): not restarted
    strong = _simulated_2pl(100, 50, seed=2, log_a=(0.0, 1.0))
    kept = nuts_fit_result(spec, strong, never)
    coords = kept.extra["diagnostics"]["coordinates"]
    assert coords["restarted_from"] is None and coords["standardised"] == []
    assert 0.0 < max(coords["shrinkage"].values()) < 0.5
    assert kept.settings.standardise is None
    # draws that are the pool's prior itself shrink fully, however far apart the chains;
    # draws a tenth as wide, to 0.01
    rng = np.random.default_rng(0)
    prior = {"u_discrimination": np.full((4, 2000), np.log(4.0)), "u_difficulty": np.zeros((4, 2000)),
             "discrimination": rng.normal(0.0, 0.5, (4, 2000, 50)) + 10.0 * np.arange(4)[:, None, None],
             "difficulty": rng.normal(0.0, 0.1, (4, 2000, 50)), "ability": np.zeros((4, 2000, 40)),
             "mu_discrimination": np.zeros((4, 2000)), "mu_difficulty": np.zeros((4, 2000))}
    draws = NutsDraws(prior, *([None] * 5))
    assert nuts.shrinkage(spec, draws) == pytest.approx(
        {"discrimination": 1.0, "difficulty": 0.01}, rel=0.02)
    assert nuts.shrinkage_restart(spec, (40, 50), never, draws, False)[0].standardise == both
    assert nuts.shrinkage_restart(spec, (40, 50), never, draws, True) == (None, {})  # converged
    assert nuts.shrinkage_restart(spec, (40, 49), never, draws, False) == (None, {})  # few items
    assert nuts.shrinkage_restart(spec, (29, 50), never, draws, False) == (None, {})  # rule's own
    nan = NutsDraws(prior | {"u_discrimination": np.full((4, 2000), np.nan)}, *([None] * 5))
    assert nuts.shrinkage_restart(spec, (40, 50), never, nan, False)[0] is None  # NaN: not over
    # seed 003's hierarchical family standardises its 40 abilities (a vague location): the
    # restart keeps them so, beside the items
    hier = get_model("2pl", prior="hierarchical")
    assert list(nuts.pooled_blocks(hier, 40, 60, None)) == ["ability"]
    hier_draws = NutsDraws(prior | {"mu_ability": np.zeros((4, 2000)), "u_ability": np.zeros((4, 2000))},
                           *([None] * 5))
    assert nuts.shrinkage_restart(hier, (40, 50), never, hier_draws, False)[0].standardise == (
        "ability",) + both
    with pytest.raises(SettingsError, match=r"standardise names \['ability'\], which are not "
                                            r"pooled blocks of model '2pl'"):
        nuts.sampler_coordinates(spec, 30, 50, NutsSettings(standardise=("ability",)))
    with pytest.raises(SettingsError, match="standardise='difficulty': must be None"):
        NutsSettings(standardise="difficulty")
    assert NutsSettings(standardise=["discrimination", "difficulty", "difficulty"]).standardise == both
    with pytest.raises(SettingsError, match=r"standardise=\('difficulty',\) and "
                                            r"noncentred_below=50: give one of them"):
        NutsSettings(standardise=("difficulty",), noncentred_below=50)
    # named blocks below 30 subjects: the anchor default's shift alone, as the rule samples
    assert [a.kind for a in nuts.sampler_coordinates(spec, 19, 175, NutsSettings(
        standardise=both)).anchored] == ["mean"]


@pytest.mark.parametrize("model", ["beta", "gamma", "mirt-comp"])
def test_nuts_samples_the_other_kinds_of_model_and_writes_their_run(model, tmp_path, capsys):
    """NUTS on a model of each kind the binary tests leave out (proportions, non-negative
    scores, two-skill abilities): finite draws of every block, the run directory written, and
    the summaries the draws' own means. The binary ones are sampled in the tests above."""
    import pandas as pd

    rng = np.random.default_rng(11)
    # beta with per-subject zero and one inflation: several subject blocks
    options = {"mirt-comp": {"dims": 2}, "beta": {"inflation_owner": "subject"}}.get(model)
    kind = get_model(model, **(options or {})).kind
    shape = (24, 6)
    y = (rng.random(shape) < 0.6).astype(np.int8) if kind == "binary" else \
        rng.uniform(0.05, 0.95, shape).astype(np.float32) * (3.0 if kind == "nonnegative" else 1.0)
    y[0, 1] = -1 if kind == "binary" else np.nan
    y[[4, 5]] = y[3]  # three identical sheets: one posterior, every subject block pooled
    res = fit_nuts(y, model, FAST.replace(num_chains=2, num_warmup=100, num_samples=150),
                   model_options=options)
    _, counts = np.unique(np.nan_to_num(y, nan=-1.0), axis=0, return_counts=True)
    assert res.extra["diagnostics"]["pooled_rows"] == counts[counts > 1].sum() >= 3
    assert set(res.draws) == {p.name for p in res.spec.params}
    for name, draws in res.draws.items():
        assert draws.shape[:2] == (2, 150) and np.isfinite(draws).all(), name
    ability = res.draws["ability"]
    assert ability.shape[2] == shape[0]
    assert ability.shape[3:] == ((2,) if model == "mirt-comp" else ())
    save_run(res, tmp_path / "run")
    info = json.loads((tmp_path / "run" / "fit.json").read_text())
    assert info["method"] == "nuts" and info["num_chains"] == 2 and info["num_samples"] == 150
    # binary responses are replicated from the likelihood; other kinds say why they are not
    assert info["log_likelihood"]["posterior_predictive"] is (kind == "binary")
    assert (kind == "binary") != ("not replicated" in info["log_likelihood"].get(
        "posterior_predictive_omitted", ""))
    subjects = pd.read_parquet(tmp_path / "run" / "subjects.parquet")
    items = pd.read_parquet(tmp_path / "run" / "items.parquet")
    twins = subjects.iloc[3:6].drop(columns="subject")
    assert (twins.nunique(dropna=False) == 1).all()  # every skill and block, rank statistics
    if "p_top1" in subjects:
        assert subjects["p_top1"].sum() == pytest.approx(1.0, abs=1e-6)
    skills = [f"_{k}" for k in res.spec.skills] if model == "mirt-comp" else [""]
    for d, skill in enumerate(skills):  # each skill's abilities, and an item block's values
        want = ability.mean(axis=(0, 1))
        np.testing.assert_allclose(subjects[f"ability{skill}_mean"],
                                   want[:, d] if want.ndim == 2 else want, rtol=1e-4, atol=1e-5)
    item_block = next(p for p in res.spec.by_owner("item") if p.shape == ())
    np.testing.assert_allclose(items[f"{item_block.name}_mean"],
                               res.draws[item_block.name].mean(axis=(0, 1)), rtol=1e-4, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz as az
    posterior = az.from_netcdf(tmp_path / "run" / "draws.nc").posterior
    assert posterior["ability"].shape[:3] == (2, 150, shape[0])
    # draws.nc holds the draws as sampled: the twins drawn apart (a joint posterior in which
    # they may rank either way), their pooled summaries the tables' (means of all of them)
    drawn = np.asarray(posterior["ability"].values)
    assert not np.array_equal(drawn[:, :, 3], drawn[:, :, 4])
    pooled = np.asarray(ability)
    assert np.array_equal(pooled[:, :, 3], pooled[:, :, 4])
    _, row_group, row_count = np.unique(np.nan_to_num(y, nan=-1.0), axis=0, return_inverse=True,
                                        return_counts=True)
    alone = np.flatnonzero(row_count[row_group.reshape(-1)] == 1)  # sheets nobody else gave
    assert alone.size > 0
    np.testing.assert_array_equal(drawn[:, :, alone], pooled[:, :, alone])

    run = load_run(tmp_path / "run")
    assert run.info["readout"]["draws_nc"] == "as sampled"
    np.testing.assert_array_equal(run.sampler_draws("ability"), drawn)
    item_block = next(p.name for p in res.spec.by_owner("item"))
    np.testing.assert_array_equal(run.sampler_draws(item_block), posterior[item_block].values)
    from engine import runfiles
    from engine.errors import RunDamagedError

    with pytest.raises(RunDamagedError, match="by chain, draw and subject \\(25\\)"):
        runfiles.read_netcdf_posterior(run.path, run.info, "draws.nc", "ability", ("subject", 25))
    with pytest.raises(RunDamagedError, match="does not hold the draws of 'nothing'"):
        runfiles.read_netcdf_posterior(run.path, run.info, "draws.nc", "nothing", ("subject", 24))
    older = load_run(tmp_path / "run")  # a run written before draws.nc held the draws as
    del older.info["readout"]["draws_nc"]  # sampled: its twins tie there, so none is read
    assert older.sampler_draws("ability") is None
    if model == "mirt-comp":  # the multi-skill boards read those draws, not their Gaussian
        from engine.readout.ranking import identical_subjects
        from engine.readout.vector_rank import format_vector_board, parse_rank, vector_leaderboard

        flat = drawn.reshape((-1,) + drawn.shape[2:])
        board = vector_leaderboard(flat, run.subjects["subject"].tolist(), list(res.spec.skills),
                                   parse_rank("pareto"), groups=identical_subjects(
                                       run.guide.loc["ability"], run.guide.log_scale["ability"]))
        assert main(["leaderboard", str(tmp_path / "run"), "--rank", "pareto"]) == 0
        printed = capsys.readouterr().out
        assert format_vector_board(board, 3) in printed
        # the fit's notes, as under the scalar board (this short run's R-hat is over 1.01)
        assert info["converged"] is False and "note: the fit did not converge" in printed
        # --draws: at most that many, evenly spaced over both chains (draws 0, 100, 199, 299)
        every = vector_leaderboard(flat[np.linspace(0, 299, 4).round().astype(int)],
                                   run.subjects["subject"].tolist(), list(res.spec.skills),
                                   parse_rank("pareto"), groups=identical_subjects(
                                       run.guide.loc["ability"], run.guide.log_scale["ability"]))
        assert main(["leaderboard", str(tmp_path / "run"), "--rank", "pareto", "--draws", "4"]) == 0
        assert format_vector_board(every, 3) in capsys.readouterr().out
        names = run.subjects["subject"].iloc[[3, 4, 5]].tolist()
        twins = board.set_index("subject").loc[names].drop(columns="rank")  # the row's place
        assert (twins.nunique(dropna=False) == 1).all(), twins  # read from all three's draws
        assert 0 < twins["p_front1"].iloc[0] < 1  # drawn apart: not always on the front together
        nc = tmp_path / "run" / "draws.nc"  # a damaged draws file is refused, never read
        data = bytearray(nc.read_bytes())
        data[len(data) // 2] ^= 0xFF
        nc.write_bytes(bytes(data))
        assert main(["leaderboard", str(tmp_path / "run"), "--rank", "pareto"]) != 0
        assert f"run file {nc} is damaged" in capsys.readouterr().err


def test_draws_nc_holds_what_arviz_loo_waic_and_bfmi_read(tmp_path):
    """draws.nc carries ArviZ's ``observed_data`` (each observed cell's response),
    ``log_likelihood`` (each observed cell's log-likelihood at each draw, checked against
    scipy's Bernoulli at the posterior's own draws), ``posterior_predictive`` (replicated
    responses, as often 1 as the model's probability at each draw says) and ``energy`` in
    ``sample_stats``, so ``az.loo``, ``az.waic``, ``az.loo_pit``, ``az.plot_ppc`` and
    ``az.bfmi`` run on a NUTS run as on any numpyro fit. Past the size limit the draws are
    thinned evenly (the ``draw`` coordinate names them), and left out, with the reason in
    fit.json, where too few would fit."""
    from scipy.special import expit

    from engine.infer import nuts

    y = _simulated_2pl(30, 6, seed=3)
    y[0, :2] = -1
    y[7, 5] = -1
    res = fit_nuts(y, "2pl", FAST.replace(num_chains=2, num_warmup=150, num_samples=200))
    save_run(res, tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import arviz as az
    idata = az.from_netcdf(tmp_path / "run" / "draws.nc")
    rows, cols = np.nonzero(y >= 0)
    observed = idata.observed_data["y"]
    assert observed.dims == ("cell",) and observed.shape == (30 * 6 - 3,)
    np.testing.assert_array_equal(observed.values, y[rows, cols])
    ll = idata.log_likelihood["y"]
    assert ll.dims == ("chain", "draw", "cell") and ll.shape == (2, 200, 30 * 6 - 3)
    for group in (observed, ll):
        np.testing.assert_array_equal(group["subject_index"].values, rows)  # positions on
        np.testing.assert_array_equal(group["item_index"].values, cols)  # the posterior's dims
    post = idata.posterior
    theta = post["ability"].values[:, :, rows]
    a = post["discrimination"].values[:, :, cols]
    b = post["difficulty"].values[:, :, cols]
    p = expit(a * (theta - b))
    ref = stats.bernoulli.logpmf(y[rows, cols], p)
    np.testing.assert_allclose(ll.values, ref, rtol=1e-4, atol=1e-5)
    loo = az.loo(idata, pointwise=True)
    assert np.isfinite(loo["elpd_loo"]) and loo["n_data_points"] == 30 * 6 - 3
    assert loo["elpd_loo"] == pytest.approx(float(np.sum(loo["loo_i"].values)))
    assert np.isfinite(az.waic(idata)["elpd_waic"])
    # replicated responses: 0 / 1 at each draw, a 1 as often as the draw's probability says
    rep = idata.posterior_predictive["y"]
    assert rep.dims == ("chain", "draw", "cell") and rep.dtype == np.int8
    assert set(np.unique(rep.values)) == {0, 1}
    z = (rep.values - p).sum(axis=(0, 1)) / np.sqrt((p * (1 - p)).sum(axis=(0, 1)))
    assert np.abs(z).max() < 5 and abs(z.mean()) < 5 / np.sqrt(z.size)  # binomial error
    rate = (rep.values == 1).mean()
    assert rate == pytest.approx(p.mean(), abs=0.02)
    pit = az.loo_pit(idata, y="y")
    assert pit.shape == (30 * 6 - 3,) and np.all((pit >= 0) & (pit <= 1))
    import matplotlib
    matplotlib.use("Agg")
    assert az.plot_ppc(idata, num_pp_samples=20, random_seed=0) is not None
    energy = idata.sample_stats["energy"]
    assert energy.shape == (2, 200) and np.isfinite(energy.values).all()
    bfmi = az.bfmi(idata)
    assert bfmi.shape == (2,) and (bfmi > 0).all()
    info = json.loads((tmp_path / "run" / "fit.json").read_text())
    assert info["log_likelihood"] == {"cells": 177, "draws_per_chain": 200,
                                      "of_draws_per_chain": 200,
                                      "max_values": nuts.POINTWISE_MAX_VALUES,
                                      "posterior_predictive": True}

    # past the limit: evenly spaced draws of each chain, the posterior's own draws
    constrained = {k: np.asarray(post[k].values) for k in post.data_vars}
    thin = az.from_dict(posterior=constrained)
    kept = nuts.add_pointwise(res.spec, thin, constrained, y, max_values=2 * 177 * 120)
    assert kept["draws_per_chain"] == 120
    draw = thin.log_likelihood["draw"].values
    assert draw[0] == 0 and draw[-1] == 199 and np.all(np.diff(draw) > 0)
    np.testing.assert_allclose(thin.log_likelihood["y"].values, ll.values[:, draw], rtol=1e-5,
                               atol=1e-6)
    assert thin.posterior_predictive["y"].shape == (2, 120, 177)
    # drawn a few draws at a time: the same replicates whatever the chunk, loglik untouched
    values = thin.log_likelihood["y"].values
    before = values.copy()
    whole = nuts.replicate_binary(values, y[rows, cols], seed=5, chunk_values=10 ** 9)
    for chunk in (1, 177 * 7, 177 * 7 + 50):
        np.testing.assert_array_equal(
            nuts.replicate_binary(values, y[rows, cols], seed=5, chunk_values=chunk), whole)
    np.testing.assert_array_equal(values, before)
    np.testing.assert_array_equal(thin.posterior_predictive["draw"].values, draw)
    none = az.from_dict(posterior=constrained)
    left = nuts.add_pointwise(res.spec, none, constrained, y, max_values=2 * 177 * 99)
    assert left["draws_per_chain"] == 0 and "az.loo needs the log_likelihood group" in left[
        "omitted"]
    assert "log_likelihood" not in none.groups() and "observed_data" in none.groups()
    assert "posterior_predictive" not in none.groups() and not left["posterior_predictive"]


def test_loadings_a_q_matrix_pins_are_zero_in_the_draws_and_left_out_of_the_diagnostics():
    """A loading the Q-matrix sets to zero is never read by the likelihood, so its draws are
    the prior's: draws.nc held them (sd 2 where the table says 0), and their R-hat and sd
    error entered fit.json's diagnostics (a run told to raise --samples for them). They are
    now 0 in every draw, as the tables report them, and the diagnostics read the free
    loadings only."""
    rng = np.random.default_rng(5)
    y = (rng.random((40, 6)) < 0.6).astype(np.int8)
    q = np.array([[1, 0], [1, 0], [1, 0], [0, 1], [0, 1], [1, 1]])
    res = fit_nuts(y, "mirt-comp", FAST.replace(num_chains=2, num_warmup=100, num_samples=150),
                   model_options={"q_matrix": q.tolist()})
    loadings = res.extra["idata"].posterior["discrimination"].values  # (chain, draw, item, skill)
    assert (loadings[..., q == 0] == 0).all()
    assert (loadings[..., q == 1] > 0).all() and loadings[..., q == 1].std() > 0
    np.testing.assert_array_equal(res.draws["discrimination"], loadings)
    block = res.extra["diagnostics"]["blocks"]["discrimination"]
    assert block["size"] == int(q.sum()) and np.isfinite(block["rhat_max"])
    assert np.isfinite(block["mcse_sd_rel_max"])
    ll = res.extra["idata"].log_likelihood["y"].values  # the likelihood never read them
    assert np.isfinite(ll).all() and ll.shape[-1] == y.size
    # the items table: value 0, no diagnostics for a value never sampled (R-hat had read 1.0)
    from engine.readout.posterior import draw_summary_columns
    cols = draw_summary_columns(res.spec, res.draws, "item")
    second = f"discrimination_{res.spec.skills[1]}"
    pinned = q[:, 1] == 0
    assert (cols[f"{second}_mean"][pinned] == 0).all()
    assert np.isnan(cols[f"{second}_rhat"][pinned]).all()
    assert np.isfinite(cols[f"{second}_rhat"][~pinned]).all()


def test_fit_refuses_options_its_method_does_not_read(tmp_path, capsys):
    """``--method nuts --max-passes 3 --mc-draws 4`` had sampled as usual, the options
    ignored without a word, and ``--chains 2`` on the variational fit likewise: each is
    refused naming the options and the method that reads them, with nothing written; the
    defaults given explicitly are not an error."""
    out = tmp_path / "run"
    assert main(["fit", str(tmp_path / "st.zarr"), "--out", str(out), "--method", "nuts",
                 "--max-passes", "3", "--mc-draws", "4"]) == 2
    err = capsys.readouterr().err
    assert ("--max-passes, --mc-draws apply to --method vi only, and this fit is --method "
            "nuts; drop them or fit with --method vi") in err
    assert main(["fit", str(tmp_path / "st.zarr"), "--out", str(out), "--chains", "2"]) == 2
    assert "--chains applies to --method nuts only" in capsys.readouterr().err
    assert not out.exists()
    # the defaults spelled out pass this check (and fail on the missing store instead)
    assert main(["fit", str(tmp_path / "st.zarr"), "--out", str(out), "--method", "nuts",
                 "--max-passes", "500", "--chains", "4"]) == 2
    assert "apply to" not in capsys.readouterr().err
    # --draws sets the rank draws of a model ranked by its expected score, under NUTS too
    assert main(["fit", str(tmp_path / "st.zarr"), "--out", str(out), "--method", "nuts",
                 "--draws", "200"]) == 2
    assert "appl" not in capsys.readouterr().err
