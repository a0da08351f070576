"""Schemathesis against the live server's OpenAPI document, run by two test files (one with a
write key, one with none) so that two test processes run them at once: the server, the run and
what every run must show."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.auth.keys import add_key, new_key
from tests.e2e.conftest import REPO, Server
from tests.reporting import REPORT_PROPERTY

SCHEMATHESIS = str(REPO / ".venv" / "bin" / "st")
# Small limits keep the fits Schemathesis submits to a few milliseconds each.
SERVER_LIMITS = {
    "MIXREG_MAX_K": "5",
    "MIXREG_MAX_K_SWEEP": "3",
    "MIXREG_MAX_N_INIT": "5",
    "MIXREG_MAX_N_BOOTSTRAP": "5",
    "MIXREG_MAX_ROWS": "1000",
    "MIXREG_MAX_FEATURES": "20",
    "MIXREG_MAX_TIME_BUDGET_S": "2",
    "MIXREG_JOB_TIME_LIMIT_S": "10",
    "MIXREG_WORKER_CONCURRENCY": "1",
    "MIXREG_MAX_QUEUED_JOBS_PER_KEY": "5",
}
# Every check but positive_data_acceptance: the server rightly refuses data its document
# cannot describe (ragged rows, NaN, k above the rows), which Schemathesis counts as valid.
CHECKS = ["--checks", "all", "--exclude-checks", "positive_data_acceptance"]
MAX_EXAMPLES = "30"
SEED = int(os.environ.get("SCHEMATHESIS_SEED") or random.SystemRandom().randrange(2**32))
"""One seed per test process; printed with the results (tests/conftest.py)."""


def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """A server requiring API keys, with small limits, and a write key for it."""
    tmp_path = tmp_path_factory.mktemp("schemathesis")
    made = new_key(scope="write", name="schemathesis")
    add_key(tmp_path / "api-keys.json", made.record)
    server = Server(
        database_url=f"sqlite:///{tmp_path / 'mixreg.db'}",
        log_path=tmp_path / "server.log",
        settings={"MIXREG_API_KEYS_FILE": str(tmp_path / "api-keys.json"), **SERVER_LIMITS},
    )
    server.start()
    yield server, made.key
    server.stop()
    server.client.close()


def run_schemathesis(server: Server, report: Path, *options: str) -> dict:
    """``st run`` on the server's document; its JSON report."""
    result = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{server.base_url}/openapi.json",
            *CHECKS,
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            str(SEED),
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--report",
            "json",
            "--report-json-path",
            str(report),
            *options,
        ],
        cwd=report.parent,
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    summary = json.loads(report.read_text())
    assert result.returncode == 0, result.stdout[-6000:] + server.log()[-3000:]
    return summary


def report_line(record_property, label: str, summary: dict) -> None:
    """Print the number of generated cases at the end of the test run (``tests/conftest.py``)."""
    cases = summary["test_cases"]
    phases = ", ".join(summary["phases"])
    record_property(
        REPORT_PROPERTY,
        f"schemathesis {label}: {cases['generated']} cases generated over "
        f"{summary['operations']['tested']} operations ({phases}); "
        f"{cases['with_failures']} with failures, {cases['errored']} errored; "
        f"seed {SEED} (SCHEMATHESIS_SEED={SEED} replays it)",
    )


def assert_every_operation_and_phase_ran(summary: dict, server: Server) -> None:
    document = server.request("GET", "/openapi.json").json()
    operations = sum(
        method in {"get", "post", "put", "delete", "patch"}
        for item in document["paths"].values()
        for method in item
    )
    assert summary["operations"]["selected"] == operations, summary["operations"]
    assert summary["operations"]["tested"] == operations, summary["operations"]
    statuses = {name: phase["status"] for name, phase in summary["phases"].items()}
    assert statuses == dict.fromkeys(("examples", "coverage", "fuzzing", "stateful"), "success")
    assert summary["test_cases"]["with_failures"] == 0
    assert summary["test_cases"]["errored"] == 0
    assert summary["failures"] == [] and summary["errors"] == []
