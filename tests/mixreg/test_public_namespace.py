"""What ``mixreg`` exports: the estimator's names in ``__all__``, the service's helpers in
``mixreg.service_support`` (docs/adr/0026-the-public-namespace.md)."""

import ast
from pathlib import Path

import mixreg
from mixreg import service_support

REPO = Path(__file__).resolve().parents[2]


def test_all_holds_the_estimators_names_and_no_service_helper():
    assert "MixtureOfLinearRegressions" in mixreg.__all__
    assert "fit_per_key" in mixreg.__all__
    assert "select_n_components" in mixreg.__all__
    assert set(mixreg.__all__).isdisjoint(service_support.__all__)
    for name in mixreg.__all__:
        assert getattr(mixreg, name) is not None


def test_every_service_helper_is_importable_from_its_submodule():
    for name in service_support.__all__:
        assert getattr(service_support, name) is not None
    assert sorted(service_support.__all__) == sorted(
        [
            "FAILURE_REASON",
            "MAX_ABS_Y",
            "MAX_FAILURES_LISTED",
            "STATUSES",
            "check_n_components_list",
            "component_order",
            "key_array",
            "likelihood_drops",
            "minimum_rows_per_line",
            "missing_keys",
            "preferred_n_components",
            "sweep_warm_start",
        ]
    )


def test_a_star_import_gives_no_service_helper():
    namespace: dict[str, object] = {}
    exec("from mixreg import *", namespace)
    assert "STATUSES" not in namespace and "key_array" not in namespace
    assert "MixtureOfLinearRegressions" in namespace


def test_a_name_mixreg_never_had_is_an_attribute_error():
    try:
        mixreg.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError("mixreg.no_such_name did not raise AttributeError")


def _uses_of_service_helpers_through_mixreg(path: Path) -> set[str]:
    """Service helpers a module takes from ``mixreg`` itself: ``from mixreg import NAME`` or
    ``mixreg.NAME``."""
    helpers = set(service_support.__all__)
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "mixreg":
            used |= {alias.name for alias in node.names} & helpers
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "mixreg"
            and node.attr in helpers
        ):
            used.add(node.attr)
    return used


def test_service_tests_and_benchmarks_import_service_helpers_from_service_support():
    # ``mixreg.STATUSES`` is an AttributeError (test above); this finds the code that would
    # reach for it before it runs.
    offenders = {}
    for folder in ("service", "tests", "bench", "mixreg", "mixreg_client"):
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            used = _uses_of_service_helpers_through_mixreg(path)
            if used:
                offenders[relative] = sorted(used)
    assert offenders == {}
