"""Response data: ingest input files into a zarr v3 store and open stores."""

from engine.data.ingest import FORMATS, ingest
from engine.data.store import KINDS, ResponseKind, Store, open_store, store_checksum, write_store

__all__ = ["FORMATS", "KINDS", "ResponseKind", "Store", "ingest", "open_store", "store_checksum",
           "write_store"]
