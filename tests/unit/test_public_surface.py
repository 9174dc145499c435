"""The package's public surface: `knowledgeops.__all__`, each name the object its home module
defines, and nothing of the package loaded by `import knowledgeops` alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata

import pytest

import knowledgeops
from knowledgeops import client, errors, settings

PUBLIC = {
    "AsyncKnowledgeOps": client.AsyncKnowledgeOps,
    "KnowledgeOps": client.KnowledgeOps,
    "ClientError": errors.ClientError,
    "KopsError": errors.KopsError,
    "Settings": settings.Settings,
    "SettingsError": errors.SettingsError,
    "load_settings": settings.load_settings,
}


def test_the_public_names_are_exactly_these() -> None:
    assert sorted(knowledgeops.__all__) == sorted([*PUBLIC, "__version__"])
    assert set(knowledgeops.__all__) <= set(dir(knowledgeops))


def test_the_version_is_the_installed_distributions() -> None:
    assert knowledgeops.__version__ == metadata.version("knowledgeops")


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_name_is_the_object_its_module_defines(name: str) -> None:
    assert (
        getattr(knowledgeops, name) is PUBLIC[name] or getattr(knowledgeops, name) == PUBLIC[name]
    )
    if name != "__version__":
        assert getattr(knowledgeops, name) is PUBLIC[name]


def test_every_deliberate_error_is_a_kops_error() -> None:
    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, errors.KopsError), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Runtime'"):
        _ = knowledgeops.Runtime  # type: ignore[attr-defined]


def loaded_by(statement: str, *names: str) -> list[str]:
    """The modules among `names` (and their submodules) that a fresh interpreter has loaded
    after running `statement`."""
    code = (
        f"import sys; {statement}; "
        f"print(sorted(m for m in sys.modules if m in {names!r} "
        f"or any(m.startswith(n + '.') for n in {names!r})))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(ast.literal_eval(shown.stdout.strip()))


def test_importing_the_package_loads_none_of_its_modules() -> None:
    assert loaded_by("import knowledgeops", "knowledgeops", "httpx", "pydantic") == ["knowledgeops"]
