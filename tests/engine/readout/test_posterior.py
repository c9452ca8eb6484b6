import jax
import numpy as np
import pytest
from scipy.stats import lognorm, norm

from engine.infer.guide import GuideState
from engine.models import get_model
from engine.readout.posterior import Z90, draw_posterior, summarize


@pytest.fixture
def guide():
    rng = np.random.default_rng(1)
    loc = {"ability": rng.normal(size=5).astype(np.float32),
           "difficulty": rng.normal(size=4).astype(np.float32),
           "discrimination": rng.normal(0, 0.3, size=4).astype(np.float32)}
    log_scale = {k: np.log(rng.uniform(0.1, 0.5, size=v.shape)).astype(np.float32)
                 for k, v in loc.items()}
    return GuideState(loc, log_scale)


def test_summaries_match_scipy_quantiles(guide):
    spec = get_model("2pl")
    items = summarize(spec, guide, "item")
    sd = np.exp(guide.log_scale["discrimination"])
    loc = guide.loc["discrimination"]
    np.testing.assert_allclose(items["discrimination_q95"], lognorm.ppf(0.95, sd, scale=np.exp(loc)),
                               rtol=1e-4)
    np.testing.assert_allclose(items["discrimination_mean"], np.exp(loc), rtol=1e-6)
    np.testing.assert_allclose(items["discrimination_sd"], np.exp(loc) * sd, rtol=1e-5)  # delta method
    subjects = summarize(spec, guide, "subject")
    np.testing.assert_allclose(subjects["ability_q05"],
                               norm.ppf(0.05, guide.loc["ability"], np.exp(guide.log_scale["ability"])),
                               rtol=1e-4, atol=1e-5)
    assert Z90 == pytest.approx(norm.ppf(0.95))


def test_draws_follow_the_guide(guide):
    spec = get_model("2pl")
    d = draw_posterior(spec, guide, 20000, rng_key=jax.random.PRNGKey(0))
    assert d["ability"].shape == (20000, 5)
    np.testing.assert_allclose(d["ability"].mean(0), guide.loc["ability"], atol=0.02)
    np.testing.assert_allclose(np.log(d["discrimination"]).std(0),
                               np.exp(guide.log_scale["discrimination"]), rtol=0.05)
