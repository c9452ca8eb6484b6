"""The irt-engine command runs OpenBLAS on one thread unless the user set its threads."""

import json
import os
import subprocess
import sys

import pytest

from engine.cli import BLAS_THREAD_SETTINGS, one_blas_thread

_PROBE = """
import json
from engine.cli import one_blas_thread
one_blas_thread()
import numpy, threadpoolctl
print(json.dumps([p["num_threads"] for p in threadpoolctl.threadpool_info()
                  if p["internal_api"] == "openblas"]))
"""


def _openblas_threads(**env) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_SETTINGS}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return json.loads(out)


def test_sets_one_thread_only_where_the_user_set_none():
    env = {}
    one_blas_thread(env)
    assert env == {"OPENBLAS_NUM_THREADS": "1"}
    for name in BLAS_THREAD_SETTINGS:
        env = {name: "3"}
        one_blas_thread(env)
        assert env == {name: "3"}


def test_numpy_openblas_runs_on_one_thread_unless_told_otherwise():
    if os.cpu_count() < 2:
        pytest.skip("one CPU: OpenBLAS takes one thread anyway, so the setting is not seen")
    threads = _openblas_threads()
    if not threads:
        pytest.skip("NumPy here is not built on OpenBLAS")
    assert set(threads) == {1}
    assert set(_openblas_threads(OPENBLAS_NUM_THREADS="2")) == {2}
