"""Text bound for a terminal: control characters in ids are shown as escapes, never obeyed."""

from __future__ import annotations

import re

__all__ = ["escape_controls", "EscapedStream"]

# C0 controls but newline and tab, DEL, C1 controls, and the bidi embeddings/overrides/isolates
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with each control character as its Python escape (ESC -> ``\\x1b``, CR ->
    ``\\r``), as ``ls -b`` does: a subject id cannot clear the screen, retitle the terminal
    or overwrite a leaderboard row."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


class EscapedStream:
    """A text stream that escapes control characters on their way to ``raw``."""

    def __init__(self, raw):
        self._raw = raw

    def write(self, text: str) -> int:
        self._raw.write(escape_controls(text))
        return len(text)

    def __getattr__(self, name):
        return getattr(self._raw, name)
