"""Host arrays onto the device without compiling a program for each shape.

``jnp.asarray`` of a NumPy array compiles and runs a small copy program (``jit(stage)``,
or ``jit(convert_element_type)`` with a dtype) once per shape and dtype: in a fresh
process each costs a lowering and a compilation-cache lookup, about 20 ms, and a fit
that moves a dozen shapes to the device paid for a dozen. :func:`to_device` converts on
the host and transfers (``jax.device_put``), which compiles nothing.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["to_device", "prng_key"]


def to_device(a, dtype=None) -> jax.Array:
    """``a`` (array-like) as a device array of ``dtype`` (as ``jnp.asarray(a, dtype)``,
    float64 becoming float32 unless x64 is on), converted on the host."""
    return jax.device_put(np.asarray(a, dtype))


@jax.jit
def _key(seed):
    return jax.random.PRNGKey(seed)


def prng_key(seed: int) -> jax.Array:
    """``jax.random.PRNGKey(seed)`` through one compiled program for every seed (eagerly,
    each call site compiled two: the seed's transfer and the key's derivation)."""
    return _key(np.int64(seed))
