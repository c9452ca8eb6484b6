"""What a command may plan to use of this machine: its memory budget and its cores."""

from __future__ import annotations

import os

__all__ = ["default_memory_budget", "usable_cores", "ID_BYTES"]

# What reading one id costs in memory: the Python str (about 50-60 bytes for short ids), the
# object array's pointer and the decoder's buffers.
ID_BYTES = 128


def default_memory_budget() -> int:
    """Half the memory the machine has available now (at least 256 MiB)."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return max(256 << 20, available // 2)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system reports one
    (``taskset``, a container's CPU set), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def size_text(n: float) -> str:
    """A byte count as text: ``"1,024 bytes"``, ``"1.5 GiB"``."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.3g}"
