"""Pictures of fits, the web page (checked in headless Chromium, by its pixels), the offline
API docs, their examples and declared errors, and structured logs with request and job ids."""

from __future__ import annotations

import io
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mixreg.datasets import make_gated, make_shared_accounts
from service.api.docs import (
    EXAMPLE_DATASET_ID,
    EXAMPLE_MODEL_ID,
    EXAMPLE_REQUEST_ID,
    OWN_ERROR_SHAPE_PREFIXES,
    Problem,
)
from tests.ci import service_unavailable

from .conftest import Server, mixture_data, module_sqlite_server

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
FAST = {"n_init": 4, "n_partitions": 50, "subsample_size": 30}
# Colours of the page and of the pictures (service/api/ui/static/ui.css, service/api/ui/plots.py).
SUCCEEDED_BADGE = (0x1A, 0x7F, 0x37)
FIRST_LINE, SECOND_LINE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)
SWAGGER_POST_GREEN = (0x49, 0xCC, 0x90)
TEXT_MEDIA_TYPES = ("application/json", "multipart/form-data", "text/csv")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (SQLite, JSON logs) for the tests of this module."""
    yield from module_sqlite_server(tmp_path_factory, "ui", MIXREG_LOG_FORMAT="json")


@pytest.fixture(scope="module")
def fitted(live: Server) -> dict[str, Any]:
    """A model of three features, a model of one feature and a k sweep."""
    X, y = mixture_data(n_rows=150, seed=12)
    several = live.wait_for_job(
        live.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": 2, "params": FAST})
    )
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, size=120)
    line = rng.integers(0, 2, size=120)
    y1 = np.where(line, 1.5 * x + 1, -0.5 * x - 1) + 0.05 * rng.standard_normal(120)
    one = live.wait_for_job(
        live.fit({"data": {"X": x[:, None].tolist(), "y": y1.tolist()}, "k": 2, "params": FAST})
    )
    sweep = live.wait_for_job(
        live.fit({"data": {"X": X.tolist(), "y": y.tolist()}, "k": [1, 2, 3], "params": FAST})
    )
    assert several["status"] == one["status"] == sweep["status"] == "succeeded"
    return {"several": several, "one": one, "sweep": sweep}


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def count_colour(image: np.ndarray, colour: tuple[int, int, int], tolerance: int = 6) -> int:
    return int(np.all(np.abs(image.astype(int) - colour) <= tolerance, axis=2).sum())


@pytest.mark.parametrize("which", ["several", "one"])
def test_a_models_picture_shows_its_lines_and_is_cached(live: Server, fitted, which):
    model_id = fitted[which]["model_id"]
    response = live.request("GET", f"/models/{model_id}/plot.png")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    image = pixels(response.content)
    assert image.shape == (420, 1000, 3)
    # Points (and lines) in both components' colours.
    assert count_colour(image, FIRST_LINE) > 100 and count_colour(image, SECOND_LINE) > 100
    etag = response.headers["etag"]
    again = live.request("GET", f"/models/{model_id}/plot.png", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""


def test_a_sweeps_picture_and_what_has_none(live: Server, fitted):
    sweep = fitted["sweep"]
    response = live.request("GET", f"/jobs/{sweep['id']}/plot.png")
    assert response.status_code == 200 and response.content.startswith(b"\x89PNG")
    single = fitted["several"]
    missing = live.request("GET", f"/jobs/{single['id']}/plot.png")
    assert missing.status_code == 404
    assert missing.json()["detail"] == (
        f"job {single['id']} fits one k, not a k sweep; its model's picture is "
        f"/models/{single['model_id']}/plot.png"
    )
    unknown = live.request("GET", f"/models/{'f' * 32}/plot.png")
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"


def external_references(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["']?((?:https?:)?//[^"' >]+)""", html)


