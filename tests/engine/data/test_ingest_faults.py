"""kill -9 of a real ``irt-engine ingest`` at several points, then a rerun: the same store as
an uninterrupted ingest, and nothing the killed process left behind survives the rerun.

The killed process is a fresh interpreter running ``engine.cli.main``; it sends itself
SIGKILL at an exact point (a function it reaches is replaced by the kill), so each point is
hit every time: logs spilled to scratch, long input spilled to bands, a finished store in
its temporary directory before the rename, and (with --overwrite) the moment the previous
store has been renamed aside and the new one is not yet in place.
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.data import open_store

ROOT = Path(__file__).resolve().parents[3]

_KILLER = r"""
import os, signal, sys

point, argv = sys.argv[1], sys.argv[2:]

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "logs-spilled":
    import engine.data.formats.logs as m
    m._resolve = die
elif point == "long-spilled":
    import engine.data.formats.long as m
    m._write_bands = die
elif point == "before-rename":
    import engine.data.store as store, engine.data.writer as writer
    store._move_into_place = writer._move_into_place = die
elif point == "mid-swap":
    real = os.rename
    def rename(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if ".old-" in os.fspath(dst):
            die()
    os.rename = rename
from engine.cli import main
sys.exit(main(argv))
"""


def _inputs(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(7)
    y = (rng.random((6, 9)) < 0.6).astype(int)
    wide = tmp_path / "wide.csv"
    wide.write_text("model," + ",".join(f"q{j}" for j in range(9)) + "\n" + "".join(
        f"m{i}," + ",".join(map(str, row)) + "\n" for i, row in enumerate(y)))
    long = tmp_path / "long.csv"
    long.write_text("subject,item,response\n" + "".join(
        f"m{i},q{j},{y[i, j]}\n" for i in range(6) for j in range(9) if (i + j) % 4))
    logs = tmp_path / "logs"
    for i in range(3):
        path = logs / "ev" / "dev" / f"m{i}" / "s.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps({
            "model_id": f"m{i}", "evaluation_name": "ev", "sample_id": f"q{j}",
            "sample_hash": f"h{j}", "input": {"raw": f"question {j}"},
            "metadata": {"k": j}, "evaluation": {"score": float(y[i, j])}}) + "\n"
            for j in range(9)))
    return {"wide": wide, "long": long, "logs": logs}


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def _same_store(got: Path, want: Path) -> None:
    a, b = open_store(got, verify=True), open_store(want, verify=True)
    assert list(a.subjects) == list(b.subjects) and list(a.items) == list(b.items)
    np.testing.assert_array_equal(a.load(), b.load())
    for key in ("checksum", "kind", "layout", "num_observed", "input_format", "item_groups"):
        assert a.meta.get(key) == b.meta.get(key), key
    info = [p / "item_info.parquet" for p in (got, want)]
    assert info[0].exists() == info[1].exists()
    if info[0].exists():
        pd.testing.assert_frame_equal(pd.read_parquet(info[0]), pd.read_parquet(info[1]))


def _killed(point: str, argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLER, point, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("source, point", [
    ("logs", "logs-spilled"), ("logs", "long-spilled"), ("logs", "before-rename"),
    ("long", "long-spilled"), ("long", "before-rename"), ("wide", "before-rename")])
def test_kill_then_rerun_gives_the_uninterrupted_store(tmp_path, source, point, capsys):
    path = _inputs(tmp_path)[source]
    assert main(["ingest", str(path), "--out", str(tmp_path / "want.zarr")]) == 0
    out = tmp_path / "s.zarr"
    argv = ["ingest", str(path), "--out", str(out)]
    _killed(point, argv)
    assert not out.exists()
    left = _leftovers(tmp_path, "s.zarr")
    assert [n for n in left if n != ".s.zarr.lock"], left  # the kill left scratch behind
    assert main(argv) == 0
    assert _leftovers(tmp_path, "s.zarr") == []
    _same_store(out, tmp_path / "want.zarr")


@pytest.mark.parametrize("source", ["wide", "logs"])
def test_kill_inside_the_swap_keeps_the_old_store_then_overwrites(tmp_path, source, capsys):
    files = _inputs(tmp_path)
    old_input = files["long"]
    out = tmp_path / "s.zarr"
    assert main(["ingest", str(old_input), "--out", str(out)]) == 0
    assert main(["ingest", str(old_input), "--out", str(tmp_path / "old.zarr")]) == 0
    assert main(["ingest", str(files[source]), "--out", str(tmp_path / "want.zarr")]) == 0
    argv = ["ingest", str(files[source]), "--out", str(out), "--overwrite"]
    _killed("mid-swap", argv)
    assert not out.exists()  # renamed aside, the new one not yet in place
    assert any(".s.zarr.old-" in n for n in _leftovers(tmp_path, "s.zarr"))
    # the next writer of s.zarr puts the old store back first: without --overwrite it exists
    assert main(["ingest", str(old_input), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    _same_store(out, tmp_path / "old.zarr")
    assert main(argv) == 0
    assert _leftovers(tmp_path, "s.zarr") == []
    _same_store(out, tmp_path / "want.zarr")


def test_a_second_writer_of_the_same_store_fails_at_once(tmp_path, capsys):
    from engine.atomic import exclusive_lock

    path = _inputs(tmp_path)["wide"]
    with exclusive_lock(tmp_path / "s.zarr"):
        code = main(["ingest", str(path), "--out", str(tmp_path / "s.zarr")])
    assert code == 2
    assert "another irt-engine process is writing --out" in capsys.readouterr().err
    assert not (tmp_path / "s.zarr").exists()
