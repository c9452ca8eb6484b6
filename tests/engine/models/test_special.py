"""Tests for engine.models.special: values and derivative chains against scipy.special
(float64) on a log grid 1e-6 .. 1e6, the log-beta against scipy.special.betaln, jit, and
finiteness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from engine.models.continuous import beta_logpdf, gamma_logpdf
from engine.models.special import (digamma, lbeta, lgamma, sigmoid, softplus, tetragamma,
                                   trigamma)

# Log grid over the shape range, plus a dense linear grid over the shifted region (x < 6)
# and its edge, where the zeros of lgamma (1, 2) and digamma (1.4616) lie.
GRID = np.unique(np.concatenate([
    np.logspace(-6, 6, 4001), np.linspace(0.05, 12.0, 4001), [5.9999995, 6.0, 6.0000005],
]).astype(np.float32))

REFERENCE = {
    "lgamma": special.gammaln,
    "digamma": special.digamma,
    "trigamma": lambda x: special.polygamma(1, x),
    "tetragamma": lambda x: special.polygamma(2, x),
}
OURS = {"lgamma": lgamma, "digamma": digamma, "trigamma": trigamma, "tetragamma": tetragamma}
# |got - want| <= RTOL |want| + ATOL: relative error 1e-5, absolute 1e-6 near the zeros.
RTOL, ATOL = 1e-5, 1e-6


def _reference(name, x=GRID):
    return REFERENCE[name](np.asarray(x, np.float64))


def _close(got, want, rtol=RTOL, atol=ATOL):
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", list(OURS))
def test_values_match_scipy(name):
    _close(jax.jit(OURS[name])(jnp.asarray(GRID)), _reference(name))


@pytest.mark.parametrize("name", list(OURS))
def test_jit_equals_no_jit(name):
    x = jnp.asarray(GRID[::7])
    # XLA may fuse (and contract to FMA) differently under jit: a few ulp.
    np.testing.assert_allclose(np.asarray(jax.jit(OURS[name])(x)), np.asarray(OURS[name](x)),
                               rtol=2e-6, atol=1e-6)


def _derivative(fn, order):
    for _ in range(order):
        fn = jax.grad(fn)
    return jax.jit(jax.vmap(fn))


@pytest.mark.parametrize("name,order,want", [
    ("lgamma", 1, "digamma"), ("lgamma", 2, "trigamma"), ("lgamma", 3, "tetragamma"),
    ("digamma", 1, "trigamma"), ("digamma", 2, "tetragamma"), ("trigamma", 1, "tetragamma"),
])
def test_derivative_chain_matches_scipy(name, order, want):
    _close(_derivative(OURS[name], order)(jnp.asarray(GRID)), _reference(want))


def test_forward_over_reverse_hessian():
    """jax.jacfwd(jax.grad(.)) of a sum is the diagonal of trigamma (the Newton pass's form)."""
    x = jnp.asarray(GRID[::40])
    hess = jax.jit(jax.jacfwd(jax.grad(lambda v: jnp.sum(lgamma(v)))))(x)
    want = np.diag(_reference("trigamma", x))
    _close(hess, want)


def test_large_and_small_arguments_stay_finite():
    x = jnp.asarray([1e-30, 1e-13, 1e-6, 1e6, 1e12, 1e30, 1e36], jnp.float32)
    for fn in (lgamma, digamma):
        assert np.isfinite(np.asarray(fn(x))).all()
    assert np.isfinite(np.asarray(trigamma(x[1:]))).all()
    assert np.isfinite(np.asarray(jax.vmap(jax.grad(jax.grad(lgamma)))(x[1:]))).all()


def test_integer_input_is_promoted():
    np.testing.assert_allclose(float(lgamma(5)), np.log(24.0), rtol=1e-6)


# ---- log-beta ------------------------------------------------------------------------------

def _shape_pairs(num=20_000, seed=0):
    rng = np.random.default_rng(seed)
    a, b = np.exp(rng.uniform(np.log(1e-6), np.log(1e6), (2, num))).astype(np.float32)
    grid = np.logspace(-6, 6, 25).astype(np.float32)
    ga, gb = np.meshgrid(grid, grid)
    return np.concatenate([a, ga.ravel()]), np.concatenate([b, gb.ravel()])


def test_lbeta_matches_scipy_betaln():
    a, b = _shape_pairs()
    want = special.betaln(a.astype(np.float64), b.astype(np.float64))
    # Relative to max(|log B|, 1): float32 cannot hold a value of size 1e6 better than 1e-7.
    got = np.asarray(jax.jit(lbeta)(a, b), np.float64)
    assert np.isfinite(got).all()
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)) < 1e-5


def _close_difference(got, first, second, rtol=1e-5, atol=1e-7):
    """``got ~ first - second`` to float32 accuracy of the terms (a difference of two
    polygamma values cannot be more accurate than the larger of them)."""
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all()
    scale = np.maximum(np.abs(first), np.abs(second))
    assert np.all(np.abs(got - (first - second)) <= rtol * scale + atol)


