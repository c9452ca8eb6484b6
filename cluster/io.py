"""Atomic writes of the small files a cluster analysis leaves beside its Parquet tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from engine.atomic import atomic_write

__all__ = ["write_json_atomic", "write_plot_atomic", "write_parquet_atomic"]


def write_json_atomic(path: Path, obj: dict) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))


def write_plot_atomic(fig, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
