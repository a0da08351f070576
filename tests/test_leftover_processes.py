"""The run fails naming every process it started that outlives it (tests/leftover_processes.py),
and passes when the processes end with their tests, checked on pytest runs inside this test."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A child kept running, and a grandchild whose parent shell exits at once, so that it is handed
# to init and found only by the run's name in its environment.
LEAKING_TEST = """
import subprocess
from pathlib import Path

def test_leaks_two_processes():
    child = subprocess.Popen(["sleep", "61"])
    orphan = subprocess.run(
        ["sh", "-c", "sleep 62 >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    Path("pids.txt").write_text(f"{child.pid} {orphan}")
    child.returncode = 0  # keeps Popen from warning about a child it never waited for
"""

TIDY_TEST = """
import subprocess

def test_waits_for_its_process():
    subprocess.run(["sleep", "0.1"], check=True)
"""


@pytest.fixture
def inner_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytest run in a process of its own, with the check and a one-second grace period."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # Without the installed plugins (hypothesis, schemathesis, ...) it starts in a second.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeini("[pytest]\nleftover_process_grace_s = 1\n")
    return pytester


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_process_left_behind_fails_the_run_naming_it(inner_run: pytest.Pytester):
    inner_run.makepyfile(LEAKING_TEST)
    try:
        result = inner_run.runpytest_subprocess("-p", "tests.leftover_processes")
    finally:
        pids = [int(pid) for pid in (inner_run.path / "pids.txt").read_text().split()]
        still_alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        _kill(pids)
    assert still_alive == pids  # the check waited for them, it did not end them
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*processes left behind*",
            "2 process(es) of this test run still alive:",
            f"  {min(pids)}: sleep 6[12]",
            f"  {max(pids)}: sleep 6[12]",
        ]
    )


def test_a_run_whose_processes_end_passes(inner_run: pytest.Pytester):
    inner_run.makepyfile(TIDY_TEST)
    result = inner_run.runpytest_subprocess("-p", "tests.leftover_processes")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    assert "processes left behind" not in result.stdout.str()
