"""Schemathesis against the live server's OpenAPI document without a key: every operation, in
every phase, answered without a 5xx or a response that breaks the document (as
test_e2e_schemathesis.py with a write key); the number of generated cases and the seed are
printed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Server
from tests.e2e.schemathesis_runs import (
    SEED,
    assert_every_operation_and_phase_ran,
    report_line,
    run_schemathesis,
    serve,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    yield from serve(tmp_path_factory)


@pytest.mark.timeout(600)
def test_schemathesis_without_a_key_finds_nothing(served, tmp_path, record_property):
    server, _ = served
    print(f"schemathesis seed {SEED}")
    summary = run_schemathesis(server, tmp_path / "without-key.json")
    report_line(record_property, "without a key", summary)
    assert_every_operation_and_phase_ran(summary, server)
    assert summary["test_cases"]["generated"] > 100
