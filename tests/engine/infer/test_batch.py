"""Batched trial refits (engine.infer.batch): Monte Carlo draws per step."""

import jax
import numpy as np

from engine.infer.batch import fit_batch
from engine.infer.guide import init_guide
from engine.infer.settings import FitSettings
from engine.models import get_model


def _trials(num_trials=4, shape=(12, 60), seed=3):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(num_trials, shape[0], 1))
    b = rng.normal(size=(num_trials, 1, shape[1]))
    return (rng.random((num_trials, *shape)) < 1 / (1 + np.exp(-(theta - b)))).astype(np.int8)


def test_batched_trials_take_one_draw_unless_settings_ask_for_more():
    spec = get_model("2pl")
    y = _trials()
    init = jax.tree.map(lambda a: np.stack([a] * len(y)), init_guide(spec, *y.shape[1:]))
    run = lambda draws: fit_batch(spec, y, init, list(range(len(y))), num_passes=24,
                                  settings=FitSettings(mc_draws=draws))
    auto, one, eight = run(0), run(1), run(8)
    # automatic (0) is one draw for trials: the same stream, the same numbers
    np.testing.assert_array_equal(auto.elbo, one.elbo)
    np.testing.assert_array_equal(auto.guide.loc["ability"], one.guide.loc["ability"])
    # eight draws average out most of the late passes' Monte Carlo jitter (medians: a pass
    # whose draws include a far tail value of a badly separated item's discrimination still
    # gives a one-pass dip of the ELBO estimate, more often with more draws)
    jitter = lambda r: np.median(np.abs(np.diff(r.elbo[:, -12:], axis=1)), axis=1)
    assert jitter(eight).mean() < 0.6 * jitter(one).mean(), (jitter(eight), jitter(one))
    level = lambda r: np.median(r.elbo[:, -12:], axis=1)
    assert level(eight).mean() > level(one).mean(), (level(eight), level(one))
