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


def imported_modules(path: Path, name: str | None = None) -> Iterator[str]:
    """Every module ``path`` (the module ``name``, by default read from the path) imports
    (relative imports resolved), including ``from a import b`` as both ``a`` and ``a.b``."""
    package = (name or module_name(path)).split(".")
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


# The floors of ``service/`` (docs/adr/0031-the-floors-of-the-service.md), top to bottom. Each
# room is a package of ``service/`` or a module at its top; the request bodies are one room of
# three modules.
FLOORS: dict[int, tuple[str, ...]] = {
    7: ("main",),
    6: ("api",),
    5: ("views", "cli"),
    4: ("jobs", "serving"),
    3: ("data", "limits"),
    2: ("schemas", "auth"),
    1: ("config", "errors", "logs", "metrics", "problems", "checks"),
}
ROOM_OF_MODULE = {"fit_schemas": "schemas", "schemas_v2": "schemas", "schemas_outcomes": "schemas"}


def room_of(module: str) -> str | None:
    """The room of ``service``'s module ``module`` (None for ``service`` itself)."""
    parts = module.split(".")
    if parts[0] != "service" or len(parts) == 1:
        return None
    return ROOM_OF_MODULE.get(parts[1], parts[1])


FLOOR_OF_ROOM = {room: floor for floor, rooms in FLOORS.items() for room in rooms}


def wrong_way_imports(path: Path, name: str | None = None) -> list[tuple[str, str]]:
    """The imports of ``path`` (the module ``name`` of ``service``, by default read from the
    path) that reach a higher floor, or another room of its own floor: ``(importer,
    imported)``."""
    importer = name or module_name(path)
    here = room_of(importer)
    wrong = set()
    for module in imported_modules(path, importer):
        there = room_of(module)
        if here is None or there is None or there == here:
            continue
        if FLOOR_OF_ROOM[there] >= FLOOR_OF_ROOM[here]:
            wrong.add((importer, module))
    return sorted(wrong)


def test_every_room_of_the_service_is_on_a_floor():
    rooms = {room_of(module_name(path)) for path in modules_of("service")} - {None}
    assert rooms == set(FLOOR_OF_ROOM)


def test_the_service_imports_only_down_its_floors():
    sources = modules_of("service")
    assert len(sources) > 60
    wrong = [pair for path in sources for pair in wrong_way_imports(path)]
    assert wrong == []


@pytest.mark.parametrize(
    ("importer", "imports", "wrong"),
    [
        ("service.data.probe", "from service.views import dataset_out", "service.views"),
        ("service.jobs.probe", "from service.serving import references", "service.serving"),
        ("service.schemas", "from service.data import ingest", "service.data"),
        ("service.checks", "import service.errors", "service.errors"),
    ],
)
def test_an_import_up_or_sideways_is_wrong(tmp_path: Path, importer: str, imports: str, wrong: str):
    # Each form the check must catch: up a floor, sideways to another room of the same floor.
    probe = tmp_path / "probe.py"
    probe.write_text(f"{imports}\nfrom service.errors import ServiceError\n")
    found = {module for _, module in wrong_way_imports(probe, importer)}
    assert wrong in found
    allowed = "from service.fit_schemas import FitRequest\nfrom .checks import name_error\n"
    probe.write_text(allowed)
    assert wrong_way_imports(probe, "service.schemas") == []