def test_the_page_lists_jobs_and_models_and_loads_nothing_from_outside(live: Server, fitted):
    page = live.request("GET", "/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    for job in fitted.values():
        assert f'id="job-{job["id"]}"' in html
    model_id = fitted["several"]["model_id"]
    assert f'<img src="/models/{model_id}/plot.png"' in html
    assert re.search(r'<meta http-equiv="refresh" content="\d+">', html)
    assert external_references(html) == []
    assert live.request("GET", "/ui/static/ui.css").status_code == 200
    detail = live.request("GET", f"/ui/models/{model_id}")
    assert detail.status_code == 200 and model_id in detail.text
    assert live.request("GET", "/", follow_redirects=False).headers["location"] == "/ui"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_are_served_without_a_cdn(live: Server, page):
    html = live.request("GET", page).text
    assert external_references(html) == []
    assets = re.findall(r"""(?:src|href)=["']?(/[^"' >]+)""", html)
    assert any(asset.endswith(".js") for asset in assets)
    for asset in assets:
        assert live.request("GET", asset).status_code == 200, asset


def chromium_screenshot(url: str, tmp_path: Path, size: str) -> np.ndarray:
    if not CHROMIUM.exists():
        service_unavailable(f"{CHROMIUM} is not installed (make test installs it)")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",
            f"--window-size={size}",
            f"--screenshot={shot}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return pixels(shot.read_bytes())


def test_the_page_in_a_browser_shows_the_job_succeeded_and_its_picture(
    live: Server, fitted, tmp_path: Path
):
    image = chromium_screenshot(f"{live.base_url}/ui", tmp_path, "1400,4200")
    # Three succeeded badges, each a filled pill of about 100 x 25 pixels.
    assert count_colour(image, SUCCEEDED_BADGE, tolerance=2) > 3 * 1500
    # The pictures loaded: the page itself uses neither of the components' colours.
    assert count_colour(image, FIRST_LINE, 12) > 300 and count_colour(image, SECOND_LINE, 12) > 300


def chromium_dom(url: str, tmp_path: Path) -> str:
    """The page as a browser builds it (its DOM after rendering)."""
    if not CHROMIUM.exists():
        service_unavailable(f"{CHROMIUM} is not installed (make test installs it)")
    done = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
        text=True,
    )
    return done.stdout


