"""Ids with control characters reach the terminal as literal escapes."""

import re

from hypothesis import given, settings, strategies as st

from engine.cli import main
from engine.terminal import escape_controls

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@settings(max_examples=300, derandomize=True)
@given(st.text())
def test_escaped_text_has_no_controls_and_keeps_the_rest(text):
    out = escape_controls(text)
    assert not CONTROL.search(out)
    if not CONTROL.search(text):
        assert out == text
    # every control becomes its Python escape, and nothing else changes
    assert out == "".join(repr(c)[1:-1] if CONTROL.match(c) else c for c in text)


def test_known_escapes():
    assert escape_controls("\x1b[2Jx\ry\u202e") == "\\x1b[2Jx\\ry\\u202e"
    assert escape_controls("a\tb\nc") == "a\tb\nc"


def test_leaderboard_prints_ids_escaped(tmp_path, capsys):
    csv = tmp_path / "r.csv"
    csv.write_text('subject,q1,q2,q3\n"\x1b[2Jevil",1,0,1\n"a\rb",0,1,1\nplain,1,1,0\n'
                   '"\x1b]0;title\x07x",0,0,1\n')
    assert main(["ingest", str(csv), "--out", str(tmp_path / "s")]) == 0
    assert main(["fit", str(tmp_path / "s"), "--out", str(tmp_path / "r"), "--quiet", "--model", "1pl",
                 "--max-passes", "10", "--draws", "50"]) == 0
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert not CONTROL.search(out)
    assert "\\x1b[2Jevil" in out and "a\\rb" in out and "\\x1b]0;title\\x07x" in out
    rows = out.splitlines()[2:6]
    assert len({len(r) for r in rows}) == 1  # columns stay aligned
