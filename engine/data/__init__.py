"""Response data: ingest input files into a zarr v3 store, open stores, and block sources."""

from engine.data.blocks import Block, BlockSource, InMemorySource
from engine.data.ingest import FORMATS, ingest
from engine.data.sparse import SparseSource
from engine.data.store import (KINDS, LAYOUTS, SPARSE_DENSITY, ResponseKind, Store, open_store,
                               store_checksum, write_store)
from engine.data.streaming import StreamingSource, prefetch
from engine.data.writer import DenseWriter, SparseWriter

__all__ = ["Block", "BlockSource", "DenseWriter", "FORMATS", "InMemorySource", "KINDS", "LAYOUTS",
           "ResponseKind", "SPARSE_DENSITY", "SparseSource", "SparseWriter", "Store",
           "StreamingSource", "ingest", "open_store", "prefetch", "store_checksum", "write_store"]
