"""A real uvicorn server in a subprocess, on a free port, against SQLite or PostgreSQL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.postgres import empty_postgres_database

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "cancelled")

# Fast worker rhythm so recovery after a kill takes seconds, not the production 15 s.
FAST_WORKER = {
    "MIXREG_HEARTBEAT_INTERVAL_S": "0.2",
    "MIXREG_STALE_AFTER_S": "2",
    "MIXREG_POLL_INTERVAL_S": "0.05",
    "MIXREG_PROGRESS_INTERVAL_S": "0.1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Server:
    """``python -m uvicorn --factory service.main:create_app`` as a subprocess."""

    def __init__(
        self,
        *,
        database_url: str,
        log_path: Path,
        settings: dict[str, str],
        command: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        # The program to run, "{port}" standing for the port; by default uvicorn with the app.
        self.command = command
        self.log_path = log_path
        self.env = {
            **os.environ,
            **FAST_WORKER,
            **settings,
            "MIXREG_DATABASE_URL": database_url,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        """Launch the server and wait until it answers; one that does not is stopped before
        the error is raised, since no fixture teardown runs for a setup that failed."""
        self.launch()
        try:
            self.wait_until_healthy(timeout)
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Start the process without waiting for it to answer."""
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "service.main:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [part.replace("{port}", str(self.port)) for part in self.command or command],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                **self.popen_options(),
            )

    def popen_options(self) -> dict[str, Any]:
        """Extra arguments of ``subprocess.Popen`` for subclasses."""
        return {}

    def wait_until_healthy(self, timeout: float = 60) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if self.client.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not answer /healthz within {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM), as a process manager would do it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to clean up."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, **kwargs)

    def fit(self, body: dict[str, Any]) -> str:
        response = self.client.post("/fit", json=body)
        assert response.status_code == 202, response.text
        job_id: str = response.json()["job_id"]
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        return job

    def wait_for_job(
        self,
        job_id: str,
        until: Callable[[dict[str, Any]], bool] = lambda job: job["status"] in TERMINAL,
        timeout: float = 60,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job did not get there in {timeout} s: {job}\n{self.log()}")
            time.sleep(0.05)


ServerFactory = Callable[..., Server]


def _servers(database_url: str, tmp_path: Path) -> Iterator[ServerFactory]:
    servers: list[Server] = []

    def make(**settings: str) -> Server:
        server = Server(
            database_url=database_url,
            log_path=tmp_path / f"server-{len(servers)}.log",
            settings=settings,
        )
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.stop()
        server.client.close()


@pytest.fixture
def make_server(database_url: str, tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers on the test's database (SQLite file or PostgreSQL); stop them after."""
    yield from _servers(database_url, tmp_path)


@pytest.fixture
def make_sqlite_server(sqlite_url: str, tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers on a SQLite file; stop them after."""
    yield from _servers(sqlite_url, tmp_path)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sqlite"),
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ],
)
def shared_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One server with the default settings for the tests of a module, once on SQLite and once
    on PostgreSQL: starting a server takes seconds, and tests that each fit their own data and
    look only at their own jobs and models need no server of their own. On PostgreSQL it has a
    database of its own, which the function-scoped fixtures never empty."""
    tmp_path = tmp_path_factory.mktemp("shared")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'mixreg.db'}"
    else:
        url = empty_postgres_database(suffix="_shared")
    server = Server(database_url=url, log_path=tmp_path / "server.log", settings={})
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.client.close()


def module_sqlite_server(
    tmp_path_factory: pytest.TempPathFactory, name: str, **settings: str
) -> Iterator[Server]:
    """A started server on a SQLite file of its own in a folder ``name``, stopped after: the
    body of a module-scoped ``server`` fixture for tests that share one server."""
    folder = tmp_path_factory.mktemp(name)
    server = Server(
        database_url=f"sqlite:///{folder / 'mixreg.db'}",
        log_path=folder / "server.log",
        settings=settings,
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.client.close()


@pytest.fixture
def server(make_server: ServerFactory) -> Server:
    """One server with the default settings (and a fast worker rhythm)."""
    return make_server()


def proc_status_mb(pid: int, field: str) -> float:
    """A ``/proc/<pid>/status`` memory figure (``VmRSS``, ``VmHWM``) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for process {pid}")


def reset_peak_mb(pid: int) -> float:
    """Restart the process's resident high-water mark (``VmHWM``) from its resident set now,
    and return that set in MB: the figure a later ``VmHWM`` is compared with."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # "5" resets the high-water mark
    return proc_status_mb(pid, "VmRSS")


def mixture_data(n_rows: int = 200, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Rows from two noisy lines in three features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, 3))
    lines = np.array([[1.0, 2.0, -1.0], [-2.0, 0.5, 1.5]])
    labels = rng.integers(0, 2, size=n_rows)
    y = np.einsum("ij,ij->i", X, lines[labels]) + np.where(labels, 1.0, -1.0)
    y += 0.05 * rng.standard_normal(n_rows)
    return X, y
