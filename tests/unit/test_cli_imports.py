"""What `kops` imports, and when: the machinery of the command that runs, not of every command;
the lab only for its own commands (`kops bench`, `kops chaos`, `kops postgres`), which name the
extra to install when a package they need is missing."""

from __future__ import annotations

import pytest
import typer

from knowledgeops.cli import bench
from tests.unit.test_public_surface import loaded_by


def test_a_missing_package_is_named_with_the_extra_that_brings_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(typer.Exit) as exited:
        bench.lab("chaos", needs=("kops_no_such_package",), extra="pgserver")
    assert exited.value.exit_code == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "kops_no_such_package" in said
    assert "pip install 'knowledgeops[pgserver]'" in said


def test_with_its_packages_there_the_lab_module_is_imported() -> None:
    assert bench.lab("devpg", needs=("pgserver",), extra="pgserver").__name__ == (
        "knowledgeops.lab.devpg"
    )


def test_the_command_line_starts_without_the_lab_or_the_service() -> None:
    """`kops` loads the machinery of the command that runs, not of every command: the lab, the
    wiring, FastAPI, SQLAlchemy and Celery stay out of `kops --help` and `kops search`."""
    heavy = ("knowledgeops.lab", "knowledgeops.roles.wiring", "fastapi", "sqlalchemy", "celery")
    assert loaded_by("from knowledgeops.cli.app import app", *heavy, "torch") == []
