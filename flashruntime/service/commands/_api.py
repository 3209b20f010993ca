"""Where the coordinator is, for every subcommand that talks to one (SPEC §10):
the global ``--api`` option, else env ``FLASHML_RUNTIME_API``, else ``http://localhost:8100``.

Pure given ``env``; an empty variable counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

API_ENV = "FLASHML_RUNTIME_API"
DEFAULT_API = "http://localhost:8100"


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
