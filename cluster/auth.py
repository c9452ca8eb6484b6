"""Ray token authentication: find the cluster's token, send it, and explain when it is missing.

Ray 2.60 clusters started with ``ray start`` may require a token (token authentication, on
whenever the head found one or ran with ``RAY_AUTH_MODE=token``). A client sends one only when
its own process runs in token mode, so irt-engine looks the token up itself, in Ray's order:
``RAY_AUTH_TOKEN``, the file named by ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``.

A local Ray that irt-engine starts for itself gets a fresh random token held only in its
processes' environment, so nothing is written to ``~/.ray`` and Ray prints no token warning.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from engine.errors import IRTError

__all__ = ["ClusterAuthError", "Token", "find_token", "token_env", "ephemeral_token_env",
           "is_auth_failure", "missing_token_message"]


class ClusterAuthError(IRTError, PermissionError):
    """The cluster wants a token that was not found, or refused the one sent."""


@dataclass(frozen=True)
class Token:
    """A token (``value`` ``None`` when none was found), where it came from, and every place
    looked at, each with what was found there."""

    value: str | None
    source: str | None
    looked: tuple[str, ...]

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"} if self.value else {}


def find_token(environ: Mapping[str, str] | None = None, home: str | Path | None = None) -> Token:
    """The Ray token from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``.

    Raises
    ------
    ClusterAuthError when ``RAY_AUTH_TOKEN_PATH`` names a file that cannot be read or is empty
    (Ray itself would then fail with a less clear message).
    """
    environ = os.environ if environ is None else environ
    home = Path(home) if home is not None else Path.home()
    looked = []
    value = environ.get("RAY_AUTH_TOKEN", "").strip()
    if value:
        return Token(value, "RAY_AUTH_TOKEN", ("RAY_AUTH_TOKEN: set",))
    looked.append("RAY_AUTH_TOKEN: unset")
    path = environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if path:
        try:
            value = Path(path).expanduser().read_text().strip()
        except OSError as err:
            raise ClusterAuthError(
                f"RAY_AUTH_TOKEN_PATH={path} cannot be read ({err.strerror}); point it at the "
                "file holding the cluster's token (`ray get-auth-token` on the head prints it)"
            ) from None
        if not value:
            raise ClusterAuthError(f"RAY_AUTH_TOKEN_PATH={path} is empty; put the cluster's token "
                                   "in it (`ray get-auth-token` on the head prints it)")
        return Token(value, f"RAY_AUTH_TOKEN_PATH={path}", (*looked, f"RAY_AUTH_TOKEN_PATH={path}"))
    looked.append("RAY_AUTH_TOKEN_PATH: unset")
    default = home / ".ray" / "auth_token"
    try:
        value = default.read_text().strip()
    except FileNotFoundError:
        value = ""
        looked.append(f"{default}: no such file")
    except OSError as err:
        value = ""
        looked.append(f"{default}: {err.strerror}")
    else:
        looked.append(f"{default}: {'found' if value else 'empty'}")
    if value:
        return Token(value, str(default), tuple(looked))
    return Token(None, None, tuple(looked))


def missing_token_message(address: str, token: Token) -> str:
    """One line: the cluster wants a token; what was sent or looked for, and how to get one."""
    fix = ("run `ray get-auth-token` on the cluster's head node and set RAY_AUTH_TOKEN to what "
           "it prints (or save it to ~/.ray/auth_token, or name its file in RAY_AUTH_TOKEN_PATH)")
    if token.value is None:
        return (f"the Ray cluster at {address} requires an authentication token and none was "
                f"found (looked in {'; '.join(token.looked)}); {fix}")
    return (f"the Ray cluster at {address} rejected the authentication token from {token.source}; "
            f"{fix}")


def is_auth_failure(err: BaseException) -> bool:
    """Whether ``err`` or an exception it was raised from is Ray refusing the token."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if type(err).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def _environment(changes: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for Ray (read by this process's Ray config and inherited by the
    processes it starts), refresh Ray's cached view of them, and restore everything after."""
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    _refresh_ray_config()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _refresh_ray_config()


def _refresh_ray_config() -> None:
    import sys

    if "ray" not in sys.modules:  # Ray reads the environment when it is first imported
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def token_env(token: Token, **extra: str) -> contextlib.AbstractContextManager:
    """Token mode with ``token`` while joining a cluster (no token: only ``extra``).

    An explicit ``RAY_AUTH_MODE`` from the user is respected.
    """
    changes = dict(extra)
    if token.value is not None:
        changes["RAY_AUTH_TOKEN"] = token.value
        if "RAY_AUTH_MODE" not in os.environ:
            changes["RAY_AUTH_MODE"] = "token"
    return _environment(changes)


def ephemeral_token_env(**extra: str) -> contextlib.AbstractContextManager:
    """Token mode with a fresh random token for a local Ray started by this process, plus the
    environment variables ``extra``.

    ``RAY_AUTH_MODE`` or ``RAY_AUTH_TOKEN`` set by the user are respected as they are.
    """
    changes = dict(extra)
    if "RAY_AUTH_MODE" not in os.environ:
        changes["RAY_AUTH_MODE"] = "token"
    if not os.environ.get("RAY_AUTH_TOKEN"):
        changes["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return _environment(changes)
