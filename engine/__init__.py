"""irt-engine: Bayesian Item Response Theory for benchmark leaderboards at any scale.

The public names load on first use (PEP 562), so ``irt-engine --help`` and commands that
need neither JAX nor Dask do not pay for importing them.
"""

from engine._lazy import lazy_exports

__all__ = ["fit", "fit_nuts", "FitSettings", "FitResult", "ingest", "open_store", "write_store",
           "Store",
           "get_model", "MODELS", "save_run", "load_run", "Run", "IRTError", "response_stats",
           "posterior_tables"]
__version__ = "0.1.0"

_HOME = {"fit": "engine.api", "fit_nuts": "engine.api", "response_stats": "engine.api",
         "Store": "engine.data",
         "ingest": "engine.data", "open_store": "engine.data", "write_store": "engine.data",
         "IRTError": "engine.errors", "FitResult": "engine.infer.fit",
         "FitSettings": "engine.infer.settings", "MODELS": "engine.models",
         "get_model": "engine.models", "Run": "engine.run", "load_run": "engine.run",
         "save_run": "engine.run", "posterior_tables": "engine.run"}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
