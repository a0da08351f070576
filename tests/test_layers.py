"""The import graph, read from the modules' source: every floor of the house imports only the
floors below it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> Iterator[str]:
    """Every module ``path`` imports (relative imports resolved), including ``from a import b``
    as both ``a`` and ``a.b``."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def modules_of(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def importers(sources: list[Path], target: str) -> list[str]:
    return [
        module_name(path)
        for path in sources
        if any(within(module, target) for module in imported_modules(path))
    ]


def test_the_graph_is_read_from_the_imports():
    # The walk sees each form of import, or the checks below could not fail.
    main = REPO / "service" / "main.py"
    assert "service.api.errors" in set(imported_modules(main))
    datasets = REPO / "service" / "api" / "routers" / "datasets.py"
    assert "service.data.datasets" in set(imported_modules(datasets))


def test_only_the_http_layer_and_the_app_factory_import_service_api():
    outside = [
        path
        for path in modules_of("service")
        if not within(module_name(path), "service.api") and module_name(path) != "service.main"
    ]
    assert len(outside) > 20
    assert importers(outside, "service.api") == []


@pytest.mark.parametrize("package", ["mixreg", "models_store", "mixreg_client"])
def test_the_lower_packages_never_import_the_service(package: str):
    assert importers(modules_of(package), "service") == []


def test_the_science_imports_no_web_or_database_code():
    heavy = ("fastapi", "starlette", "sqlalchemy", "models_store", "httpx", "mixreg_client")
    found = {name: importers(modules_of("mixreg"), name) for name in heavy}
    assert found == {name: [] for name in heavy}


def test_the_users_command_line_uses_only_the_clients_public_api():
    cli = modules_of("mixreg_client/cli")
    private = [
        (module_name(path), module)
        for path in cli
        for module in imported_modules(path)
        if within(module, "mixreg_client")
        and not within(module, "mixreg_client.cli")
        and any(part.startswith("_") for part in module.split(".")[1:])
    ]
    assert private == []
    # The server's commands are looked up at run time, never imported at the top.
    assert importers(cli, "service") == []
