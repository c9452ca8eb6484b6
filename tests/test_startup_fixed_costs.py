"""Fixed costs of everyday commands: what a process imports and compiles besides its work."""

import ast
import subprocess
import sys

import jax
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import engine
from engine.data.arrow import to_numbers
from engine.readout.posterior import draw_posterior

_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
          pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.null()]


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.lists(st.one_of(st.none(), st.integers(-120, 120)), max_size=25),
                       max_size=4),
       kind=st.sampled_from(_TYPES), head=st.integers(0, 9), tail=st.integers(0, 9))
def test_to_numbers_reads_arrow_buffers_as_arrow_casts_them(chunks, kind, head, tail):
    """Chunked columns, sliced at any bit offset, with nulls: the values Arrow's own cast
    gives, NaN where missing."""
    if pa.types.is_boolean(kind):
        chunks = [[None if v is None else v % 3 == 0 for v in c] for c in chunks]
    if pa.types.is_null(kind):
        chunks = [[None] * len(c) for c in chunks]
    if pa.types.is_unsigned_integer(kind):
        chunks = [[None if v is None else abs(v) for v in c] for c in chunks]
    col = pa.chunked_array([pa.array(c, type=kind) for c in chunks], type=kind)
    if len(col) > head + tail:
        col = col.slice(head, len(col) - head - tail)
    want = pc.cast(col, pa.float64()).to_numpy() if len(col) else np.empty(0)
    np.testing.assert_array_equal(to_numbers(col), want)
    if not col.null_count:
        got = to_numbers(col, np.int64)
        assert got.dtype == np.int64 and np.array_equal(got, want)


def test_to_numbers_refuses_missing_values_as_integers_and_other_types():
    with pytest.raises(ValueError, match="missing values cannot be int64"):
        to_numbers(pa.array([1, None, 3], pa.int32()), np.int64)
    with pytest.raises(TypeError, match="type string"):
        to_numbers(pa.array(["1"]))


