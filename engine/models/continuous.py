"""Continuous-response IRT: Beta-IRT (Molenaar), Gamma-IRT for errors, Beta^3-IRT.

- ``beta`` (seed 003 section 4.4): ``y ~ Beta(a, b)``, ``a = exp((eta + o)/2)``,
  ``b = exp((-eta + o)/2)``, ``eta = alpha theta - beta``, per-item log-precision ``o``,
  so ``E[y] = sigmoid(eta)``. Discrimination optional, vague or hierarchical priors.
- ``gamma`` (seed 001 eq. 6-7): errors ``e ~ Gamma(shape c (delta/theta)^a,
  rate ((1 - delta)/(1 - theta))^a)`` with ability and difficulty in (0, 1),
  ``a ~ N(1, s0^2)`` and a per-item scale ``c > 0``; ``E[e] = c (delta/(1-delta))^a
  ((1-theta)/theta)^a`` is the expected-error item characteristic curve.
- ``beta3`` (seed 001 eq. 4-5, 10): ``p ~ Beta((theta/delta)^a, ((1-theta)/(1-delta))^a)``
  for responses ``p = 1/(1 + e/c)`` in (0, 1].

Exact boundary values are real data, not noise: unit scores at exactly 0 or 1 and errors
at exactly 0 are fitted by zero/one inflation (Molenaar, Curi and Bazan 2022):
probabilities ``zero = P(y = 0)`` and ``one = P(y = 1 | y > 0)``, the density taking the
rest. ``inflation="auto"`` turns them on when the data has such values; nothing is clipped.

``inflation_owner`` says whose probabilities they are: ``item`` (each item its own, the only
choice before issue 17), ``subject`` (each subject its own) or ``both`` (each subject its
own, moved per item on the logit scale by an offset ``zero_item`` / ``one_item`` with a
fitted ``N(0, 1/u)`` prior; the default resolved from data, as it had the best held-out
log-likelihood on every MQM block, README). On MT leaderboards the share of error-free
segments is what separates systems, so a per-item mass leaves it out of the ranking; with a
per-subject mass the ability alone no longer orders subjects, and the model declares
``score``: the expected response (for errors, minus the expected error), averaged over
items, which the leaderboard ranks by (:mod:`engine.readout.expected`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from engine.errors import DataFormatError, ModelError
from engine.models.logistic import _block as prior_block
from engine.models.priors import check_family, hyper_params, logit_uniform, normal
from engine.models.spec import Linear, ModelSpec, ParamSpec, Symmetry
from engine.models.special import lbeta, lgamma

__all__ = ["beta_model", "gamma_model", "beta3_model", "beta_logpdf", "gamma_logpdf",
           "inflated_loglik", "INFLATIONS", "INFLATION_OWNERS"]

_EPS = 1e-7
# Trust region for a discrimination that multiplies the ability: while abilities are still
# near 0 its curvature is tiny, and full Newton steps overshoot into huge |eta|.
_DISC_STEP = 0.3
INFLATIONS = ("auto", "none", "zero", "one", "zero-one")
# "auto" is resolved from data to "both"; a model built without data (or a run written
# before the option existed) reads it as "item", the owner those runs were fitted with.
INFLATION_OWNERS = ("auto", "subject", "item", "both")
_DEFAULT_OWNER = "both"


def beta_logpdf(y, log_a, log_b):
    """``log Beta(y | a, b)`` from log shapes; ``y`` strictly inside (0, 1).

    The normaliser ``log B(a, b)`` comes from :func:`engine.models.special.lbeta`: accurate
    for large shapes, and its Hessian costs a few logs and divisions per cell.
    """
    a, b = jnp.exp(log_a), jnp.exp(log_b)
    return -lbeta(a, b) + (a - 1.0) * jnp.log(y) + (b - 1.0) * jnp.log1p(-y)


def gamma_logpdf(y, log_shape, log_rate):
    """``log Gamma(y | shape, rate)`` from log parameters; ``y > 0``."""
    k, r = jnp.exp(log_shape), jnp.exp(log_rate)
    return k * log_rate - lgamma(k) + (k - 1.0) * jnp.log(y) - r * y


def _logs(p):
    p = jnp.clip(p, _EPS, 1.0 - _EPS)
    return jnp.log(p), jnp.log1p(-p)


def inflated_loglik(logpdf, log_params: tuple, y, mask, *, zero=None, one=None, inside=0.5):
    """Per-cell log-likelihood with optional point masses at 0 and 1.

    ``P(y = 0) = zero``, ``P(y = 1 | y > 0) = one``, and the rest spread by the density
    ``logpdf(y, *log_params)``:
    ``log p(y) = log(1 - zero) + log(1 - one) + logpdf(y, *log_params)`` for ``y`` off the
    masses. Without ``zero`` (``one``) the value 0 (1) is left to the density.

    Cells whose density is not used (missing, or on a point mass) evaluate it at ``y =
    inside`` with every log-parameter set to 0 (shapes and rates of 1): a draw from a factor
    that no data pins (an item whose every response sits on a point mass keeps its vague
    prior) would otherwise overflow the density's derivatives there, and ``0 * inf`` makes
    the masked gradient NaN.
    """
    at0 = (y == 0.0) if zero is not None else jnp.zeros_like(y, dtype=bool)
    at1 = (y == 1.0) if one is not None else jnp.zeros_like(y, dtype=bool)
    cont = ~(at0 | at1)
    use = cont & (mask > 0)
    safe = jnp.where(use, y, inside)
    ll = jnp.where(use, logpdf(safe, *(jnp.where(use, p, 0.0) for p in log_params)), 0.0)
    if zero is not None:
        log_z, log1m_z = _logs(zero)
        ll = ll + jnp.where(at0, log_z, log1m_z)
    if one is not None:
        log_o, log1m_o = _logs(one)
        ll = ll + jnp.where(at0, 0.0, jnp.where(at1, log_o, log1m_o))
    return ll


def _inflation_params(inflation: str, owner: str) -> list[ParamSpec]:
    """``zero`` / ``one`` per item or per subject; with ``both``, per subject plus an item
    offset ``<name>_item`` on the logit scale, ``N(0, 1/u)`` with ``u ~ Gamma(1, 1)``."""
    out = []
    for name in ("zero", "one"):
        if name not in inflation.split("-"):
            continue
        out.append(ParamSpec(name, "item" if owner == "item" else "subject", logit_uniform(),
                             transform="sigmoid", init=-2.0))
        if owner == "both":
            _, u, _ = hyper_params(f"{name}_item")
            out += [ParamSpec(**u), ParamSpec(f"{name}_item", "item", normal(0.0, precision=u["name"]))]
    return out


def _offset_symmetries(params: list[ParamSpec]) -> list[Symmetry]:
    """A subject logit up and every item offset down by the same amount: cells unchanged."""
    names = {p.name for p in params}
    return [Symmetry(f"{n}-offset", ((n, 0.0, 1.0), (f"{n}_item", 0.0, -1.0)))
            for n in ("zero", "one") if f"{n}_item" in names]


def _masses(params) -> tuple:
    """Per-cell ``(zero, one)`` probabilities (``None`` where not modelled): the declared
    block, moved on the logit scale by the item offset where the model has one."""
    out = []
    for name in ("zero", "one"):
        p = params.get(name)
        if p is not None and f"{name}_item" in params:
            log_p, log1m_p = _logs(p)
            p = jax.nn.sigmoid(log_p - log1m_p + params[f"{name}_item"])
        out.append(p)
    return tuple(out)


def _resolve_owner(owner: str, name: str) -> str:
    if owner not in INFLATION_OWNERS:
        raise ModelError(f"model {name!r}: unknown inflation_owner {owner!r}; use one of "
                         f"{', '.join(INFLATION_OWNERS)}")
    return "item" if owner == "auto" else owner


def _inflation_note(inflation: str, owner: str) -> str:
    where = "per subject with item offsets" if owner == "both" else f"per {owner}"
    return f"inflation {inflation}" + (f" {where}" if inflation != "none" else "")


def _boundary_cell(y, value):
    hit = ~np.isnan(y) & (y == value) if np.issubdtype(y.dtype, np.floating) else (y == value)
    idx = np.argwhere(hit)
    return (int(hit.sum()), tuple(int(i) for i in idx[0])) if idx.size else (0, None)


def _adapt(model: str, inflation: str, zero_allowed: bool, one_allowed: bool, owner: str):
    """``adapt(y)``: resolve ``auto`` from the data, or refuse boundary values not modelled.

    ``inflation_owner="auto"`` always resolves to the default owner (recorded in the run)."""

    def adapt(y: np.ndarray) -> dict:
        out = {"inflation_owner": _DEFAULT_OWNER} if owner == "auto" else {}
        n0, cell0 = _boundary_cell(y, 0)
        n1, cell1 = _boundary_cell(y, 1) if one_allowed else (0, None)
        observed = int((~np.isnan(y)).sum() if np.issubdtype(y.dtype, np.floating) else (y >= 0).sum())
        if observed and n0 + n1 == observed:
            raise DataFormatError(
                f"model {model!r}: all {observed} observed responses are exactly 0"
                f"{' or 1' if one_allowed else ''}, so the density part of the model gets no data "
                f"(every cell would sit on an inflation point mass); these are binary responses: "
                f"fit a binary model such as 2pl")
        if inflation == "auto":
            want = {(False, False): "none", (True, False): "zero", (False, True): "one",
                    (True, True): "zero-one"}[(n0 > 0 and zero_allowed, n1 > 0)]
            return {**out, "inflation": want}
        for n, cell, point, covered in ((n0, cell0, 0, "zero"), (n1, cell1, 1, "one")):
            if n and covered not in inflation.split("-"):
                raise DataFormatError(
                    f"model {model!r} with inflation={inflation!r}: {n} response(s) equal {point} "
                    f"exactly (first at row {cell[0]}, column {cell[1]}), where the density is "
                    f"{'zero or infinite' if point == 0 else 'undefined'}; use inflation='auto' "
                    f"(or include {covered!r}); values are never clipped")
        return out

    return adapt


def _check(inflation: str, allowed: tuple[str, ...], name: str) -> None:
    if inflation not in allowed:
        raise ModelError(f"model {name!r}: unknown inflation {inflation!r}; use one of {', '.join(allowed)}")


def _beta_linear(*, disc: bool, inflation: tuple[str, ...]) -> Linear:
    """``eta = alpha theta - beta`` as the predictor; log-precision and inflation as extras."""
    names = ("log_precision",) + inflation

    def item(params):
        b = params["difficulty"]
        a = params["discrimination"] if disc else jnp.ones_like(b)
        return a[..., None], -b, tuple(params[n] for n in names)

    def cell(eta, extras, y, mask):
        e = dict(zip(names, extras))
        o = e["log_precision"]
        return inflated_loglik(beta_logpdf, (0.5 * (eta + o), 0.5 * (o - eta)), y, mask,
                               zero=e.get("zero"), one=e.get("one"))

    return Linear(subject=lambda params: params["ability"][..., None], item=item, cell=cell)


def _beta_subject_loglik(linear, params, y, mask):
    """The Beta cell with subject-owned point masses (not a linear-predictor extra)."""
    eta, (o,) = linear.eta(params)
    zero, one = _masses(params)
    return inflated_loglik(beta_logpdf, (0.5 * (eta + o), 0.5 * (o - eta)), y, mask,
                           zero=zero, one=one)


def _with_masses(mean, params):
    """``E[y]`` from the density's mean and the point masses at 0 and 1."""
    zero, one = (0.0 if m is None else m for m in _masses(params))
    return (1.0 - zero) * (one + (1.0 - one) * mean)


