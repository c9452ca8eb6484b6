"""Response kinds: binary, unit scores in [0, 1], non-negative errors.

Binary responses are stored as int8 with ``-1`` missing; continuous ones as float32 with
NaN missing. A kind is detected from the values and can be overridden; a value outside
the kind's support is an error naming its row and column, never clipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.data.blocks import InMemorySource
from engine.data.tally import observed
from engine.errors import DataFormatError

__all__ = ["KINDS", "KIND_MEANING", "detect_kind", "kind_note", "check_kind", "as_responses", "FloatInMemorySource",
           "source_for", "boundary_counts"]

KINDS = ("binary", "unit", "nonnegative")

# Which data kinds a model of a given kind can read (binary scores are unit scores too).
READS = {"binary": ("binary",), "unit": ("binary", "unit"),
         "nonnegative": ("binary", "unit", "nonnegative")}


def detect_kind(y: np.ndarray) -> str:
    """Smallest kind holding every observed value of ``y`` (int8 -1 / NaN missing)."""
    values = y[observed(y)]
    if values.size == 0 or np.isin(values, (0, 1)).all():
        return "binary"
    if values.min() >= 0 and values.max() <= 1:
        return "unit"
    return "nonnegative"


# what a kind means to a model that reads it, for notes and errors
KIND_MEANING = {"binary": "0/1, 1 = right", "unit": "a score in [0, 1], higher is better",
                "nonnegative": "an error >= 0, lower is better"}


def kind_note(y: np.ndarray, items, kind: str) -> str | None:
    """A note where the values suggest that ``kind`` (not binary) is not what the data
    mean, or None: most item columns hold only 0/1 and a few others hold other values (a
    demographic or count column read as an item), or every response is a whole number and
    most columns hold a few values (ratings, chosen options or 1/2 codes, which the
    non-negative kind would read as errors). ``y``: float, NaN missing; ``items``: the
    column names. Read a block of columns at a time (no copy of ``y`` is held)."""
    if kind == "binary" or y.size == 0:
        return None
    binary, whole, distinct, low, high = _columns(y)
    n = y.shape[1]
    if binary.all():  # 0/1 data given another kind (--kind): the kind is the user's word
        return None
    if 0 < (~binary).sum() <= n / 2:
        other = np.flatnonzero(~binary)
        names = [str(items[j]) for j in other]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        column = y[:, other[0]]
        example = column[~np.isnan(column) & ~np.isin(column, (0, 1))][0]
        return (f"kind {kind}: {int(binary.sum())} of {n} item columns hold only 0/1, and "
                f"{shown} {'holds' if len(names) == 1 else 'hold'} other values (e.g. "
                f"{example:g} in {names[0]}); if {'it is' if len(names) == 1 else 'they are'} "
                f"not an item (a demographic, a count), drop it and ingest again: the "
                f"responses are then binary")
    small = (distinct <= 12) & (distinct > 0)
    if kind != "nonnegative" or not whole.all() or small.sum() < n / 2:
        return None
    note = (f"kind {kind}: every response is a whole number, and {int(small.sum())} of {n} item "
            f"columns hold at most 12 values (from {low[small].min():g} to "
            f"{high[small].max():g}), which a model of this kind reads as "
            f"{KIND_MEANING[kind]}; if they are ratings, chosen options or 1/2 codes, recode "
            f"them to 0/1 (e.g. 1/2 to 0/1, or agree = 1) and ingest again")
    wide = np.flatnonzero(distinct > 12)
    if wide.size:
        names = [str(items[j]) for j in wide]
        note += (f"; {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"
                 f" {'holds' if len(names) == 1 else 'hold'} a wider range (up to "
                 f"{high[wide[0]]:g} in {names[0]}): if {'it is' if len(names) == 1 else 'they are'}"
                 f" not an item (a demographic, a count), drop it")
    return note


def _columns(y: np.ndarray, block: int = 4096) -> tuple[np.ndarray, ...]:
    """Per column of ``y`` (float, NaN missing): whether every observed value is 0 or 1,
    whether every one is a whole number, the number of distinct observed values, and the
    smallest and largest (NaN where none); a block of columns sorted at a time."""
    n = y.shape[1]
    binary, whole = np.ones(n, bool), np.ones(n, bool)
    distinct = np.zeros(n, np.int64)
    low, high = np.full(n, np.nan), np.full(n, np.nan)
    for j in range(0, n, block):
        part = np.sort(y[:, j:j + block], axis=0)  # NaN last
        seen = ~np.isnan(part)
        count = seen.sum(axis=0)
        some = count > 0
        cols = slice(j, j + part.shape[1])
        binary[cols] = np.where(seen, (part == 0) | (part == 1), True).all(axis=0)
        whole[cols] = np.where(seen, part == np.round(part), True).all(axis=0)
        distinct[cols] = np.where(some, np.sum(np.diff(part, axis=0) > 0, axis=0) + 1, 0)
        low[cols] = np.where(some, part[0], np.nan)
        high[cols] = np.where(some, part[np.maximum(count - 1, 0), np.arange(part.shape[1])],
                              np.nan)
    return binary, whole, distinct, low, high


def _first_bad(bad: np.ndarray, y: np.ndarray, what: str, name: str, fix: str) -> DataFormatError:
    r, c = np.argwhere(bad)[0]
    return DataFormatError(f"{name} row {r}, column {c}: got {y[r, c].item()!r}; expected {what}. "
                           f"{int(bad.sum())} such value(s); {fix}")


def check_kind(y: np.ndarray, kind: str, name: str = "responses") -> None:
    """Raise ``DataFormatError`` at the first value outside ``kind``'s support."""
    if kind not in KINDS:
        raise DataFormatError(f"unknown response kind {kind!r}; use one of {', '.join(KINDS)}")
    obs = observed(y)
    if np.issubdtype(y.dtype, np.floating):
        bad = obs & ~np.isfinite(y)
        if bad.any():
            raise _first_bad(bad, y, "a finite number or NaN (missing)", name, "mark missing cells NaN")
    if kind == "binary":
        bad = obs & ~np.isin(y, (0, 1))
        what = "0, 1 or missing"
    elif kind == "unit":
        bad = obs & ((y < 0) | (y > 1))
        what = "a score in [0, 1] or missing"
    else:
        bad = obs & (y < 0)
        what = "a non-negative error or missing"
    if bad.any():
        raise _first_bad(bad, y, what, name,
                         "rescale the scores or choose another kind/model")