def test_the_model_page_in_a_browser_shows_the_table_of_standard_errors(
    live: Server, fitted, tmp_path: Path
):
    model = live.request("GET", fitted["several"]["model_url"]).json()
    dom = chromium_dom(f"{live.base_url}/ui/models/{model['id']}", tmp_path)
    table = dom[dom.index('<table id="standard-errors">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row, flags=re.S) for row in rows[1:]]
    # Per line: three coefficients, the intercept, the weight and the noise variance.
    assert len(cells) == 2 * 6
    assert [row[1] for row in cells[:6]] == [
        "x0",
        "x1",
        "x2",
        "intercept",
        "weight",
        "noise variance",
    ]
    first = model["components"][0]["estimates"]["coef"][0]
    assert cells[0][0] == "0"
    assert float(cells[0][2]) == pytest.approx(first["estimate"], rel=1e-5)
    assert float(cells[0][3]) == pytest.approx(first["std_error"], rel=1e-3)
    assert float(cells[0][4]) == pytest.approx(first["z_value"], rel=1e-3)
    second_weight = model["components"][1]["estimates"]["weight"]
    assert float(cells[10][2]) == pytest.approx(second_weight["estimate"], rel=1e-5)
    assert cells[10][4] == "-"  # no Wald test of a weight


@pytest.fixture(scope="module")
def kinds(live: Server) -> dict[str, dict[str, Any]]:
    """A gated model (with the gate's standard errors), a grouped one and a keyed one, small."""

    def upload(X: np.ndarray, y: np.ndarray, columns: dict[str, list[Any]]) -> str:
        body = {"X": X.tolist(), "y": y.tolist(), "columns": columns}
        response = live.request("POST", "/datasets", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    gated = make_gated(n_samples=300, n_features=1, n_concomitant=1, random_state=2)
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(20), 10)
    x = rng.uniform(-1, 1, size=(groups.size, 1))
    y = np.where(groups % 2, 2 * x[:, 0] + 3, -x[:, 0] - 3) + 0.1 * rng.standard_normal(groups.size)
    X, y_keyed, account, _ = make_shared_accounts(
        n_accounts=3, n_ratings=60, n_features=1, random_state=7
    )
    bodies = {
        "gated": {
            "dataset_id": upload(gated.X, gated.y, {"w": gated.concomitant[:, 0].tolist()}),
            "algorithm": "am-classic",
            "gating": ["w"],
            "standard_errors": True,
        },
        "grouped": {
            "dataset_id": upload(x, y, {"user": [f"user-{g}" for g in groups]}),
            "algorithm": "am-classic",
            "groups": "user",
        },
        "keyed": {
            "dataset_id": upload(X, y_keyed, {"account": [f"a{a}" for a in account.tolist()]}),
            "split_by": "account",
            "params": FAST,
        },
    }
    jobs = {kind: live.fit({**body, "k": 2, "seed": 3}) for kind, body in bodies.items()}
    models = {}
    for kind, job_id in jobs.items():
        job = live.wait_for_job(job_id)
        assert job["status"] == "succeeded", job
        models[kind] = live.request("GET", job["model_url"]).json()
    return models


def table_cells(dom: str, table_id: str) -> list[list[str]]:
    """The cells of each body row of the table ``table_id``."""
    table = dom[dom.index(f'<table id="{table_id}">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table[table.index("<tbody>") :], flags=re.S)
    return [re.findall(r"<td>(.*?)</td>", row, flags=re.S) for row in rows]


def test_the_model_page_in_a_browser_shows_a_gated_models_gate(live: Server, kinds, tmp_path: Path):
    model = kinds["gated"]
    gate = model["gate"]
    dom = chromium_dom(f"{live.base_url}/ui/models/{model['id']}", tmp_path)
    # A row per line: its one concomitant coefficient, intercept and noise variance.
    rows = table_cells(dom, "gate")
    assert [row[0] for row in rows] == ["0 (reference)", "1"]
    for row, coef, intercept, variance in zip(
        rows, gate["coef"], gate["intercept"], gate["noise_variance"], strict=True
    ):
        numbers = [float(cell) for cell in row[1:]]
        assert numbers == pytest.approx([*coef, intercept, variance], rel=1e-5, abs=1e-12)
    assert "Line 0 is the reference" in dom
    fit = re.search(r'<dd id="gate-fit">(.*?)</dd>', dom, flags=re.S)
    assert fit is not None
    assert [float(n) for n in fit.group(1).split(" (")[0].split(", ")] == pytest.approx(
        [gate["log_likelihood"], gate["bic"]], rel=1e-5
    )
    holdout = re.search(r'<dd id="gate-holdout">(.*?)</dd>', dom, flags=re.S)
    assert holdout is not None
    assert float(holdout.group(1).rsplit(" ", 1)[1]) == pytest.approx(
        gate["holdout"]["rmse_most_likely"], rel=1e-5
    )
    # The gate's standard errors follow the lines' in their table.
    errors = [row for row in table_cells(dom, "standard-errors") if row[1].startswith("gate: ")]
    (estimated,) = model["uncertainty"]["gate"]
    assert [row[:2] for row in errors] == [["1", "gate: w"], ["1", "gate: intercept"]]
    assert float(errors[0][3]) == pytest.approx(estimated["coef"][0]["std_error"], rel=1e-3)
    assert float(errors[1][2]) == pytest.approx(estimated["intercept"]["estimate"], rel=1e-5)
    picture = live.request("GET", f"/models/{model['id']}/plot.png")
    assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG")


def test_the_model_page_in_a_browser_names_the_groups_and_the_keys(
    live: Server, kinds, tmp_path: Path
):
    grouped = kinds["grouped"]
    dom = chromium_dom(f"{live.base_url}/ui/models/{grouped['id']}", tmp_path / "grouped")
    assert "Grouped by <code>user</code>" in dom
    # Training groups per line: together, every training group.
    per_line = [int(row[-1]) for row in table_cells(dom, "lines")]
    assert sum(per_line) == grouped["group_metrics"]["n_groups_train"] and min(per_line) > 0

    keyed = kinds["keyed"]
    summary = keyed["keyed"]
    dom = chromium_dom(f"{live.base_url}/ui/models/{keyed['id']}", tmp_path / "keyed")
    keys = re.search(r'<dl id="keys">\s*<dt>keys</dt><dd>(\d+) ', dom)
    assert keys is not None and int(keys.group(1)) == summary["n_keys"] == 3
    assert f"fitted {summary['keys_by_status']['fitted']}" in dom
    assert (
        "Lines of the global model" in dom and "the picture is of the global model" in dom.lower()
    )
    picture = live.request("GET", f"/models/{keyed['id']}/plot.png")
    assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG")


def test_the_docs_page_renders_offline_in_a_browser(live: Server, tmp_path: Path):
    image = chromium_screenshot(f"{live.base_url}/docs", tmp_path, "1200,900")
    # Swagger UI drew its operations (the green of POST), not a blank page.
    assert count_colour(image, SWAGGER_POST_GREEN) > 1000


# --- the OpenAPI document ---


def documented_examples(document: dict[str, Any]) -> Iterator[tuple[str, str, str, str, Any, dict]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            body = operation.get("requestBody")
            if body is None:
                continue
            parameters = {
                parameter["name"]: parameter.get("example")
                for parameter in operation.get("parameters", [])
                if parameter["in"] == "query" and "example" in parameter
            }
            for media_type, content in body["content"].items():
                for name, example in content.get("examples", {}).items():
                    yield path, method, media_type, name, example["value"], parameters


def test_every_request_body_has_an_example_that_works(live: Server, fitted):
    document = live.request("GET", "/openapi.json").json()
    # Binary bodies (NPZ, .npy, Parquet) have no example a document can hold as text.
    bodies = [
        (path, method, media_type)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        for media_type in operation.get("requestBody", {}).get("content", {})
        if media_type in TEXT_MEDIA_TYPES and not path.startswith(OWN_ERROR_SHAPE_PREFIXES)
    ]
    assert bodies, "no request bodies documented"
    examples = [
        example
        for example in documented_examples(document)
        if not example[0].startswith(OWN_ERROR_SHAPE_PREFIXES)
    ]
    assert {(path, method, media) for path, method, media, *_ in examples} == set(bodies)

    dataset_id = live.request("POST", "/datasets", json={"X": [[0.0], [1.0]], "y": [0.0, 1.0]})
    substitutes = {
        EXAMPLE_DATASET_ID: dataset_id.json()["id"],
        EXAMPLE_MODEL_ID: fitted_two_feature_model(live),
    }
    # Version 1 of a registered model, for the paths that name one.
    exported = live.request("GET", f"/models/{substitutes[EXAMPLE_MODEL_ID]}/export")
    registered = live.request(
        "POST", "/models/import", params={"registered_model": "example"}, json=exported.json()
    )
    assert registered.status_code == 201, registered.text
    substitutes[EXAMPLE_REQUEST_ID] = logged_request_id(live, substitutes[EXAMPLE_MODEL_ID])
    path_values = {
        "{target}": substitutes[EXAMPLE_MODEL_ID],
        "{model_id}": substitutes[EXAMPLE_MODEL_ID],
        "{name}": "example",
        "{version}": "1",
        "{alias}": "production",
    }
    for path, method, media_type, name, value, parameters in examples:
        text = json.dumps(value) if not isinstance(value, str) else value
        for placeholder, real in substitutes.items():
            text = text.replace(placeholder, real)
        for placeholder, real in path_values.items():
            path = path.replace(placeholder, real)
        if media_type == "application/json":
            response = live.request(
                method, path, content=text, headers={"Content-Type": media_type}
            )
        elif media_type == "multipart/form-data":
            fields = json.loads(text)
            upload = fields.pop("file")
            response = live.request(
                method, path, files={"file": ("example.csv", upload, "text/csv")}, data=fields
            )
        else:
            response = live.request(
                method, path, content=text, params=parameters, headers={"Content-Type": media_type}
            )
        assert 200 <= response.status_code < 300, (path, media_type, name, response.text)


def logged_request_id(live: Server, model_id: str) -> str:
    """The ``X-Request-ID`` of a predict request of ``model_id`` once the prediction log holds
    it (its writer flushes in the background), for the outcome example."""
    rate = live.request("PUT", f"/prediction-log/settings/{model_id}", json={"sample_rate": 1})
    assert rate.status_code == 200, rate.text
    answer = live.request("POST", "/predict", json={"model_id": model_id, "X": [[0.5, -1.0]]})
    assert answer.status_code == 200, answer.text
    for _ in range(100):
        metrics = live.request("GET", "/metrics").text
        written = re.search(
            r'^mixreg_prediction_log_rows(?:_total)?\{state="written"\} ([0-9.e+]+)$',
            metrics,
            re.MULTILINE,
        )
        if written and float(written.group(1)) >= 1:
            return str(answer.headers["X-Request-ID"])
        time.sleep(0.1)
    raise AssertionError("the predict request was not logged within 10 s")


def fitted_two_feature_model(live: Server) -> str:
    """A model of the examples' two features, fitted from the fit example itself."""
    document = live.request("GET", "/openapi.json").json()
    body = document["paths"]["/fit"]["post"]["requestBody"]["content"]["application/json"]
    job = live.wait_for_job(live.fit(body["examples"]["inline"]["value"]))
    assert job["status"] == "succeeded", job
    return str(job["model_id"])


def test_errors_are_documented_as_the_problems_really_sent(live: Server):
    document = live.request("GET", "/openapi.json").json()
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, item in document["paths"].items():
        if path.startswith(OWN_ERROR_SHAPE_PREFIXES):
            continue
        for operation in item.values():
            if "422" in operation["responses"]:
                assert operation["responses"]["422"]["content"] == problem, path
    fit = document["paths"]["/fit"]["post"]
    for status in ("422", "409", "413"):
        content = fit["responses"][status]["content"]
        assert content == {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        }
    assert "404" in document["paths"]["/models/{model_id}"]["get"]["responses"]

    # What the server sends validates against the documented schema (extra fields refused).
    invalid = live.request("POST", "/fit", json={"data": {"X": [[1.0]], "y": [1.0]}, "k": 0})
    missing = live.request("GET", f"/models/{'f' * 32}")
    for response in (invalid, missing):
        Problem.model_validate(response.json())
    assert invalid.json()["errors"][0]["loc"] == ["body", "k"]

    # POST /fit's union is discriminated by `algorithm`, and `algorithm` may still be left out.
    request_schema = fit["requestBody"]["content"]["application/json"]["schema"]
    assert request_schema["discriminator"]["propertyName"] == "algorithm"
    assert request_schema["discriminator"]["mapping"]["em"] == "#/components/schemas/EmFit"
    unknown = live.request(
        "POST", "/fit", json={"data": {"X": [[1.0]], "y": [1.0]}, "k": 1, "algorithm": "kmeans"}
    )
    assert unknown.json()["detail"].startswith("algorithm 'kmeans' is unknown; choose one of auto")


@pytest.mark.parametrize(
    ("request_", "status", "detail"),
    [
        pytest.param(
            {
                "path": "/fit",
                "json": {"data": {"X": [[1.0, 2.0]] * 5, "y": [1, 2, 3, 4, 5]}, "k": 5},
            },
            422,
            "k=5 is more than the 4 training rows: holdout_fraction=0.2 holds out 1 of the 5 "
            "rows; lower k to at most 4, lower holdout_fraction (0 trains on every row), or "
            "add rows",
            id="k-above-the-training-rows",
        ),
        pytest.param(
            {"path": "/datasets", "content": "a,y\n1,2\n", "headers": {"Content-Type": "text/csv"}},
            422,
            "name the column to predict: add the query parameter ?target=NAME to a raw text/csv "
            "body, or the form field 'target' to a multipart upload; columns are a, y",
            id="raw-csv-without-target",
        ),
        pytest.param(
            {
                "path": "/fit",
                "content": '{"data": {"X": [[1.0]], "y": [1.0]}, "k": 1}',
                "headers": {"Content-Type": "application/x-www-form-urlencoded"},
            },
            415,
            "POST /fit reads a JSON body, but the request says Content-Type: "
            "application/x-www-form-urlencoded; send the header Content-Type: application/json "
            "(curl -d sends application/x-www-form-urlencoded unless given "
            "-H 'Content-Type: application/json')",
            id="json-without-its-content-type",
        ),
        pytest.param(
            {"path": "/predict", "json": {"model_id": "f" * 32, "X": [0.5, 1.5]}},
            422,
            "X must be a list of rows, each a list of feature values; to send one row, wrap it "
            "in a list: [[0.5, 1.5]]",
            id="a-row-not-in-a-list",
        ),
        pytest.param(
            {"path": "/fit", "json": {"data": {"X": [[1.0]], "y": [1.0]}}},
            422,
            'k is required: the number of lines to fit, e.g. "k": 2 (a list such as [1, 2, 3] '
            "fits one model per k)",
            id="missing-k",
        ),
    ],
)
def test_error_messages_name_the_fix(live: Server, request_, status, detail):
    response = live.request("POST", **request_)
    assert response.status_code == status, response.text
    assert response.json()["detail"] == detail


# --- logs ---


def test_json_logs_carry_the_request_id_and_the_job_id(live: Server, fitted):
    echoed = live.request("GET", "/healthz", headers={"X-Request-ID": "trace-42"})
    assert echoed.headers["X-Request-ID"] == "trace-42"
    generated = live.request("GET", "/healthz").headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    refused = live.request("GET", "/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert refused.headers["X-Request-ID"] != "bad id with spaces"

    lines = [json.loads(line) for line in live.log().splitlines() if line.startswith("{")]
    assert lines, live.log()
    access = [
        line
        for line in lines
        if line.get("path") == "/healthz" and line["request_id"] == "trace-42"
    ]
    assert access and access[0]["logger"] == "uvicorn.access" and access[0]["status"] == 200
    job_id = fitted["several"]["id"]
    started = [line for line in lines if line["job_id"] == job_id]
    assert any("started" in line["message"] for line in started), started
    # The fit process logs in the server's format, every line naming its job.
    fitting = [line for line in lines if line["message"].startswith("fitting ")]
    assert job_id in {line["job_id"] for line in fitting}, fitting
    assert all(line["job_id"] for line in fitting), fitting
