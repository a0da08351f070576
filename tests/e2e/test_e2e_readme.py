"""The README's walk-through, run as written against a server started by `make serve`, and
every output the README shows compared with what the server prints now (ids and times aside,
numbers within their rounding)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import REPO, free_port

MIXREG = REPO / ".venv" / "bin" / "mixreg"

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

    base = f"http://127.0.0.1:{make_serve}"
    sweep_job = next(
        job
        for job in httpx.get(f"{base}/jobs", params={"limit": 50}).json()["items"]
        if job.get("k_values") == [1, 2, 3, 4]
    )
    assert_same_sweep(shown_sweep(), sweep_job["sweep"])

    shown = command_line_sample()
    environment = {**os.environ, "MIXREG_URL": base}
    fitted = subprocess.run(
        [str(MIXREG), "fit", "two-lines.csv", "--target", "y", "--k", "2", "--seed", "7"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    model_id = fitted.stdout.split()[1]
    predicted = subprocess.run(
        f"{MIXREG} predict {model_id} two-lines.csv | head -3",
        shell=True, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    progress = [line for line in fitted.stderr.splitlines() if "succeeded" in line][-1]
    assert_same_lines(shown["fit"][:1], [progress])
    assert_same_lines(shown["fit"][1:], fitted.stdout.splitlines())
    assert_same_lines(shown["predict"], predicted.stdout.splitlines())


# --- outputs shown in the README ---

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
ID = re.compile(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{8}\b")
ELAPSED = re.compile(r"\b\d+:\d\d:\d\d\b")
BAR = re.compile(r"━+")
# Numbers agree to the digits shown, or to 0.1 % (fits differ a little between machines' BLAS).
RELATIVE = 1e-3


def same_number(shown: str, actual: float) -> bool:
    """Whether ``actual`` rounds to ``shown`` (within its last digit), or is within 0.1 %."""
    mantissa = shown.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(shown.split("e")[1]) if "e" in shown else 0
    if "." not in mantissa and "e" not in shown:
        return float(shown) == actual  # counts and integers: exactly
    digit = 10.0 ** (exponent - decimals)
    return abs(float(shown) - actual) <= max(digit, RELATIVE * abs(actual))


def assert_same_line(shown: str, actual: str) -> None:
    def shape(line: str) -> str:
        line = BAR.sub("━", ELAPSED.sub("<time>", ID.sub("<id>", line)))
        return NUMBER.sub("<n>", " ".join(line.split()))

    assert shape(shown) == shape(actual), (
        f"README shows\n  {shown}\nthe server now prints\n  {actual}"
    )
    unmasked = [ID, ELAPSED]
    for pattern in unmasked:
        shown, actual = pattern.sub("", shown), pattern.sub("", actual)
    for shown_number, actual_number in zip(
        NUMBER.findall(shown), NUMBER.findall(actual), strict=True
    ):
        assert same_number(shown_number, float(actual_number)), (
            f"README shows {shown_number} where the server now prints {actual_number}:\n"
            f"  {shown}\n  {actual}"
        )


def assert_same_lines(shown: list[str], actual: list[str]) -> None:
    assert len(shown) == len(actual), (shown, actual)
    for shown_line, actual_line in zip(shown, actual, strict=True):
        assert_same_line(shown_line, actual_line)


def readme_section(heading: str) -> str:
    readme = (REPO / "README.md").read_text()
    return re.split(r"\n#{2,3} ", readme.split(f"\n{heading}\n", 1)[1], maxsplit=1)[0]


def command_line_sample() -> dict[str, list[str]]:
    """The terminal session shown under the README's command line heading: what ``mixreg fit``
    and ``mixreg predict`` print (the commands' lines left out)."""
    section = readme_section("### Command line")
    match = re.search(r"^```\n(\$ mixreg fit .*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert match, "the command line section shows no session"
    fit_text, predict_text = match.group(1).split("\n$ mixreg predict ", 1)
    return {
        "fit": fit_text.splitlines()[1:],
        "predict": predict_text.splitlines()[1:],
    }


def shown_sweep() -> dict[str, object]:
    """The sweep of the README's k sweep section: best k, and per k the fields it shows."""
    section = readme_section("## Choosing k: a k sweep")
    match = re.search(r"^```json\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert match, "the k sweep section shows no sweep"
    text = match.group(1)
    best = re.search(r'"best_n_components": (\d+)', text)
    assert best
    models = [
        dict(re.findall(r'"(\w+)": ([-\w.]+)', entry))
        for entry in re.findall(r'\{"n_components".*?\}', text, re.DOTALL)
    ]
    return {"best_n_components": best.group(1), "models": models}


def assert_same_sweep(shown: dict[str, object], sweep: dict[str, object]) -> None:
    assert int(str(shown["best_n_components"])) == sweep["best_n_components"]
    models = sweep["models"]
    assert isinstance(models, list) and isinstance(shown["models"], list)
    assert len(shown["models"]) == len(models)
    for shown_model, model in zip(shown["models"], models, strict=True):
        for name, value in shown_model.items():
            if value in ("true", "false"):
                assert model[name] is (value == "true"), (name, model)
            else:
                assert same_number(value, float(model[name])), (
                    f"k={model['n_components']}: README shows {name} {value}, the server now "
                    f"{model[name]}"
                )


def test_the_estimator_example_prints_what_the_readme_shows():
    section = readme_section("## The estimator from Python")
    match = re.search(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert match, "the estimator section has no ```python block"
    block = match.group(1)
    # Each print(...) with a comment shows its output before the comment's colon.
    shown = [
        comment.split(":")[0].strip()
        for comment in re.findall(r"^print\(.*\)[ \t]+# (.*)$", block, re.MULTILINE)
    ]
    assert shown, "the example shows no output"
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert printed[-len(shown) :] == shown
