"""Simulated 1PL/2PL response matrices for the benchmarks (pure numpy).

theta ~ N(0, 1), difficulty b ~ N(0, 1), log-discrimination ~ N(0, log_disc_sd^2),
P(y = 1) = sigmoid(a * (theta - b)).  Responses are int8 (subjects x items), fully observed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["simulate_1pl", "simulate_2pl", "simulate_asymptotes", "ASYMPTOTES"]

# model -> (guessing lower asymptote, feasibility upper asymptote)
ASYMPTOTES = {"3pl": (True, False), "4pl": (True, True), "feas": (False, True)}

_CHUNK_CELLS = 4_000_000  # cells per row chunk (~32 MB of float64 temporaries)


def _draw_responses(
    rng: np.random.Generator,
    ability: np.ndarray,
    difficulty: np.ndarray,
    discrimination: np.ndarray,
) -> np.ndarray:
    """Draw Bernoulli responses in row chunks so peak memory stays small."""
    num_subjects, num_items = ability.size, difficulty.size
    responses = np.empty((num_subjects, num_items), dtype=np.int8)
    rows = max(1, _CHUNK_CELLS // max(num_items, 1))
    for start in range(0, num_subjects, rows):
        stop = min(start + rows, num_subjects)
        logits = discrimination[None, :] * (ability[start:stop, None] - difficulty[None, :])
        prob = 1.0 / (1.0 + np.exp(-logits))
        responses[start:stop] = rng.random(prob.shape) < prob
    return responses


def simulate_2pl(
    num_subjects: int, num_items: int, *, seed: int, log_disc_sd: float = 0.3
) -> dict[str, np.ndarray]:
    """Simulate a 2PL data set.

    Returns
    -------
    dict with ``responses`` (int8, S x N), ``ability`` (S,), ``difficulty`` (N,),
    ``discrimination`` (N,).
    """
    return _simulate(num_subjects, num_items, seed,
                     lambda rng: np.exp(log_disc_sd * rng.standard_normal(num_items)))


def simulate_1pl(num_subjects: int, num_items: int, *, seed: int) -> dict[str, np.ndarray]:
    """Simulate a 1PL (Rasch, a = 1) data set; same keys as :func:`simulate_2pl`."""
    return _simulate(num_subjects, num_items, seed, lambda rng: np.ones(num_items))


def _simulate(num_subjects: int, num_items: int, seed: int, draw_discrimination) -> dict:
    """Abilities, difficulties, then ``draw_discrimination(rng)``, then responses, from one
    generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    ability = rng.standard_normal(num_subjects)
    difficulty = rng.standard_normal(num_items)
    discrimination = draw_discrimination(rng)
    responses = _draw_responses(rng, ability, difficulty, discrimination)
    return dict(responses=responses, ability=ability, difficulty=difficulty,
                discrimination=discrimination)


def simulate_asymptotes(model: str, num_subjects: int, num_items: int, *, seed: int,
                        guessing: float | None = None,
                        feasibility: float | None = None) -> dict:
    """Simulate a 3PL, 4PL or feasibility (DAD IRT-feas) data set: the 2PL's abilities,
    difficulties and discriminations, guessing ``c ~ Beta(2, 8)`` (3PL, 4PL) and
    feasibility ``d ~ 1 - Beta(2, 8)`` (4PL, feas); ``P = c + (d - c) sigmoid(a (theta - b))``.
    Keys as :func:`simulate_2pl` plus ``guessing`` / ``feasibility`` where the model has them.
    ``guessing`` / ``feasibility``: every item's true asymptote fixed at that value instead
    (the Beta draws are still made, so everything else matches the seed's default data)."""
    lower, upper = ASYMPTOTES[model]
    rng = np.random.default_rng(seed)
    out = {"ability": rng.standard_normal(num_subjects),
           "difficulty": rng.standard_normal(num_items),
           "discrimination": np.exp(0.3 * rng.standard_normal(num_items))}
    c = rng.beta(2, 8, num_items) if lower else np.zeros(num_items)
    d = 1 - rng.beta(2, 8, num_items) if upper else np.ones(num_items)
    if lower and guessing is not None:
        c = np.full(num_items, float(guessing))
    if upper and feasibility is not None:
        d = np.full(num_items, float(feasibility))
    if lower:
        out["guessing"] = c
    if upper:
        out["feasibility"] = d
    eta = out["discrimination"] * (out["ability"][:, None] - out["difficulty"])
    p = c + (d - c) / (1 + np.exp(-eta))
    out["responses"] = (rng.random(p.shape) < p).astype(np.int8)
    return out
