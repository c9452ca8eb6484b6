"""Fast float32 log-gamma, polygamma and log-beta with cheap higher derivatives.

``jax.scipy.special.gammaln`` differentiates to ``digamma`` and then to ``polygamma(1, .)``,
which XLA evaluates as a Hurwitz zeta series: the per-cell Hessian of a Beta or Gamma
log-density is dominated by it. Here each function carries a ``custom_jvp`` to the next,
``lgamma -> digamma -> trigamma -> tetragamma``, so ``jax.jacfwd(jax.grad(f))`` costs a few
logs and divisions per cell, and third derivatives still work.

Method (branch-free): arguments ``x < 6`` are moved to ``z = x + 6`` and the six recurrence
terms ``x, x + 1, ..., x + 5`` are taken out again through the polynomial
``P(x) = x (x + 1) ... (x + 5)`` and its derivatives (positive coefficients, so Horner's rule
does not cancel); then the Stirling / asymptotic series is summed at ``z >= 6``. Arguments
``x >= 6`` go to the series unshifted, so nothing overflows for large ``x``.

Domain: ``x > 0`` only (shape parameters, e.g. ``exp`` of a log shape); there is no
reflection for negative arguments, and ``x <= 0`` gives inf or nan. In float32, ``lgamma`` is
finite up to about ``4e36`` (then it overflows, as the true value does) and ``trigamma``
(``~1/x^2``) and ``tetragamma`` (``~-2/x^3``) overflow below about ``1e-19`` and ``1e-13``.
Accuracy is float32's: on ``1e-6 .. 1e6`` relative error below ``1e-5`` (mostly ``1e-6``),
absolute about ``1e-6`` around the zeros of ``lgamma`` (``x = 1, 2``) and ``digamma``
(``x ~ 1.4616``); see ``tests/engine/models/test_special.py``. The series is truncated at
about ``1e-9`` relative, so float64 inputs do not get float64 accuracy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["lgamma", "digamma", "trigamma", "tetragamma", "lbeta", "softplus", "sigmoid"]

_SHIFT = 6.0
_HALF_LOG_2PI = 0.91893853320467274178
_TINY = 1e-37  # above float32's smallest normal number
# P(x) = x (x+1) (x+2) (x+3) (x+4) (x+5) and its first two derivatives, highest power first.
_P = (1.0, 15.0, 85.0, 225.0, 274.0, 120.0, 0.0)
_DP = (6.0, 75.0, 340.0, 675.0, 548.0, 120.0)
_D2P = (30.0, 300.0, 1020.0, 1350.0, 548.0)


def _horner(coeffs, x):
    out = jnp.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        out = out * x + c
    return out


def _reduce(x):
    """``(small, z, xs)``: ``small = x < 6``, the series argument ``z >= 6``, and ``x`` where
    small (1 elsewhere, so the recurrence polynomials stay finite and are masked out)."""
    small = x < _SHIFT
    z = jnp.where(small, x + _SHIFT, x)
    xs = jnp.where(small, x, 1.0)
    return small, z, xs


def _as_float(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.result_type(float))


def _stirling_tail(z):
    """``lgamma(z) - [(z - 1/2) log z - z + log(2 pi)/2]`` for ``z >= 6`` (error < 3e-9)."""
    r = 1.0 / z
    w = r * r
    return r * (1.0 / 12.0 - w * (1.0 / 360.0 - w * (1.0 / 1260.0 - w / 1680.0)))


def _scaled_poly(xs, z):
    """``P(x) / z^6 = prod_k (x + k) / (x + 6)`` in ``(0, 1)``: the recurrence terms scaled so
    that their log is of the size of the result near its zeros, not of ``log 720``."""
    z3 = z * z * z
    return _horner(_P, xs) / (z3 * z3)


def _lgamma_impl(x):
    small, z, xs = _reduce(x)
    # lgamma(z) - log P(x) with (z - 1/2) log z split as (x - 1/2) log z + 6 log z; the 6 log z
    # goes into the log of P / z^6, and -z = -x - 6 so no rounding of z enters the -z term.
    recurrence = jnp.where(small, jnp.log(_scaled_poly(xs, z)) + _SHIFT, 0.0)
    return ((x - 0.5) * jnp.log(z) - x - recurrence) + (_HALF_LOG_2PI + _stirling_tail(z))


def _digamma_impl(x):
    small, z, xs = _reduce(x)
    r = 1.0 / z
    w = r * r
    series = jnp.log(z) - 0.5 * r - w * (1.0 / 12.0 - w * (1.0 / 120.0 - w * (
        1.0 / 252.0 - w * (1.0 / 240.0 - w / 132.0))))
    # sum_k 1/(x + k) = P'(x) / P(x)
    return series - jnp.where(small, _horner(_DP, xs) / _horner(_P, xs), 0.0)


def _trigamma_impl(x):
    small, z, xs = _reduce(x)
    r = 1.0 / z
    w = r * r
    series = r + 0.5 * w + r * w * (1.0 / 6.0 - w * (1.0 / 30.0 - w * (
        1.0 / 42.0 - w * (1.0 / 30.0 - w * 5.0 / 66.0))))
    # sum_k 1/(x + k)^2 = (P'^2 - P P'') / P^2; Cauchy-Schwarz bounds the cancellation by 6x.
    p, dp = _horner(_P, xs), _horner(_DP, xs)
    shift = (dp * dp - p * _horner(_D2P, xs)) / (p * p)
    return series + jnp.where(small, shift, 0.0)


def tetragamma(x):
    """``polygamma(2, x)`` for ``x > 0`` (plain function: its own derivative is by autodiff)."""
    x = _as_float(x)
    small, z, xs = _reduce(x)
    r = 1.0 / z
    w = r * r
    series = -w - r * w - w * w * (0.5 - w * (1.0 / 6.0 - w * (1.0 / 6.0 - w * (
        0.3 - w * 5.0 / 6.0))))
    cubes = sum(1.0 / (xs + k) ** 3 for k in range(int(_SHIFT)))
    return series - jnp.where(small, 2.0 * cubes, 0.0)


def _with_derivative(impl, derivative):
    """``impl`` as a ``custom_jvp`` whose derivative is ``derivative`` (itself differentiable),
    so each order of a forward-over-reverse Hessian takes the next function of the chain.

    The rule's value is ``fn(x)``, not ``impl(x)``: under a second differentiation it is
    differentiated by the rule again. Through ``impl`` it was differentiated as written, and
    softplus's ``max(x, 0) + log1p(exp(-|x|))`` has slope 0.5 - 0.5 = 0 at x = 0 there (the
    3PL's forward-over-forward Hessian at a logit of exactly 0 was off by 10x)."""
    fn = jax.custom_jvp(impl)

    @fn.defjvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return fn(x), derivative(x) * t

    return fn


