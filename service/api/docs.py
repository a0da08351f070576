"""The OpenAPI document and its pages: served offline, with working examples and the real
error shape.

- ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) load their scripts from the installed
  ``fastapi-offline`` package, never from a CDN, so they work without internet access.
- Every request body carries examples that the server accepts as they are (ids of stored
  datasets and models are the ones to replace), checked by a test that posts each one.
- Every error response is declared as ``application/problem+json`` with the schema the
  handlers really send (:class:`Problem`), in place of FastAPI's default 422 body.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from service.auth.policy import DOCS_STATIC
from service.problems import PROBLEM_MEDIA_TYPE

# The path the auth policy leaves open for the docs pages' own scripts and styles.
HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})
# The Open Inference Protocol defines its own error body ({"error": ...}).
OWN_ERROR_SHAPE_PREFIXES = ("/v2/",)
EXAMPLE_MODEL_ID = "0123456789abcdef0123456789abcdef"
"""Stands for a model id in the examples: replace it with the id of a fitted model."""
EXAMPLE_DATASET_ID = "fedcba9876543210fedcba9876543210"
"""Stands for a dataset id in the examples: replace it with the id ``POST /datasets`` gave."""
EXAMPLE_REQUEST_ID = "00000000-0000-4000-8000-000000000000"
"""Stands for the ``X-Request-ID`` of a logged predict answer in the examples."""


class ValidationProblemItem(BaseModel):
    """One reason a request is invalid."""

    model_config = ConfigDict(extra="forbid")

    loc: list[str | int] = Field(description='where in the request, e.g. ["body", "X", 3, 1]')
    msg: str
    type: str = Field(description="pydantic's error type, e.g. missing, invalid_input")
    ctx: dict[str, str] | None = Field(default=None, description="the error's parameters")


class Problem(BaseModel):
    """An RFC 9457 problem: the body of every error response."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "type": "urn:mixreg:problem:not-found",
                    "title": "Not Found",
                    "status": 404,
                    "detail": f"model {EXAMPLE_MODEL_ID} does not exist",
                    "instance": f"/models/{EXAMPLE_MODEL_ID}",
                }
            ]
        },
    )

    type: str = Field(description='"urn:mixreg:problem:<kind>", or "about:blank"')
    title: str = Field(description="the HTTP status phrase")
    status: int
    detail: str = Field(description="what is wrong, naming the field, row or column")
    instance: str = Field(description="the path of the request")
    errors: list[ValidationProblemItem] | None = Field(
        default=None, description="validation errors (422): every field that is wrong"
    )


# --- examples of request bodies ---

_EXAMPLE_X = [
    [0.1, 0.9],
    [0.8, -0.3],
    [-0.5, 0.4],
    [0.3, 0.3],
    [-0.9, -0.7],
    [0.6, 0.8],
    [-0.2, -0.6],
    [0.9, 0.1],
    [-0.7, 0.5],
    [0.4, -0.9],
    [0.0, 0.2],
    [-0.4, -0.1],
]
# Even rows on y = 2 x1 - x2 + 1, odd rows on y = -x1 + 3 x2 - 2.
_EXAMPLE_Y = [
    round(2 * x1 - x2 + 1 if index % 2 == 0 else -x1 + 3 * x2 - 2, 6)
    for index, (x1, x2) in enumerate(_EXAMPLE_X)
]
_EXAMPLE_DATA = {"X": _EXAMPLE_X, "y": _EXAMPLE_Y, "feature_names": ["x1", "x2"]}
_EXAMPLE_CSV = "x1,x2,y\n" + "".join(
    f"{x1},{x2},{y}\n" for (x1, x2), y in zip(_EXAMPLE_X, _EXAMPLE_Y, strict=True)
)


def _example(summary: str, value: Any, description: str | None = None) -> dict[str, Any]:
    example: dict[str, Any] = {"summary": summary, "value": value}
    if description:
        example["description"] = description
    return example


