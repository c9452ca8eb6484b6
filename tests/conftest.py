"""Session-wide test settings."""

import atexit
import os
import shutil
import tempfile

# One persistent compilation cache for the whole session, in a temporary folder removed at
# its end: every test, xdist worker and process a test starts (CLI, kill -9, Ray workers)
# inherits it, so a program compiled once (the same model at the same bucketed shape) is
# loaded by the next test instead of compiled again. Never ~/.cache: the CLI's default folder
# stays untouched. Tests of the cache itself give their processes folders of their own.
_SESSION_CACHE = "IRT_ENGINE_TEST_SESSION_CACHE"
if _SESSION_CACHE not in os.environ:  # the first process of the session (xdist's controller)
    os.environ[_SESSION_CACHE] = tempfile.mkdtemp(prefix="irt-engine-test-jax-")
    atexit.register(shutil.rmtree, os.environ[_SESSION_CACHE], True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_SESSION_CACHE]
os.environ["IRT_ENGINE_COMPILATION_CACHE"] = "1"

# gcsfs reads this once, when it is first imported (by whichever test comes first): its
# experimental bucket-type probe waits on a GCS emulator's gRPC port without end, and the
# gs:// tests run against an emulator on 127.0.0.1 (tests/cluster/gcsserver.py).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# Ray rewrites 127.0.0.1 to the machine's network address unless this is set when Ray is first
# imported, by whichever test comes first; tests talk to 127.0.0.1 only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
