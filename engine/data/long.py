"""The streaming long-format reader, under its older name: see ``engine.data.formats.long``."""

from engine.data.formats.long import (DEFAULT_BUDGET, LongTable, append_by_band, band_file,
                                      ingest_long)

__all__ = ["DEFAULT_BUDGET", "LongTable", "append_by_band", "band_file", "ingest_long"]
