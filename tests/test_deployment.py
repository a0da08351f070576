"""The deployment files read as Docker reads them: docker-compose.yml validated by Debian's
docker-compose (its ``config`` needs no engine), the mixreg services built and never pulled,
base images pinned by digest, no password in the files, a health check and resource limits on
every long-running service, retention and JSON logs on, a TLS proxy profile, PostgreSQL
checked over TCP and restarted, an image without sources installed from hashed wheels, a
health check on the port the server serves, and one lock file of versions for the image and
``make install``."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from service.config import Settings
from tests.ci import service_unavailable

REPO = Path(__file__).resolve().parents[1]
MIXREG_SERVICES = ("migrate", "api", "worker")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


@pytest.mark.parametrize("profile", [None, "proxy"])
def test_the_compose_file_is_valid_for_docker_compose(profile):
    program = shutil.which("docker-compose")
    if program is None:
        service_unavailable("docker-compose is not installed (`make docker-compose` installs it)")
    profiles = [] if profile is None else ["--profile", profile]
    result = subprocess.run(
        [program, "--file", "docker-compose.yml", *profiles, "config", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_mixreg_services_are_built_never_pulled():
    services = compose()["services"]
    for name in MIXREG_SERVICES:
        service = services[name]
        assert service["build"] == {"context": "."}, name
        assert service["pull_policy"] == "build", name
        assert "image" not in service, name


DIGEST = re.compile(r"[^\s@]+@sha256:[0-9a-f]{64}")


def test_every_base_image_is_pinned_by_digest():
    froms = [stage[0].split()[1] for stage in dockerfile_stages()]
    assert froms and all(DIGEST.fullmatch(image) for image in froms), froms
    images = {
        name: service["image"]
        for name, service in compose()["services"].items()
        if "image" in service
    }
    assert {"postgres", "proxy"} <= images.keys()
    assert all(DIGEST.fullmatch(image) for image in images.values()), images


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "environment as a mapping"
    return {key: str(value) for key, value in environment.items()}


def test_no_password_is_written_in_the_compose_file():
    text = (REPO / "docker-compose.yml").read_text()
    # No URL with a user:password@ part, no password variable with a value.
    assert not re.search(r"://[^/@\s:]+:[^/@\s]+@", text)
    services = compose()["services"]
    for name, service in services.items():
        for key, value in environment_of(service).items():
            if "PASSWORD" in key:
                assert key.endswith("_FILE") and value.startswith("/run/secrets/"), (name, key)
    assert compose()["secrets"]["postgres_password"] == {"file": "./secrets/postgres-password"}
    for name in ("postgres", *MIXREG_SERVICES):
        assert services[name]["secrets"] == ["postgres_password"], name
    gitignored = (REPO / ".gitignore").read_text().split()
    assert "secrets/" in gitignored and "secrets" in (REPO / ".dockerignore").read_text().split()


def test_every_long_running_service_is_checked_and_limited():
    services = compose()["services"]
    long_running = [name for name, service in services.items() if service["restart"] != "no"]
    assert set(long_running) == {"postgres", "api", "worker", "proxy"}
    for name in long_running:
        service = services[name]
        check = service["healthcheck"]
        assert not check.get("disable") and check["test"][0] in ("CMD", "CMD-SHELL"), name
        limits = service["deploy"]["resources"]["limits"]
        assert float(limits["cpus"]) > 0 and re.fullmatch(r"\d+[mg]", limits["memory"]), name
    # The workers' limit holds two fits of the measured peak (bench/RESULTS.md): worker 265
    # MiB, fork server 237 MiB, a fit process 645 MiB on 1,000,000 x 20 rows.
    worker = services["worker"]
    assert "--concurrency" in worker["command"]
    concurrency = int(worker["command"][worker["command"].index("--concurrency") + 1])
    memory = worker["deploy"]["resources"]["limits"]["memory"]
    mebibytes = int(memory[:-1]) * (1024 if memory.endswith("g") else 1)
    assert mebibytes >= 265 + 237 + concurrency * 645
    results = (REPO / "bench" / "RESULTS.md").read_text()
    assert "| CSV | `subsample` | succeeded | 6.5 | 434 | 645 |" in results


def test_the_compose_deployment_keeps_data_for_a_while_and_logs_json():
    services = compose()["services"]
    for name in MIXREG_SERVICES:
        environment = environment_of(services[name])
        assert environment["MIXREG_LOG_FORMAT"] == "json", name
        for kind in ("JOB", "DATASET", "MODEL"):
            assert float(environment[f"MIXREG_{kind}_RETENTION_DAYS"]) > 0, (name, kind)


def test_the_proxy_profile_ends_tls_in_front_of_the_api():
    services = compose()["services"]
    proxy = services["proxy"]
    assert proxy["profiles"] == ["proxy"] and proxy["image"].startswith("caddy:")
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in proxy["volumes"]
    caddyfile = (REPO / "deploy" / "Caddyfile").read_text()
    assert "reverse_proxy api:8000" in caddyfile
    assert {"80:80", "443:443"} <= set(proxy["ports"])
    api = services["api"]
    # The API trusts the proxy's X-Forwarded-Proto (Secure cookies) and is published on this
    # machine only: other machines come through the proxy.
    assert "172.16.0.0/12" in environment_of(api)["MIXREG_FORWARDED_ALLOW_IPS"]
    assert api["ports"] == ["127.0.0.1:8000:8000"]


def test_a_password_file_sets_the_database_urls_password(tmp_path, monkeypatch):
    secret = tmp_path / "postgres-password"
    secret.write_text("s3cr/et@x\n")
    monkeypatch.setenv("MIXREG_DATABASE_URL", "postgresql+psycopg://mixreg@postgres:5432/mixreg")
    monkeypatch.setenv("MIXREG_DATABASE_PASSWORD_FILE", str(secret))
    url = make_url(Settings().database_url)
    assert (url.username, url.password, url.host, url.database) == (
        "mixreg",
        "s3cr/et@x",
        "postgres",
        "mixreg",
    )
    secret.write_text("\n")
    with pytest.raises(ValidationError, match=r"MIXREG_DATABASE_PASSWORD_FILE .* is empty"):
        Settings()
    monkeypatch.setenv("MIXREG_DATABASE_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match="cannot be read"):
        Settings()


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
    makefile = (REPO / "Makefile").read_text()
    assert "--constraint requirements.lock -e '.[dev]'" in makefile


def test_the_image_installs_only_hashed_wheels_at_the_locked_versions():
    build = [line for line in dockerfile_stages()[0] if line.startswith("RUN")]
    installs = [line for line in build if "pip install" in line]
    assert "--require-hashes" in installs[0] and "requirements-image.lock" in installs[0]
    # The project itself: built offline from the hashed setuptools, its dependencies checked.
    assert all(word in installs[1] for word in ("--no-index", "--no-deps", "pip check"))
    text = (REPO / "requirements-image.lock").read_text().replace("\\\n", " ")
    pinned = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = re.fullmatch(r"(\S+)==(\S+) +--hash=sha256:[0-9a-f]{64}", line.strip())
            assert match, line
            pinned[match[1]] = match[2]
    locked = locked_versions()
    assert {name: version for name, version in pinned.items() if name != "setuptools"} == {
        name: locked[name] for name in pinned if name != "setuptools"
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = project["dependencies"] + project["optional-dependencies"]["server"]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[<>=\[ ;]", item)[0]).lower() for item in runtime}
    assert names | {"setuptools"} <= pinned.keys()
    assert "lock-image" in (REPO / "Makefile").read_text()