_trigamma = _with_derivative(_trigamma_impl, tetragamma)
_digamma = _with_derivative(_digamma_impl, _trigamma)
_lgamma = _with_derivative(_lgamma_impl, _digamma)


def _exp_neg_abs(x):
    return jnp.exp(-jnp.abs(x))  # in (0, 1]: never overflows


def _sigmoid_slope(x):
    """``sigmoid'(x) = e / (1 + e)^2`` with ``e = exp(-|x|)``: exact in the tails, where
    ``s (1 - s)`` rounds to zero once ``s`` rounds to 1."""
    e = _exp_neg_abs(x)
    return e / ((1.0 + e) * (1.0 + e))


def _sigmoid_impl(x):
    e = _exp_neg_abs(x)
    return jnp.where(x >= 0, 1.0, e) / (1.0 + e)


def _softplus_impl(x):
    return jnp.maximum(x, 0.0) + jnp.log1p(_exp_neg_abs(x))


_sigmoid = _with_derivative(_sigmoid_impl, _sigmoid_slope)
_softplus = _with_derivative(_softplus_impl, _sigmoid)


def softplus(x):
    """``log(1 + exp(x))``; its derivative is :func:`sigmoid`, whose derivative is
    ``e / (1 + e)^2``. Value, gradient and Hessian of a Bernoulli cell then share one
    ``exp(-|x|)``, where ``jax.nn.softplus`` differentiates through ``logaddexp`` to several
    exponentials per order (a forward-over-reverse Hessian of a 2PL tile about 2x slower).

    Examples
    --------
    >>> round(float(softplus(0.0)), 6)  # log 2
    0.693147
    >>> round(float(jax.jacfwd(jax.grad(softplus))(0.0)), 6)  # sigmoid'(0)
    0.25
    """
    return _softplus(_as_float(x))


