"""The 10 s version of ``bench/load.py``: 32 clients mixing predicts, small fits and listings
against a real server requiring API keys, on SQLite and on PostgreSQL. No 5xx, no job lost
or duplicated, every job final at the end (speeds are the benchmark's business)."""

from __future__ import annotations

import pytest

from bench.load import OPERATIONS, LoadConfig, outcome_lines, run_backend
from tests.reporting import REPORT_PROPERTY

pytestmark = pytest.mark.e2e

TEN_SECONDS = LoadConfig(
    duration_s=10, clients=32, max_requests=100_000, max_queued_jobs=30, drain_timeout_s=120
)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_ten_seconds_of_load_lose_nothing(backend, request, tmp_path, record_property):
    url = request.getfixturevalue(f"{'postgres' if backend == 'postgresql' else 'sqlite'}_url")
    outcome = run_backend(backend, url, TEN_SECONDS, tmp_path, log=False)
    # Printed at the end of the test run (tests/conftest.py).
    record_property(REPORT_PROPERTY, "\n".join(outcome_lines(outcome)))
    assert outcome.problems == []
    for operation in OPERATIONS:
        assert sum(outcome.tally.statuses[operation].values()) > 0, operation
    assert outcome.jobs_accepted > 0
    assert outcome.jobs_in_database == outcome.jobs_accepted
    assert sum(outcome.jobs_by_status.values()) == outcome.jobs_accepted