def _beta_expected(linear, params):
    return _with_masses(jax.nn.sigmoid(linear.eta(params)[0]), params)


def beta_model(*, prior: str = "vague", signed_discrimination: bool = False,
               discrimination: bool = True, inflation: str = "auto",
               inflation_owner: str = "auto") -> ModelSpec:
    """Beta-IRT in the Molenaar parameterisation (seed 003 section 4.4).

    Vague: ``theta ~ N(0, 1)``, ``beta ~ N(0, 10^3)``, ``log alpha ~ N(0, 1)``,
    ``o ~ N(0, 1)``. Hierarchical: theta and beta pool through ``N(mu, 1/u)``; alpha and
    o keep ``N(0, 1)``. ``discrimination=False`` clamps alpha = 1 (1PL-style).
    ``inflation``: ``auto`` (from the data), ``none``, ``zero``, ``one`` or ``zero-one``;
    ``inflation_owner``: ``subject``, ``item`` or ``both`` (module docstring). Per-item
    masses are extras of the linear predictor; per-subject ones make the cell a plain
    ``loglik`` (the generic per-cell derivatives).
    """
    _check(inflation, INFLATIONS, "beta")
    owner = _resolve_owner(inflation_owner, "beta")
    check_family(prior)
    if signed_discrimination and not discrimination:
        raise ModelError("--signed-discrimination needs a model with discrimination")
    resolved = "none" if inflation == "auto" else inflation
    params = prior_block("ability", "subject", prior, normal(0.0, 1.0))
    params += prior_block("difficulty", "item", prior, normal(0.0, 1e3))
    symmetries = []
    if discrimination:
        if signed_discrimination:
            params.append(ParamSpec("discrimination", "item", normal(1.0, 1.0), init=1.0,
                                    max_step=_DISC_STEP))
            a_move = ("discrimination", -1.0, 0.0)
        else:
            params.append(ParamSpec("discrimination", "item", normal(0.0, 1.0), transform="exp",
                                    max_step=_DISC_STEP))
            a_move = ("discrimination", 0.0, -1.0)
        # eta = alpha theta - beta: theta * k with alpha / k leaves every cell unchanged.
        symmetries.append(Symmetry("scale", (("ability", 1.0, 0.0), a_move)))
    else:
        symmetries.append(Symmetry("shift", (("ability", 0.0, 1.0), ("difficulty", 0.0, 1.0))))
    params.append(ParamSpec("log_precision", "item", normal(0.0, 1.0)))
    inflation_params = _inflation_params(resolved, owner)
    params += inflation_params
    name = "beta" if discrimination else "beta-1pl"
    symmetries += _offset_symmetries(inflation_params)
    per_item = tuple(p.name for p in inflation_params if owner == "item")
    linear = _beta_linear(disc=discrimination, inflation=per_item)
    expected = partial(_beta_expected, linear)
    by_subject = owner != "item" and bool(inflation_params)
    cells = ({"loglik": partial(_beta_subject_loglik, linear), "score": expected} if by_subject
             else {"linear": linear})
    return ModelSpec(
        name=name + ("-signed" if signed_discrimination else ""),
        kind="unit",
        params=tuple(params),
        description=(f"Beta-IRT (Molenaar): E[y] = sigmoid({'alpha theta' if discrimination else 'theta'}"
                     f" - beta), per-item log-precision; {_inflation_note(resolved, owner)}; "
                     f"{prior} priors"),
        symmetries=tuple(symmetries),
        expected=expected,
        adapt=_adapt(name, inflation, zero_allowed=True, one_allowed=True, owner=inflation_owner),
        **cells,
    )


