"""Fit settings: a frozen, validated dataclass that round-trips through fit.json."""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass

from engine.errors import SettingsError

__all__ = ["FitSettings", "default_block_cells", "parse_bytes"]

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str | int) -> int:
    """A byte count from ``"512M"``, ``"4G"``, ``"1.5GiB"``, ``"64k"`` or a plain integer.

    Units are binary (K = 1024). Raises ``SettingsError`` on anything else or on <= 0.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        raw = str(text).strip()
        t = raw.lower().removesuffix("ib").removesuffix("b")
        unit = t[-1] if t and t[-1] in _UNITS else ""
        try:
            value = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
        except (ValueError, OverflowError):
            value = None
        if value is None or not t[: len(t) - len(unit)].strip():
            raise SettingsError(f"memory budget {raw!r} is not a size; write it like 512M, 4G or "
                                f"1.5G (units K, M, G, T; binary)")
    if value < 1:
        raise SettingsError(f"memory budget {text!r} must be positive; write it like 512M or 4G")
    return value

OPTIMIZERS = ("auto", "newton", "adam")
# Adam stops on its plain Monte Carlo ELBO, noisier than Newton's and still climbing slowly
# when a window of ``patience`` passes sees no change: it compares windows this much longer
_ADAM_WINDOW = 3
ABILITY_FACTORS = ("auto", "gaussian", "quadrature")
# mc_draws = 0: draws per step until a step evaluates about this many cells, at most
# _MAX_AUTO_DRAWS (a 10 x 1,418 leaderboard takes 16; 161 x 11,873 takes 1)
_AUTO_DRAW_CELLS = 1 << 20
_MAX_AUTO_DRAWS = 16
# why naming the optimizer a model does not use is refused, by the model's own optimizer
_DISAGREE = {
    "newton": "Adam stopped 15-35 nats of ELBO short of Newton on the LSAT7 2PL, with "
              "discriminations 25-50% higher",
    "adam": "the diagonal Newton step stalls on the likelihood's ridge, 1,000+ nats short",
}


# Cells per block by default: on a CPU a block's temporaries stay in cache-sized pieces; on
# an accelerator each block costs launches and a sum, so blocks are as large as its memory
# allows (1B cells on one H200: 82 ms a pass in 4M-cell blocks, 23 ms in 64M-cell ones, 15 ms
# in 256M-cell ones; BENCHMARKS.md, "On a GPU"), at most one 128th of the device's memory.
CPU_BLOCK_CELLS = 1 << 22
ACCELERATOR_BLOCK_CELLS = 1 << 28
_DEVICE_BYTES_PER_BLOCK_CELL = 128


def default_block_cells() -> int:
    """Cells per block where ``max_block_cells`` is 0: by JAX's default backend and, on an
    accelerator, its memory (a power of two between the CPU's size and 268,435,456)."""
    import jax

    try:
        backend = jax.default_backend()
    except (AssertionError, RuntimeError) as err:  # JAX asserts when no named platform starts
        named = os.environ.get("JAX_PLATFORMS")
        raise SettingsError(
            f"JAX could not start a backend (JAX_PLATFORMS={named!r}): "
            f"{type(err).__name__} {err}; unset JAX_PLATFORMS, or name a platform this machine "
            f"has (cpu; cuda needs a GPU and jax[cuda])") from None
    if backend == "cpu":
        return CPU_BLOCK_CELLS
    try:
        limit = int((jax.local_devices()[0].memory_stats() or {})["bytes_limit"])
    except (KeyError, TypeError, ValueError, RuntimeError, NotImplementedError):
        return CPU_BLOCK_CELLS << 4
    fits = max(1, limit // _DEVICE_BYTES_PER_BLOCK_CELL)
    return int(min(ACCELERATOR_BLOCK_CELLS, max(CPU_BLOCK_CELLS, 1 << (fits.bit_length() - 1))))


@dataclass(frozen=True)
class FitSettings:
    """How a model is fitted.

    optimizer : ``auto`` (the default): the one the model declares (``ModelSpec.optimizer``,
        e.g. Gamma-IRT's ridge needs ``adam``, optax Adam on the reparameterised ELBO
        gradient), else ``newton`` (natural-gradient variational Newton with the exact
        diagonal curvature of the per-cell log-likelihood; few passes). Naming the other
        one is refused (:meth:`for_model`): they do not agree.
    max_passes, min_passes : bounds on passes over the data.
    tol, patience : converged when the mean ELBO over the last ``patience`` passes differs
        from the mean over the ``patience`` before by less than ``tol`` (relative); the
        posterior returned is the average over the last ``patience`` passes.
    damping : Newton step fraction for locations (``precision_damping`` for precisions).
    unbiased_after : Newton steps that use the draw's own curvature in the gradient's
        control variate (fast while far from the optimum, but biased); later steps use
        curvatures fixed before the draw, so the fit settles at the ELBO's optimum (to first
        order). Not used with ``steps_per_pass > 1``.
    mc_draws : Monte Carlo draws of the guide per step, their terms averaged; 0 = automatic:
        enough draws that a step evaluates about ``2^20`` cells (at most 16), so small
        matrices (a leaderboard of ten systems) get steps as steady as large ones, while a
        matrix of a million cells or more takes one draw per step.
    learning_rate : Adam's peak rate (exponentially decayed over ``max_passes``).
    steps_per_pass : 1 = one step per full pass; k > 1 = k stochastic steps per pass,
        each on a random share of blocks with the likelihood scaled up to the whole matrix.
    num_devices : devices to shard blocks across (None = all local devices).
    max_block_cells : cells per block (fixed shape, so the step compiles once); 0 = automatic
        (:func:`default_block_cells`: 4,194,304 on a CPU; on an accelerator a power of two up
        to 268,435,456 by its memory).
    seed : the one source of randomness.
    checkpoint_every : save the fit's progress every this many passes (0 = never).
    memory_budget : bytes the response data may occupy in memory (None = a share of the
        machine's available memory); larger stores are streamed from disk.
    prefetch : block groups read ahead of the devices when streaming.
    ability_factor : ``quadrature`` integrates each scalar ability out on adaptive
        quadrature and fits the items at their marginal posterior mode
        (:mod:`engine.infer.marginal`; binary models with one scalar ability, population or
        vague priors, matrices held in memory); ``gaussian`` is the mean-field variational fit;
        ``auto`` (the default) takes quadrature where it applies, subjects have at most
        ``quadrature_max_items`` observed responses (median) and the matrix has at most
        ``quadrature_max_cells`` observed cells, gaussian otherwise.
    quadrature_max_items : the ``auto`` switch's bound on responses per subject.
    quadrature_max_cells : the ``auto`` switch's bound on observed cells (the quadrature fit
        costs tens of times a mean-field pass per cell; BENCHMARKS.md, "Default fit").
    nuts_fallback_max_cells : where ``auto``'s quadrature fit ends unconverged, a matrix with
        at most this many observed cells is sampled by NUTS (the exact reference, at
        :class:`engine.infer.nuts.NutsSettings`' defaults) instead of fitted mean-field, whose
        intervals are too narrow there (18-subject NLU rte, 2PL: 0.46-0.77 of NUTS's sds);
        0 always runs the mean-field fit. fit.json ``ability_factor.method`` says which ran.
        The bound keeps NUTS's cost to a few minutes on 2 cores. At NUTS's defaults, with
        the item pools standardised under 30 subjects: rte's 2,502 cells 22 s, R-hat 1.004;
        NLU quail's 10,008 119 s, 1.007; OpenML Bioresponse's 9,519 142 s, 1.005 (1.8 in
        109 s with the pools as they are, when the bound was 5,000).
    nuts_first_subjects : ``auto`` samples a matrix with fewer subjects than this by NUTS
        (within ``nuts_fallback_max_cells``) where it would take the quadrature fit: there
        every item is seen by few subjects, and the quadrature fit's item sds were a median
        0.85-0.95 of NUTS's on the 18-subject NLU boards, the least 0.71 (BENCHMARKS.md),
        where NUTS's sds are the posterior's. 30 (the default) is where the pools'
        sampling coordinates change (``engine.infer.nuts.NONCENTRED_SUBJECTS``); 0 never.
        fit.json's ``ability_factor`` says which ran and why.
    bucket_shapes : pad a matrix held in memory in one tile with missing cells to bucketed
        sizes (``engine.infer.fit.bucket_size``), so data sets of similar shape share compiled
        programs; the padding takes no part in the fit.
    """

    optimizer: str = "auto"
    max_passes: int = 500
    min_passes: int = 10
    tol: float = 1e-4
    patience: int = 5
    damping: float = 0.6
    precision_damping: float = 0.5
    unbiased_after: int = 6
    max_step: float = 1.0
    min_precision: float = 1e-4
    learning_rate: float = 0.05
    mc_draws: int = 0
    steps_per_pass: int = 1
    num_devices: int | None = None
    max_block_cells: int = 0
    seed: int = 0
    progress: bool = False
    checkpoint_every: int = 0
    memory_budget: int | None = None
    prefetch: int = 2
    ability_factor: str = "auto"
    quadrature_max_items: int = 1000
    quadrature_max_cells: int = 500_000
    nuts_fallback_max_cells: int = 12_000
    nuts_first_subjects: int = 30
    bucket_shapes: bool = True

    def for_model(self, spec) -> "FitSettings":
        """These settings with ``optimizer="auto"`` resolved for ``spec``.

        Raises
        ------
        SettingsError : an optimizer other than the model's own was named. The two do not
            agree where the model does not declare one: on the LSAT7 2PL Adam stopped 15-35
            nats of ELBO short of Newton with discriminations 25-50% higher (BENCHMARKS.md),
            and on Gamma-IRT the diagonal Newton step stalls on the likelihood's ridge.
        """
        own = getattr(spec, "optimizer", None) or "newton"
        if self.optimizer not in ("auto", own):
            raise SettingsError(
                f"optimizer={self.optimizer!r} for model {spec.name!r}: this model is fitted "
                f"with {own!r}, the optimizer that converges on it (the two disagree here: "
                f"{_DISAGREE[own]}); use optimizer='auto' (--optimizer auto, the default)")
        return dataclasses.replace(self, optimizer=own)

    @property
    def stop_window(self) -> int:
        """Passes per window of the convergence test: ``patience``, three times that for
        Adam (its plain Monte Carlo ELBO needs the longer window to see a slow climb)."""
        return self.patience * (_ADAM_WINDOW if self.optimizer == "adam" else 1)

    def __post_init__(self):
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise SettingsError(f"seed={self.seed!r}; need an integer")
        if self.ability_factor not in ABILITY_FACTORS:
            raise SettingsError(f"ability_factor={self.ability_factor!r}; use one of "
                                f"{', '.join(ABILITY_FACTORS)}")
        if self.optimizer not in OPTIMIZERS:
            raise SettingsError(f"optimizer={self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if not 1 <= self.min_passes <= self.max_passes:
            raise SettingsError(
                f"need 1 <= min_passes <= max_passes, got {self.min_passes} and {self.max_passes}")
        if not 0.0 < self.damping <= 1.0 or not 0.0 < self.precision_damping <= 1.0:
            raise SettingsError("damping and precision_damping must be in (0, 1]")
        if self.tol <= 0 or self.learning_rate <= 0 or self.max_step <= 0:
            raise SettingsError("tol, learning_rate and max_step must be positive")
        if self.patience < 1 or self.steps_per_pass < 1:
            raise SettingsError("patience and steps_per_pass must be >= 1")
        if self.max_block_cells < 0:
            raise SettingsError(f"max_block_cells must be >= 1, or 0 for automatic, got "
                                f"{self.max_block_cells}")
        for name in ("checkpoint_every", "prefetch", "unbiased_after", "mc_draws",
                     "quadrature_max_items", "quadrature_max_cells", "nuts_fallback_max_cells",
                     "nuts_first_subjects"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise SettingsError(f"memory_budget must be a positive number of bytes, got "
                                f"{self.memory_budget}")
        if self.num_devices is not None and self.num_devices < 1:
            raise SettingsError(f"num_devices must be >= 1, got {self.num_devices}")

    @property
    def block_cells(self) -> int:
        """``max_block_cells``, or :func:`default_block_cells` where it is 0 (automatic)."""
        return self.max_block_cells or default_block_cells()

    def draws_for(self, observed_cells: int) -> int:
        """Monte Carlo draws per step for a matrix of ``observed_cells`` (see ``mc_draws``)."""
        if self.mc_draws:
            return self.mc_draws
        return int(min(_MAX_AUTO_DRAWS, max(1, -(-_AUTO_DRAW_CELLS // max(observed_cells, 1)))))

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
