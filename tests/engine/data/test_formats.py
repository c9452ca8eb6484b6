"""Tests for engine.data.formats: one reader interface for tables and logs, no import circle,
``--format`` forces a reader and detection names the one it picked."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.data import ingest, open_store
from engine.data.formats import FORMATS, LOG_FORMATS, detect_format, input_format
from engine.errors import DataFormatError, SettingsError

ROOT = Path(__file__).resolve().parents[3]
MODULES = ["engine.data.long", "engine.data.ingest", "engine.data.formats",
           "engine.data.formats.validate", "engine.data.formats.wide",
           "engine.data.formats.long", "engine.data.formats.pyirt", "engine.data.formats.logs",
           "engine.data.formats.every_eval_ever", "engine.data.formats.lm_eval",
           "engine.data.formats.helm", "engine.data.formats.inspect_ai"]


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)


def test_each_module_imports_alone_in_a_fresh_interpreter():
    first = [_fresh("import engine.data.long"), _fresh("import engine.data.ingest")]
    assert [p.returncode for p in first] == [0, 0], [p.stderr for p in first]
    code = ("import importlib, sys\n"
            f"for name in {MODULES!r}:\n"
            "    for m in [m for m in sys.modules if m.startswith('engine')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n"
            "    print(name, 'engine.data.ingest' in sys.modules)\n")
    proc = _fresh(code)
    assert proc.returncode == 0, proc.stderr
    loaded = dict(line.split() for line in proc.stdout.splitlines())
    assert set(loaded) == set(MODULES)
    # the readers never import the ingest entry point: the circle through it is gone
    assert {name for name, seen in loaded.items() if seen == "True"} == {"engine.data.ingest"}


def test_every_format_has_one_reader_interface():
    for name in FORMATS:
        reader = input_format(name)
        assert reader.name == name
        assert isinstance(reader.options, frozenset)
        assert callable(reader.detect) and callable(reader.ingest)
    assert {n for n in FORMATS if "metric" in input_format(n).options} == set(LOG_FORMATS)
    assert [n for n in FORMATS if "id_column" in input_format(n).options] == ["wide"]
    with pytest.raises(DataFormatError, match="unknown input format 'xml'"):
        input_format("xml")


def _files(tmp_path: Path) -> dict[str, Path]:
    wide = tmp_path / "wide.csv"
    wide.write_text("model,q1,q2\na,1,0\nb,0,1\n")
    long = tmp_path / "long.csv"
    long.write_text("subject,item,response\na,q1,1\na,q2,0\nb,q1,0\nb,q2,1\n")
    pyirt = tmp_path / "r.jsonl"
    pyirt.write_text('{"subject_id": "a", "responses": {"q1": 1, "q2": 0}}\n'
                     '{"subject_id": "b", "responses": {"q1": 0, "q2": 1}}\n')
    eee = tmp_path / "eee.jsonl"
    eee.write_text("".join(json.dumps({
        "model_id": m, "evaluation_name": "ev", "sample_id": s, "sample_hash": "h" + s,
        "evaluation": {"score": float(v), "is_correct": bool(v)}}) + "\n"
        for m, s, v in [("a", "q1", 1), ("a", "q2", 0), ("b", "q1", 0), ("b", "q2", 1)]))
    return {"wide": wide, "long": long, "jsonl": pyirt, "every-eval-ever": eee}


def test_detection_picks_each_format_and_the_same_store_comes_out(tmp_path):
    truth = {("a", "q1"): 1, ("a", "q2"): 0, ("b", "q1"): 0, ("b", "q2"): 1}
    for name, path in _files(tmp_path).items():
        assert detect_format(path) == name
        store = ingest(path, tmp_path / f"{name}.zarr")
        assert store.meta["input_format"] == name
        y = store.load()
        got = {(s, i.split("/")[-1]): int(y[a, b]) for a, s in enumerate(store.subjects)
               for b, i in enumerate(store.items)}
        assert got == truth


def test_format_forces_a_reader(tmp_path):
    long = _files(tmp_path)["long"]
    # forced as wide, the long file is a table of 8 rows with columns item and response
    with pytest.raises(DataFormatError, match=r'long\.csv line 2, column "item": got \'q1\''):
        ingest(long, tmp_path / "w.zarr", fmt="wide", id_column="subject")
    # the jsonl reader forced on a CSV names the line it cannot parse
    with pytest.raises(DataFormatError, match=r"long\.csv line 1: invalid JSON"):
        ingest(long, tmp_path / "j.zarr", fmt="jsonl")
    with pytest.raises(DataFormatError, match=r"long\.csv line 1: not valid JSON"):
        ingest(long, tmp_path / "e.zarr", fmt="every-eval-ever")
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_options_of_another_format_are_refused(tmp_path):
    files = _files(tmp_path)
    with pytest.raises(SettingsError, match=r"--id-column\) applies to wide input only; this "
                                            r"input is long"):
        ingest(files["long"], tmp_path / "s.zarr", id_column="subject")
    with pytest.raises(SettingsError, match="--metric and --keep apply to evaluation logs .* "
                                            "this input is jsonl"):
        ingest(files["jsonl"], tmp_path / "s.zarr", keep="first")
    with pytest.raises(SettingsError, match="applies to wide input only; this input is "
                                            "every-eval-ever"):
        ingest(files["every-eval-ever"], tmp_path / "s.zarr", id_column="x")


def test_mixed_formats_name_each_file(tmp_path):
    files = _files(tmp_path)
    with pytest.raises(DataFormatError, match=r"inputs mix formats \['long', 'wide'\] "
                                              r"\(.*wide\.csv \(wide\), .*long\.csv \(long\)\)"):
        ingest([files["wide"], files["long"]], tmp_path / "s.zarr")


def test_cli_says_which_format_it_detected(tmp_path):
    path = _files(tmp_path)["every-eval-ever"]
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "ingest", str(path), "--out",
                           str(tmp_path / "s.zarr")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "detected format every-eval-ever"
    np.testing.assert_array_equal(open_store(tmp_path / "s.zarr").load(), [[1, 0], [0, 1]])


def test_cli_format_choices_are_the_readers():
    from engine.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    fmt = next(a for a in sub.choices["ingest"]._actions if a.dest == "format")
    assert tuple(fmt.choices) == FORMATS
