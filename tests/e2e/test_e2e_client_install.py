"""The client-only install: ``pip install mixreg`` without the ``server`` extra, in a fresh
virtual environment, gives the estimator, the client and the user's commands of ``mixreg``,
which fit against a running server; the server's commands say what to install."""

from __future__ import annotations

import os
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, Server, mixture_data, module_sqlite_server

pytestmark = [pytest.mark.e2e, pytest.mark.install]

SERVER_ONLY = ("fastapi", "uvicorn", "sqlalchemy", "procrastinate", "matplotlib", "pyarrow")


@pytest.fixture(scope="module")
def client_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with ``pip install REPO`` (no extras); its bin folder."""
    folder = tmp_path_factory.mktemp("client-only")
    venv.EnvBuilder(with_pip=True).create(folder / "venv")
    bin_folder = folder / "venv" / "bin"
    subprocess.run(
        [str(bin_folder / "python"), "-m", "pip", "install", "--quiet", str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    yield bin_folder


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from module_sqlite_server(tmp_path_factory, "server")


def test_the_client_only_install_fits_against_a_server(
    client_only: Path, live: Server, tmp_path: Path
):
    installed = subprocess.run(
        [
            str(client_only / "python"),
            "-c",
            "import importlib.util as u, sys; "
            f"print([name for name in {SERVER_ONLY!r} if u.find_spec(name)])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert installed.stdout.strip() == "[]"

    X, y = mixture_data(n_rows=60, seed=1)
    data = tmp_path / "data.csv"
    rows = [
        ",".join(map(repr, [*row, target]))
        for row, target in zip(X.tolist(), y.tolist(), strict=True)
    ]
    data.write_text("a,b,c,y\n" + "\n".join(rows) + "\n")
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("MIXREG_")
    }
    # The server's settings are none of the user's commands' business: a bad one is ignored.
    environment.update(MIXREG_URL=live.base_url, MIXREG_MAX_K="not a number")
    fit = subprocess.run(
        [
            str(client_only / "mixreg"),
            "fit",
            str(data),
            "--target",
            "y",
            "--k",
            "2",
            "-q",
            "--param",
            "n_init=4",
            "--param",
            "n_partitions=50",
            "--param",
            "subsample_size=30",
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert fit.returncode == 0, fit.stderr
    model_id = fit.stdout.strip()
    assert live.request("GET", f"/models/{model_id}").json()["feature_names"] == ["a", "b", "c"]

    serve = subprocess.run(
        [str(client_only / "mixreg"), "serve"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert serve.returncode == 2
    assert serve.stderr.startswith("mixreg serve: the server is not installed (no module ")
    assert serve.stderr.strip().endswith("install it with pip install 'mixreg[server]'")
