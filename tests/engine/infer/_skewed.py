"""A skewed two-item posterior and its moments by scipy integration, for the item routes'
tests (importance sampling, the sampler)."""

import numpy as np
from scipy import integrate, stats

from engine.infer.marginal import distinct_rows


def skewed_case():
    """30 subjects, two 1PL items, one of them easy: a skewed marginal posterior (the mode a
    quarter of an sd off the mean), its moments by a 2-D grid of scipy-integrated marginal
    likelihoods (abilities on a 721-point trapezoid rule)."""
    rng = np.random.default_rng(1)
    theta, b = rng.normal(size=30), np.array([-2.5, 0.3])
    y = (rng.random((30, 2)) < 1 / (1 + np.exp(-(theta[:, None] - b)))).astype(np.int8)
    patterns, _, counts = distinct_rows(y)
    tg = np.linspace(-9, 9, 721)
    g1, g2 = np.meshgrid(np.linspace(-12, 4, 321), np.linspace(-4, 4, 161), indexing="ij")
    p = 1 / (1 + np.exp(-(tg[:, None] - np.stack([g1, g2], -1)[..., None, :])))
    lp = stats.norm.logpdf(g1, 0, np.sqrt(1e3)) + stats.norm.logpdf(g2, 0, np.sqrt(1e3))
    for row, c in zip(patterns, counts):
        lik = np.prod(np.where(row == 1, p, 1 - p), -1) * stats.norm.pdf(tg)
        lp = lp + c * np.log(integrate.trapezoid(lik, tg, axis=-1))
    w = np.exp(lp - lp.max())
    w /= w.sum()
    mean = np.array([(w * g1).sum(), (w * g2).sum()])
    sd = np.sqrt(np.array([(w * g1 ** 2).sum(), (w * g2 ** 2).sum()]) - mean ** 2)
    # the marginal CDF at each node: the mass below it plus half its own (the trapezoid
    # between nodes), so the interpolated quantiles are not half a step low
    ends = np.array([np.interp([0.05, 0.95], np.cumsum(m) - m / 2, axis)
                     for m, axis in ((w.sum(axis=1), g1[:, 0]), (w.sum(axis=0), g2[0]))]).T
    return y, mean, sd, ends
