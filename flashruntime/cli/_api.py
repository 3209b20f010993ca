"""Where the coordinator is and which token to show it, for every subcommand that talks
to one: the global ``--api`` option, else env ``FLASHML_RUNTIME_API``, else
``http://localhost:8100``; the subcommand's ``--token``, else env ``FLASHML_TOKEN``.

Pure given ``env``; an empty variable counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

API_ENV = "FLASHML_RUNTIME_API"
TOKEN_ENV = "FLASHML_TOKEN"
DEFAULT_API = "http://localhost:8100"
TOKEN_HELP = f"bearer token of a submitter or operator (else env {TOKEN_ENV}); needed when the coordinator has tokens"


def resolve_api(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """The coordinator's base URL without a trailing slash. A value that is not an
    http(s) URL raises ``ValueError`` naming where it came from."""
    environ = os.environ if env is None else env
    if flag is not None:
        value, source = flag, "--api"
    elif environ.get(API_ENV):
        value, source = environ[API_ENV], API_ENV
    else:
        value, source = DEFAULT_API, "the default"
    stripped = value.strip()
    scheme, _, rest = stripped.partition("://")
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise ValueError(f"{source} {value!r} is not an http(s) URL: give the coordinator's address, "
                         f"e.g. {DEFAULT_API}")
    return stripped.rstrip("/")


def resolve_token(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token to send: ``--token``, else ``FLASHML_TOKEN``, else None. Blank
    values count as unset."""
    environ = os.environ if env is None else env
    for value in (flag, environ.get(TOKEN_ENV)):
        if value is not None and value.strip():
            return value.strip()
    return None


def auth_hint(status: int) -> str:
    """What to do about a 401 or 403 from the coordinator ("" for other statuses)."""
    if status == 401:
        return f"; the coordinator needs a valid token: pass --token or set {TOKEN_ENV}"
    if status == 403:
        return "; this token's role may not do that (see the security model in the docs)"
    return ""
