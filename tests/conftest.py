"""Session-wide test settings."""

import os

# The CLI keeps compiled programs in ~/.cache between runs; tests call it in-process, where
# that would switch the cache on for every later test. Tests that want it set it themselves.
os.environ.setdefault("IRT_ENGINE_COMPILATION_CACHE", "0")

# gcsfs reads this once, when it is first imported (by whichever test comes first): its
# experimental bucket-type probe waits on a GCS emulator's gRPC port without end, and the
# gs:// tests run against an emulator on 127.0.0.1 (tests/cluster/gcsserver.py).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# Ray rewrites 127.0.0.1 to the machine's network address unless this is set when Ray is first
# imported, by whichever test comes first; tests talk to 127.0.0.1 only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
