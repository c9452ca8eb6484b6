"""irt-engine: Bayesian Item Response Theory for benchmark leaderboards at any scale."""

from engine.api import fit, response_stats
from engine.data import Store, ingest, open_store, write_store
from engine.errors import IRTError
from engine.infer.fit import FitResult
from engine.infer.settings import FitSettings
from engine.models import MODELS, get_model
from engine.run import Run, load_run, save_run

__all__ = ["fit", "FitSettings", "FitResult", "ingest", "open_store", "write_store", "Store",
           "get_model", "MODELS", "save_run", "load_run", "Run", "IRTError", "response_stats"]
__version__ = "0.1.0"
