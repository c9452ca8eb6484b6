"""Data parallelism: the only module that calls ``jax.pmap``.

Blocks are dealt across the local devices; each device computes its block's terms and
the results are summed with ``psum``, so one device and many run the same block terms. On
one device they run under ``jax.jit`` instead: the same program without ``pmap``'s
per-call dispatch (about 3 ms a call against jit's tens of microseconds, 0.2 s of a
39-pass fit of the NLU matrix) and its shard_map staging when traced.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np

from engine.data.blocks import Block

from engine.errors import SettingsError
from engine.exported import exported_jit

__all__ = ["make_parallel_terms", "stack_blocks", "num_local_devices"]


def num_local_devices(requested: int | None = None) -> int:
    available = jax.local_device_count()
    if requested is None:
        return available
    if not 1 <= requested <= available:
        raise SettingsError(f"--devices {requested}: only {available} local device(s) exist; pass "
                            f"--devices 1 to {available}, or leave it out to use all of them")
    return requested


def make_parallel_terms(block_terms: Callable, num_devices: int) -> Callable:
    """``terms(z, stacked_block) -> Terms`` summed over a group of ``num_devices`` blocks."""

    if num_devices == 1:  # the group's one block, taken inside the compiled program
        @exported_jit
        def one(z, subject_idx, item_idx, y):
            return block_terms(z, subject_idx[0], item_idx[0], y[0])

        return lambda z, group: one(z, group.subject_idx, group.item_idx, group.y)

    def per_device(z, subject_idx, item_idx, y):
        return jax.lax.psum(block_terms(z, subject_idx, item_idx, y), axis_name="devices")

    # psum leaves every device with the same sum: out_axes=None returns it once, unstacked.
    pmapped = jax.pmap(per_device, axis_name="devices", in_axes=(None, 0, 0, 0), out_axes=None,
                       devices=jax.local_devices()[:num_devices])

    first = jax.local_devices()[0]

    def terms(z, group: Block):
        out = pmapped(z, group.subject_idx, group.item_idx, group.y)
        return jax.device_put(out, first)  # the first device's copy, for the update

    return terms


def stack_blocks(blocks: Sequence[Block], num_devices: int) -> Block:
    """Stack ``num_devices`` host blocks along a new leading axis for ``pmap`` (one copy;
    a block's arrays may be views of the caller's matrix)."""
    return Block(*(np.stack(parts) for parts in zip(*blocks)))