def _log_odds_terms(params):
    """log theta, log(1 - theta), log delta, log(1 - delta) and the discrimination a."""
    t, d = params["ability"], params["difficulty"]
    return jnp.log(t), jnp.log1p(-t), jnp.log(d), jnp.log1p(-d), params["discrimination"]


def _gamma_loglik(params, y, mask):
    lt, l1t, ld, l1d, a = _log_odds_terms(params)
    log_shape = jnp.log(params["scale"]) + a * (ld - lt)
    log_rate = a * (l1d - l1t)
    return inflated_loglik(gamma_logpdf, (log_shape, log_rate), y, mask,
                           zero=_masses(params)[0], inside=1.0)


def _gamma_expected(params):
    """Expected error (seed 001 eq. 7), times 1 - P(e = 0) under a hurdle."""
    lt, l1t, ld, l1d, a = _log_odds_terms(params)
    mean = params["scale"] * jnp.exp(a * (ld - l1d) + a * (l1t - lt))
    zero = _masses(params)[0]
    return mean if zero is None else (1.0 - zero) * mean


def _gamma_score(params):
    """Minus the expected error: higher is better (for MQM, the expected MQM score)."""
    return -_gamma_expected(params)


def _unit_interval_params(s0: float) -> list[ParamSpec]:
    """theta, delta ~ B(1, 1) (fitted as logits) and a ~ N(1, s0^2) (seed 001 eq. 4, 6)."""
    return [
        ParamSpec("ability", "subject", logit_uniform(), transform="sigmoid"),
        ParamSpec("difficulty", "item", logit_uniform(), transform="sigmoid"),
        ParamSpec("discrimination", "item", normal(1.0, s0 ** 2), init=1.0),
    ]


