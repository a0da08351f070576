"""The deployment files read as Docker reads them: docker-compose.yml validated by Debian's
docker-compose (its ``config`` needs no engine), one image for every mixreg service, PostgreSQL
checked over TCP and restarted, an image without sources, a health check on the port the
server serves, and one lock file of versions for the image and ``make install``."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from tests.ci import service_unavailable

REPO = Path(__file__).resolve().parents[1]
MIXREG_SERVICES = ("migrate", "api", "worker")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def test_the_compose_file_is_valid_for_docker_compose():
    program = shutil.which("docker-compose")
    if program is None:
        service_unavailable("docker-compose is not installed (`make docker-compose` installs it)")
    result = subprocess.run(
        [program, "--file", "docker-compose.yml", "config", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_one_image_is_built_once_for_every_mixreg_service():
    services = compose()["services"]
    images = {services[name].get("image") for name in MIXREG_SERVICES}
    assert len(images) == 1 and None not in images, images
    builders = [name for name, service in services.items() if "build" in service]
    assert builders == ["migrate"]


def test_postgres_is_checked_over_tcp_and_restarted():
    postgres = compose()["services"]["postgres"]
    check = " ".join(postgres["healthcheck"]["test"])
    assert re.search(r"pg_isready .*-h (127\.0\.0\.1|localhost)\b", check), check
    assert postgres["restart"] == "unless-stopped"


def dockerfile_stages() -> list[list[str]]:
    """The instructions of each stage of the Dockerfile (continuation lines joined)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_the_image_keeps_no_sources_and_checks_the_port_it_serves():
    final = dockerfile_stages()[-1]
    copies = [line for line in final if line.upper().startswith(("COPY", "ADD"))]
    assert copies and all(line.startswith("COPY --from=") for line in copies), copies
    health = next(line for line in final if line.startswith("HEALTHCHECK"))
    command = next(line for line in final if line.startswith("CMD"))
    # The check reads the port from MIXREG_PORT; the server, given no --port, serves it.
    assert "os.environ['MIXREG_PORT']" in health
    assert "--port" not in command
    assert any(line.startswith("ENV") and "MIXREG_PORT=8000" in line for line in final)
    api = compose()["services"]["api"]
    assert "--port" not in api["command"]
    assert "os.environ['MIXREG_PORT']" in " ".join(api["healthcheck"]["test"])


def locked_versions() -> dict[str, str]:
    versions = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            versions[re.sub(r"[-_.]+", "-", name).lower()] = version
    return versions


def test_the_image_and_make_install_use_one_lock_file_of_every_dependency():
    locked = locked_versions()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [
        requirement
        for extra in project["optional-dependencies"].values()
        for requirement in extra
        if not requirement.startswith("mixreg")
    ]
    names = {
        re.sub(r"[-_.]+", "-", re.split(r"[<>=\[ ;]", item)[0]).lower() for item in requirements
    }
    assert names - locked.keys() == set()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version) for version in locked.values())
    build = dockerfile_stages()[0]
    assert any(
        "--constraint /src/requirements.lock" in line for line in build if line.startswith("RUN")
    )
    makefile = (REPO / "Makefile").read_text()
    assert "--constraint requirements.lock -e '.[dev]'" in makefile