def sigmoid(x):
    """``1 / (1 + exp(-x))``; its derivative is ``e / (1 + e)^2`` with ``e = exp(-|x|)``."""
    return _sigmoid(_as_float(x))


def lgamma(x):
    """``log Gamma(x)`` for ``x > 0``; its derivative is :func:`digamma`.

    Examples
    --------
    >>> round(float(lgamma(5.0)), 5)  # log 4! = log 24
    3.17805
    >>> round(float(jax.jacfwd(jax.grad(lgamma))(5.0)), 5)  # trigamma(5)
    0.22132
    """
    return _lgamma(_as_float(x))


def digamma(x):
    """``psi(x) = d/dx log Gamma(x)`` for ``x > 0``; its derivative is :func:`trigamma`."""
    return _digamma(_as_float(x))


def trigamma(x):
    """``polygamma(1, x)`` for ``x > 0``; its derivative is :func:`tetragamma`."""
    return _trigamma(_as_float(x))


def _lgamma_correction(x):
    """``lgamma(x) - [(x - 1/2) log x - x + log(2 pi)/2]`` for ``x > 0``: small for large
    ``x``, so differences of it do not cancel the way differences of ``lgamma`` do."""
    small, z, xs = _reduce(x)
    # For x < 6, from lgamma(x) above: (x - 1/2) log(z/x) - log(P/z^6) - 6.
    shift = (xs - 0.5) * jnp.log(z / xs) - jnp.log(_scaled_poly(xs, z)) - _SHIFT
    return _stirling_tail(z) + jnp.where(small, shift, 0.0)


def _lbeta_impl(a, b):
    p, q = jnp.minimum(a, b), jnp.maximum(a, b)
    c = a + b
    ratio = p / c
    # Stirling heads of lgamma(p) + lgamma(q) - lgamma(c), regrouped so that nothing of the
    # size of lgamma(c) is formed and cancelled (the -x terms cancel exactly):
    # (p - 1/2) log p + (q - 1/2) log q - (c - 1/2) log c
    #   = p log(p/c) - log(p)/2 + (q - 1/2) log1p(-p/c).
    # p/c may underflow (p < 1e-38 c); the floor changes p log(p/c) by < p log(c / (p 1e38)).
    log_ratio = jnp.log(jnp.maximum(ratio, _TINY))
    head = p * log_ratio - 0.5 * jnp.log(p) + (q - 0.5) * jnp.log1p(-ratio) + _HALF_LOG_2PI
    return head + _lgamma_correction(p) + _lgamma_correction(q) - _lgamma_correction(c)


@jax.custom_jvp
def _lbeta(a, b):
    return _lbeta_impl(a, b)


@_lbeta.defjvp
def _lbeta_jvp(primals, tangents):
    (a, b), (ta, tb) = primals, tangents
    psi_c = _digamma(a + b)
    return _lbeta_impl(a, b), (_digamma(a) - psi_c) * ta + (_digamma(b) - psi_c) * tb


def lbeta(a, b):
    """``log B(a, b) = lgamma(a) + lgamma(b) - lgamma(a + b)`` for ``a, b > 0``.

    Computed from Stirling heads regrouped as ``p log(p/c) - log(p)/2 + (q - 1/2) log1p(-p/c)``
    (``p <= q``, ``c = p + q``) plus small correction terms, so large shapes keep float32
    accuracy (the plain difference of ``lgamma`` values loses about ``1e-7 lgamma(c)``).
    Derivatives: ``digamma(a) - digamma(a + b)`` and likewise for ``b``.
    """
    a, b = jnp.broadcast_arrays(_as_float(a), _as_float(b))
    return _lbeta(a, b)
