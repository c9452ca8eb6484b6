"""Small simulated response tables written as wide CSV files, for command-line tests."""

from pathlib import Path

import numpy as np
import pandas as pd


def write_rasch_csv(path: Path, num_subjects: int, num_items: int, seed: int) -> np.ndarray:
    """A 1PL (Rasch) matrix with ids ``s0..`` and ``q0..`` as a wide CSV; returns the 0/1 matrix."""
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=(num_subjects, 1)), rng.normal(size=num_items)
    y = (rng.random((num_subjects, num_items)) < 1 / (1 + np.exp(-(theta - b)))).astype(int)
    df = pd.DataFrame(y, columns=[f"q{j}" for j in range(num_items)])
    df.insert(0, "subject_id", [f"s{i}" for i in range(num_subjects)])
    df.to_csv(path, index=False)
    return y
