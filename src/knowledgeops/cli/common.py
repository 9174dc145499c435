"""What every `kops` command shares: the consoles, one way to fail with an exit status, the
settings, and the options that say where a running KnowledgeOps is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from knowledgeops.errors import StartupError
from knowledgeops.settings import Settings, load_settings

console = Console()
err = Console(stderr=True)

EXIT_FAILED = 1  # the command's work failed: a refused request, a document that failed
EXIT_STARTUP = 2  # a process could not start: settings, database, broker (the message says which)

DEFAULT_URL = os.environ.get("KOPS_URL", "http://127.0.0.1:8000")
UrlOpt = Annotated[str, typer.Option("--url", help="Where KnowledgeOps runs.", envvar="KOPS_URL")]
DatasetOpt = Annotated[
    str | None, typer.Option("--dataset", "-d", help="Dataset id or name (default: the default).")
]
DataDirOpt = Annotated[Path | None, typer.Option(help="Data folder (KOPS_DATA_DIR).")]


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    """Print `error: message` on stderr; raise what this returns to exit with `code`."""
    # escaped: messages carry file names and server text, which are not rich markup; soft_wrap:
    # no line breaks inserted at 80 columns when stderr is a file or a pipe
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def cannot_start(exc: StartupError) -> typer.Exit:
    return fail(str(exc), EXIT_STARTUP)


def settings(**overrides: Any) -> Settings:
    """The settings from the environment, with the options the user gave (None: not given)."""
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except StartupError as exc:
        raise cannot_start(exc) from None
