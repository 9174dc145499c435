"""`kops keys create|list|revoke`: API keys, straight in the database (no running API needed;
roles/admin.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from knowledgeops.cli.common import DataDirOpt, cannot_start, console, err, fail, settings
from knowledgeops.errors import RequestError, StartupError
from knowledgeops.settings import DEFAULT_TENANT

if TYPE_CHECKING:
    from knowledgeops.service.keys import ApiKeys

keys_app = typer.Typer(help="API keys: create (shown once), list, revoke.", no_args_is_help=True)


@contextmanager
def _keys(data_dir: Path | None) -> Iterator[ApiKeys]:
    from knowledgeops.roles.admin import api_keys  # noqa: PLC0415 (SQLAlchemy, for this command)

    with ExitStack() as stack:
        try:
            keys = stack.enter_context(api_keys(settings(data_dir=data_dir)))
        except StartupError as exc:
            raise cannot_start(exc) from None
        yield keys


@keys_app.command("create")
def create(
    tenant: Annotated[
        str, typer.Option(help="Whose data the key reaches (lowercase letters, digits, . _ -).")
    ] = DEFAULT_TENANT,
    name: Annotated[str, typer.Option(help="What the key is for (shown in `kops keys list`).")] = (
        "api key"
    ),
    data_dir: DataDirOpt = None,
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    with _keys(data_dir) as keys:
        try:
            view, secret = keys.create(tenant, name)
        except RequestError as exc:
            raise fail(exc.message) from None
    # the secret alone on stdout, so that `KEY=$(kops keys create …)` works
    print(secret)
    err.print(
        f"created key {view.id} ({escape(view.prefix)}…) for tenant {escape(view.tenant_id)!r}; "
        "it is not shown again",
        soft_wrap=True,
    )


@keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked keys.")] = False,
    data_dir: DataDirOpt = None,
) -> None:
    """List keys (never their secrets)."""
    with _keys(data_dir) as keys:
        found = keys.list(tenant, include_revoked=revoked)
    table = Table("id", "tenant", "name", "key", "created", "revoked")
    for key in found:
        table.add_row(
            key.id,
            escape(key.tenant_id),
            escape(key.name),
            escape(key.prefix) + "…",
            key.created_at.strftime("%Y-%m-%d %H:%M"),
            key.revoked_at.strftime("%Y-%m-%d %H:%M") if key.revoked_at else "",
        )
    console.print(table)


@keys_app.command("revoke")
def revoke(
    key: Annotated[str, typer.Argument(help="The key's id, or the prefix `kops keys list` shows.")],
    data_dir: DataDirOpt = None,
) -> None:
    """Revoke a key: requests with it get 401 from now on."""
    with _keys(data_dir) as keys:
        try:
            view = keys.revoke(key.removesuffix("…"))
        except RequestError as exc:
            raise fail(exc.message) from None
    console.print(f"revoked key {view.id} ({escape(view.prefix)}…) of tenant {view.tenant_id!r}")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
