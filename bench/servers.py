"""Servers the benchmarks start: a subprocess on a free loopback port, with a log file."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def proc_status_bytes(pid: int | str, field_name: str) -> int:
    """A memory field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``; reported in kB) in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field_name} field")


def reset_peak_rss(pid: int | str) -> bool:
    """Reset the peak RSS of ``pid`` to its current RSS; False if the kernel refuses."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # "5" resets the high-water mark (Linux >= 4.0)
    except OSError:
        return False
    return True


def peak_baseline_bytes(pid: int | str) -> int:
    """The figure a step's peak (``VmHWM`` after it) is compared with: the resident set now,
    the high-water mark reset first; where the kernel does not allow that, the earlier
    high-water mark (which can hide growth, never invent it)."""
    return proc_status_bytes(pid, "VmRSS" if reset_peak_rss(pid) else "VmHWM")


class ServerProcess:
    """``command`` (``{port}`` standing for the port) run from the repository with exactly
    the environment ``env`` (plus ``MIXREG_PORT``), its output appended to ``log_path``.

    The port is chosen once, so a server killed and started again answers at the same URL.
    """

    def __init__(self, command: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.command = [part.replace("{port}", str(self.port)) for part in command]
        self.env = {**env, "MIXREG_PORT": str(self.port)}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(
        self, ready_path: str = "/readyz", *, method: str = "GET", timeout_s: float = 120
    ) -> None:
        """Start the process and wait until ``method ready_path`` answers 200."""
        with self.log_path.open("ab") as output:
            self.process = subprocess.Popen(
                self.command, cwd=REPO_ROOT, env=self.env, stdout=output, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.command[0]} exited early:\n{self.log()[-3000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if client.request(method, ready_path).status_code == 200:
                        return
                time.sleep(0.1)
        raise RuntimeError(
            f"{self.command} did not answer within {timeout_s} s:\n{self.log()[-3000:]}"
        )

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as in a crash."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the process is still there after 60 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
