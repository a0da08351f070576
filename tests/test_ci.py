"""Recognizing a CI run from the CI environment variable, as CI systems set it."""

from pathlib import Path

import pytest

from tests.ci import running_in_ci, service_unavailable


@pytest.mark.parametrize(
    "value", ["1", "true", "True", "TRUE", "yes", "Yes", "on", "ON", " true\n"]
)
def test_truthy_values_mean_ci(value):
    assert running_in_ci({"CI": value})


@pytest.mark.parametrize("value", ["", "0", "false", "False", "no", "off", "2", "truthy", "y"])
def test_other_values_do_not_mean_ci(value):
    assert not running_in_ci({"CI": value})


def test_an_unset_variable_does_not_mean_ci():
    assert not running_in_ci({})


def test_the_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("CI", "1")
    assert running_in_ci()
    monkeypatch.delenv("CI")
    assert not running_in_ci()


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        ("1", pytest.fail.Exception),
        ("True", pytest.fail.Exception),
        ("yes", pytest.fail.Exception),
        (None, pytest.skip.Exception),
        ("", pytest.skip.Exception),
        ("0", pytest.skip.Exception),
        ("false", pytest.skip.Exception),
    ],
)
def test_a_missing_service_fails_the_test_in_ci_and_skips_it_elsewhere(monkeypatch, value, outcome):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    # Catch both, so that a wrong outcome fails this test instead of skipping it.
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception)) as raised:
        service_unavailable("no database")
    assert raised.type is outcome
    assert str(raised.value) == "no database"


REPO = Path(__file__).resolve().parents[1]
UNREACHABLE_POSTGRES = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"


@pytest.mark.parametrize(
    ("value", "outcome"), [("1", "errors"), ("True", "errors"), (None, "skipped")]
)
def test_a_test_on_an_unreachable_postgres_errors_in_ci_and_is_skipped_elsewhere(
    pytester, monkeypatch, value, outcome
):
    # The project's own postgres_url fixture, in a separate pytest process.
    pytester.makeconftest("from tests.conftest import postgres_url  # noqa: F401\n")
    pytester.makepyfile("def test_uses_postgres(postgres_url):\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MIXREG_TEST_POSTGRES_URL", UNREACHABLE_POSTGRES)
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines(["*PostgreSQL not reachable at postgresql+psycopg://nobody@*"])
