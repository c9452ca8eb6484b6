"""Expected-score read-out: each subject's model score averaged over the items.

A model whose ability alone does not order subjects (a per-subject probability of an exact
boundary value, e.g. error-free MT segments) declares ``ModelSpec.score``, a per-cell score
where higher is better: the expected response, or minus the expected error. Each subject's
*expected score* is its mean over every item of the fit (seen or not, so subjects that saw
different items are compared on the same items), computed per posterior draw of the
subject blocks with the item blocks at their point estimates (constrained locations, as
``items.parquet`` reports them); the leaderboard ranks by it and reports its posterior mean
and 90% interval.

Why items are held at their point: the items are common to every subject, so their
uncertainty moves all subjects' scores together and hardly changes the ranking, while a
mean-field draw of one item's correlated parameters (Gamma-IRT's scale, difficulty and
discrimination, drawn independently) can give that item an expected error far from any the
data support; on MQM errors such draws put the 5% quantile of a system's mean expected error
at 2.5 times the median and reordered near-tied systems (tau with the mean MQM score 0.82
against 0.91 with items at their point).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from engine.host import to_device
from engine.infer.guide import GuideState
from engine.models.spec import ModelSpec
from engine.readout.posterior import draw_posterior

__all__ = ["score_draws", "score_summary"]

_CELLS = 1 << 22  # draws x subjects x items evaluated together


def score_draws(spec: ModelSpec, guide: GuideState, num_draws: int, *, rng_key) -> np.ndarray:
    """Per-draw expected score of every subject, ``(num_draws, S)``: subject blocks drawn,
    item blocks at their point estimates (module docstring).

    Raises
    ------
    ValueError : ``spec`` declares no ``score``.
    """
    if spec.score is None:
        raise ValueError(f"model {spec.name!r} declares no score; rank by ability")
    num_subjects, num_items = spec.counts(guide.loc, axis=0)
    lik = spec.likelihood_params
    drawn = tuple(p.name for p in lik if p.owner != "item")
    draws = draw_posterior(spec, guide, num_draws, rng_key=rng_key, names=drawn)
    point = {p.name: p.constrain(to_device(guide.loc[p.name]))
             for p in lik if p.owner == "item"}
    consts = {k: to_device(v, np.float32)
              for k, v in spec.constant_values(num_subjects, num_items).items()}
    owner = {p.name: p.owner for p in lik} | {c.name: c.owner for c in spec.constants}
    expand = {"subject": lambda v: v[:, None], "item": lambda v: v[None, :], "global": lambda v: v}

    @jax.jit
    def mean_over_items(chunk):
        def one(params):
            full = {k: expand[owner[k]](v) for k, v in {**params, **point, **consts}.items()}
            s = jnp.broadcast_to(spec.score(full), (num_subjects, num_items))
            return jnp.mean(s, axis=1)

        return jax.lax.map(one, chunk)

    step = max(1, min(num_draws, _CELLS // max(1, num_subjects * num_items)))
    out = np.empty((num_draws, num_subjects), np.float32)
    for start in range(0, num_draws, step):
        stop = min(num_draws, start + step)
        pad = step - (stop - start)  # fixed shapes: one compile
        chunk = {k: to_device(np.concatenate([v[start:stop]] + [v[:1]] * pad) if pad else
                                v[start:stop]) for k, v in draws.items()}
        out[start:stop] = np.asarray(mean_over_items(chunk))[: stop - start]
    return out


def score_summary(draws: np.ndarray, groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``score_mean``, ``score_sd``, ``score_q05``, ``score_q95`` per subject from ``(T, S)``;
    subjects of one group of ``groups`` (identical posteriors) read from all the group's
    draws (:func:`engine.readout.ranking.pooled_statistics`)."""
    from engine.readout.ranking import pooled_statistics

    return pooled_statistics(draws, groups, {
        "score_mean": lambda v: v.mean(axis=0), "score_sd": lambda v: v.std(axis=0),
        "score_q05": lambda v: np.quantile(v, 0.05, axis=0),
        "score_q95": lambda v: np.quantile(v, 0.95, axis=0)})
