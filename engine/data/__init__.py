"""Response data: ingest input files into a zarr v3 store, open stores, and block sources."""

from engine._lazy import lazy_exports

__all__ = ["Block", "BlockSource", "DenseWriter", "FORMATS", "InMemorySource", "KINDS", "LAYOUTS",
           "ResponseKind", "SPARSE_DENSITY", "SparseSource", "SparseWriter", "Store",
           "StreamingSource", "ingest", "open_store", "prefetch", "store_checksum", "write_store"]

_HOMES = {
    'Block': 'engine.data.blocks',
    'BlockSource': 'engine.data.blocks',
    'DenseWriter': 'engine.data.writer',
    'FORMATS': 'engine.data.ingest',
    'InMemorySource': 'engine.data.blocks',
    'KINDS': 'engine.data.store',
    'LAYOUTS': 'engine.data.store',
    'ResponseKind': 'engine.data.store',
    'SPARSE_DENSITY': 'engine.data.store',
    'SparseSource': 'engine.data.sparse',
    'SparseWriter': 'engine.data.writer',
    'Store': 'engine.data.store',
    'StreamingSource': 'engine.data.streaming',
    'ingest': 'engine.data.ingest',
    'open_store': 'engine.data.store',
    'prefetch': 'engine.data.streaming',
    'store_checksum': 'engine.data.store',
    'write_store': 'engine.data.store',
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