def _no_prior_family(prior: str, signed_discrimination: bool, name: str) -> None:
    if prior != "vague":
        raise ModelError(f"model {name!r} has Beta(1, 1) priors on ability and difficulty "
                         "(seed 001); use prior='vague'")
    # a ~ N(1, s0^2) is signed by design: the flag changes nothing here.
    del signed_discrimination


def gamma_model(*, prior: str = "vague", signed_discrimination: bool = False,
                s0: float = 1.0, inflation: str = "auto", inflation_owner: str = "auto") -> ModelSpec:
    """Gamma-IRT for non-negative errors (seed 001 eq. 6-9), fitted on the errors directly.

    ``scale`` is the per-item ``c_j`` (``log c ~ N(0, 10)``: errors come in any unit).
    ``inflation``: ``auto``, ``none`` or ``zero`` (a hurdle for exact-zero errors);
    ``inflation_owner``: ``subject``, ``item`` or ``both`` (module docstring).
    """
    _check(inflation, ("auto", "none", "zero"), "gamma")
    owner = _resolve_owner(inflation_owner, "gamma")
    _no_prior_family(prior, signed_discrimination, "gamma")
    resolved = "none" if inflation == "auto" else inflation
    params = _unit_interval_params(s0)
    params.append(ParamSpec("scale", "item", normal(0.0, 10.0), transform="exp"))
    inflation_params = _inflation_params(resolved, owner)
    params += inflation_params
    return ModelSpec(
        name="gamma",
        kind="nonnegative",
        params=tuple(params),
        loglik=_gamma_loglik,
        description=f"Gamma-IRT on errors: E[e] = c (delta/(1-delta))^a ((1-theta)/theta)^a; "
                    f"{_inflation_note(resolved, owner)}",
        # shape and rate pin theta and delta separately: no continuous symmetry but the offsets'
        symmetries=tuple(_offset_symmetries(inflation_params)),
        expected=_gamma_expected,
        score=_gamma_score if owner != "item" and resolved != "none" else None,
        adapt=_adapt("gamma", inflation, zero_allowed=True, one_allowed=False,
                     owner=inflation_owner),
        # shape c (delta/theta)^a and rate ((1-delta)/(1-theta))^a: a curved theta-delta
        # ridge on which the diagonal Newton step stalls 300-900 nats below Adam's ELBO on
        # every MQM block (BENCHMARKS.md)
        optimizer="adam",
    )


