"""`irt-engine submit`: what it ships and refuses, and how it finds a token (no cluster needed;
tests/cluster/test_token_cluster.py submits to a real one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.auth import ClusterAuthError, find_token, is_auth_failure, missing_token_message
from cluster.shipping import excluded_reason, plan_paths, stage, stage_code
from cluster.submit import entrypoint
from engine.errors import SettingsError


def test_entrypoint_runs_the_shipped_cli():
    assert entrypoint(["irt-engine", "fit", "s", "--out", "r x"], "/usr/bin/python3") == \
        "/usr/bin/python3 -m engine.cli fit s --out 'r x'"
    with pytest.raises(SettingsError, match="nothing to submit"):
        entrypoint([])
    with pytest.raises(SettingsError, match="cannot itself be"):
        entrypoint(["submit", "--", "fit"])


def test_submit_to_no_job_server_is_a_clear_error(capsys, tmp_path, monkeypatch):
    from engine.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["submit", "--address", "http://127.0.0.1:9", "--", "fit", "/s", "--out",
                 "/r"]) == 2
    assert "no Ray job server at http://127.0.0.1:9" in capsys.readouterr().err


@pytest.fixture
def project(tmp_path):
    """A working folder with a store, secrets beside and inside it, and links leading out."""
    root = tmp_path / "proj"
    (root / "store.zarr" / "responses").mkdir(parents=True)
    (root / "store.zarr" / "zarr.json").write_text("{}")
    (root / "store.zarr" / "responses" / "c0").write_bytes(b"x" * 1000)
    (root / "store.zarr" / ".zattrs").write_text("{}")
    (root / "store.zarr" / "credentials.json").write_text("{}")
    (root / ".env").write_text("SECRET=1\n")
    (root / ".ssh").mkdir()
    (root / ".ssh" / "id_ed25519").write_text("key")
    (root / "id_rsa").write_text("key")
    (root / "aws.pem").write_text("key")
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    os.symlink(outside, root / "store.zarr" / "leak")
    os.symlink(root / "store.zarr" / "zarr.json", root / "store.zarr" / "inside")
    os.symlink(tmp_path, root / "up")
    return root


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_only_named_inputs_are_shipped_without_secrets_or_links_out(project, tmp_path):
    plan = plan_paths(["fit", "store.zarr", "--out", "/shared/run"], cwd=project)
    assert plan.relative == ["store.zarr"] and plan.in_place == []
    staged = stage(plan, tmp_path / "ship")
    assert _files(staged) == {"store.zarr/zarr.json", "store.zarr/responses/c0",
                              "store.zarr/inside"}
    assert not any(p.is_symlink() for p in staged.rglob("*"))
    assert (staged / "store.zarr" / "inside").read_text() == "{}"  # a link inside: copied
    assert plan.files == 3 and plan.bytes == 1004
    assert plan.skipped == {"dot-files": ["store.zarr/.zattrs"],
                            "credentials": ["store.zarr/credentials.json"],
                            "symlinks leading outside": ["store.zarr/leak"]}
    line = plan.describe((10, 2048))
    assert line.startswith("shipping 3 files, 1004 B (store.zarr) and irt-engine's code "
                           "(10 files, 2.0 KiB); not shipped:"), line


def test_working_dir_ships_the_folder_filtered(project, tmp_path):
    plan = plan_paths(["fit", "store.zarr", "--out", "/shared/run"], cwd=tmp_path,
                      working_dir=project)
    staged = stage(plan, tmp_path / "ship")
    assert _files(staged) == {"store.zarr/zarr.json", "store.zarr/responses/c0",
                              "store.zarr/inside"}
    assert set(plan.skipped["dot-files"]) == {".env", ".ssh", "store.zarr/.zattrs"}
    assert set(plan.skipped["credentials"]) == {"id_rsa", "aws.pem",
                                                "store.zarr/credentials.json"}
    assert set(plan.skipped["symlinks leading outside"]) == {"up", "store.zarr/leak"}


def test_absolute_and_url_inputs_are_used_in_place(project):
    plan = plan_paths(["ingest", "/data/a.csv", "s3://bucket/b.csv", "--out", "s3://bucket/s"],
                      cwd=project)
    assert plan.relative == [] and plan.in_place == ["/data/a.csv", "s3://bucket/b.csv"]


@pytest.mark.parametrize("command, message", [
    (["fit", "store.zarr", "--out", "run"],
     "--out run is a relative path: on the cluster it would be written inside the job's "
     "temporary working directory"),
    (["fit", "missing.zarr", "--out", "/r"], "store missing.zarr does not exist in"),
    (["fit", "../outside.txt", "--out", "/r"], "store ../outside.txt lies outside"),
    (["fit", "up/outside.txt", "--out", "/r"], "leads through a symlink to"),
    (["fit", ".env", "--out", "/r"], "store .env: .env is a dot-file, which submit never ships"),
    (["fit", "aws.pem", "--out", "/r"], "aws.pem is a credential"),
    (["report", "store.zarr", "--out", "/r.html", "--stability", "st"],
     "--stability st does not exist"),
    (["fit", "--nope"], "the submitted command `fit --nope` is not valid"),
])
def test_bad_paths_are_refused_before_submission(project, command, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        plan_paths(command, cwd=project)


def test_inputs_beyond_the_limit_are_refused(project, tmp_path):
    plan = plan_paths(["fit", "store.zarr", "--out", "/r"], cwd=project)
    with pytest.raises(SettingsError, match=r"exceed 500 B .*absolute paths \(or URLs\)"):
        stage(plan, tmp_path / "ship", max_bytes=500)


def test_code_is_shipped_without_caches(tmp_path):
    dirs, (files, size) = stage_code(tmp_path)
    assert [Path(d).name for d in dirs] == ["engine", "cluster"]
    shipped = _files(tmp_path)
    assert "engine/cli.py" in shipped and "cluster/submit.py" in shipped
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in shipped)
    assert files == len(shipped) and size > 10_000


@pytest.mark.parametrize("name, reason", [
    (".env", "dot-file"), (".git", "dot-file"), ("id_rsa", "credential"),
    ("id_ed25519.pub", "credential"), ("server.key", "credential"),
    ("gcp-credentials.json", "credential"), ("store.zarr", None), ("zarr.json", None),
    ("responses.csv", None),
])
def test_excluded_names(name, reason):
    assert excluded_reason(name) == reason


def test_token_lookup_order_and_messages(tmp_path):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    none = find_token({}, home)
    assert none.value is None and none.looked == (
        "RAY_AUTH_TOKEN: unset", "RAY_AUTH_TOKEN_PATH: unset",
        f"{home}/.ray/auth_token: no such file")
    msg = missing_token_message("http://127.0.0.1:8275", none)
    assert msg.startswith("the Ray cluster at http://127.0.0.1:8275 requires an authentication "
                          "token and none was found (looked in RAY_AUTH_TOKEN: unset;")
    assert "ray get-auth-token" in msg and "\n" not in msg
    (home / ".ray" / "auth_token").write_text("from-home\n")
    assert find_token({}, home).value == "from-home"
    (tmp_path / "tok").write_text("from-path\n")
    assert find_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "tok")}, home).value == "from-path"
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "tok")}
    tok = find_token(env, home)
    assert (tok.value, tok.source) == ("from-env", "RAY_AUTH_TOKEN")
    assert tok.header() == {"Authorization": "Bearer from-env"}
    assert "rejected the authentication token from RAY_AUTH_TOKEN" in \
        missing_token_message("x", tok)
    with pytest.raises(ClusterAuthError, match=r"RAY_AUTH_TOKEN_PATH=.*missing cannot be read"):
        find_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}, home)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ClusterAuthError, match=r"RAY_AUTH_TOKEN_PATH=.*empty is empty"):
        find_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "empty")}, home)


def test_auth_failures_are_found_through_the_exception_chain():
    from ray.exceptions import AuthenticationError

    try:
        try:
            raise AuthenticationError("RPC error: InvalidAuthToken")
        except AuthenticationError as inner:
            raise ConnectionError("Failed to connect to Ray cluster") from inner
    except ConnectionError as err:
        assert is_auth_failure(err)
    assert not is_auth_failure(ConnectionError("refused"))