def as_responses(y: np.ndarray, kind: str | None = None, name: str = "responses") -> tuple[np.ndarray, str]:
    """Validate and convert an in-memory matrix: int8 (-1 missing) for binary, float32 (NaN) else.

    Integer input keeps the ``-1`` missing sentinel; float input uses NaN.
    """
    y = np.asarray(y)
    if y.ndim != 2:
        raise DataFormatError(f"{name} must be a 2-D subjects x items array, got shape {y.shape}")
    if 0 in y.shape:
        raise DataFormatError(f"{name} has shape {y.shape}: no subjects or no items to fit")
    if y.dtype == bool:
        y = y.astype(np.int8)
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):  # text, objects
        y = _as_numbers(y, name)
    if not np.issubdtype(y.dtype, np.floating):
        if (y < -1).any():
            r, c = np.argwhere(y < -1)[0]
            raise DataFormatError(f"{name} row {r}, column {c}: got {y[r, c]}; integer responses "
                                  "must be 0, 1 or -1 (missing); pass floats with NaN for scores")
        y = np.where(y < 0, np.nan, y.astype(np.float64)) if (y > 1).any() else y
    detected = detect_kind(y)
    kind = kind or detected
    check_kind(y, kind, name)
    if kind == "binary":
        obs = observed(y)
        return np.where(obs, np.nan_to_num(y), -1).astype(np.int8), kind
    return np.where(observed(y), y, np.nan).astype(np.float32), kind


def _as_numbers(y: np.ndarray, name: str) -> np.ndarray:
    """An object or text matrix as numbers: int64 with -1 missing where every value is a whole
    number (as an int matrix reads), else float64 with NaN missing; None and pandas' NA are
    missing. A cell that is not a number is an error naming it."""
    try:
        out = y.astype(np.float64)  # None -> NaN; fast where every cell is a number
        if y.dtype.kind in "US":  # numpy parses text numbers; text is not a response
            raise ValueError
    except (TypeError, ValueError):
        out = np.empty(y.shape, np.float64)
        for (r, c), v in np.ndenumerate(y):
            if v is None or (not isinstance(v, (str, bytes)) and _is_na(v)):
                out[r, c] = np.nan
            elif isinstance(v, (bool, np.bool_, int, float, np.integer, np.floating)):
                out[r, c] = float(v)
            else:
                shown = repr(str(v)) if isinstance(v, str) else repr(v)
                raise DataFormatError(f"{name} row {r}, column {c}: got {shown}; expected a number "
                                      f"(or None / NaN for missing)") from None
    finite = np.isfinite(out)
    if np.array_equal(out[finite], np.round(out[finite])):  # whole numbers: -1 is missing
        return np.where(finite, out, -1).astype(np.int64)
    return out


def _is_na(v) -> bool:
    try:
        return bool(v != v) or type(v).__name__ in ("NAType", "NaTType")
    except TypeError:  # pandas.NA compares to NA
        return True


def boundary_counts(y: np.ndarray) -> dict[str, int]:
    """Observed cells exactly at 0 and at 1."""
    obs = observed(y)
    return {"zeros": int((obs & (y == 0)).sum()), "ones": int((obs & (y == 1)).sum())}


@dataclass
class FloatInMemorySource(InMemorySource):
    """Tiles of a float32 response matrix, NaN missing (padding is NaN too)."""

    dtype = np.float32


def source_for(y: np.ndarray, max_block_cells: int) -> InMemorySource:
    """The in-memory block source matching ``y``'s storage (int8 or float32)."""
    if np.issubdtype(y.dtype, np.floating):
        return FloatInMemorySource(y, max_block_cells=max_block_cells)
    return InMemorySource(y, max_block_cells=max_block_cells)
