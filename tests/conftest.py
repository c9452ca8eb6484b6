"""Session-wide test settings."""

import os

# The CLI keeps compiled programs in ~/.cache between runs; tests call it in-process, where
# that would switch the cache on for every later test. Tests that want it set it themselves.
os.environ.setdefault("IRT_ENGINE_COMPILATION_CACHE", "0")
