"""Wrong credentials against an S3 server that checks them: moto on 127.0.0.1 with IAM
authentication enforced (``INITIAL_NO_AUTH_ACTION_COUNT=3``: the first three requests create an
IAM user, its policy and its access key; every later request must be signed by a known key).

A wrong secret and an unknown key id each give one clear line, exit 2, and write nothing
(neither at the URL nor locally); the right key works against the same server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("moto")
pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")

from tests.cluster.conftest import simulate_2pl  # noqa: E402
from tests.cluster.s3server import S3Server  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", ' \
         '"Resource": "*"}]}'


@pytest.fixture(scope="module")
def s3_auth():
    saved = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"  # the server process inherits it
    try:
        server = S3Server()
    finally:
        if saved is None:
            os.environ.pop("INITIAL_NO_AUTH_ACTION_COUNT")
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = saved
    try:
        env = server.env({})
        iam = boto3.client("iam", region_name="us-east-1", endpoint_url=server.endpoint,
                           aws_access_key_id="x", aws_secret_access_key="x")
        iam.create_user(UserName="irt")
        iam.put_user_policy(UserName="irt", PolicyName="s3", PolicyDocument=POLICY)
        key = iam.create_access_key(UserName="irt")["AccessKey"]
        server.key, server.secret = key["AccessKeyId"], key["SecretAccessKey"]
        server.base_env = dict(env, AWS_ACCESS_KEY_ID=server.key,
                               AWS_SECRET_ACCESS_KEY=server.secret)
        import s3fs

        server.fs = s3fs.S3FileSystem(key=server.key, secret=server.secret,
                                      endpoint_url=server.endpoint, skip_instance_cache=True)
        server.fs.mkdir("bkt")
        yield server
    finally:
        server.stop()


def _cli(*args, env, cwd) -> subprocess.CompletedProcess:
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)],
                          env=dict(os.environ, **env, PYTHONPATH=str(REPO),
                                   TMPDIR=str(cwd / "tmp")),
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def _objects(s3, prefix="bkt") -> list[str]:
    s3.fs.invalidate_cache()
    return sorted(s3.fs.find(prefix))


def test_wrong_keys_are_one_line_and_write_nothing(s3_auth, tmp_path):
    y = simulate_2pl(10, 8, seed=2)
    df = pd.DataFrame(y, columns=[f"q{i}" for i in range(8)])
    df.insert(0, "system", [f"s{i}" for i in range(10)])
    df.to_csv(tmp_path / "r.csv", index=False)
    good = s3_auth.base_env
    assert _cli("ingest", tmp_path / "r.csv", "--out", "s3://bkt/store.zarr", env=good,
                cwd=tmp_path).returncode == 0
    before = _objects(s3_auth)
    assert "bkt/store.zarr/zarr.json" in before
    wrong_secret = dict(good, AWS_SECRET_ACCESS_KEY="not-the-secret")
    unknown_key = dict(good, AWS_ACCESS_KEY_ID="AKIAUNKNOWNKEY000000")
    for env, code in [(wrong_secret, "SignatureDoesNotMatch"), (unknown_key, "InvalidAccess")]:
        for cmd in (["ingest", tmp_path / "r.csv", "--out", "s3://bkt/other.zarr"],
                    ["fit", "s3://bkt/store.zarr", "--out", "s3://bkt/run", "--quiet"],
                    ["leaderboard", "s3://bkt/run"]):
            res = _cli(*cmd, env=env, cwd=tmp_path)
            assert res.returncode == 2, (cmd, res.stdout, res.stderr[-2000:])
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1, (cmd, res.stderr[-2000:])
            assert "access denied" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0], lines[0]
            assert code in lines[0] or "Forbidden" in lines[0], lines[0]
    assert _objects(s3_auth) == before  # nothing written at the URL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "tmp"]
    assert not list((tmp_path / "tmp").iterdir())  # nothing left locally
