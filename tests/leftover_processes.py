"""A pytest plugin failing the run when a process it started outlives it.

Servers, fork servers, resource trackers and fit processes started by a test must end with the
test run: one left behind holds ports, files and memory long after, and a fork server or
resource tracker that stays alive shows that something still holds its lifeline pipe.

The first pytest process of a run (the xdist controller, or the only process) names the run in
the environment variable ``MIXREG_TEST_RUN``, which every process started from it inherits (the
xdist workers, the servers they start, their fork servers and fits), even one whose parent
exited and which was handed to init. When the session finishes (in the controller after the
workers have exited) every process still carrying the name, or descending from this process,
is listed; the run fails naming them unless they go within a grace period
(``leftover_process_grace_s``, for processes that are already on their way out).

The multiprocessing fork server and resource tracker of this very process are not counted:
they end when it exits, and no test can stop them earlier.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import time
import uuid
from pathlib import Path

import pytest

RUN_VARIABLE = "MIXREG_TEST_RUN"
GRACE_OPTION = "leftover_process_grace_s"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        GRACE_OPTION,
        "seconds processes of the run may take to exit after the session before it fails",
        default="15",
    )


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if not _is_xdist_worker(config):
        # A new name even when one is inherited: a pytest run inside a test is a run of its own.
        os.environ[RUN_VARIABLE] = f"{os.getpid()}-{uuid.uuid4().hex}"


def _parent_pids() -> dict[int, int]:
    """Every live process's parent, by process id (zombies left out: they are already dead)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name in parentheses may hold spaces: the fields follow its last ")".
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # ended while being read
            continue
        if state != "Z":
            parents[int(entry.name)] = int(parent)
    return parents


def _carries(pid: int, name: bytes) -> bool:
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # ended, or another user's process
        return False
    return name in environment.split(b"\0")


def _command_line(pid: int) -> str:
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "(ended)"
    return " ".join(part.decode(errors="replace") for part in arguments if part) or "(no command)"


def _own_helpers() -> set[int]:
    """This process's multiprocessing fork server and resource tracker (they end with it)."""
    helpers = {
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
    }
    return {pid for pid in helpers if pid is not None}


def leftover_processes(run_name: str) -> dict[int, str]:
    """Processes of the run still alive, other than this one and its own helpers: their
    command lines by process id."""
    parents = _parent_pids()
    me = os.getpid()
    descendants: set[int] = set()
    frontier = {me}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - descendants
        descendants |= frontier
    marker = f"{RUN_VARIABLE}={run_name}".encode()
    named = {pid for pid in parents if pid not in descendants and _carries(pid, marker)}
    found = descendants | named
    return {pid: _command_line(pid) for pid in sorted(found - {me} - _own_helpers())}


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_xdist_worker(session.config):
        return
    run_name = os.environ[RUN_VARIABLE]
    deadline = time.monotonic() + float(session.config.getini(GRACE_OPTION))
    while (leftovers := leftover_processes(run_name)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not leftovers:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"  {pid}: {command}" for pid, command in leftovers.items()]
    message = "\n".join([f"{len(leftovers)} process(es) of this test run still alive:", *lines])
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