def test_lbeta_derivatives_match_scipy():
    a, b = _shape_pairs(2_000, seed=1)
    ad, bd = a.astype(np.float64), b.astype(np.float64)
    psi, tri = special.digamma, lambda v: special.polygamma(1, v)
    grad = jax.jit(jax.vmap(jax.grad(lbeta, argnums=(0, 1))))(a, b)
    _close_difference(grad[0], psi(ad), psi(ad + bd))
    _close_difference(grad[1], psi(bd), psi(ad + bd))
    hess = jax.jit(jax.vmap(jax.jacfwd(jax.grad(lbeta, argnums=(0, 1)), argnums=(0, 1))))(a, b)
    _close_difference(hess[0][0], tri(ad), tri(ad + bd))
    _close_difference(hess[0][1], 0.0, tri(ad + bd))
    _close_difference(hess[1][1], tri(bd), tri(ad + bd))


def test_lbeta_underflowing_ratio_stays_finite():
    a = jnp.asarray([1e-30, 1e-20, 2e-22], jnp.float32)
    b = jnp.asarray([3e38, 1e36, 1.0], jnp.float32)
    want = special.betaln(np.asarray(a, np.float64), np.asarray(b, np.float64))
    _close(lbeta(a, b), want)


# ---- the densities that use them -----------------------------------------------------------

def test_beta_logpdf_matches_scipy_with_large_shapes():
    from scipy import stats
    log_a, log_b = np.meshgrid(np.linspace(-8.0, 13.0, 22), np.linspace(-8.0, 13.0, 22))
    log_a, log_b = log_a.ravel().astype(np.float32), log_b.ravel().astype(np.float32)
    y = np.full_like(log_a, 0.3)
    want = stats.beta.logpdf(np.float64(y[0]), np.exp(log_a.astype(np.float64)), np.exp(log_b.astype(np.float64)))
    got = np.asarray(beta_logpdf(jnp.asarray(y), log_a, log_b), np.float64)
    # The log(y) terms carry float32 rounding of a few ulp of a * log(y).
    scale = np.exp(np.maximum(log_a, log_b).astype(np.float64))
    assert np.all(np.abs(got - want) <= 1e-5 * np.maximum(np.abs(want), 1.0) + 1e-6 * scale)


def test_gamma_logpdf_matches_scipy():
    from scipy import stats
    log_k, log_r = np.meshgrid(np.linspace(-6.0, 6.0, 13), np.linspace(-4.0, 4.0, 9))
    log_k, log_r = log_k.ravel().astype(np.float32), log_r.ravel().astype(np.float32)
    y = np.float32(0.7)
    k, r = np.exp(log_k.astype(np.float64)), np.exp(log_r.astype(np.float64))
    want = stats.gamma.logpdf(np.float64(y), k, scale=1.0 / r)
    got = np.asarray(gamma_logpdf(jnp.float32(y), log_k, log_r), np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


LOGITS = np.concatenate([np.linspace(-40.0, 40.0, 8001), [-100.0, -88.0, 0.0, 88.0, 100.0]])


def test_softplus_and_sigmoid_chain_match_scipy():
    """softplus -> sigmoid -> sigmoid' against numpy's logaddexp and scipy's expit (float64),
    the tails included: the slope stays exact where s (1 - s) would round to zero."""
    x = jnp.asarray(LOGITS, jnp.float32)
    x64 = np.asarray(x, np.float64)
    s = special.expit(x64)
    slope = np.exp(-np.abs(x64)) / (1 + np.exp(-np.abs(x64))) ** 2
    _close(jax.jit(softplus)(x), np.logaddexp(0.0, x64), rtol=2e-7, atol=1e-30)
    _close(jax.jit(sigmoid)(x), s, rtol=2e-7, atol=1e-30)
    _close(_derivative(softplus, 1)(x), s, rtol=2e-7, atol=1e-30)
    _close(_derivative(softplus, 2)(x), slope, rtol=1e-6, atol=1e-30)
    _close(_derivative(sigmoid, 1)(x), slope, rtol=1e-6, atol=1e-30)
    assert float(_derivative(softplus, 2)(jnp.asarray([30.0]))[0]) > 0  # s (1 - s) gives 0
    hess = jax.jacfwd(jax.grad(lambda v: jnp.sum(softplus(v))))(x[::400])
    _close(np.diagonal(hess), slope[::400], rtol=1e-6, atol=1e-30)


def test_second_derivatives_through_the_value_use_the_chain():
    """A function of the value (here its square), differentiated twice forward over forward
    and forward over reverse: ``(f^2)'' = 2 f'^2 + 2 f f''`` against scipy, x = 0 included
    (through softplus's own code its slope at 0 read 0.5 - 0.5 = 0, not 0.5)."""
    x64 = np.array([-20.0, -3.0, -0.5, 0.0, 0.5, 3.0, 20.0])
    s = special.expit(x64)
    cases = {softplus: (np.logaddexp(0.0, x64), s, s * (1 - s)),
             sigmoid: (s, s * (1 - s), s * (1 - s) * (1 - 2 * s))}
    positive = np.array([0.05, 0.5, 1.0, 3.0, 20.0])
    cases[lgamma] = (special.gammaln(positive), special.digamma(positive),
                     special.polygamma(1, positive))
    for fn, (f, d1, d2) in cases.items():
        x = jnp.asarray(positive if fn is lgamma else x64, jnp.float32)
        square = lambda v: fn(v) ** 2
        want = 2 * d1 ** 2 + 2 * f * d2
        for second in (jax.jacfwd(jax.jacfwd(square)), jax.jacfwd(jax.grad(square))):
            _close(jax.jit(jax.vmap(second))(x), want, rtol=2e-5, atol=1e-6)
