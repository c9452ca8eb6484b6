"""Stores whose metadata lies about their size, opened by real processes under an address-space
cap: a one-line error naming the store, before the claimed memory is spent."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main

CAP = 3 << 30  # bytes of address space: far below what the lies claim
S, N = 200_000_000, 1_000_000


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _lying_store(tmp_path: Path, *, chunks_too: bool) -> Path:
    csv = tmp_path / "y.csv"
    csv.write_text("subject,q1,q2,q3\na,1,0,1\nb,0,1,1\nc,1,1,0\n")
    store = tmp_path / "s.zarr"
    assert main(["ingest", str(csv), "--out", str(store)]) == 0
    _edit(store / "zarr.json", lambda d: d["attributes"]["irt_engine"].update(
        num_subjects=S, num_items=N, num_observed=S * N))

    def responses(d):
        d["shape"] = [S, N]
        if chunks_too:  # one chunk claimed as large as the whole matrix
            d["chunk_grid"]["configuration"]["chunk_shape"] = [S, N]
            for codec in d["codecs"]:
                if codec["name"] == "sharding_indexed":
                    codec["configuration"]["chunk_shape"] = [S, N]

    _edit(store / "responses" / "zarr.json", responses)
    for name, size in (("subjects", S), ("items", N)):
        def ids(d, size=size):
            d["shape"] = [size]
            if chunks_too:
                d["chunk_grid"]["configuration"]["chunk_shape"] = [size]
        _edit(store / name / "zarr.json", ids)
    return store


@pytest.mark.parametrize("chunks_too", [False, True])
@pytest.mark.parametrize("command", [["fit", "--quiet"], ["stability", "--quiet"]])
def test_lying_sizes_are_refused_under_a_memory_cap(tmp_path, command, chunks_too):
    store = _lying_store(tmp_path, chunks_too=chunks_too)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "engine.cli", command[0], str(store),
                           "--out", str(out), *command[1:]],
                          capture_output=True, text=True, preexec_fn=_capped, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert str(store) in lines[0] and "200,000,000 subjects" in lines[0]
    assert not out.exists()
