"""The store's item side table from evaluation logs: where each item came from and what it was.

``item_info.parquet`` inside the store holds one row per item, taken from the first line
(or entry, or sample) that showed the item: ``item`` (the store's item id), ``group`` (its
evaluation or task), ``file`` and ``line`` (where to look it up in the logs), and what the
format carries about the sample: ``sample_id``, ``sample_hash`` (Every Eval Ever
``sample_hash``, lm-eval ``doc_hash``), ``input_sha256`` (SHA-256 of the sample's input as
canonical JSON: sorted keys, no spaces, UTF-8), ``input_preview`` (its first
``PREVIEW_CHARS`` characters: ``input.raw`` or the text, else the canonical JSON) and
``metadata`` (canonical JSON of the sample's metadata when at most ``METADATA_CHARS``
characters long, else ``"sha256:<hex>"`` of it). The input itself is not stored, so each
row is bounded (about 2.5 KB at most) whatever the inputs' length; rows are streamed to the
file as items first appear, never held for the whole input.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ITEM_INFO", "ItemTable", "METADATA_CHARS", "PREVIEW_CHARS", "describe_sample",
           "read_item_info"]

ITEM_INFO = "item_info.parquet"
PREVIEW_CHARS, METADATA_CHARS, _ID_CHARS = 200, 2000, 200
_TEXT = ("sample_id", "sample_hash", "input_sha256", "input_preview", "metadata")
SCHEMA = pa.schema([("item", pa.string()), ("group", pa.string()), ("file", pa.string()),
                    ("line", pa.int64()), *[(name, pa.string()) for name in _TEXT]])


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _short_id(value) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else _canonical(value)
    return text[:_ID_CHARS]


def describe_sample(*, sample_id=None, sample_hash=None, input=None, metadata=None) -> dict:
    """The side-table columns of one sample (see the module doc); ``None`` where absent."""
    row = {"sample_id": _short_id(sample_id), "sample_hash": _short_id(sample_hash),
           "input_sha256": None, "input_preview": None, "metadata": None}
    if input is not None:
        text = _canonical(input)
        row["input_sha256"] = _sha256(text)
        raw = input.get("raw") if isinstance(input, dict) else input
        row["input_preview"] = (raw if isinstance(raw, str) else text)[:PREVIEW_CHARS]
    if metadata is not None:
        text = _canonical(metadata)
        row["metadata"] = text if len(text) <= METADATA_CHARS else "sha256:" + _sha256(text)
    return row


class ItemTable:
    """Streams side-table rows to ``path`` (a Parquet file), a batch per ``add``."""

    def __init__(self, path: Path):
        self.path, self.writer, self.rows = Path(path), None, 0

    def add(self, rows: list[dict]) -> None:
        if not rows:
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, SCHEMA)
        columns = {name: [r.get(name) for r in rows] for name in SCHEMA.names}
        self.writer.write_table(pa.table(columns, schema=SCHEMA))
        self.rows += len(rows)

    def close(self) -> Path | None:
        """Close the file; its path, or None when no row was written."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        return self.path if self.rows else None


def read_item_info(store, items=None):
    """The item side table of a store (a pandas DataFrame indexed by item id), or of only the
    ``items`` given; raises ``DataFormatError`` when the store has none (it was not ingested
    from evaluation logs)."""
    from engine.errors import DataFormatError

    path = Path(store.path if hasattr(store, "path") else store) / ITEM_INFO
    if not path.is_file():
        raise DataFormatError(f"{path.parent}: no {ITEM_INFO}; item details are kept only for "
                              f"evaluation logs (ingest them again with this version)")
    filters = None if items is None else [("item", "in", list(items))]
    return pq.read_table(path, filters=filters).to_pandas().set_index("item")
