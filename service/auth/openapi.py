"""The API keys in the OpenAPI document: the bearer scheme, the scope of each operation, and the
answers of the auth middleware (400, 401, 403) on every operation it guards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from service.auth import policy
from service.problems import PROBLEM_MEDIA_TYPE

SECURITY_SCHEME = "apiKey"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_PROBLEM_CONTENT = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
_WWW_AUTHENTICATE = {
    "WWW-Authenticate": {
        "description": 'the Bearer challenge, e.g. Bearer realm="mixreg", error="invalid_token"',
        "schema": {"type": "string"},
    }
}
_AUTHENTICATED_ANSWERS = {
    "400": "an API key was sent in the query string: refused, send it in the header",
    "401": "no API key, or one that is unknown or revoked",
    "403": "the API key lacks the scope this operation needs",
}
_UNAUTHENTICATED_ANSWERS = {
    "403": "this server has no API keys and answers only clients on its own machine",
}


def document_keys(
    schema: dict[str, Any], *, authenticated: bool, metrics_open: bool
) -> dict[str, Any]:
    """Add the bearer scheme and the middleware's answers to ``schema`` in place."""
    components = schema.setdefault("components", {})
    if authenticated:
        components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key, made by `mixreg keys create --scope read|write`, sent as "
            "`Authorization: Bearer <key>`. Scope `read`: GET requests and predictions; scope "
            "`write`: everything.",
        }
    for path, item in schema.get("paths", {}).items():
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            if policy.is_open(path, metrics_open=metrics_open):
                operation["security"] = []
                continue
            if authenticated:
                scope = policy.required_scope(method.upper(), path)
                operation["security"] = [{SECURITY_SCHEME: []}]
                note = f"Needs an API key with the scope `{scope}`."
                operation["description"] = f"{operation.get('description', '')}\n\n{note}".strip()
                answers = _AUTHENTICATED_ANSWERS
            else:
                answers = _UNAUTHENTICATED_ANSWERS
            responses = operation.setdefault("responses", {})
            for status, description in answers.items():
                if status not in responses:
                    responses[status] = {"description": description, "content": _PROBLEM_CONTENT}
                if authenticated and status in ("400", "401", "403"):
                    responses[status].setdefault("headers", {}).update(_WWW_AUTHENTICATE)
    return schema


def install(app: FastAPI, *, authenticated: bool, metrics_open: bool) -> None:
    """Add the keys to the document ``app.openapi`` builds; call it after any other change to
    ``app.openapi``, which it wraps."""
    build = app.openapi
    documented: list[int] = []

    def openapi() -> dict[str, Any]:
        schema = build()
        if id(schema) not in documented:  # the document is built once, then cached
            document_keys(schema, authenticated=authenticated, metrics_open=metrics_open)
            documented.append(id(schema))
        return schema

    wrapped: Callable[[], dict[str, Any]] = openapi
    app.openapi = wrapped  # type: ignore[method-assign]
