"""Schemathesis against the live server's OpenAPI document with a write key: every operation,
in every phase (examples, coverage, fuzzing, and stateful sequences following the links between
operations). No 5xx, and no response that breaks the document (status, content type, headers,
body schema); the number of generated cases and the seed are printed. The seed is random unless
SCHEMATHESIS_SEED sets it (to replay a run from its log). Without a key:
test_e2e_schemathesis_keyless.py."""

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
def test_schemathesis_with_a_write_key_finds_nothing(served, tmp_path, record_property):
    server, key = served
    print(f"schemathesis seed {SEED}")
    summary = run_schemathesis(
        server, tmp_path / "with-key.json", "--header", f"Authorization: Bearer {key}"
    )
    report_line(record_property, "with a write key", summary)
    assert_every_operation_and_phase_ran(summary, server)
    assert summary["test_cases"]["generated"] > 500