def _cli_in_a_fresh_process(args, modules, exit_code=0):
    """``irt-engine ARGS`` (``engine.cli.main``) in a new Python process that must return
    ``exit_code``: its printed lines, which of ``modules`` it had imported (the last line,
    as a list's text) and its standard error."""
    code = ("import sys\n"
            "from engine.cli import main\n"
            f"assert main({[str(a) for a in args]!r}) == {exit_code}\n"
            f"print([m for m in {tuple(modules)!r} if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    *printed, imported = out.stdout.strip().splitlines()
    return printed, imported, out.stderr


def test_ingesting_a_parquet_table_imports_neither_pandas_nor_jax(tmp_path):
    """The wide Parquet reader takes the values from Arrow's buffers: no pandas (Arrow's
    ``to_numpy`` imports it), and no JAX, in an ingest process."""
    y = (np.random.default_rng(0).random((40, 5)) < 0.6).astype(np.int8)
    table = pa.table({"subject": [f"s{i}" for i in range(40)]} |
                     {f"q{j}": pa.array(y[:, j]) for j in range(5)})
    pq.write_table(table, tmp_path / "wide.parquet")
    _, imported, _ = _cli_in_a_fresh_process(
        ["ingest", tmp_path / "wide.parquet", "--out", tmp_path / "store"],
        ("pandas", "jax", "pyarrow.dataset"))
    assert imported == "[]"
    from engine.data.store import open_store

    np.testing.assert_array_equal(open_store(tmp_path / "store").load(), y)


@pytest.mark.parametrize("seed", [0, 7, -1, 2 ** 33 + 3])
def test_an_int_seed_draws_what_its_key_draws(seed):
    y = (np.random.default_rng(1).random((30, 4)) < 0.5).astype(np.int8)
    y[:3] = y[3]  # identical answer sheets share their draws
    res = engine.fit(y, model="1pl")
    by_key = draw_posterior(res.spec, res.guide, 50, rng_key=jax.random.PRNGKey(seed))
    by_seed = draw_posterior(res.spec, res.guide, 50, rng_key=seed)
    assert by_key.keys() == by_seed.keys()
    for name in by_key:
        np.testing.assert_array_equal(by_key[name], by_seed[name])


# JAX's eager operations on host arrays: each compiles a program of its own per shape (about
# 20 ms each in a fresh process), which a fit and its read-outs no longer run
_EAGER = {"stage", "convert_element_type", "broadcast_in_dim", "exp", "multiply", "unstack",
          "_threefry_seed", "_threefry_split", "concatenate", "dynamic_slice", "gather"}


@pytest.mark.parametrize("factor", ["quadrature", "gaussian"])
def test_a_fit_and_its_run_compile_no_eager_operations(tmp_path, factor):
    """A 2PL fit of a short test, by the quadrature fit (importance-sampled item means) or
    the mean-field fit, and its run directory, in a fresh process (an eager program is
    compiled once per process and shape, so an earlier test could hide one): every program
    compiled is one of the engine's own, none a per-shape eager operation. Nor does it
    import pandas (0.15-0.3 s: the run's tables are written from NumPy columns) or
    scipy.linalg (0.12-0.23 s: its programs call no LAPACK, engine.exported)."""
    code = ("import logging, sys, jax, numpy as np\n"
            "import engine\n"
            "from engine.infer.settings import FitSettings\n"
            "from engine.run import save_run\n"
            "names = set()\n"
            "class Names(logging.Handler):\n"
            "    def emit(self, record):\n"
            "        text = record.getMessage()\n"
            "        if text.startswith('Compiling jit('):\n"
            "            names.add(text.split('jit(')[1].split(')')[0])\n"
            "logging.getLogger('jax').addHandler(Names())\n"
            "logging.getLogger('jax').setLevel(logging.WARNING)\n"
            "y = (np.random.default_rng(3).random((233, 7)) < 0.6).astype(np.int8)\n"
            "with jax.log_compiles(True):\n"
            f"    res = engine.fit(y, model='2pl', settings=FitSettings(ability_factor={factor!r}))\n"
            f"    save_run(res, {str(tmp_path / 'run')!r})\n"
            "print([m for m in ('pandas', 'scipy.linalg') if m in sys.modules])\n"
            "print(res.extra['ability_factor']['method'])\n"
            "print(sorted(names))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    imported, method, names = out.stdout.strip().splitlines()[-3:]
    names = set(ast.literal_eval(names))
    assert imported == "[]"
    assert method == factor
    assert names, "no compilation was logged: the check would pass vacuously"
    assert not names & _EAGER, sorted(names)


@settings(max_examples=60, deadline=None)
@given(means=st.lists(st.sampled_from([-1.0, 0.0, 0.5, 0.5, 2.0, 3.25, float("nan")]), min_size=1,
                     max_size=12),
       top_k=st.one_of(st.none(), st.integers(1, 5)), score=st.booleans())
def test_the_board_is_pandas_sort_on_either_table_kind(means, top_k, score):
    """``leaderboard`` on a DataFrame, a pyarrow Table or a mapping of arrays gives the board
    pandas's own stable descending sort gives (ties in table order), with the same tie
    groups, and all three print the same text. A DataFrame keeps its dtypes (categorical,
    nullable integer) and attrs."""
    import pandas as pd

    from engine.readout.leaderboard import format_leaderboard, leaderboard, rank_key
    from engine.readout.ranking import tie_groups

    n = len(means)
    m = np.asarray(means)
    key = "score" if score and not np.isnan(m).any() else "ability"  # a missing score: by ability
    df = pd.DataFrame({"subject": [f"s{i}" for i in range(n)], "ability_mean": m,
                       "ability_q05": m - 1.0, "ability_q95": m + 1.0,
                       "p_top1": np.linspace(0, 1, n), "accuracy": np.linspace(1, 0, n),
                       "n_responses": np.arange(n, dtype=np.int64) + 5})
    df["group"] = pd.Categorical([f"g{i % 3}" for i in range(n)])
    df["flag"] = pd.array([None if i % 4 == 1 else i for i in range(n)], dtype="Int64")
    df.attrs["note"] = "kept"
    if score:
        df["score_mean"], df["score_q05"], df["score_q95"] = -m, -m - 0.1, -m + 0.1
    want = df.assign(tie_group=tie_groups(df[f"{key}_mean"].to_numpy(), df[f"{key}_q05"].to_numpy(),
                                          df[f"{key}_q95"].to_numpy()))
    want = want.sort_values(f"{key}_mean", ascending=False, kind="stable").reset_index(drop=True)
    # equal means share the best rank among them; a NaN mean is never equal (its position)
    v = want[f"{key}_mean"].to_numpy()
    ranks = [k + 1 if np.isnan(v[k]) else 1 + int(np.sum(v[~np.isnan(v)] > v[k])) for k in range(n)]
    want.insert(0, "rank", np.asarray(ranks, np.int64))
    full_ranks = want["rank"].to_numpy()
    want = want.head(top_k) if top_k else want
    got = leaderboard(df, top_k)
    pd.testing.assert_frame_equal(got, want)  # dtypes too
    assert got.attrs["note"] == "kept"  # the frame's attrs kept (with the board's shared ranks)
    shared = sorted({int(r) for r in full_ranks if (full_ranks == r).sum() > 1})
    assert got.attrs["shared_ranks"] == shared
    # a cut inside a shared rank: only the DataFrame, which carries the whole board's
    # shared ranks, marks its last row; a Table or mapping reads the rows it has
    cut_in_tie = bool(top_k) and top_k < n and full_ranks[top_k] == full_ranks[top_k - 1]
    plain = [c for c in df.columns if c not in ("group", "flag")]  # Table and mapping: NumPy
    arrow_in = pa.Table.from_pandas(df[plain], preserve_index=False)
    columns_in = {c: df[c].to_numpy() for c in plain}
    assert rank_key(columns_in) == rank_key(arrow_in) == rank_key(df) == key
    arrow = leaderboard(arrow_in, top_k)
    assert isinstance(arrow, pa.Table)
    pd.testing.assert_frame_equal(arrow.to_pandas(), want.drop(columns=["group", "flag"]),
                                  check_dtype=False)
    if cut_in_tie:  # the same text but the DataFrame's marks of the rank the cut shares
        last = format_leaderboard(got).splitlines()
        assert last[1 + len(want)].split()[0] == f"{full_ranks[top_k - 1]}="
        assert _strip_marks(format_leaderboard(arrow)) == _strip_marks(format_leaderboard(got))
    else:
        assert format_leaderboard(arrow) == format_leaderboard(got)
    columns = leaderboard(columns_in, top_k)
    pd.testing.assert_frame_equal(pd.DataFrame(columns), want.drop(columns=["group", "flag"]),
                                  check_dtype=False)
    assert format_leaderboard(columns) == format_leaderboard(arrow)


def _strip_marks(text: str) -> list[str]:
    """A printed board without its shared-rank marks and their note line."""
    rows = [line.split() for line in text.splitlines() if not line.startswith("rank: ")]
    return [[row[0].rstrip("="), *row[1:]] if row and row[0].rstrip("=").isdigit() else row
            for row in rows]


def _column(n: int):
    """A NumPy column of length ``n`` of one of the dtypes a run table holds."""
    size = {"min_size": n, "max_size": n}
    return st.one_of(
        st.lists(st.floats(width=32), **size).map(lambda v: np.array(v, np.float32)),
        st.lists(st.floats(), **size).map(lambda v: np.array(v, np.float64)),
        st.lists(st.integers(-2**62, 2**62), **size).map(lambda v: np.array(v, np.int64)),
        st.lists(st.integers(-2**31, 2**31 - 1), **size).map(lambda v: np.array(v, np.int32)),
        st.lists(st.booleans(), **size).map(lambda v: np.array(v, bool)),
        st.lists(st.text(max_size=6), **size).map(lambda v: np.array(v, object)),
        st.lists(st.text(max_size=6), **size).map(lambda v: np.array(v, str)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), names=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5,
                                      unique=True))
def test_a_table_of_columns_reads_back_as_the_dataframe_pandas_writes(tmp_path_factory, data,
                                                                       names):
    """Run tables written from NumPy columns through their Arrow buffers (no pandas) read
    back equal to the same columns written by pandas: every dtype a run table holds,
    NaN and infinities, booleans packed to bits at any length, and any Unicode text."""
    import pandas as pd

    from engine import runfiles

    length = data.draw(st.integers(0, 20))
    cols = {name: data.draw(_column(length)) for name in names}
    tmp = tmp_path_factory.mktemp("table")
    runfiles.write_table(cols, tmp / "columns.parquet")
    runfiles.write_table(pd.DataFrame(cols), tmp / "pandas.parquet")
    got = pd.read_parquet(tmp / "columns.parquet")
    assert list(got.columns) == names and len(got) == length
    if length:  # pandas writes an empty object column as Arrow's null type, not as text
        pd.testing.assert_frame_equal(got, pd.read_parquet(tmp / "pandas.parquet"))
    for name, column in cols.items():
        # as objects: a NumPy text array would drop trailing NULs again
        want = np.array([str(x) for x in column] + [None], object)[:-1] \
            if column.dtype.kind in "OU" else column
        np.testing.assert_array_equal(got[name].to_numpy(), want)


def test_a_table_of_columns_refuses_ragged_or_nested_columns(tmp_path):
    from engine import runfiles

    with pytest.raises(ValueError, match="column 'b': shape \\(2,\\), expected \\(3,\\)"):
        runfiles.write_table({"a": np.zeros(3), "b": np.zeros(2)}, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="column 'a': shape \\(3, 2\\), expected one dimension"):
        runfiles.write_table({"a": np.zeros((3, 2))}, tmp_path / "t.parquet")
    assert not (tmp_path / "t.parquet").exists()


def test_a_leaderboard_process_imports_neither_pandas_nor_jax(tmp_path):
    """The everyday board reads the run's subjects table with pyarrow: no pandas (0.3 s of
    a 0.45 s process) and no JAX; it prints what the DataFrame board prints."""
    from engine.readout.leaderboard import format_leaderboard, leaderboard
    from engine.run import load_run, save_run

    y = (np.random.default_rng(2).random((30, 5)) < 0.6).astype(np.int8)
    save_run(engine.fit(y, model="1pl"), tmp_path / "run")
    board, imported, _ = _cli_in_a_fresh_process(["leaderboard", tmp_path / "run"],
                                                 ("pandas", "jax"))
    assert imported == "[]"
    assert "\n".join(board) == format_leaderboard(leaderboard(load_run(tmp_path / "run").subjects))


def test_a_fit_of_a_missing_store_is_refused_before_jax_is_imported(tmp_path):
    """``fit`` names a local store that is not there at once (0.04 s), not after importing
    what a fit needs (0.6 s), and writes nothing."""
    printed, imported, errors = _cli_in_a_fresh_process(
        ["fit", tmp_path / "nothing.zarr", "--out", tmp_path / "run"], ("jax", "zarr"), exit_code=2)
    assert printed == [] and imported == "[]"
    assert "nothing.zarr: no such response store; run `irt-engine ingest" in errors
    assert list(tmp_path.iterdir()) == []
