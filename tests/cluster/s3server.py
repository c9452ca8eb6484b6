"""An S3-compatible object store on 127.0.0.1 for tests: moto's server in its own process.

The server binds 127.0.0.1 only. :func:`s3_env` is the environment a user would set
(credentials, endpoint URL, no instance-metadata lookups), so every process the tests start
reaches this server and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

from tests.cluster.raycluster import free_port

SERVER = ("import sys, time\n"
          "from moto.server import ThreadedMotoServer\n"
          "ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1])).start()\n"
          "print('ready', flush=True)\n"
          "while True: time.sleep(3600)\n")


class LoopbackServer:
    """A server script run in its own process on 127.0.0.1:PORT (``SCRIPT`` gets the port as
    its argument), ready once the port accepts connections; started and stopped by its owner."""

    SCRIPT = SERVER
    NAME = "moto server"

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.NAME} exited at start")
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.NAME} did not start")

    def make_bucket(self, name: str) -> str:
        self.filesystem().mkdir(name)
        return name

    @contextlib.contextmanager
    def serving(self, bucket: str):
        """This server with ``bucket`` made and its endpoint (``env``) in this process's
        environment, for in-process calls (gcsfs reads it when first imported); afterwards
        the environment is restored and the server stopped."""
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env(saved))
        try:
            self.make_bucket(bucket)
            yield self
        finally:
            os.environ.clear()
            os.environ.update(saved)
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class S3Server(LoopbackServer):
    """``moto`` in server mode on 127.0.0.1:PORT."""

    def env(self, base: dict | None = None) -> dict:
        """``base`` (default os.environ) plus credentials and this endpoint."""
        env = dict(os.environ if base is None else base)
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=self.endpoint,
                   AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                   AWS_CONFIG_FILE=os.devnull)
        return env

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.endpoint,
                                 skip_instance_cache=True)

    def objects(self, prefix: str) -> list[str]:
        fs = self.filesystem()
        return sorted(fs.find(prefix)) if fs.exists(prefix.split("/")[0]) else []
