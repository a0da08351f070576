"""The service's domain errors: what cannot be done, in one sentence that names the field,
row, column or setting at fault.

They say nothing of HTTP: data, jobs, serving and auth raise them, and ``service.api.errors``
gives each kind its status and renders it as a problem+json response.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A request the service cannot carry out.

    ``slug`` names the kind of problem (the problem type ``urn:mixreg:problem:<slug>``);
    ``errors`` lists validation errors, each with ``loc``, ``msg`` and ``type``.
    """

    slug: str = "bad-request"

    def __init__(self, detail: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors


class InvalidInputError(ServiceError):
    """The request is well-formed but its content cannot be used."""

    slug = "invalid-input"


class NotFoundError(ServiceError):
    """A referenced dataset, job or model does not exist."""

    slug = "not-found"


class ConflictError(ServiceError):
    """The request conflicts with the current state of a resource."""

    slug = "conflict"


class UnsupportedMediaTypeError(ServiceError):
    """The request body has a content type the endpoint cannot read."""

    slug = "unsupported-media-type"


class NotAcceptableError(ServiceError):
    """The client accepts no format the answer can be given in."""

    slug = "not-acceptable"


class LimitExceededError(ServiceError):
    """A parameter asks for more work than the server's limit; the detail names the setting."""

    slug = "limit-exceeded"


class DataTooLargeError(ServiceError):
    """The data has more rows or features than the server's limit; the detail names the
    setting."""

    slug = "limit-exceeded"


class TooManyJobsError(ServiceError):
    """The caller has as many unfinished jobs as it may have; retry after ``retry_after_s``."""

    slug = "too-many-jobs"

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class ServiceUnavailableError(ServiceError):
    """The server could not carry out the request for a passing reason of its own (not the
    request's); retry after ``retry_after_s``."""

    slug = "unavailable"

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s
