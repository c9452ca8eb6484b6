"""Fit settings: a frozen, validated dataclass that round-trips through fit.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.errors import SettingsError

__all__ = ["FitSettings"]

OPTIMIZERS = ("newton", "adam")


@dataclass(frozen=True)
class FitSettings:
    """How a model is fitted.

    optimizer : ``newton`` (natural-gradient variational Newton with the exact diagonal
        curvature of the per-cell log-likelihood; few passes) or ``adam`` (optax Adam on
        the reparameterised ELBO gradient).
    max_passes, min_passes : bounds on passes over the data.
    tol, patience : converged when the mean ELBO over the last ``patience`` passes differs
        from the mean over the ``patience`` before by less than ``tol`` (relative); the
        posterior returned is the average over the last ``patience`` passes.
    damping : Newton step fraction for locations (``precision_damping`` for precisions).
    learning_rate : Adam's peak rate (exponentially decayed over ``max_passes``).
    steps_per_pass : 1 = one step per full pass; k > 1 = k stochastic steps per pass,
        each on a random share of blocks with the likelihood scaled up to the whole matrix.
    num_devices : devices to shard blocks across (None = all local devices).
    max_block_cells : cells per block (fixed shape, so the step compiles once).
    seed : the one source of randomness.
    """

    optimizer: str = "newton"
    max_passes: int = 500
    min_passes: int = 10
    tol: float = 1e-4
    patience: int = 5
    damping: float = 0.6
    precision_damping: float = 0.5
    max_step: float = 1.0
    min_precision: float = 1e-4
    learning_rate: float = 0.05
    steps_per_pass: int = 1
    num_devices: int | None = None
    max_block_cells: int = 1 << 22
    seed: int = 0
    progress: bool = False
    checkpoint_every: int = 0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise SettingsError(f"optimizer={self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if not 1 <= self.min_passes <= self.max_passes:
            raise SettingsError(
                f"need 1 <= min_passes <= max_passes, got {self.min_passes} and {self.max_passes}")
        if not 0.0 < self.damping <= 1.0 or not 0.0 < self.precision_damping <= 1.0:
            raise SettingsError("damping and precision_damping must be in (0, 1]")
        if self.tol <= 0 or self.learning_rate <= 0 or self.max_step <= 0:
            raise SettingsError("tol, learning_rate and max_step must be positive")
        if self.patience < 1 or self.steps_per_pass < 1 or self.max_block_cells < 1:
            raise SettingsError("patience, steps_per_pass and max_block_cells must be >= 1")
        if self.num_devices is not None and self.num_devices < 1:
            raise SettingsError(f"num_devices must be >= 1, got {self.num_devices}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FitSettings":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise SettingsError(f"unknown fit settings {sorted(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> "FitSettings":
        return dataclasses.replace(self, **changes)
