"""The README's walk-through, run as written against a server started by `make serve`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import httpx
import pytest

from .conftest import REPO, free_port

pytestmark = pytest.mark.e2e


def walk_through() -> str:
    """The fenced bash block under the README's walk-through heading."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Walk-through", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```bash\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert match, "the walk-through has no ```bash block"
    return match.group(1)


@pytest.fixture
def make_serve(tmp_path):
    """`make serve` on a free port with the database in a temporary directory."""
    port = free_port()
    env = {
        **os.environ,
        "MIXREG_PORT": str(port),
        "MIXREG_DATABASE_URL": f"sqlite:///{tmp_path / 'mixreg.db'}",
    }
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        ["make", "--no-print-directory", "-C", str(REPO), "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "make serve did not come up"
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()


def test_the_readme_walk_through_runs_as_written(make_serve, tmp_path):
    result = subprocess.run(
        ["bash", "-c", walk_through()],
        cwd=tmp_path,
        env={**os.environ, "MIXREG_PORT": str(make_serve)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": succeeded" in result.stdout
    assert '"predictions":[[' in result.stdout
    assert '"best_component":[' in result.stdout
    assert "beats baseline True warnings []" in result.stdout
    assert "best k 2" in result.stdout
