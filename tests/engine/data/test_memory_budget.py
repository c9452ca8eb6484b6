"""Readers compare the size a file claims with the memory budget before allocating it, and
refuse with an error naming the size and the streaming option, leaving nothing behind."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from engine.data import ingest
from engine.data.formats.validate import CELL_BYTES as _CELL_BYTES, ID_BYTES as _ID_BYTES
from engine.errors import DataFormatError, SettingsError


def _nothing_written(tmp_path):
    assert not (tmp_path / "out.zarr").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _need(rows, cols):
    return rows * cols * _CELL_BYTES + (rows + cols) * _ID_BYTES


def test_wide_csv_header_wider_than_the_budget(tmp_path):
    src = tmp_path / "w.csv"
    src.write_text("model," + ",".join(f"q{j}" for j in range(5000)) + "\nm," +
                   ",".join("1" for _ in range(5000)) + "\n")
    budget = _need(1, 5001) - 1
    with pytest.raises(DataFormatError, match=r"w\.csv: a wide table of 5,001 columns needs about "
                                              r"1\.5 MiB in memory.*over the memory budget.*long "
                                              r"format.*--memory-budget"):
        ingest(src, tmp_path / "out.zarr", memory_budget=budget)
    _nothing_written(tmp_path)
    assert ingest(src, tmp_path / "out.zarr", memory_budget=budget + 2 * _need(1, 5001)).shape \
        == (1, 5000)


def test_wide_csv_rows_beyond_the_budget(tmp_path):
    src = tmp_path / "w.csv"
    rows = "\n".join(f"m{r}," + ",".join("1" for _ in range(10)) for r in range(200))
    src.write_text("model," + ",".join(f"q{j}" for j in range(10)) + "\n" + rows + "\n")
    with pytest.raises(DataFormatError, match=r"w\.csv: a wide table of over \d+ rows x 11 columns"):
        ingest(src, tmp_path / "out.zarr", memory_budget=_need(100, 11))
    _nothing_written(tmp_path)


def test_parquet_footer_is_checked_before_reading(tmp_path):
    src = tmp_path / "w.parquet"
    frame = pd.DataFrame(np.ones((1000, 3), np.int8), columns=["q1", "q2", "q3"])
    frame.insert(0, "model", [f"m{k}" for k in range(1000)])
    frame.to_parquet(src)
    with pytest.raises(DataFormatError, match=r"w\.parquet: a wide table of 1,000 rows x 4 "
                                              r"columns \(its Parquet footer\) needs about"):
        ingest(src, tmp_path / "out.zarr", memory_budget=_need(1000, 4) - 1)
    _nothing_written(tmp_path)


def test_jsonl_table_beyond_the_budget(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"subject_id": f"s{k}", "responses": {f"q{k}": 1}}) + "\n"
                           for k in range(100)))  # 100 x 100, mostly missing
    with pytest.raises(DataFormatError, match=r"p\.jsonl: a table of 100 subjects x 100 items"):
        ingest(src, tmp_path / "out.zarr", memory_budget=_need(100, 100) - 1)
    _nothing_written(tmp_path)


def test_bad_budget_and_id_column_for_other_formats(tmp_path):
    src = tmp_path / "l.csv"
    src.write_text("subject,item,response\na,q1,1\n")
    with pytest.raises(SettingsError, match="memory_budget=0"):
        ingest(src, tmp_path / "out.zarr", memory_budget=0)
    with pytest.raises(SettingsError, match=r"--id-column\)? applies to wide input only"):
        ingest(src, tmp_path / "out.zarr", id_column="subject")
    _nothing_written(tmp_path)


def test_fit_refuses_a_store_whose_parameters_exceed_the_budget(tmp_path, monkeypatch, capsys):
    """A 1 x N store: its responses are tiny (and would stream), its N items' parameters are
    not; the fit refuses before reading, naming the size and what to do."""
    import engine.api as api
    from engine.cli import main
    from engine.data import write_store
    from engine.infer.settings import FitSettings

    n = 3000
    y = (np.arange(n) % 2).astype(np.int8)[None, :]
    store = write_store(y, ["m"], [f"q{j}" for j in range(n)], tmp_path / "s.zarr")
    need = (1 + n) * api.FIT_ID_BYTES
    monkeypatch.setattr(api, "default_memory_budget", lambda: need // 4)
    from engine.data.formats.validate import size_text

    with pytest.raises(SettingsError, match=r"s\.zarr: a fit of 1 subjects x 3,000 items needs "
                       rf"about {re.escape(size_text(need))} for its parameters.*responses "
                       r"already stream from the store, parameters cannot: raise --memory-budget"):
        api.make_source(store, FitSettings(memory_budget=need - 1))
    assert main(["fit", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run"),
                 "--memory-budget", str(need - 1)]) == 2
    assert "a fit of 1 subjects x 3,000 items" in capsys.readouterr().err
    assert not (tmp_path / "run" / "fit.json").exists()
    # a budget that holds the parameters lets it through; the responses load or stream
    assert api.make_source(store, FitSettings(memory_budget=need)).num_items == n
