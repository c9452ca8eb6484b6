"""The persistent JAX compilation cache that commands and Ray workers share."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["compilation_cache_dir", "use_compilation_cache"]


def compilation_cache_dir() -> str:
    """``JAX_COMPILATION_CACHE_DIR``, by default ``~/.cache/irt-engine/jax``."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(
        Path.home() / ".cache" / "irt-engine" / "jax")


def use_compilation_cache() -> None:
    """Keep compiled programs between runs, so a repeated command skips most of its JAX
    compilation (:func:`compilation_cache_dir`); ``IRT_ENGINE_COMPILATION_CACHE=0`` turns
    it off."""
    if os.environ.get("IRT_ENGINE_COMPILATION_CACHE", "1") == "0":
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", compilation_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
