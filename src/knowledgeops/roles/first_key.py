"""The first API key: on a database without any, the embedded default creates one for the default
tenant and shows it once (only its hash is kept); every API process warns when it runs open or
without an active key."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from knowledgeops.service.keys import ApiKeys
from knowledgeops.settings import Settings

log = logging.getLogger(__name__)

FIRST_KEY_FILE = "first-api-key"


def check_auth(settings: Settings, keys: ApiKeys, *, first_key: bool) -> None:
    """Warn when the API runs open; with `first_key` (the embedded default), create the first
    key of a database that has none and show it."""
    if settings.auth == "off":
        log.warning(
            "KOPS_AUTH=off: the API is open to anyone who can reach it, all as one tenant; "
            "use this only on a trusted machine"
        )
        return
    secret = keys.ensure_first_key() if first_key else None
    if secret is not None:
        announce_first_key(secret, settings.data_dir)
    elif keys.count_active() == 0:
        log.warning("no active API key: every request gets 401; create one with `kops keys create`")


def announce_first_key(secret: str, data_dir: Path) -> None:
    """Show the first key once. On a terminal it is printed (stderr); otherwise (a service
    manager, a container) stderr is a log that is kept and shipped, so the key goes to a file
    only this user can read, and the log says where."""
    if sys.stderr.isatty():
        sys.stderr.write(
            "\n"
            "  An API key was created for the default tenant. It is shown only this once:\n\n"
            f"      {secret}\n\n"
            "  Send it as `Authorization: Bearer <key>` (the kops CLI reads KOPS_API_KEY).\n"
            "  More keys: `kops keys create --tenant T --name N`; list: `kops keys list`.\n\n"
        )
        sys.stderr.flush()
        return
    path = data_dir / FIRST_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    log.warning(
        "an API key was created for the default tenant and written to %s (readable only by "
        "this user); read it, then delete the file",
        path,
    )