def _beta3_loglik(params, y, mask):
    lt, l1t, ld, l1d, a = _log_odds_terms(params)
    zero, one = _masses(params)
    return inflated_loglik(beta_logpdf, (a * (lt - ld), a * (l1t - l1d)), y, mask,
                           zero=zero, one=one)


def _beta3_expected(params):
    """Seed 001 eq. 5: ``1 / (1 + (delta/(1-delta))^a (theta/(1-theta))^-a)``, with inflation."""
    lt, l1t, ld, l1d, a = _log_odds_terms(params)
    return _with_masses(jax.nn.sigmoid(a * (lt - l1t) - a * (ld - l1d)), params)


def beta3_model(*, prior: str = "vague", signed_discrimination: bool = False,
                s0: float = 1.0, inflation: str = "auto", inflation_owner: str = "auto") -> ModelSpec:
    """Beta^3-IRT (seed 001 eq. 4, 10) for responses in (0, 1], e.g. ``1 / (1 + e / c)``.

    An error of exactly 0 maps to a response of exactly 1: ``inflation="auto"`` adds the
    point mass (and one at 0 if present); ``inflation_owner`` as for ``beta``.
    """
    _check(inflation, INFLATIONS, "beta3")
    owner = _resolve_owner(inflation_owner, "beta3")
    _no_prior_family(prior, signed_discrimination, "beta3")
    resolved = "none" if inflation == "auto" else inflation
    inflation_params = _inflation_params(resolved, owner)
    params = _unit_interval_params(s0) + inflation_params
    return ModelSpec(
        name="beta3",
        kind="unit",
        params=tuple(params),
        loglik=_beta3_loglik,
        description=f"Beta^3-IRT: Beta((theta/delta)^a, ((1-theta)/(1-delta))^a); "
                    f"{_inflation_note(resolved, owner)}",
        symmetries=tuple(_offset_symmetries(inflation_params)),
        expected=_beta3_expected,
        score=_beta3_expected if owner != "item" and resolved != "none" else None,
        adapt=_adapt("beta3", inflation, zero_allowed=True, one_allowed=True,
                     owner=inflation_owner),
    )