REQUEST_EXAMPLES: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    "datasets-create": {
        "application/json": {
            "two-lines": _example(
                "12 rows from two lines, as JSON", {**_EXAMPLE_DATA, "name": "two lines"}
            ),
        },
        "multipart/form-data": {
            "csv-file": _example(
                "a CSV file whose column y is the target",
                {"file": _EXAMPLE_CSV, "target": "y", "name": "two lines"},
                "Choose a .csv file (with a header row) or an .npz archive; `target` names "
                "the column to predict.",
            ),
        },
        "text/csv": {
            "csv-body": _example(
                "a raw CSV body (name the target with ?target=y)",
                _EXAMPLE_CSV,
                "Send with the query parameter `target` naming the column to predict.",
            ),
        },
    },
    "fit-submit": {
        "application/json": {
            "inline": _example(
                "k = 2 lines of inline data, default algorithm (auto)",
                {"data": _EXAMPLE_DATA, "k": 2, "seed": 7},
            ),
            "stored-dataset": _example(
                "a stored dataset (replace dataset_id with the id POST /datasets gave)",
                {"dataset_id": EXAMPLE_DATASET_ID, "k": 2, "algorithm": "auto", "seed": 7},
            ),
            "k-sweep": _example(
                "a k sweep: a model per k, BIC picks one",
                # 10 training rows: each of k lines must own p + 1 = 4 of them, so k <= 2.
                {"data": _EXAMPLE_DATA, "k": [1, 2], "seed": 7},
            ),
            "em-with-params": _example(
                "EM with five restarts",
                {
                    "data": _EXAMPLE_DATA,
                    "k": 2,
                    "algorithm": "em",
                    "params": {"n_init": 5, "max_iter": 100},
                    "holdout_fraction": 0.25,
                    "seed": 1,
                },
            ),
        },
    },
    "predict-predict": {
        "application/json": {
            "with-targets": _example(
                "two rows with their targets (replace model_id with a fitted model's id)",
                {"model_id": EXAMPLE_MODEL_ID, "X": [[0.5, 0.5], [-0.2, 0.9]], "y": [1.5, 0.9]},
            ),
            "rows-only": _example(
                "one row (a list of rows, even for one)",
                {"model_id": EXAMPLE_MODEL_ID, "X": [[0.5, 0.5]]},
            ),
        },
    },
    "models-predict": {
        "application/json": {
            "with-targets": _example(
                "two rows with their targets",
                {"X": [[0.5, 0.5], [-0.2, 0.9]], "y": [1.5, 0.9]},
            ),
            "rows-only": _example("one row (a list of rows, even for one)", {"X": [[0.5, 0.5]]}),
        },
    },
    "models-predict_version": {
        "application/json": {
            "rows-only": _example("one row (a list of rows, even for one)", {"X": [[0.5, 0.5]]}),
        },
    },
    "models-import": {
        "application/json": {
            "two-lines": _example(
                "two lines in two features (GET /models/{model_id}/export gives such documents)",
                {
                    "format": "mixreg-model",
                    "format_version": 1,
                    "n_components": 2,
                    "n_features": 2,
                    "feature_names": ["x1", "x2"],
                    "fit_intercept": True,
                    "coef": [[1.0, 2.0], [-1.0, 0.5]],
                    "intercept": [0.0, 1.0],
                    "shares": [0.5, 0.5],
                    "gate": None,
                    "algorithm": "auto",
                    "params": {},
                    "metrics": {
                        "train_min_loss": 0.1,
                        "n_train": 12,
                        "baseline": {
                            "coef": [0.1, 0.2],
                            "intercept": 0.3,
                            "train_min_loss": 1.0,
                            "holdout_min_loss": None,
                        },
                    },
                },
            ),
        },
    },
    "registered-models-set_alias": {
        "application/json": {
            "first-version": _example("point the alias at version 1", {"version": 1}),
        },
    },
}
PARAMETER_EXAMPLES: dict[tuple[str, str], Any] = {
    ("datasets-create", "target"): "y",
    ("datasets-create", "name"): "two lines",
}


# --- the document ---


def _problem_content() -> dict[str, Any]:
    return {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _standard_errors(path: str, operation: dict[str, Any]) -> dict[str, str]:
    errors: dict[str, str] = {}
    if operation.get("parameters") or "requestBody" in operation:
        errors["422"] = (
            "the request is invalid: `detail` names the field, row or column and what to "
            "change; `errors` lists every invalid field with its `loc`"
        )
    if "{" in path:
        errors["404"] = "the resource named in the path does not exist"
    if "requestBody" in operation:
        errors["413"] = "the request body is larger than MIXREG_MAX_BODY_BYTES"
    return errors


def declare_problems(document: dict[str, Any]) -> None:
    """Declare every error response as problem+json with the :class:`Problem` schema."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    for path, item in document.get("paths", {}).items():
        if path.startswith(OWN_ERROR_SHAPE_PREFIXES):
            continue
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for status, description in _standard_errors(path, operation).items():
                existing = responses.get(status)
                if existing is None or _is_fastapi_validation_error(existing):
                    responses[status] = {"description": description}
            for status, response in responses.items():
                if status[0] in "45" and (
                    "content" not in response or _is_fastapi_validation_error(response)
                ):
                    response["content"] = _problem_content()
    for name in ("HTTPValidationError", "ValidationError"):
        if name in schemas and f'"#/components/schemas/{name}"' not in repr(document).replace(
            "'", '"'
        ):
            del schemas[name]


def _is_fastapi_validation_error(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return bool(schema.get("$ref", "").endswith("/HTTPValidationError"))


def add_examples(document: dict[str, Any]) -> None:
    """Put :data:`REQUEST_EXAMPLES` on their request bodies and parameter examples on their
    parameters."""
    for item in document.get("paths", {}).values():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            operation_id = operation.get("operationId", "")
            content = operation.get("requestBody", {}).get("content", {})
            for media_type, examples in REQUEST_EXAMPLES.get(operation_id, {}).items():
                if media_type in content:
                    content[media_type]["examples"] = examples
            for parameter in operation.get("parameters", []):
                key = (operation_id, parameter.get("name", ""))
                if key in PARAMETER_EXAMPLES:
                    parameter["example"] = PARAMETER_EXAMPLES[key]


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and ``/redoc`` from packaged assets and complete the document with the
    problem responses and examples above.

    ``app`` must be created with ``docs_url=None, redoc_url=None``.
    """
    assets = files("fastapi_offline") / "static"
    app.mount(DOCS_STATIC, StaticFiles(directory=str(assets)), name="docs-static")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_STATIC}/favicon.png",
            oauth2_redirect_url=oauth2_redirect_url,
            # validatorUrl null: no badge fetched from the public validator.
            swagger_ui_parameters={"validatorUrl": None, "tryItOutEnabled": True},
        )

    @app.get(oauth2_redirect_url, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{DOCS_STATIC}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_STATIC}/favicon.png",
            with_google_fonts=False,
        )

    # Wraps whatever builds the document now (FastAPI's own, or one that adds the security
    # schemes), so the additions here come on top; installed last in create_app.
    build = app.openapi
    completed: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        document = build()
        if not completed or completed[0] is not document:
            declare_problems(document)
            add_examples(document)
            completed[:] = [document]
        return document

    app.openapi = openapi  # type: ignore[method-assign]
