"""A GCS emulator on 127.0.0.1 for tests: ``gcp-storage-emulator`` in its own process.

The server binds 127.0.0.1 only and keeps its objects in memory. :meth:`GCSServer.env` is the
environment a user of an emulator would set: ``STORAGE_EMULATOR_HOST`` (gcsfs then talks to
it without credentials), no GCE metadata probe, and gcsfs's experimental bucket-type probe
(a gRPC call that waits 60 s on an emulator) off.
"""

from __future__ import annotations

import os

from tests.cluster.s3server import LoopbackServer

SERVER = ("import sys, time\n"
          "from gcp_storage_emulator.server import create_server\n"
          "create_server('127.0.0.1', int(sys.argv[1]), in_memory=True).start()\n"
          "print('ready', flush=True)\n"
          "while True: time.sleep(3600)\n")


class GCSServer(LoopbackServer):
    """``gcp-storage-emulator`` on 127.0.0.1:PORT."""

    SCRIPT = SERVER
    NAME = "GCS emulator"

    def env(self, base: dict | None = None) -> dict:
        """``base`` (default os.environ) plus this emulator's endpoint and no other GCP
        address: no credentials file, no metadata server."""
        env = {k: v for k, v in dict(os.environ if base is None else base).items()
               if k != "GOOGLE_APPLICATION_CREDENTIALS"}
        env.update(STORAGE_EMULATOR_HOST=self.endpoint, NO_GCE_CHECK="true",
                   GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9",
                   GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false", GCSFS_DEFAULT_PROJECT="test",
                   AWS_EC2_METADATA_DISABLED="true")
        return env

    def filesystem(self):
        import gcsfs

        return gcsfs.GCSFileSystem(token="anon", endpoint_url=self.endpoint, project="test",
                                   skip_instance_cache=True)

    def objects(self, prefix: str) -> list[str]:
        fs = self.filesystem()
        try:
            return sorted(fs.find(prefix))
        except FileNotFoundError:
            return []
