"""Atomic writes of the small files a cluster analysis leaves beside its Parquet tables."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd

__all__ = ["write_json_atomic", "write_plot_atomic", "write_parquet_atomic"]


def _tmp(path: Path) -> Path:
    return path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = _tmp(Path(path))
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    tmp = _tmp(Path(path))
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def write_plot_atomic(fig, path: Path) -> None:
    tmp = _tmp(Path(path)).with_suffix(".png")
    fig.savefig(tmp, dpi=120, format="png")
    os.replace(tmp, path)
