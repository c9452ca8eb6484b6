"""Settings of the trial runner and of each resampling analysis: frozen, validated dataclasses."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from engine.errors import SettingsError

__all__ = ["RunnerSettings", "StabilitySettings", "BootstrapSettings", "DimensionsSettings",
           "parse_sizes", "default_sizes"]

BACKENDS = ("ray", "inprocess")


class _Settings:
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RunnerSettings(_Settings):
    """How trials are scheduled.

    backend : ``ray`` (tasks on a Ray cluster) or ``inprocess`` (same batches, one process).
    address : an existing Ray cluster (``ray://...`` or ``HOST:PORT``); ``None`` starts a local
        Ray bound to 127.0.0.1 with no dashboard.
    batch_size : trials fitted together in one task (vectorised with ``jax.vmap``).
    max_in_flight : tasks submitted but not yet finished (``None``: twice the cluster's CPUs).
    max_retries : resubmissions of a task whose worker or node died.
    num_cpus : CPUs of the local Ray started when ``address`` is ``None`` (``None``: all).
    progress : a progress bar on stderr.
    verbose : Ray's own log lines (start-up, workers' output) on this terminal.
    """

    backend: str = "ray"
    address: str | None = None
    batch_size: int = 8
    max_in_flight: int | None = None
    max_retries: int = 3
    num_cpus: int | None = None
    progress: bool = True
    verbose: bool = False

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise SettingsError(f"backend={self.backend!r}; use one of {', '.join(BACKENDS)}")
        if self.batch_size < 1:
            raise SettingsError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise SettingsError(f"--max-in-flight must be >= 1, got {self.max_in_flight}")
        if self.max_retries < 0:
            raise SettingsError(f"--max-retries must be >= 0, got {self.max_retries}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise SettingsError(f"--num-cpus must be >= 1, got {self.num_cpus}")


def default_sizes(num_items: int, start: int = 25) -> tuple[int, ...]:
    """25, 50, 100, 200, ... doubling, then half the items (the largest disjoint pair)."""
    half = num_items // 2
    sizes, k = [], start
    while k < half:
        sizes.append(k)
        k *= 2
    if half >= 1:
        sizes.append(half)
    return tuple(sizes)


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"25,50,100"`` -> ``(25, 50, 100)`` with a clear error for anything else."""
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SettingsError(f"--sizes {text!r}: give comma-separated whole numbers, e.g. 25,50,100")
    if not sizes or min(sizes) < 1:
        raise SettingsError(f"--sizes {text!r}: give at least one size, each >= 1")
    return tuple(sorted(set(sizes)))


@functools.lru_cache(maxsize=1)
def one_ability_models() -> tuple[str, ...]:
    """The registered models a trial command fits: those with one scalar ability that build
    without options (the multi-skill ones need ``--dims``, which these commands lack)."""
    from engine.models.registry import models_by_default

    return tuple(name for name, spec in models_by_default().items()
                 if spec.param("ability").shape == ())


def _check_model(settings, passes: int) -> None:
    """Check ``settings.model`` and ``passes``; a ``prior`` of None becomes the model's own
    (``engine.models.default_prior``), so the saved settings name the prior fitted."""
    from engine.models.registry import MODELS, resolve_prior

    scalar = one_ability_models()
    if settings.model not in scalar:
        why = " (trials rank subjects by one ability)" if settings.model in MODELS else ""
        raise SettingsError(f"--model {settings.model!r}{why}: choose one of {', '.join(scalar)}")
    from engine.models.priors import PRIOR_FAMILIES

    prior = resolve_prior(settings.model, settings.prior)
    if prior not in PRIOR_FAMILIES:
        raise SettingsError(f"--prior {prior!r}: choose one of {', '.join(PRIOR_FAMILIES)}")
    object.__setattr__(settings, "prior", prior)
    if passes < 1:
        raise SettingsError(f"--passes must be >= 1, got {passes}")


@dataclass(frozen=True)
class StabilitySettings(_Settings):
    """Ranking stability (seed 002, 4.3.1 and appendix D).

    sizes : item-sample sizes (``None``: ``default_sizes``); each at most half the items.
    trials_per_size : disjoint sample pairs drawn per size.
    passes : variational Newton passes per trial fit, warm-started from the full fit.
    bootstrap : resamples of the per-size tau difference (IRT minus accuracy).
    """

    sizes: tuple[int, ...] | None = None
    trials_per_size: int = 10
    model: str = "2pl"
    prior: str | None = None  # None: the model's own (population for 1PL, 2PL)
    passes: int = 20
    bootstrap: int = 2000
    seed: int = 0

    def __post_init__(self):
        _check_model(self, self.passes)
        if self.trials_per_size < 1:
            raise SettingsError(f"--trials-per-size must be >= 1, got {self.trials_per_size}")
        if self.bootstrap < 1:
            raise SettingsError(f"--bootstrap must be >= 1, got {self.bootstrap}")

    def resolved_sizes(self, num_items: int) -> tuple[int, ...]:
        sizes = self.sizes or default_sizes(num_items)
        half = num_items // 2
        too_big = [k for k in sizes if k > half]
        if too_big or half < 1:
            raise SettingsError(
                f"--sizes {','.join(map(str, too_big or sizes))}: two disjoint samples need each "
                f"size <= half the items ({half} of {num_items}); choose smaller sizes")
        return tuple(sizes)


@dataclass(frozen=True)
class BootstrapSettings(_Settings):
    """Bootstrap intervals: items resampled with replacement, the model refitted per replicate."""

    replicates: int = 200
    model: str = "2pl"
    prior: str | None = None  # None: the model's own (population for 1PL, 2PL)
    passes: int = 20
    level: float = 0.9
    seed: int = 0

    def __post_init__(self):
        _check_model(self, self.passes)
        if self.replicates < 2:
            raise SettingsError(f"--replicates must be >= 2, got {self.replicates}")
        if not 0.0 < self.level < 1.0:
            raise SettingsError(f"--level must be in (0, 1), got {self.level}")


@dataclass(frozen=True)
class DimensionsSettings(_Settings):
    """Parallel analysis with column-permuted shuffles, and residual eigenvalues of a one-skill
    fit tested against ``residual_simulations`` data sets simulated from that fit."""

    shuffles: int = 200
    model: str = "2pl"
    prior: str | None = None  # None: the model's own (population for 1PL, 2PL)
    num_eigenvalues: int = 20
    residual_simulations: int = 60
    seed: int = 0

    def __post_init__(self):
        _check_model(self, 1)
        if self.shuffles < 2:
            raise SettingsError(f"--shuffles must be >= 2, got {self.shuffles}")
        if self.residual_simulations < 2:
            raise SettingsError(f"--residual-simulations must be >= 2, got {self.residual_simulations}")
        if self.num_eigenvalues < 1:
            raise SettingsError(f"--num-eigenvalues must be >= 1, got {self.num_eigenvalues}")
